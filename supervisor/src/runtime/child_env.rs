//! The environment of each child the runtime starts: the runtime's description, shared by
//! every child, then the broker's control identity or an executor's slot identity.

use super::supervise::RuntimeSpec;
use perago_core::env;

/// What every child gets: the runtime's description (each name is a constant of
/// `perago_core::env` or `perago_core::capacity`, read with the same constant on the other
/// side).
pub(crate) fn base_env(spec: &RuntimeSpec) -> Vec<(String, String)> {
    let path = |p: &std::path::Path| p.display().to_string();
    let mut vars = vec![
        (env::CONDUCTOR_SERVER_URL, spec.conductor_url.clone()),
        (env::PERAGO_TASK_NAME, spec.task_name.clone()),
        (env::PERAGO_MANIFEST, path(&spec.manifest_path)),
        (env::PERAGO_SOCKET, path(&spec.socket)),
        (
            env::PERAGO_WORKER_ID_PREFIX,
            spec.prefix.as_str().to_owned(),
        ),
        (env::PERAGO_LOG_ROOT, path(&spec.log_root)),
        (env::PERAGO_WORKSPACE_ROOT, path(&spec.workspace_root)),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect::<Vec<_>>();
    vars.extend(spec.capacity.child_env());
    if let Some(domain) = &spec.domain {
        vars.push((env::PERAGO_DOMAIN.to_owned(), domain.to_string()));
    }
    vars.push((
        perago_core::liveness::PERAGO_STALL_TIMEOUT.to_owned(),
        perago_core::liveness::child_value(spec.stall_timeout),
    ));
    vars.extend(spec.child_env.iter().cloned());
    vars
}

/// The broker's environment: the base, the control token and the one process whose `Control`
/// calls it takes (`control_pid`: this supervisor).
pub(crate) fn broker_env(
    spec: &RuntimeSpec,
    control_token: &str,
    control_pid: u32,
) -> Vec<(String, String)> {
    let mut vars = vec![
        (
            env::PERAGO_CONTROL_TOKEN.to_owned(),
            control_token.to_owned(),
        ),
        (env::PERAGO_CONTROL_PID.to_owned(), control_pid.to_string()),
    ];
    vars.extend(base_env(spec));
    vars
}

/// An executor's environment: the base and its identity.
pub(crate) fn executor_env(
    spec: &RuntimeSpec,
    worker_id: &str,
    slot: u32,
    generation: u64,
    token: String,
) -> Vec<(String, String)> {
    let mut vars = base_env(spec);
    vars.extend([
        (env::PERAGO_WORKER_ID.to_owned(), worker_id.to_owned()),
        (env::PERAGO_SLOT.to_owned(), slot.to_string()),
        (env::PERAGO_GENERATION.to_owned(), generation.to_string()),
        (env::PERAGO_SLOT_TOKEN.to_owned(), token),
    ]);
    vars
}

#[cfg(test)]
mod tests {
    use super::*;
    use perago_core::identity::WorkerPrefix;
    use std::time::Duration;

    /// The environment the supervisor writes is what each child reads back: the names are
    /// shared constants, and every value arrives as set.
    #[test]
    fn each_child_reads_back_the_environment_the_supervisor_writes() {
        let mut capacity = perago_core::capacity::Capacity::fixed(3);
        capacity.min_executors = 2;
        let spec = RuntimeSpec {
            task_name: "orders.ship".into(),
            manifest_path: "/etc/perago/task.toml".into(),
            manifest: std::sync::Arc::new(
                perago_core::manifest::Manifest::parse(
                    std::path::Path::new("task.toml"),
                    std::path::Path::new("/etc/perago"),
                    "[task]\nname = \"orders.ship\"\nkind = \"workspace-free\"\ntimeout_seconds = 60\n[body]\ncommand = [\"./ship\"]\n",
                )
                .unwrap(),
            ),
            capacity: capacity.clone(),
            prefix: WorkerPrefix::explicit("host7").unwrap(),
            conductor_url: "http://conductor:8080/api".into(),
            socket: "/run/perago/broker.sock".into(),
            force_kill_after: None,
            log_root: "/var/log/perago".into(),
            workspace_root: "/var/lib/perago".into(),
            gc_interval: Duration::from_secs(300),
            gc_ttl: Duration::from_secs(3600),
            child_env: vec![
                (env::PERAGO_POLL_WAIT_MS.to_owned(), "250".to_owned()),
                (env::PERAGO_POLL_INTERVAL_MS.to_owned(), "40".to_owned()),
                (env::PERAGO_EXECUTION_MODE.to_owned(), "thread".to_owned()),
                (
                    env::PERAGO_SDK_SETTINGS.to_owned(),
                    r#"[{"property":"thread_count","value":"3","variable":"CONDUCTOR_WORKER_ALL_THREAD_COUNT"}]"#
                        .to_owned(),
                ),
            ],
            lakefs: None,
            notify: None,
            process_label: None,
            domain: Some(perago_core::conductor::Domain::parse("blue").unwrap()),
            stall_timeout: Some(Duration::from_secs(5)),
            rolls: None,
        };
        let lookup = |vars: Vec<(String, String)>| {
            move |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        };
        let broker = perago_broker::cli::config_from(lookup(broker_env(&spec, "c0ffee", 4242)))
            .expect("the broker takes its environment");
        assert_eq!(broker.task_name, "orders.ship");
        assert_eq!(broker.prefix.as_str(), "host7");
        assert_eq!(broker.conductor.base_url(), "http://conductor:8080/api");
        assert_eq!(broker.socket, spec.socket);
        assert_eq!(broker.control_token, "c0ffee");
        assert_eq!(broker.control_pid, 4242);
        assert_eq!(broker.poll_wait, Duration::from_millis(250));
        assert_eq!(broker.poll_interval, Duration::from_millis(40));
        assert_eq!(broker.settings.execution_mode, "thread");
        assert_eq!(
            broker.settings.sdk_settings,
            [perago_proto::admin::v1::SdkSetting {
                property: "thread_count".into(),
                value: "3".into(),
                variable: "CONDUCTOR_WORKER_ALL_THREAD_COUNT".into(),
            }]
        );
        assert_eq!(broker.capacity, capacity);
        assert_eq!(broker.stall_timeout, Some(Duration::from_secs(5)));
        assert_eq!(broker.domain, spec.domain);

        let vars = executor_env(&spec, "host70002", 2, 9, "t0k3n".into());
        let (identity, manifest) = perago_executor::cli::identity_from(lookup(vars.clone()))
            .expect("the executor takes its environment");
        assert_eq!(identity.worker_id, "host70002");
        assert_eq!((identity.slot, identity.generation), (2, 9));
        assert_eq!(identity.token, "t0k3n");
        assert_eq!(identity.socket, spec.socket);
        assert_eq!(manifest, spec.manifest_path);
        let value = |name: &str| lookup(vars.clone())(name);
        assert_eq!(
            value(env::PERAGO_LOG_ROOT).as_deref(),
            Some("/var/log/perago")
        );
        assert_eq!(
            value(env::PERAGO_WORKSPACE_ROOT).as_deref(),
            Some("/var/lib/perago")
        );
    }
}
