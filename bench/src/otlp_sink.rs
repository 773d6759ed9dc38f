//! A collector for the `tracing` scenario: takes OTLP/HTTP exports (`POST /v1/traces`,
//! protobuf) on loopback, answers 200 at once and counts the spans, so what the runtime pays to
//! export is measured against a collector that costs it nothing to wait for.

use perago_proto::otlp::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;
use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The largest export read (the runtime's batches are far smaller).
const MAX_REQUEST: usize = 64 << 20;

pub(crate) struct Sink {
    url: String,
    spans: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Sink {
    pub(crate) async fn start() -> Result<Self, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| perago_core::errors::chain(&e))?;
        let url = format!(
            "http://{}",
            listener
                .local_addr()
                .map_err(|e| perago_core::errors::chain(&e))?
        );
        let spans = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&spans);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&counted)));
            }
        });
        Ok(Self { url, spans, task })
    }

    /// The base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn spans(&self) -> u64 {
        self.spans.load(Ordering::Relaxed)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One keep-alive connection's requests, until it closes or sends what is not a request.
async fn serve(mut stream: tokio::net::TcpStream, spans: Arc<AtomicU64>) {
    let mut buffer = Vec::new();
    loop {
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if buffer.len() > 64 << 10 || !read_more(&mut stream, &mut buffer).await {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let Some(length) = head.lines().find_map(|line| {
            line.strip_prefix("content-length:")
                .and_then(|v| v.trim().parse::<usize>().ok())
        }) else {
            return;
        };
        if length > MAX_REQUEST {
            return;
        }
        while buffer.len() < head_end + length {
            if !read_more(&mut stream, &mut buffer).await {
                return;
            }
        }
        if let Ok(request) = ExportTraceServiceRequest::decode(&buffer[head_end..head_end + length])
        {
            let count: usize = request
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len())
                .sum();
            spans.fetch_add(count as u64, Ordering::Relaxed);
        }
        buffer.drain(..head_end + length);
        let answer =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if stream.write_all(answer).await.is_err() {
            return;
        }
    }
}

async fn read_more(stream: &mut tokio::net::TcpStream, buffer: &mut Vec<u8>) -> bool {
    let mut chunk = [0; 16 << 10];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buffer.extend_from_slice(&chunk[..n]);
            true
        }
    }
}
