//! One `/metrics` for a supervisor that runs several task types: each type's broker keeps its
//! registry (every series labelled with its task type) but serves no HTTP of its own; each
//! scrape here asks every broker for its exposition over `Admin.Metrics`, concurrently, and
//! answers with their merge (`perago_core::metrics_text::merge_expositions`). The HTTP side is
//! the broker's (`perago_broker::metrics::serve_with`).

use perago_proto::admin::v1::{MetricsRequest, admin_client::AdminClient};
use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use tokio::net::TcpListener;
use tonic::transport::Channel;

/// How long one broker may take to connect and answer `Admin.Metrics` in a scrape; a broker
/// slower than that is left out of the scrape, so one stuck broker cannot stall the others'.
const BROKER_TIMEOUT: Duration = Duration::from_secs(2);
/// The content type when no broker answered (the brokers' own: Prometheus text 0.0.4).
const DEFAULT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A change in whether a broker answers, worth one log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// It stopped answering.
    Down,
    /// It answers again.
    Up,
}

/// One broker socket, and what the scrapes know of it.
#[derive(Debug)]
struct Broker {
    socket: PathBuf,
    /// The channel of the last answer, reused by the next scrape; dropped on a failure.
    channel: Mutex<Option<Channel>>,
    /// True while the broker does not answer (so an outage is logged once, not per scrape).
    down: AtomicBool,
}

impl Broker {
    fn new(socket: PathBuf) -> Self {
        Self {
            socket,
            channel: Mutex::new(None),
            down: AtomicBool::new(false),
        }
    }

    fn cached(&self) -> Option<Channel> {
        self.channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn cache(&self, channel: Option<Channel>) {
        *self
            .channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = channel;
    }

    /// Records whether the broker answered this scrape: `Some` when that changes.
    fn record(&self, answered: bool) -> Option<Change> {
        let was_down = self.down.swap(!answered, Ordering::Relaxed);
        match (was_down, answered) {
            (false, false) => Some(Change::Down),
            (true, true) => Some(Change::Up),
            _ => None,
        }
    }

    /// The broker's exposition and its content type, or why there is none.
    async fn ask(&self) -> Result<(String, String), String> {
        let call = async {
            let channel = match self.cached() {
                Some(channel) => channel,
                None => perago_core::socket::connect(&self.socket)
                    .await
                    .map_err(|e| {
                        perago_core::errors::causes(&e)
                            .unwrap_or_else(|| perago_core::errors::chain(&e))
                    })?,
            };
            let answer = AdminClient::new(channel.clone())
                .metrics(MetricsRequest {})
                .await
                .map_err(|s| s.message().to_owned())?
                .into_inner();
            self.cache(Some(channel));
            Ok((answer.text, answer.content_type))
        };
        let answer = tokio::time::timeout(BROKER_TIMEOUT, call)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no answer within {} s",
                    BROKER_TIMEOUT.as_secs_f32()
                ))
            });
        if answer.is_err() {
            self.cache(None);
        }
        answer
    }

    /// [`Self::ask`], logging the start and the end of an outage.
    async fn scrape(&self) -> Option<(String, String)> {
        let answer = self.ask().await;
        match (self.record(answer.is_ok()), &answer) {
            (Some(Change::Down), Err(cause)) => tracing::warn!(
                socket = %self.socket.display(),
                "the broker at {} does not answer Admin.Metrics ({cause}); /metrics leaves its series out until it answers again",
                self.socket.display()
            ),
            (Some(Change::Up), _) => tracing::info!(
                socket = %self.socket.display(),
                "the broker at {} answers Admin.Metrics again",
                self.socket.display()
            ),
            _ => {}
        }
        answer.ok()
    }
}

/// Every broker's exposition, merged; `None` when there are brokers and none answered.
async fn scrape(brokers: &Arc<Vec<Broker>>) -> Option<(String, String)> {
    // Concurrently; awaited in socket order, so the merged text's order is stable.
    let calls: Vec<_> = (0..brokers.len())
        .map(|i| {
            let brokers = Arc::clone(brokers);
            tokio::spawn(async move { brokers[i].scrape().await })
        })
        .collect();
    let mut texts = Vec::with_capacity(calls.len());
    let mut content_type = None;
    for call in calls {
        if let Ok(Some((text, kind))) = call.await {
            content_type.get_or_insert(kind);
            texts.push(text);
        }
    }
    if texts.is_empty() && !brokers.is_empty() {
        return None;
    }
    Some((
        perago_core::metrics_text::merge_expositions(&texts),
        content_type.unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_owned()),
    ))
}

/// Serves `GET /metrics` on `listener` until dropped (abort the task): the merge of the
/// expositions of the brokers at `sockets`, asked over `Admin.Metrics` at each scrape. A
/// broker that does not answer within 2 s is left out of that scrape (and logged at warn once
/// per outage); when none answers, the scrape gets 503. The HTTP side is the broker's own
/// ([`perago_broker::metrics::serve_with`]).
pub(crate) async fn serve_merged(listener: TcpListener, sockets: Vec<PathBuf>) {
    let brokers = Arc::new(sockets.into_iter().map(Broker::new).collect::<Vec<_>>());
    perago_broker::metrics::serve_with(listener, move || {
        let brokers = Arc::clone(&brokers);
        async move { scrape(&brokers).await }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A broker on a thread of its own with its own runtime, as thread mode runs it.
    struct RunningBroker {
        socket: PathBuf,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl RunningBroker {
        fn start(dir: &std::path::Path, conductor: &str, task: &str) -> Self {
            let socket = dir.join(format!("{task}.sock"));
            let prefix: String = task.chars().filter(char::is_ascii_alphanumeric).collect();
            let env = [
                ("CONDUCTOR_SERVER_URL", conductor.to_owned()),
                ("PERAGO_SOCKET", socket.display().to_string()),
                ("PERAGO_SLOTS", "1".to_owned()),
                ("PERAGO_CONTROL_TOKEN", "control-secret".to_owned()),
                ("PERAGO_TASK_NAME", task.to_owned()),
                ("PERAGO_WORKER_ID_PREFIX", prefix),
                ("PERAGO_POLL_WAIT_MS", "200".to_owned()),
            ];
            let config = perago_broker::cli::config_from(|name| {
                env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
            })
            .unwrap();
            assert!(config.metrics_addr.is_none());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let thread = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                // Dropping the broker's future and its runtime ends it: its socket closes.
                runtime.block_on(async {
                    tokio::select! {
                        result = perago_broker::run(config, std::future::pending()) => {
                            panic!("the broker stopped by itself: {result:?}")
                        }
                        _ = stopped => {}
                    }
                });
            });
            Self {
                socket,
                stop: Some(stop),
                thread: Some(thread),
            }
        }

        fn stop(&mut self) {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
            if let Some(thread) = self.thread.take() {
                thread.join().unwrap();
            }
        }
    }

    impl Drop for RunningBroker {
        fn drop(&mut self) {
            self.stop();
        }
    }

    /// Waits (under a deadline) until `socket` answers `Admin.Metrics`.
    async fn wait_answering(socket: &std::path::Path) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let broker = Broker::new(socket.to_owned());
        while broker.ask().await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the broker at {} never answered",
                socket.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A plain HTTP/1.1 request: the status code and the body.
    async fn http(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(
                format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        let code = head.split(' ').nth(1).unwrap().parse().unwrap();
        assert!(
            code != 200 || head.contains("text/plain; version=0.0.4"),
            "{head}"
        );
        (code, body.to_owned())
    }

    /// Every `# TYPE` name, checking that none is there twice.
    fn types_once(text: &str) -> Vec<&str> {
        let types: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let mut unique = types.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), types.len(), "a family twice:\n{text}");
        types
    }

    #[test]
    fn an_outage_is_reported_once_and_its_end_once() {
        let broker = Broker::new(PathBuf::from("/nonexistent.sock"));
        assert_eq!(broker.record(true), None);
        assert_eq!(broker.record(false), Some(Change::Down));
        assert_eq!(broker.record(false), None);
        assert_eq!(broker.record(false), None);
        assert_eq!(broker.record(true), Some(Change::Up));
        assert_eq!(broker.record(true), None);
        assert_eq!(broker.record(false), Some(Change::Down));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_metrics_for_two_brokers_and_a_stopped_one_is_left_out() {
        let conductor = perago_devstack::conductor::ConductorServer::builder()
            .bind("127.0.0.1:0")
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let mut alpha = RunningBroker::start(dir.path(), &conductor.base_url(), "merge.alpha");
        let mut beta = RunningBroker::start(dir.path(), &conductor.base_url(), "merge.beta");
        wait_answering(&alpha.socket).await;
        wait_answering(&beta.socket).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_merged(
            listener,
            vec![alpha.socket.clone(), beta.socket.clone()],
        ));

        let (code, both) = http(addr, "GET", "/metrics").await;
        assert_eq!(code, 200, "{both}");
        for task in ["merge.alpha", "merge.beta"] {
            for series in [
                format!("perago_polls_total{{task=\"{task}\"}} "),
                format!("perago_slots{{task=\"{task}\"}} 1\n"),
                format!("task_poll_total{{taskType=\"{task}\"}} "),
                format!("perago_task_duration_seconds_count{{task=\"{task}\"}} 0\n"),
            ] {
                assert!(both.contains(&series), "{series} missing:\n{both}");
            }
        }
        let types = types_once(&both);
        for family in [
            "perago_polls_total",
            "perago_task_duration_seconds",
            "task_poll_total",
            "active_workers",
        ] {
            assert!(types.contains(&family), "{family}:\n{both}");
        }
        assert!(both.ends_with("\n# EOF\n"), "{both}");
        assert_eq!(both.matches("# EOF").count(), 1);

        assert_eq!(http(addr, "POST", "/metrics").await.0, 405);
        assert_eq!(http(addr, "GET", "/nope").await.0, 404);

        beta.stop();
        let (code, one) = http(addr, "GET", "/metrics").await;
        assert_eq!(code, 200, "{one}");
        assert!(
            one.contains("perago_polls_total{task=\"merge.alpha\"} "),
            "{one}"
        );
        assert!(!one.contains("merge.beta"), "{one}");
        types_once(&one);

        alpha.stop();
        let (code, none) = http(addr, "GET", "/metrics").await;
        assert_eq!((code, none.as_str()), (503, "no broker answers\n"));
        server.abort();
    }
}
