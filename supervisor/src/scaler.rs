//! `scaler`: KEDA's external scaler (`externalscaler.ExternalScaler`) over TCP, answering
//! with Conductor's backlog of the task type (and domain) a ScaledObject names in its
//! `scalerMetadata`. Also served inside `start` with PERAGO_SCALER_ADDR. It reads queue sizes
//! only: it never polls, so it never holds a task. See docs/scaler.md.

use crate::{cli::ScalerArgs, errors::ExpectedError};
use perago_core::conductor::{ConductorClient, DepthRoutes, Domain, queue_name};
use perago_proto::externalscaler::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
    external_scaler_server::{ExternalScaler, ExternalScalerServer},
};
use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::Arc,
    time::Duration,
};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

/// The address `start` serves the scaler on (none: not served).
pub(crate) const PERAGO_SCALER_ADDR: &str = "PERAGO_SCALER_ADDR";
/// How often `StreamIsActive` reads the queue (default [`DEFAULT_INTERVAL`]).
pub(crate) const PERAGO_SCALER_INTERVAL: &str = "PERAGO_SCALER_INTERVAL";
/// `StreamIsActive`'s default reading interval.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest interval taken: every open stream costs Conductor a request per interval.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// The metadata keys.
pub(crate) const TASK_TYPE: &str = "taskType";
/// The optional domain key.
pub(crate) const DOMAIN: &str = "domain";
/// The optional target key.
pub(crate) const TARGET_PER_POD: &str = "targetPerPod";
/// The longest task type taken (perago's own limit on task names).
const MAX_TASK_TYPE_BYTES: usize = perago_core::identity::MAX_PREFIX_BYTES;

/// One queue to measure and the backlog one pod is meant to take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The task type.
    pub(crate) task_type: String,
    /// Its domain; `None`: the default queue.
    pub(crate) domain: Option<Domain>,
    /// The metric's target: tasks waiting per pod.
    pub(crate) per_pod: u64,
}

/// `targetPerPod` when the metadata has none.
#[derive(Debug, Clone)]
pub(crate) struct Defaults {
    /// By task type (inside `start`: the `-j` maximum of each type it runs).
    pub(crate) by_type: BTreeMap<String, u64>,
    /// Any other type (`--target-per-pod`; 1 inside `start`).
    pub(crate) otherwise: u64,
}

impl Defaults {
    fn per_pod(&self, task_type: &str) -> u64 {
        self.by_type
            .get(task_type)
            .copied()
            .unwrap_or(self.otherwise)
    }
}

/// The target of a ScaledObject's `scalerMetadata`, or why not (the reason names the key).
/// Keys other than perago's are KEDA's own (`scalerAddress`, …) and left alone.
pub(crate) fn parse_metadata(
    metadata: &HashMap<String, String>,
    defaults: &Defaults,
) -> Result<Target, String> {
    let task_type = metadata.get(TASK_TYPE).ok_or_else(|| {
        format!("scalerMetadata.{TASK_TYPE} is required (the Conductor task type)")
    })?;
    if let Some(problem) = task_type_problem(task_type) {
        return Err(format!(
            "scalerMetadata.{TASK_TYPE} {task_type:?} {problem}"
        ));
    }
    let domain = metadata
        .get(DOMAIN)
        .map(|value| {
            Domain::parse(value).map_err(|e| {
                format!(
                    "scalerMetadata.{DOMAIN}: {}",
                    perago_core::errors::DisplayChain(&e)
                )
            })
        })
        .transpose()?;
    let per_pod = match metadata.get(TARGET_PER_POD) {
        None => defaults.per_pod(task_type),
        Some(value) => match value.trim().parse::<u64>() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(format!(
                    "scalerMetadata.{TARGET_PER_POD} {value:?} is not a positive integer"
                ));
            }
        },
    };
    Ok(Target {
        task_type: task_type.clone(),
        domain,
        per_pod,
    })
}

/// Why `name` cannot be a task type perago runs (the manifest's `task.name` rules), if so.
fn task_type_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        Some("must not be empty".to_owned())
    } else if name.len() > MAX_TASK_TYPE_BYTES {
        Some(format!(
            "is {} bytes long; at most {MAX_TASK_TYPE_BYTES}",
            name.len()
        ))
    } else if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        Some("must not contain whitespace or control characters".to_owned())
    } else if name.contains(':') || name.contains(',') {
        // `domain:type` is a queue name; Spring splits a list at ','.
        Some("must not contain ':' or ',' (Conductor reads them as a domain or a list)".to_owned())
    } else if name.contains('/') || name == "." || name.contains("..") {
        Some("must not contain '/' or '..' (a task name becomes a folder name)".to_owned())
    } else {
        None
    }
}

/// The metric's name: `conductor-backlog-<taskType>[-<domain>]` in lower case, every other
/// character than an ASCII letter or digit as `-` (what Kubernetes takes in a metric name;
/// KEDA prefixes it with the trigger's index, `s0-…`).
pub(crate) fn metric_name(target: &Target) -> String {
    let mut name = String::from("conductor-backlog-");
    let mut push = |text: &str| {
        name.extend(text.chars().map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        }))
    };
    push(&target.task_type);
    if let Some(domain) = &target.domain {
        push("-");
        push(domain.as_str());
    }
    name
}

/// The service.
#[derive(Debug, Clone)]
pub(crate) struct Scaler {
    conductor: ConductorClient,
    /// Which queue-size route the server has, learned once for every read.
    routes: Arc<DepthRoutes>,
    defaults: Arc<Defaults>,
    interval: Duration,
}

impl Scaler {
    /// Answers from `conductor`'s queues; streams read them every `interval`.
    pub(crate) fn new(conductor: ConductorClient, defaults: Defaults, interval: Duration) -> Self {
        Self {
            conductor,
            routes: Arc::default(),
            defaults: Arc::new(defaults),
            interval,
        }
    }

    fn target(&self, object: Option<&ScaledObjectRef>) -> Result<Target, Status> {
        let empty = HashMap::new();
        let metadata = object.map_or(&empty, |o| &o.scaler_metadata);
        parse_metadata(metadata, &self.defaults).map_err(Status::invalid_argument)
    }

    /// The queue's size, or UNAVAILABLE naming the queue and the cause.
    async fn backlog(&self, target: &Target) -> Result<u64, Status> {
        backlog(&self.conductor, &self.routes, target).await
    }
}

/// The queue's size on whichever route the server has (the kept one, else the deprecated
/// one: `ConductorClient::queue_depth`, as the broker reads it).
async fn backlog(
    conductor: &ConductorClient,
    routes: &DepthRoutes,
    target: &Target,
) -> Result<u64, Status> {
    conductor
        .queue_depth(&target.task_type, target.domain.as_ref(), routes)
        .await
        .map_err(|e| {
            let queue = queue_name(&target.task_type, target.domain.as_ref());
            let why = format!(
                "cannot read the size of Conductor's queue {queue:?}: {}",
                perago_core::errors::DisplayChain(&e)
            );
            tracing::warn!(%queue, "{why}");
            Status::unavailable(why)
        })
}

#[tonic::async_trait]
impl ExternalScaler for Scaler {
    async fn is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        let target = self.target(Some(request.get_ref()))?;
        let backlog = self.backlog(&target).await?;
        Ok(Response::new(IsActiveResponse {
            result: backlog > 0,
        }))
    }

    type StreamIsActiveStream =
        tokio_stream::wrappers::ReceiverStream<Result<IsActiveResponse, Status>>;

    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let target = self.target(Some(request.get_ref()))?;
        let (tx, rx) = mpsc::channel(1);
        let conductor = self.conductor.clone();
        let routes = Arc::clone(&self.routes);
        let interval = self.interval;
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let active = match backlog(&conductor, &routes, &target).await {
                    Ok(n) => n > 0,
                    Err(status) => {
                        // KEDA opens the stream again; the error says why it ended.
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                if last != Some(active) {
                    if tx
                        .send(Ok(IsActiveResponse { result: active }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    last = Some(active);
                }
                tokio::select! {
                    () = tx.closed() => return,
                    () = tokio::time::sleep(interval) => {}
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let target = self.target(Some(request.get_ref()))?;
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![MetricSpec {
                metric_name: metric_name(&target),
                target_size: i64::try_from(target.per_pod).unwrap_or(i64::MAX),
                target_size_float: target.per_pod as f64,
            }],
        }))
    }

    async fn get_metrics(
        &self,
        request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        let target = self.target(request.get_ref().scaled_object_ref.as_ref())?;
        let backlog = self.backlog(&target).await?;
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![MetricValue {
                metric_name: metric_name(&target),
                metric_value: i64::try_from(backlog).unwrap_or(i64::MAX),
                metric_value_float: backlog as f64,
            }],
        }))
    }

    type StreamMetricSpecStream =
        tokio_stream::wrappers::ReceiverStream<Result<GetMetricSpecResponse, Status>>;

    async fn stream_metric_spec(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamMetricSpecStream>, Status> {
        Err(Status::unimplemented(
            "the metric spec of a scalerMetadata never changes: ask GetMetricSpec",
        ))
    }
}

/// Serves `scaler` on `listener` with gRPC health (SERVING) and reflection, until the future
/// is dropped.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    scaler: Scaler,
) -> Result<(), tonic::transport::Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<ExternalScalerServer<Scaler>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(perago_proto::EXTERNALSCALER_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the descriptor set is valid");
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(perago_proto::EXTERNALSCALER_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .expect("the descriptor set is valid");
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(ExternalScalerServer::new(scaler))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
        .await
}

/// Binds `addr` and logs the address bound (`127.0.0.1:0` picks a port).
pub(crate) async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, ExpectedError> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        ExpectedError::Config(vec![format!(
            "cannot serve the KEDA scaler on {addr}: {}",
            perago_core::errors::DisplayChain(&e)
        )])
    })?;
    let bound = listener.local_addr().unwrap_or(addr);
    tracing::info!(addr = %bound, "KEDA external scaler served at {bound}");
    Ok(listener)
}

/// PERAGO_SCALER_INTERVAL, or why it is bad.
pub(crate) fn interval(vars: &BTreeMap<String, String>) -> Result<Duration, String> {
    perago_core::env::duration_at_least(
        PERAGO_SCALER_INTERVAL,
        vars.get(PERAGO_SCALER_INTERVAL)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty()),
        MIN_INTERVAL,
    )
    .map(|d| d.unwrap_or(DEFAULT_INTERVAL))
}

/// PERAGO_SCALER_ADDR, if set, or why it is bad.
pub(crate) fn addr(vars: &BTreeMap<String, String>) -> Result<Option<SocketAddr>, String> {
    match vars
        .get(PERAGO_SCALER_ADDR)
        .filter(|v| !v.trim().is_empty())
    {
        None => Ok(None),
        Some(value) => value.trim().parse().map(Some).map_err(|_| {
            format!("{PERAGO_SCALER_ADDR} {value:?} is not an address such as 0.0.0.0:9466")
        }),
    }
}

/// `perago-supervisor scaler`.
pub(crate) fn scaler(
    args: &ScalerArgs,
    vars: &BTreeMap<String, String>,
) -> Result<(), ExpectedError> {
    let mut problems = Vec::new();
    let conductor = ConductorClient::from_lookup(|name| vars.get(name).cloned())
        .map_err(|e| problems.push(perago_core::errors::chain(&e)))
        .ok();
    let interval = interval(vars)
        .map_err(|why| problems.push(why))
        .unwrap_or(DEFAULT_INTERVAL);
    if args.target_per_pod == 0 {
        problems.push("--target-per-pod must be at least 1".to_owned());
    }
    let Some(conductor) = conductor.filter(|_| problems.is_empty()) else {
        return Err(ExpectedError::Config(problems));
    };
    perago_core::logging::init_stderr("perago-supervisor");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ExpectedError::AsyncRuntime)?;
    runtime.block_on(async {
        let listener = bind(args.listen).await?;
        let scaler = Scaler::new(
            conductor,
            Defaults {
                by_type: BTreeMap::new(),
                otherwise: args.target_per_pod,
            },
            interval,
        );
        tokio::select! {
            served = serve(listener, scaler) => served.map_err(|e| {
                ExpectedError::Config(vec![format!(
                    "the KEDA scaler stopped serving on {}: {}",
                    args.listen,
                    perago_core::errors::DisplayChain(&e)
                )])
            }),
            () = shutdown() => {
                tracing::info!("the KEDA scaler stops");
                Ok(())
            }
        }
    })
}

/// SIGTERM or SIGINT.
async fn shutdown() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn defaults() -> Defaults {
        Defaults {
            by_type: BTreeMap::from([("resize".to_owned(), 4)]),
            otherwise: 1,
        }
    }

    #[test]
    fn metadata_names_the_queue_and_the_target() {
        let target = parse_metadata(
            &metadata(&[
                ("taskType", "encode"),
                ("domain", "blue"),
                ("targetPerPod", "8"),
                ("scalerAddress", "perago-scaler:9466"),
            ]),
            &defaults(),
        )
        .unwrap();
        assert_eq!(target.task_type, "encode");
        assert_eq!(target.domain, Some(Domain::parse("blue").unwrap()));
        assert_eq!(target.per_pod, 8);
    }

    #[test]
    fn the_target_defaults_to_the_types_own_then_the_scalers() {
        let of = |task: &str| {
            parse_metadata(&metadata(&[("taskType", task)]), &defaults())
                .unwrap()
                .per_pod
        };
        assert_eq!(of("resize"), 4);
        assert_eq!(of("encode"), 1);
        let target = parse_metadata(&metadata(&[("taskType", "encode")]), &defaults()).unwrap();
        assert_eq!(target.domain, None);
    }

    #[test]
    fn bad_metadata_names_the_key() {
        let why =
            |pairs: &[(&str, &str)]| parse_metadata(&metadata(pairs), &defaults()).unwrap_err();
        assert_eq!(
            why(&[("domain", "blue")]),
            "scalerMetadata.taskType is required (the Conductor task type)"
        );
        for bad in ["", "a b", "blue:encode", "a,b", "a/b", "..", "tab\there"] {
            let text = why(&[("taskType", bad)]);
            assert!(
                text.starts_with("scalerMetadata.taskType "),
                "{bad:?}: {text}"
            );
        }
        let long = "x".repeat(MAX_TASK_TYPE_BYTES + 1);
        assert!(why(&[("taskType", &long)]).contains("bytes long"));
        for bad in ["", "NO_DOMAIN", "a:b", "a b"] {
            let text = why(&[("taskType", "encode"), ("domain", bad)]);
            assert!(
                text.starts_with("scalerMetadata.domain: domain "),
                "{bad:?}: {text}"
            );
        }
        for bad in ["0", "-1", "two", "1.5", ""] {
            assert_eq!(
                why(&[("taskType", "encode"), ("targetPerPod", bad)]),
                format!("scalerMetadata.targetPerPod {bad:?} is not a positive integer")
            );
        }
    }

    #[test]
    fn metric_names_are_what_kubernetes_takes() {
        let name = |task: &str, domain: Option<&str>| {
            metric_name(&Target {
                task_type: task.to_owned(),
                domain: domain.map(|d| Domain::parse(d).unwrap()),
                per_pod: 1,
            })
        };
        assert_eq!(name("encode", None), "conductor-backlog-encode");
        assert_eq!(
            name("encode", Some("blue")),
            "conductor-backlog-encode-blue"
        );
        assert_eq!(
            name("Video.Encode_v2", Some("Team_A.eu")),
            "conductor-backlog-video-encode-v2-team-a-eu"
        );
        assert_eq!(name("größe", None), "conductor-backlog-gr--e");
        for n in [
            name("Video.Encode_v2", Some("Team_A.eu")),
            name("größe", None),
        ] {
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{n}"
            );
        }
    }

    #[test]
    fn the_settings_are_checked() {
        let vars = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(interval(&vars(&[])), Ok(DEFAULT_INTERVAL));
        assert_eq!(
            interval(&vars(&[(PERAGO_SCALER_INTERVAL, "250ms")])),
            Ok(Duration::from_millis(250))
        );
        let why = interval(&vars(&[(PERAGO_SCALER_INTERVAL, "1ms")])).unwrap_err();
        assert!(why.starts_with(PERAGO_SCALER_INTERVAL), "{why}");
        assert_eq!(addr(&vars(&[])), Ok(None));
        assert_eq!(
            addr(&vars(&[(PERAGO_SCALER_ADDR, "127.0.0.1:0")])),
            Ok(Some("127.0.0.1:0".parse().unwrap()))
        );
        let why = addr(&vars(&[(PERAGO_SCALER_ADDR, "nowhere")])).unwrap_err();
        assert!(why.starts_with("PERAGO_SCALER_ADDR \"nowhere\""), "{why}");
    }
}
