//! Reading the task type's queue depth (run once, adaptive executor count): the route the API
//! keeps (`GET /tasks/queue/size`), then the deprecated one (`GET /tasks/queue/sizes`) when that
//! fails. A failure of both is logged at warn once, and once more (at info) when a read works
//! again; the machine then falls back to what polls show (see `state/once.rs`).
//!
//! A server without the first route (it answers 404 or 405: the route never answers 404 for a
//! task type, an unknown one counts 0) is remembered as such, and later reads go straight to
//! the second. That one takes the name whole however many commas it has (see
//! `ConductorClient::queue_sizes`), so both give the depth of the very task type perago runs.
//!
//! A runtime with a domain (`--domain`) reads its domain's queue (`domain:type`) on both
//! routes: that is the queue it polls, and the default one can be full of tasks it never gets.

use perago_core::conductor::{ConductorClient, DepthRoutes, Domain};
use std::sync::atomic::{AtomicBool, Ordering};

/// What the reads learned so far; shared by every read of one broker.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    /// The last read failed, so that each change is logged once.
    failing: AtomicBool,
    /// Which route this server has (`ConductorClient::queue_depth`).
    routes: DepthRoutes,
}

/// Reads the depth of `task_type`; `None` when neither route answers with one.
pub(crate) async fn read(
    client: &ConductorClient,
    task_type: &str,
    domain: Option<&Domain>,
    routes: &Routes,
) -> Option<u64> {
    match client.queue_depth(task_type, domain, &routes.routes).await {
        Ok(depth) => {
            if routes.failing.swap(false, Ordering::AcqRel) {
                tracing::info!(depth, "the queue depth can be read again");
            }
            Some(depth)
        }
        Err(e) => {
            if !routes.failing.swap(true, Ordering::AcqRel) {
                let first = e.first.as_ref().map_or_else(
                    || "not asked (missing on this server)".to_owned(),
                    perago_core::errors::chain,
                );
                tracing::warn!(
                    task = task_type,
                    error = %first,
                    fallback_error = %perago_core::errors::DisplayChain(&e.second),
                    "cannot read the queue depth; run once ends after {} empty polls in a row \
                     instead, the adaptive executor count keeps the last depth read; polling \
                     goes on (logged again when a read works)",
                    crate::state::ONCE_EMPTY_POLLS
                );
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A loopback server that answers each request with `answer(request line)` and records
    /// the request lines; one request per connection.
    async fn server(
        answer: fn(&str) -> (&'static str, String),
    ) -> (ConductorClient, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&lines);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if conn.read(&mut byte).await.unwrap_or(0) == 0 {
                        break;
                    }
                    head.push(byte[0]);
                }
                let text = String::from_utf8_lossy(&head);
                let line = text.lines().next().unwrap_or_default().to_owned();
                let (status, body) = answer(&line);
                seen.lock().unwrap().push(line);
                let out = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(out.as_bytes()).await;
            }
        });
        let client = ConductorClient::new(&format!("http://{addr}/api")).unwrap();
        (client, lines)
    }

    /// Issue #24, item 7: a server without `/tasks/queue/size` (404) is asked once; later
    /// reads go straight to `/tasks/queue/sizes`, which gets a comma name whole.
    #[tokio::test]
    async fn a_missing_size_route_is_remembered_and_a_comma_name_read_whole() {
        let (client, lines) = server(|line| {
            if line.starts_with("GET /api/tasks/queue/sizes?taskType=x%2Cy&taskType=x%2Cy ") {
                ("200 OK", r#"{"x,y": 7}"#.to_owned())
            } else {
                ("404 Not Found", r#"{"status": 404}"#.to_owned())
            }
        })
        .await;
        let routes = Routes::default();
        for _ in 0..3 {
            assert_eq!(read(&client, "x,y", None, &routes).await, Some(7));
        }
        let lines = lines.lock().unwrap().clone();
        let asked_size = lines
            .iter()
            .filter(|l| l.starts_with("GET /api/tasks/queue/size?"))
            .count();
        assert_eq!(asked_size, 1, "{lines:?}");
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(!routes.failing.load(Ordering::Acquire));
    }

    /// Any other failure of `/tasks/queue/size` (a 500, say) is not taken for a missing
    /// route: it is asked again next time.
    #[tokio::test]
    async fn a_failing_size_route_is_asked_again() {
        let (client, lines) = server(|line| {
            if line.starts_with("GET /api/tasks/queue/sizes?") {
                ("200 OK", r#"{"t": 2}"#.to_owned())
            } else {
                ("500 Internal Server Error", r#"{"status": 500}"#.to_owned())
            }
        })
        .await;
        let routes = Routes::default();
        assert_eq!(read(&client, "t", None, &routes).await, Some(2));
        assert_eq!(read(&client, "t", None, &routes).await, Some(2));
        let asked_size = lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("GET /api/tasks/queue/size?"))
            .count();
        assert_eq!(asked_size, 2);
    }

    /// Issue #26, item 1: a runtime with a domain reads its domain's queue on both routes
    /// (`domain=` on the kept one, the queue name `domain:type` on the deprecated one).
    #[tokio::test]
    async fn a_domain_reads_its_own_queue_on_both_routes() {
        let (client, lines) = server(|line| {
            if line.starts_with("GET /api/tasks/queue/size?taskType=t&domain=blue ") {
                ("500 Internal Server Error", r#"{"status": 500}"#.to_owned())
            } else if line
                .starts_with("GET /api/tasks/queue/sizes?taskType=blue%3At&taskType=blue%3At ")
            {
                ("200 OK", r#"{"blue:t": 6}"#.to_owned())
            } else {
                ("200 OK", "99".to_owned())
            }
        })
        .await;
        let blue = Domain::parse("blue").unwrap();
        assert_eq!(
            read(&client, "t", Some(&blue), &Routes::default()).await,
            Some(6)
        );
        assert_eq!(lines.lock().unwrap().len(), 2, "{lines:?}");
    }

    /// Issue #26, item 1: the poll loop polls in its domain (`&domain=blue`).
    #[tokio::test]
    async fn the_poll_loop_polls_in_its_domain() {
        let (client, lines) = server(|_| ("200 OK", "[]".to_owned())).await;
        let (_settings, poller) = poller(client, Some("blue"), 100, 0);
        let (events, mut rx) = tokio::sync::mpsc::channel(8);
        let run = tokio::spawn(poller.run(events));
        let mut grants = 0;
        while let Some(event) = rx.recv().await {
            if let crate::actor::Event::PollRequest { reply } = event {
                // One poll, then 0: the loop stops.
                let _ = reply.send(if grants == 0 { 1 } else { 0 });
                grants += 1;
            }
        }
        run.await.unwrap();
        let lines = lines.lock().unwrap().clone();
        assert_eq!(
            lines,
            [
                "GET /api/tasks/poll/batch/t?workerid=tBroker&domain=blue&count=1&timeout=100 HTTP/1.1"
            ]
        );
    }

    fn poller(
        client: ConductorClient,
        domain: Option<&str>,
        wait_ms: u64,
        idle_ms: u64,
    ) -> (
        tokio::sync::watch::Sender<crate::state::PollSettings>,
        crate::poller::Poller,
    ) {
        let (tx, settings) = tokio::sync::watch::channel(crate::state::PollSettings {
            domain: domain.map(|d| Domain::parse(d).unwrap()),
            wait: std::time::Duration::from_millis(wait_ms),
            idle_wait: std::time::Duration::from_millis(idle_ms),
        });
        let poller = crate::poller::Poller {
            client,
            task_name: "t".to_owned(),
            settings,
            broker_id: "tBroker".to_owned(),
            backoff: perago_core::backoff::Backoff::default_remote(),
            counters: Arc::default(),
            gauges: Arc::default(),
            health: crate::health::Health::new("polls"),
        };
        (tx, poller)
    }

    /// Issue #26, item 4: the poll loop takes new settings (a reconfigure) from its next poll
    /// on, and a new setting ends the wait after an empty poll at once (an hour here).
    #[tokio::test]
    async fn the_poll_loop_follows_a_reconfigure_from_its_next_poll() {
        let (client, lines) = server(|_| ("200 OK", "[]".to_owned())).await;
        let (settings, poller) = poller(client, Some("blue"), 100, 3_600_000);
        let (events, mut rx) = tokio::sync::mpsc::channel(8);
        let run = tokio::spawn(poller.run(events));
        let mut grants = 0;
        while let Some(event) = rx.recv().await {
            match event {
                crate::actor::Event::PollRequest { reply } => {
                    let _ = reply.send(if grants < 2 { 1 } else { 0 });
                    grants += 1;
                }
                // The first poll came back empty: the loop now waits an hour, unless told.
                crate::actor::Event::Polled { .. } if grants == 1 => {
                    settings.send_replace(crate::state::PollSettings {
                        domain: None,
                        wait: std::time::Duration::from_millis(200),
                        idle_wait: std::time::Duration::ZERO,
                    });
                }
                _ => {}
            }
        }
        tokio::time::timeout(std::time::Duration::from_secs(10), run)
            .await
            .expect("the new settings ended the hour's wait")
            .unwrap();
        let lines = lines.lock().unwrap().clone();
        assert_eq!(
            lines,
            [
                "GET /api/tasks/poll/batch/t?workerid=tBroker&domain=blue&count=1&timeout=100 HTTP/1.1",
                "GET /api/tasks/poll/batch/t?workerid=tBroker&count=1&timeout=200 HTTP/1.1",
            ]
        );
    }
}
