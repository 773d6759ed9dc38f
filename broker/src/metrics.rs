//! Prometheus metrics over plain HTTP (`GET /metrics`), opt-in with `PERAGO_METRICS_ADDR`.

use crate::counters::{Counters, Gauges, prometheus};
use std::sync::Arc;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
};

/// Answers every connection with the current exposition (for `/metrics`) or 404.
pub(crate) async fn serve(
    listener: TcpListener,
    task: String,
    counters: Arc<Counters>,
    gauges: Arc<Gauges>,
) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let (task, counters, gauges) = (task.clone(), Arc::clone(&counters), Arc::clone(&gauges));
        tokio::spawn(async move {
            // One small request per connection is all a scraper sends; read its head only.
            let mut head = vec![0u8; 4096];
            let Ok(Ok(n)) =
                tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut head))
                    .await
            else {
                return;
            };
            let request = String::from_utf8_lossy(&head[..n]);
            let path = request.split_whitespace().nth(1).unwrap_or("");
            let (status, body, kind) = if request.starts_with("GET ") && path == "/metrics" {
                (
                    "200 OK",
                    prometheus(&task, &counters, &gauges),
                    "text/plain; version=0.0.4; charset=utf-8",
                )
            } else {
                (
                    "404 Not Found",
                    "not found; try /metrics\n".to_owned(),
                    "text/plain",
                )
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}
