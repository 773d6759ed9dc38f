//! The harness of the runtime tests: devstack's Conductor in this process, a task
//! fixture on disk, and the real `perago-supervisor` (with the real broker and executors) as
//! child processes.

use perago_core::conductor::ConductorClient;
use perago_devstack::conductor::{ConductorHandle, ConductorServer, QueueSemantics};
use serde_json::{Value, json};
use std::{
    fs,
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

/// The real programs, built for this package (see `tests/Cargo.toml`).
pub(crate) const SUPERVISOR: &str = env!("CARGO_BIN_EXE_perago-supervisor-dup");
/// The broker program.
pub(crate) const BROKER: &str = env!("CARGO_BIN_EXE_perago-broker-dup");
/// The executor program.
pub(crate) const EXECUTOR: &str = env!("CARGO_BIN_EXE_perago-executor-dup");

/// Scales every test deadline (`PERAGO_TEST_PATIENCE=3` on a slow machine).
pub(crate) fn patience(d: Duration) -> Duration {
    let factor: f64 = std::env::var("PERAGO_TEST_PATIENCE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|f: &f64| *f >= 1.0)
        .unwrap_or(1.0);
    d.mul_f64(factor)
}

/// Polls `probe` every 20 ms until it yields a value, or panics after `timeout` (scaled by
/// [`patience`]) naming what was awaited.
pub(crate) async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + patience(timeout);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A shell body that stops mid-way until the test lets it go on, so the test can act while it
/// runs: it reads its params, creates `started` in the task's folder, waits for `go` there, then
/// runs `then`. See [`TaskFixture::gate`].
pub(crate) fn gated_body(then: &str) -> String {
    format!("read params\ntouch started\nwhile [ ! -e go ]; do sleep 0.05; done\n{then}")
}

/// The two files of a task's [`gated_body`].
#[derive(Debug)]
pub(crate) struct Gate {
    /// Made by the body once it runs.
    pub(crate) started: PathBuf,
    /// Made by the test to let the body go on.
    pub(crate) go: PathBuf,
}

impl Gate {
    /// Waits until the body has started (up to 20 s).
    pub(crate) async fn started(&self) {
        eventually("the body to start", Duration::from_secs(20), || async {
            self.started.exists().then_some(())
        })
        .await;
    }

    /// Lets the body go on.
    pub(crate) fn open(&self) {
        fs::write(&self.go, "").unwrap();
    }

    /// Closes the gate again, for the next attempt of the same task.
    pub(crate) fn reset(&self) {
        fs::remove_file(&self.go).unwrap();
        fs::remove_file(&self.started).unwrap();
    }
}

/// A task folder with `task.toml` and a `body.sh`.
#[derive(Debug)]
pub(crate) struct TaskFixture {
    /// The folder.
    pub(crate) dir: tempfile::TempDir,
    /// The task name.
    pub(crate) name: String,
}

impl TaskFixture {
    /// A workspace-free task named `name` whose body is the shell script `body`; `extra` is
    /// appended to `[task]` (e.g. `response_timeout_seconds = 2`).
    pub(crate) fn new(name: &str, body: &str, extra_task: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("body.sh"), body).unwrap();
        // Two retries unless the test sets its own.
        let retries = if extra_task.contains("retry_count") {
            ""
        } else {
            "retry_count = 2\n"
        };
        fs::write(
            dir.path().join("task.toml"),
            format!(
                "[task]\nname = \"{name}\"\nkind = \"workspace-free\"\ntimeout_seconds = 60\n\
                 {retries}retry_delay_seconds = 0\n{extra_task}\n\
                 [body]\ncommand = [\"sh\", \"body.sh\"]\n"
            ),
        )
        .unwrap();
        Self {
            dir,
            name: name.to_owned(),
        }
    }

    /// A workspace task named `name` with body `body.sh`; `extra_task` is appended to
    /// `[task]`, `tail` after the tables (e.g. a `[workspace]` table).
    pub(crate) fn workspace(name: &str, body: &str, extra_task: &str, tail: &str) -> Self {
        let fixture = Self::new(name, body, extra_task);
        let manifest = fs::read_to_string(fixture.manifest())
            .unwrap()
            .replace("kind = \"workspace-free\"", "kind = \"workspace\"");
        fs::write(fixture.manifest(), format!("{manifest}{tail}")).unwrap();
        fixture
    }

    /// The gate of a [`gated_body`] of this task.
    pub(crate) fn gate(&self) -> Gate {
        Gate {
            started: self.dir.path().join("started"),
            go: self.dir.path().join("go"),
        }
    }

    /// Adds a file beside the manifest.
    pub(crate) fn with_file(self, name: &str, text: &str) -> Self {
        fs::write(self.dir.path().join(name), text).unwrap();
        self
    }

    /// Appends text to the manifest.
    pub(crate) fn with_manifest_tail(self, text: &str) -> Self {
        let path = self.manifest();
        let mut manifest = fs::read_to_string(&path).unwrap();
        manifest.push_str(text);
        fs::write(path, manifest).unwrap();
        self
    }

    /// The manifest path.
    pub(crate) fn manifest(&self) -> PathBuf {
        self.dir.path().join("task.toml")
    }

    /// The worker id prefix perago derives from the name.
    pub(crate) fn prefix(&self) -> String {
        self.name
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect()
    }
}

/// devstack's Conductor, in this process, with a client.
#[derive(Debug)]
pub(crate) struct Conductor {
    /// The server.
    pub(crate) server: ConductorHandle,
    /// A client for it.
    pub(crate) client: ConductorClient,
}

impl Conductor {
    /// Starts on a free loopback port. `PERAGO_TEST_SWEEP_LAG=SECONDS` makes its timeouts fire
    /// that much late, as the real server's do (issue #24, item 7): a way to rerun any test
    /// against a late server without changing the defaults.
    pub(crate) async fn start() -> Self {
        Self::start_semantics(QueueSemantics::default()).await
    }

    /// [`start`](Self::start) with these batch-poll semantics (`--queue-semantics`).
    pub(crate) async fn start_semantics(semantics: QueueSemantics) -> Self {
        let lag = std::env::var("PERAGO_TEST_SWEEP_LAG")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .unwrap_or(0.0);
        Self::started(semantics, Duration::from_secs_f64(lag)).await
    }

    /// Starts on a free loopback port; timeouts fire `lag` after their deadline.
    pub(crate) async fn with_sweep_lag(lag: Duration) -> Self {
        Self::started(QueueSemantics::default(), lag).await
    }

    async fn started(semantics: QueueSemantics, lag: Duration) -> Self {
        let server = ConductorServer::builder()
            .queue_semantics(semantics)
            .sweep_lag(lag)
            .bind("127.0.0.1:0")
            .await
            .expect("devstack binds");
        let client = ConductorClient::new(&server.base_url()).unwrap();
        Self { server, client }
    }

    /// Registers the TaskDef `perago extract` makes for `task`, and a one-task workflow named
    /// `<task>.wf` whose output is the task's result.
    pub(crate) async fn register(&self, task: &TaskFixture) {
        let out = Command::new(SUPERVISOR)
            .args(["extract", task.manifest().to_str().unwrap(), "-o", "-"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let def: Value = serde_json::from_slice(&out.stdout).unwrap();
        let inputs: serde_json::Map<String, Value> = def["inputKeys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                let k = k.as_str().unwrap();
                (k.to_owned(), json!(format!("${{workflow.input.{k}}}")))
            })
            .collect();
        self.client.register_task_defs(&[def]).await.unwrap();
        let wf = json!({
            "name": format!("{}.wf", task.name), "version": 1, "schemaVersion": 2,
            "tasks": [{"name": task.name, "taskReferenceName": "t", "type": "SIMPLE",
                       "inputParameters": inputs}],
            "outputParameters": {"result": "${t.output.result}", "workspace": "${t.output.workspace}"}
        });
        self.client.upsert_workflow_defs(&[wf]).await.unwrap();
    }

    /// Starts one workflow of `task` with a whole task input.
    pub(crate) async fn start_with(&self, task: &TaskFixture, input: Value) -> String {
        self.client
            .start_workflow(&format!("{}.wf", task.name), &input)
            .await
            .unwrap()
    }

    /// Starts one workflow of `task` with `params`.
    pub(crate) async fn start_workflow(&self, task: &TaskFixture, params: Value) -> String {
        self.client
            .start_workflow(&format!("{}.wf", task.name), &json!({"params": params}))
            .await
            .unwrap()
    }

    /// The workflow, with its tasks.
    pub(crate) async fn workflow(&self, id: &str) -> Value {
        self.client.get_workflow(id).await.unwrap()
    }

    /// Waits until the workflow is terminal; returns it.
    pub(crate) async fn wait_terminal(&self, id: &str, timeout: Duration) -> Value {
        eventually(&format!("workflow {id} to end"), timeout, || async {
            let wf = self.workflow(id).await;
            let status = wf["status"].as_str().unwrap_or_default().to_owned();
            (status != "RUNNING" && status != "PAUSED").then_some(wf)
        })
        .await
    }
}

/// A `perago-supervisor start` child process; SIGKILLed when dropped (its children then get
/// SIGTERM from the kernel and drain).
#[derive(Debug)]
pub(crate) struct SupervisorProc {
    /// The process.
    pub(crate) child: Child,
    /// Its workspace root (removed with the test).
    _root: tempfile::TempDir,
    /// Where its stderr goes.
    pub(crate) log: PathBuf,
}

impl SupervisorProc {
    /// The workspace root.
    pub(crate) fn workspace_root(&self) -> PathBuf {
        self._root.path().join("ws")
    }

    /// Starts `perago-supervisor start MANIFEST -j N` against `conductor`, with `env` added.
    pub(crate) fn start(
        task: &TaskFixture,
        conductor: &Conductor,
        jobs: u32,
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_with(task, conductor, jobs, env, None, None)
    }

    /// [`start`](Self::start) as the user `uid` (group `uid` too) when given: its workspace
    /// and log roots (and the task folder) are handed to that user.
    pub(crate) fn start_as(
        task: &TaskFixture,
        conductor: &Conductor,
        jobs: u32,
        env: &[(&str, &str)],
        uid: Option<u32>,
    ) -> Self {
        Self::start_with(task, conductor, jobs, env, uid, None)
    }

    /// [`start`](Self::start), with `RLIMIT_NOFILE` (soft and hard) set to `nofile` for the
    /// supervisor and so for its broker and executors (a shell sets it, then `exec`s).
    pub(crate) fn start_limited(
        task: &TaskFixture,
        conductor: &Conductor,
        jobs: u32,
        env: &[(&str, &str)],
        nofile: Option<u64>,
    ) -> Self {
        Self::start_with(task, conductor, jobs, env, None, nofile)
    }

    /// The general form of [`start`](Self::start): as another user, and with a descriptor
    /// limit.
    pub(crate) fn start_with(
        task: &TaskFixture,
        conductor: &Conductor,
        jobs: u32,
        env: &[(&str, &str)],
        uid: Option<u32>,
        nofile: Option<u64>,
    ) -> Self {
        Self::start_args(task, conductor, &jobs.to_string(), &[], env, uid, nofile)
    }

    /// [`start_with`](Self::start_with) with `-j` as text (`1..4`) and more `start` arguments
    /// (`--once`).
    pub(crate) fn start_args(
        task: &TaskFixture,
        conductor: &Conductor,
        jobs: &str,
        args: &[&str],
        env: &[(&str, &str)],
        uid: Option<u32>,
        nofile: Option<u64>,
    ) -> Self {
        Self::start_tasks(&[task], conductor, &[jobs], args, env, uid, nofile)
    }

    /// One supervisor running every task of `tasks` (`start A.toml B.toml …`), with a `-j` per
    /// entry of `jobs` (`2`, `b.task=1..3`).
    pub(crate) fn start_many(
        tasks: &[&TaskFixture],
        conductor: &Conductor,
        jobs: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_tasks(tasks, conductor, jobs, &[], env, None, None)
    }

    /// The general form: every manifest of `tasks`, each `-j` of `jobs`, more arguments.
    pub(crate) fn start_tasks(
        tasks: &[&TaskFixture],
        conductor: &Conductor,
        jobs: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
        uid: Option<u32>,
        nofile: Option<u64>,
    ) -> Self {
        let setup = nofile.map(|n| format!("ulimit -n {n}"));
        Self::start_set_up(tasks, conductor, jobs, args, env, uid, setup.as_deref())
    }

    /// [`start_tasks`](Self::start_tasks) with the supervisor started inside the memory
    /// cgroup whose `cgroup.procs` is `procs` (a shell moves itself there, then `exec`s), so
    /// its broker, executors and bodies are in it too.
    pub(crate) fn start_in_cgroup(
        tasks: &[&TaskFixture],
        conductor: &Conductor,
        jobs: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
        procs: &std::path::Path,
    ) -> Self {
        let setup = format!("echo $$ > '{}'", procs.display());
        Self::start_set_up(tasks, conductor, jobs, args, env, None, Some(&setup))
    }

    /// The supervisor, started by a shell that runs `setup` first when given.
    fn start_set_up(
        tasks: &[&TaskFixture],
        conductor: &Conductor,
        jobs: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
        uid: Option<u32>,
        setup: Option<&str>,
    ) -> Self {
        let root = tempfile::tempdir().unwrap();
        let log = root.path().join("supervisor.log");
        let mut cmd = match setup {
            None => perago_tests::command(SUPERVISOR),
            Some(setup) => {
                let mut cmd = perago_tests::command("sh");
                cmd.args(["-c", &format!("{setup} && exec \"$0\" \"$@\""), SUPERVISOR]);
                cmd
            }
        };
        if let Some(uid) = uid {
            use std::os::unix::process::CommandExt as _;
            for dir in std::iter::once(root.path()).chain(tasks.iter().map(|t| t.dir.path())) {
                std::os::unix::fs::chown(dir, Some(uid), Some(uid)).unwrap();
                for entry in fs::read_dir(dir).unwrap() {
                    std::os::unix::fs::chown(entry.unwrap().path(), Some(uid), Some(uid)).unwrap();
                }
            }
            fs::File::create(&log).unwrap();
            std::os::unix::fs::chown(&log, Some(uid), Some(uid)).unwrap();
            cmd.uid(uid).gid(uid);
        }
        cmd.arg("start")
            .args(tasks.iter().map(|t| t.manifest()))
            .args(jobs.iter().flat_map(|j| ["-j", j]))
            .args(args)
            .env("CONDUCTOR_SERVER_URL", conductor.server.base_url())
            .env("PERAGO_WORKSPACE_ROOT", root.path().join("ws"))
            .env("PERAGO_LOG_ROOT", root.path().join("logs"))
            .env("PERAGO_BROKER_BIN", BROKER)
            .env("PERAGO_EXECUTOR_BIN", EXECUTOR)
            // Short long-polls keep drains quick in tests.
            .env("PERAGO_POLL_WAIT_MS", "200")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap());
        // The whole suite runs once per execution mode (scripts/test): a test that names its
        // mode keeps it.
        if let Some(mode) = test_execution_mode()
            && !args.contains(&"--execution-mode")
            && !env.iter().any(|(k, _)| *k == "PERAGO_EXECUTION_MODE")
        {
            cmd.env("PERAGO_EXECUTION_MODE", mode);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("the supervisor starts");
        Self {
            child,
            _root: root,
            log,
        }
    }

    /// [`start`](Self::start) with owned environment values.
    pub(crate) fn start_owned(
        task: &TaskFixture,
        conductor: &Conductor,
        jobs: u32,
        env: &[(&'static str, String)],
    ) -> Self {
        let borrowed: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Self::start(task, conductor, jobs, &borrowed)
    }

    /// The JSONL log folder of `worker_id`.
    pub(crate) fn jsonl_dir(&self, task: &TaskFixture, worker_id: &str) -> PathBuf {
        self._root
            .path()
            .join("logs")
            .join(&task.name)
            .join(format!("worker_id={worker_id}"))
    }

    /// Every JSONL log line of `worker_id` so far (all its files, in name order).
    pub(crate) fn jsonl_text(&self, task: &TaskFixture, worker_id: &str) -> String {
        let Ok(entries) = fs::read_dir(self.jsonl_dir(task, worker_id)) else {
            return String::new();
        };
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        files
            .iter()
            .map(|f| fs::read_to_string(f).unwrap_or_default())
            .collect()
    }

    /// Its pid.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log so far.
    pub(crate) fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log once it has `line` in it (a runtime writes its info lines when it goes idle,
    /// so what it has just done can be seen before its line): fails showing the log when
    /// `line` does not come within `timeout`.
    pub(crate) async fn log_with(&self, line: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + patience(timeout);
        loop {
            let log = self.log_text();
            if log.contains(line) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for the log line {line:?}:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends a signal by name (`TERM`, `INT`, `KILL`) to the supervisor.
    pub(crate) fn signal(&self, name: &str) {
        signal_pid(self.pid(), name);
    }

    /// Waits for the supervisor to exit.
    pub(crate) async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + patience(timeout);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the supervisor did not exit within {timeout:?}\n--- log ---\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for SupervisorProc {
    /// Ends the runtime as a whole: the supervisor, and every process whose environment names
    /// this runtime's root (its broker and executors, also orphaned ones of a supervisor the
    /// test killed). Left alone they would drain against a devstack that is gone with the test,
    /// retrying their updates for minutes.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let root = self._root.path().as_os_str().as_encoded_bytes().to_vec();
        let Ok(entries) = fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let environ = fs::read(entry.path().join("environ")).unwrap_or_default();
            if environ
                .split(|b| *b == 0)
                .any(|kv| kv.windows(root.len()).any(|w| w == root.as_slice()))
            {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

/// The Python the tests run bodies and third-party clients with (`PERAGO_TEST_PYTHON`, else
/// the workspace's `.venv`, which `scripts/test` makes).
pub(crate) fn test_python() -> PathBuf {
    let python = std::env::var_os("PERAGO_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| perago_tests::workspace_root().join(".venv/bin/python"));
    assert!(
        python.exists(),
        "{} is missing: run scripts/test, which makes .venv from tests/python/requirements.txt",
        python.display()
    );
    python
}

/// The execution mode the suite runs every runtime in, when not the default (`process`):
/// `PERAGO_TEST_EXECUTION_MODE=thread`.
pub(crate) fn test_execution_mode() -> Option<String> {
    std::env::var("PERAGO_TEST_EXECUTION_MODE")
        .ok()
        .filter(|m| !m.is_empty())
}

/// `perago-supervisor status --json` of the runtime under `root` (`Null` if none answers).
pub(crate) fn status_json(root: &std::path::Path) -> Value {
    let run = perago_tests::Run::of(perago_tests::command(SUPERVISOR).args([
        "status",
        "--json",
        "--socket",
        root.join("run/broker.sock").to_str().unwrap(),
    ]));
    serde_json::from_str(&run.stdout).unwrap_or_default()
}

/// Sends signal `name` to `pid` with kill(1).
pub(crate) fn signal_pid(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// A live process: pid and argv.
#[derive(Debug, Clone)]
pub(crate) struct Proc {
    /// Process id.
    pub(crate) pid: u32,
    /// The arguments; `argv[0]` is the name perago set.
    pub(crate) argv: Vec<String>,
}

/// Every live (non-zombie) process whose parent is `parent`.
pub(crate) fn children_of(parent: u32) -> Vec<Proc> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the parenthesized command: state, ppid, …
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("Z");
        let ppid: u32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid != parent || state == "Z" {
            continue;
        }
        let argv: Vec<String> = fs::read(format!("/proc/{pid}/cmdline"))
            .map(|raw| {
                raw.split(|b| *b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        if argv.is_empty() {
            // It exited between the two reads (a zombie's cmdline is empty).
            continue;
        }
        out.push(Proc { pid, argv });
    }
    out.sort_by(|a, b| a.argv.first().cmp(&b.argv.first()));
    out
}

/// Whether the suite runs in thread mode (see [`test_execution_mode`]).
pub(crate) fn thread_mode() -> bool {
    test_execution_mode().as_deref() == Some("thread")
}

/// The broker and executors of the supervisor `sup`, by the names `ps -o args` shows in
/// process mode (`perago-conductor-broker`, `perago-executor-0001`, …), sorted. In thread
/// mode they are threads of the supervisor, each with a runtime of its own, named
/// `perago-broker` and `executor-0001` (a thread's name holds 15 bytes): the same names are
/// returned for them.
pub(crate) fn workers_of(sup: u32) -> Vec<String> {
    let mut names: Vec<String> = if thread_mode() {
        fs::read_dir(format!("/proc/{sup}/task"))
            .map(|tasks| {
                tasks
                    .flatten()
                    .filter_map(|t| fs::read_to_string(t.path().join("comm")).ok())
                    .filter_map(|comm| match comm.trim_end() {
                        "perago-broker" => Some("perago-conductor-broker".to_owned()),
                        name if name.starts_with("executor-") => Some(format!("perago-{name}")),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    } else {
        children_of(sup)
            .into_iter()
            .filter_map(|p| p.argv.into_iter().next())
            .filter(|name| name.starts_with("perago-") && !name.contains('/'))
            .collect()
    };
    names.sort();
    names
}

/// Whether the supervisor `sup` runs the worker `name` (see [`workers_of`]).
pub(crate) fn runs_worker(sup: u32, name: &str) -> bool {
    workers_of(sup).iter().any(|w| w == name)
}

/// The child of `parent` whose argv[0] is `name`.
pub(crate) fn child_named(parent: u32, name: &str) -> Option<Proc> {
    children_of(parent)
        .into_iter()
        .find(|p| p.argv.first().map(String::as_str) == Some(name))
}

/// Whether `pid` is alive (and not a zombie).
pub(crate) fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

/// devstack's lakeFS, in this process, with a client and one seeded repository.
#[derive(Debug)]
pub(crate) struct Lakefs {
    /// The server.
    pub(crate) server: perago_devstack::lakefs::LakefsHandle,
    /// A client for it.
    pub(crate) client: perago_core::lakefs::LakefsClient,
}

impl Lakefs {
    /// Starts on a free loopback port.
    pub(crate) async fn start() -> Self {
        let server = perago_devstack::lakefs::LakefsServer::builder()
            .bind("127.0.0.1:0")
            .await
            .expect("devstack lakeFS binds");
        let config = perago_core::lakefs::LakefsConfig {
            endpoint: server.endpoint(),
            access_key_id: server.credentials().access_key_id.clone(),
            secret_access_key: server.credentials().secret_access_key.clone(),
        };
        let client = perago_core::lakefs::LakefsClient::new(&config).unwrap();
        Self { server, client }
    }

    /// The environment a supervisor needs to reach it.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("LAKEFS_ENDPOINT", self.server.endpoint()),
            (
                "LAKEFS_ACCESS_KEY_ID",
                self.server.credentials().access_key_id.clone(),
            ),
            (
                "LAKEFS_SECRET_ACCESS_KEY",
                self.server.credentials().secret_access_key.clone(),
            ),
        ]
    }

    /// Creates `repo` (branch `main`) holding `files` (key → content) in one commit.
    pub(crate) async fn seed(&self, repo: &str, files: &[(&str, &str)]) {
        self.client
            .ensure_repository(repo, &format!("mem://{repo}"), "main")
            .await
            .unwrap();
        for (key, content) in files {
            self.client
                .upload(repo, "main", key, content.as_bytes().to_vec())
                .await
                .unwrap();
        }
        self.client
            .commit(repo, "main", "seed", &serde_json::Map::new())
            .await
            .unwrap();
    }

    /// The content of `key` on `main`, `None` if absent.
    pub(crate) async fn read(&self, repo: &str, key: &str) -> Option<String> {
        match self.client.get_object(repo, "main", key).await {
            Ok(bytes) => Some(String::from_utf8(bytes).unwrap()),
            Err(e) if e.is_not_found() => None,
            Err(e) => panic!("reading {key}: {e}"),
        }
    }
}
