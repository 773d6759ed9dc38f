//! A perago runtime under test: the release supervisor, broker and executors as processes,
//! started against the benchmark's devstack, measured from spawn to every slot attached.

use crate::procs::{CpuByRole, anon_rss_mib, descendants, perago_cpu, rss_mib};
use perago_proto::admin::v1::{SlotState, StatusRequest, admin_client::AdminClient};
use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// Where the programs under test are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `perago-supervisor`.
    pub supervisor: PathBuf,
    /// `perago-broker`.
    pub broker: PathBuf,
    /// `perago-executor`.
    pub executor: PathBuf,
    /// The Rust echo task (`perago-bench-task`).
    pub task: PathBuf,
}

/// Which body perago runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    /// A Rust `Task` binary as the executor.
    Rust,
    /// The stock executor running `cat` with the exec protocol (one process per task).
    Exec,
    /// A workspace task: the stock executor, a shell body adding one file per task.
    Workspace,
    /// The stock executor with a persistent Python body (`jsonl` protocol).
    JsonlPython,
    /// An I/O-bound task: the stock executor running a shell that sleeps 100 ms, then `cat`.
    Sleep,
}

impl Body {
    /// How the figures name it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Rust => "rust body",
            Self::Exec => "exec body",
            Self::Workspace => "workspace body",
            Self::JsonlPython => "jsonl python body",
            Self::Sleep => "sleep 100ms body",
        }
    }
}

pub(crate) struct Runtime {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Runtime {
    /// Starts `-j jobs` and waits until every slot is attached; returns the start-up time.
    pub(crate) async fn start(
        bins: &Binaries,
        conductor_url: &str,
        task: &str,
        body: Body,
        jobs: u32,
        env: &[(String, String)],
    ) -> Result<(Self, Duration), String> {
        let dir = tempfile::tempdir().map_err(|e| perago_core::errors::chain(&e))?;
        let body_table = match body {
            Body::Rust => format!("executor = \"{}\"", bins.task.display()),
            Body::Exec => "command = [\"cat\"]".to_owned(),
            Body::Sleep => "command = [\"sh\", \"-c\", \"sleep 0.1; exec cat\"]".to_owned(),
            Body::JsonlPython => {
                std::fs::write(
                    dir.path().join("echo.py"),
                    "import json, sys\nfor line in sys.stdin:\n    r = json.loads(line)\n    \
                     print(json.dumps({\"execution_id\": r[\"execution_id\"], \"result\": r[\"params\"]}), flush=True)\n",
                )
                .map_err(|e| perago_core::errors::chain(&e))?;
                "command = [\"python3\", \"-u\", \"echo.py\"]\nprotocol = \"jsonl\"".to_owned()
            }
            Body::Workspace => {
                std::fs::write(
                    dir.path().join("body.sh"),
                    "read p\nn=$(printf '%s' \"$p\" | tr -dc 0-9)\n\
                     echo \"$n\" > \"$PERAGO_WORKSPACE_DIR/out-$n.txt\"\necho '{}'\n",
                )
                .map_err(|e| perago_core::errors::chain(&e))?;
                "command = [\"sh\", \"body.sh\"]".to_owned()
            }
        };
        let kind = if body == Body::Workspace {
            "workspace"
        } else {
            "workspace-free"
        };
        std::fs::write(
            dir.path().join("task.toml"),
            format!(
                "[task]\nname = \"{task}\"\nkind = \"{kind}\"\ntimeout_seconds = 0\n\
                 response_timeout_seconds = 600\nretry_count = 0\n[body]\n{body_table}\n"
            ),
        )
        .map_err(|e| perago_core::errors::chain(&e))?;
        let root = dir.path().join("ws");
        let started = Instant::now();
        let child = Command::new(&bins.supervisor)
            .arg("start")
            .arg(dir.path().join("task.toml"))
            .args(["-j", &jobs.to_string()])
            .env("CONDUCTOR_SERVER_URL", conductor_url)
            .env("PERAGO_WORKSPACE_ROOT", &root)
            .env("PERAGO_LOG_ROOT", dir.path().join("logs"))
            .env("PERAGO_BROKER_BIN", &bins.broker)
            .env("PERAGO_EXECUTOR_BIN", &bins.executor)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {}: {}",
                    bins.supervisor.display(),
                    perago_core::errors::DisplayChain(&e)
                )
            })?;
        let runtime = Self { child, _dir: dir };
        let socket = root.join("run/broker.sock");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(channel) = perago_core::socket::connect(&socket).await
                && let Ok(status) = AdminClient::new(channel).status(StatusRequest {}).await
            {
                let slots = status.into_inner().slots;
                let idle = slots
                    .iter()
                    .filter(|s| s.state == SlotState::Idle as i32)
                    .count();
                if idle == jobs as usize {
                    return Ok((runtime, started.elapsed()));
                }
            }
            if Instant::now() > deadline {
                return Err(format!("{jobs} slots did not attach within 60 s"));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// RSS in MiB of the broker and of each executor.
    pub(crate) fn rss(&self) -> (f64, Vec<f64>) {
        self.memory(rss_mib)
    }

    /// Anonymous RSS in MiB of the broker and of each executor.
    pub(crate) fn anon_rss(&self) -> (f64, Vec<f64>) {
        self.memory(anon_rss_mib)
    }

    fn memory(&self, read: fn(u32) -> Option<f64>) -> (f64, Vec<f64>) {
        let mut broker = 0.0;
        let mut executors = Vec::new();
        for (pid, name) in descendants(self.child.id()) {
            match name.as_str() {
                "perago-conductor-broker" => broker = read(pid).unwrap_or(0.0),
                n if n.starts_with("perago-executor-") => {
                    executors.extend(read(pid));
                }
                _ => {}
            }
        }
        (broker, executors)
    }

    /// CPU seconds so far by role (supervisor, broker, executors, bodies).
    pub(crate) fn cpu(&self) -> CpuByRole {
        perago_cpu(self.child.id())
    }

    /// SIGTERM (drain) and wait.
    pub(crate) async fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
