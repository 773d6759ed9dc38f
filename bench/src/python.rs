//! The peer: conductor-python's TaskHandler with N worker processes (`python/python_worker.py`).

use crate::procs::{CpuByRole, descendants, rss_mib, tree_cpu};
use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

pub(crate) struct PythonWorkers {
    child: Child,
}

impl PythonWorkers {
    /// Starts `processes` worker processes for `task`; returns once the handler says ready.
    pub(crate) fn start(
        python: &Path,
        script: &Path,
        conductor_url: &str,
        task: &str,
        processes: u32,
    ) -> Result<Self, String> {
        let mut child = Command::new(python)
            .arg(script)
            .env("CONDUCTOR_SERVER_URL", conductor_url)
            .env("BENCH_TASK", task)
            .env("BENCH_PROCESSES", processes.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {}: {}",
                    python.display(),
                    perago_core::errors::DisplayChain(&e)
                )
            })?;
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| perago_core::errors::chain(&e))?;
        if line.trim() != "ready" {
            let _ = child.kill();
            return Err(format!(
                "the Python worker did not start (is conductor-python installed in {}?)",
                python.display()
            ));
        }
        Ok(Self { child })
    }

    /// RSS in MiB of each worker process (the handler's children running workers).
    pub(crate) fn rss(&self) -> Vec<f64> {
        descendants(self.child.id())
            .into_iter()
            .filter_map(|(pid, _)| rss_mib(pid))
            .collect()
    }

    /// CPU seconds so far of the whole runner (handler and worker processes).
    pub(crate) fn cpu(&self) -> CpuByRole {
        tree_cpu(self.child.id(), "conductor-python")
    }

    pub(crate) async fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..500 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for (pid, _) in descendants(self.child.id()) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}
