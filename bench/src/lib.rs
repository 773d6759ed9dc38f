//! perago's benchmarks: perago beside the Conductor Python SDK's TaskHandler and the floor
//! (a bare poll+update client, a raw Unix-socket ping-pong), measured in one run against the
//! same in-process devstack, printed as a table with ratios, and written as JSON and an SVG
//! plot. See `docs/performance.md`.
//!
//! `cargo run --release -p perago-bench -- [--runs N] [--tasks N] [--smoke] [scenario…]`
//! with scenarios `throughput exec payload logging spawn latency slot memory startup scaling
//! workspace polls`
//! (default: all).

#![forbid(unsafe_code)]

mod otlp_sink;
mod perago;
mod procs;
mod python;
mod report;
mod slot;
mod workload;

pub use perago::Binaries;
use perago::{Body, Runtime};
use perago_devstack::conductor::QueueSemantics;
use python::PythonWorkers;
use report::{Figure, quantile, scaling_svg, table};
use serde_json::json;
use std::{
    path::{Path, PathBuf},
    time::Duration,
};
use workload::{Conductor, ceiling, throughput};

const SCENARIOS: [&str; 14] = [
    "throughput",
    "exec",
    "payload",
    "logging",
    "tracing",
    "spawn",
    "latency",
    "slot",
    "memory",
    "startup",
    "scaling",
    "io-scale",
    "workspace",
    "polls",
];
const TASK: &str = "bench.echo";

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Scenarios to run (empty = all).
    pub scenarios: Vec<String>,
    /// Runs per figure.
    pub runs: usize,
    /// Tasks per throughput run.
    pub tasks: usize,
    /// Tiny counts, to keep the benchmark working in CI.
    pub smoke: bool,
    /// Where the JSON and SVG go.
    pub out: PathBuf,
    /// An earlier run's `results.json` to compare each figure with.
    pub previous: PathBuf,
    /// The Python with conductor-python.
    pub python: PathBuf,
    /// The programs under test.
    pub binaries: Binaries,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ is in the workspace")
        .to_owned()
}

fn usage() -> String {
    format!(
        "usage: perago-bench [--runs N] [--tasks N] [--smoke] [--out DIR] [--previous FILE] [--python PATH] [--bin-dir DIR] [--supervisor|--broker|--executor|--task PATH] [SCENARIO...]\nscenarios: {}",
        SCENARIOS.join(" ")
    )
}

/// Parses the command line (without argv[0]).
pub fn parse_args(args: &[String]) -> Result<Options, String> {
    let root = workspace_root();
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_owned))
        .unwrap_or_else(|| root.join("target/release"));
    let mut bin_dir = exe_dir;
    let mut overrides: [Option<PathBuf>; 4] = Default::default();
    let mut options = Options {
        scenarios: Vec::new(),
        runs: 3,
        tasks: 5000,
        smoke: false,
        out: root.join("target/bench"),
        previous: root.join("docs/performance-previous.json"),
        python: std::env::var_os("PERAGO_TEST_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join(".venv/bin/python")),
        binaries: Binaries {
            supervisor: PathBuf::new(),
            broker: PathBuf::new(),
            executor: PathBuf::new(),
            task: PathBuf::new(),
        },
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value\n{}", usage()))
        };
        match arg.as_str() {
            "--runs" => {
                options.runs = value("--runs")?
                    .parse()
                    .map_err(|_| "--runs takes a number")?
            }
            "--tasks" => {
                options.tasks = value("--tasks")?
                    .parse()
                    .map_err(|_| "--tasks takes a number")?
            }
            "--smoke" => options.smoke = true,
            "--out" => options.out = PathBuf::from(value("--out")?),
            "--previous" => options.previous = PathBuf::from(value("--previous")?),
            "--python" => options.python = PathBuf::from(value("--python")?),
            "--bin-dir" => bin_dir = PathBuf::from(value("--bin-dir")?),
            "--supervisor" => overrides[0] = Some(PathBuf::from(value("--supervisor")?)),
            "--broker" => overrides[1] = Some(PathBuf::from(value("--broker")?)),
            "--executor" => overrides[2] = Some(PathBuf::from(value("--executor")?)),
            "--task" => overrides[3] = Some(PathBuf::from(value("--task")?)),
            "-h" | "--help" => return Err(usage()),
            s if SCENARIOS.contains(&s) => options.scenarios.push(s.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{}", usage())),
        }
    }
    if options.smoke {
        options.runs = 1;
        options.tasks = options.tasks.min(40);
    }
    if options.runs == 0 || options.tasks == 0 {
        return Err("--runs and --tasks must be at least 1".to_owned());
    }
    let [supervisor, broker, executor, task] = overrides;
    // Absolute: the task binary is written into a manifest in a temporary directory, where a
    // relative path would name another file (the supervisor resolves it against the manifest).
    let absolute = |path: PathBuf| {
        std::path::absolute(&path)
            .map_err(|e| format!("{}: {}", path.display(), perago_core::errors::chain(&e)))
    };
    options.binaries = Binaries {
        supervisor: absolute(supervisor.unwrap_or_else(|| bin_dir.join("perago-supervisor")))?,
        broker: absolute(broker.unwrap_or_else(|| bin_dir.join("perago-broker")))?,
        executor: absolute(executor.unwrap_or_else(|| bin_dir.join("perago-executor")))?,
        task: absolute(task.unwrap_or_else(|| bin_dir.join("perago-bench-task")))?,
    };
    Ok(options)
}

/// Builds the programs under test when they are missing beside the benchmark (the normal
/// case after `cargo run --release -p perago-bench`), in the benchmark's own profile.
pub fn ensure_binaries(binaries: &Binaries) -> Result<(), String> {
    let all = [
        &binaries.supervisor,
        &binaries.broker,
        &binaries.executor,
        &binaries.task,
    ];
    if all.iter().all(|b| b.exists()) {
        return Ok(());
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let release = binaries
        .supervisor
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|p| p == "release");
    eprintln!("building the programs under test…");
    let mut cmd = std::process::Command::new(cargo);
    cmd.current_dir(workspace_root()).args([
        "build",
        "--quiet",
        "--bins",
        "-p",
        "perago-supervisor",
        "-p",
        "perago-broker",
        "-p",
        "perago-executor",
        "-p",
        "perago-bench",
    ]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().map_err(|e| {
        format!(
            "cannot run cargo: {}",
            perago_core::errors::DisplayChain(&e)
        )
    })?;
    if !status.success() || !all.iter().all(|b| b.exists()) {
        return Err(format!(
            "cannot build the programs under test into {}",
            binaries
                .supervisor
                .parent()
                .unwrap_or(Path::new("."))
                .display()
        ));
    }
    Ok(())
}

/// The ceiling client's own CPU per task.
const CEILING_CPU: &str = "cpu/task Conductor client alone (ceiling client's thread)";

struct Bench {
    o: Options,
    figures: Vec<Figure>,
    scaling: Vec<(String, Vec<(f64, f64)>)>,
}

impl Bench {
    fn figure(&mut self, name: &str, unit: &'static str) -> &mut Figure {
        if let Some(i) = self.figures.iter().position(|f| f.name == name) {
            return &mut self.figures[i];
        }
        self.figures.push(Figure::new(name, unit));
        self.figures.last_mut().expect("just pushed")
    }

    fn median(&self, name: &str) -> Option<f64> {
        self.figures
            .iter()
            .find(|f| f.name == name)
            .map(Figure::median)
    }

    fn patience(&self) -> Duration {
        Duration::from_secs(600)
    }

    /// One perago throughput run; also records RSS idle and under load, and CPU per task by
    /// role.
    async fn perago_run(&mut self, body: Body, jobs: u32, tasks: usize) -> Result<f64, String> {
        self.perago_measured(body, jobs, tasks, 0, &[], "").await
    }

    /// A perago run with `pad` bytes more input per task and `env` for the runtime; `tag`
    /// names the variant in the CPU figures (e.g. " 64KiB", " RUST_LOG=warn").
    async fn perago_measured(
        &mut self,
        body: Body,
        jobs: u32,
        tasks: usize,
        pad: usize,
        env: &[(String, String)],
        tag: &str,
    ) -> Result<f64, String> {
        let conductor = Conductor::start().await?;
        conductor.register(TASK).await?;
        let (runtime, took) =
            Runtime::start(&self.o.binaries, &conductor.url(), TASK, body, jobs, env).await?;
        conductor.wait_polling(1, Duration::from_secs(60)).await?;
        let (broker_idle, exec_idle) = runtime.rss();
        let (broker_anon, exec_anon) = runtime.anon_rss();
        let cpu_before = runtime.cpu();
        let ids = conductor.start_many_padded(TASK, tasks, pad).await?;
        let (broker_busy, exec_busy) = runtime.rss();
        let times = conductor.wait_all(&ids, self.patience()).await?;
        let spent = runtime.cpu().since(&cpu_before);
        runtime.stop().await;
        conductor.server.shutdown().await;
        let who = format!("perago {} j={jobs}{tag}", body.name());
        if body == Body::Sleep {
            self.figure(&format!("start-up to all slots attached, {who}"), "ms")
                .runs
                .push(took.as_secs_f64() * 1000.0);
        }
        let per_task = |seconds: f64| seconds * 1e6 / tasks as f64;
        for (role, seconds) in &spent.0 {
            self.figure(&format!("cpu/task {role}, {who}"), "µs")
                .runs
                .push(per_task(*seconds));
        }
        let bodies = spent.0.get("bodies").copied().unwrap_or(0.0);
        self.figure(
            &format!("cpu/task runtime (broker+executors+supervisor), {who}"),
            "µs",
        )
        .runs
        .push(per_task(spent.total() - bodies));
        self.figure(&format!("cpu/task whole worker side, {who}"), "µs")
            .runs
            .push(per_task(spent.total()));
        if body == Body::Rust && pad == 0 && env.is_empty() {
            let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
            self.figure("rss broker idle", "MiB").runs.push(broker_idle);
            self.figure("rss broker under load", "MiB")
                .runs
                .push(broker_busy);
            self.figure("rss executor idle (max)", "MiB")
                .runs
                .push(max(&exec_idle));
            self.figure("rss executor under load (max)", "MiB")
                .runs
                .push(max(&exec_busy));
            // What RSS is made of besides the binary's pages (shared, and mapped 64 KiB
            // around each page touched, so that a change of code layout moves RSS by half a
            // MiB with no change of memory).
            self.figure("rss anonymous broker idle", "MiB")
                .runs
                .push(broker_anon);
            self.figure("rss anonymous executor idle (max)", "MiB")
                .runs
                .push(max(&exec_anon));
        }
        Ok(throughput(&times))
    }

    async fn python_run(&mut self, processes: u32, tasks: usize) -> Result<f64, String> {
        self.python_measured(processes, tasks, 0, "").await
    }

    /// One conductor-python run (see [`Bench::perago_measured`] for `pad` and `tag`).
    async fn python_measured(
        &mut self,
        processes: u32,
        tasks: usize,
        pad: usize,
        tag: &str,
    ) -> Result<f64, String> {
        let conductor = Conductor::start().await?;
        conductor.register(TASK).await?;
        let script = workspace_root().join("bench/python/python_worker.py");
        let workers =
            PythonWorkers::start(&self.o.python, &script, &conductor.url(), TASK, processes)?;
        // Its worker processes start after it says ready (a second of imports): measured from
        // when each polls, as perago is from when its broker does.
        conductor
            .wait_polling(processes as usize, Duration::from_secs(60))
            .await?;
        let cpu_before = workers.cpu();
        let ids = conductor.start_many_padded(TASK, tasks, pad).await?;
        let rss = workers.rss();
        let times = conductor.wait_all(&ids, self.patience()).await?;
        let spent = workers.cpu().since(&cpu_before);
        workers.stop().await;
        conductor.server.shutdown().await;
        self.figure(
            &format!("cpu/task whole worker side, conductor-python j={processes}{tag}"),
            "µs",
        )
        .runs
        .push(spent.total() * 1e6 / tasks as f64);
        if !rss.is_empty() && pad == 0 {
            let mean = rss.iter().sum::<f64>() / rss.len() as f64;
            self.figure("rss python process under load (mean)", "MiB")
                .runs
                .push(mean);
        }
        Ok(throughput(&times))
    }

    /// `numerator / denominator` as a figure, when both medians exist and the denominator is
    /// above zero.
    fn ratio(&mut self, name: &str, numerator: &str, denominator: &str) {
        if let (Some(n), Some(d)) = (self.median(numerator), self.median(denominator))
            && d > 0.0
        {
            self.figure(name, "x").runs.push(n / d);
        }
    }

    /// The runtime's CPU per task split in two: the Conductor client's share (the ceiling
    /// client's own CPU per task: one update and 1/64 of a batch poll, the two round trips at
    /// their cheapest) and the rest, which is perago's own (slot protocol, executors, logs,
    /// timers). From the medians.
    fn runtime_split(&mut self, jobs: u32) {
        let Some(http) = self.median(CEILING_CPU) else {
            return;
        };
        for body in [Body::Rust, Body::Exec, Body::JsonlPython] {
            let who = format!("perago {} j={jobs}", body.name());
            let Some(runtime) = self.median(&format!(
                "cpu/task runtime (broker+executors+supervisor), {who}"
            )) else {
                continue;
            };
            self.figure(
                &format!("cpu/task runtime less the Conductor client, {who}"),
                "µs",
            )
            .runs
            .push(runtime - http);
        }
    }

    async fn throughput(&mut self) -> Result<(), String> {
        let tasks = self.o.tasks;
        for _ in 0..self.o.runs {
            let conductor = Conductor::start().await?;
            let c = ceiling(&conductor, "bench.ceiling", tasks).await?;
            conductor.server.shutdown().await;
            self.figure("ceiling: poll+update client", "tasks/s")
                .runs
                .push(c.tasks_per_second);
            self.figure(CEILING_CPU, "µs")
                .runs
                .push(c.cpu_seconds * 1e6 / tasks as f64);
            for jobs in [2, 4] {
                let rust = self.perago_run(Body::Rust, jobs, tasks).await?;
                self.figure(&format!("perago rust body j={jobs}"), "tasks/s")
                    .runs
                    .push(rust);
                let exec = self.perago_run(Body::Exec, jobs, tasks).await?;
                self.figure(&format!("perago exec body j={jobs}"), "tasks/s")
                    .runs
                    .push(exec);
                let jsonl = self.perago_run(Body::JsonlPython, jobs, tasks).await?;
                self.figure(&format!("perago jsonl python body j={jobs}"), "tasks/s")
                    .runs
                    .push(jsonl);
                let py = self.python_run(jobs, tasks).await?;
                self.figure(&format!("conductor-python j={jobs}"), "tasks/s")
                    .runs
                    .push(py);
            }
        }
        for jobs in [2, 4] {
            let ceiling = self.median("ceiling: poll+update client");
            let rust = self.median(&format!("perago rust body j={jobs}"));
            let exec = self.median(&format!("perago exec body j={jobs}"));
            let jsonl = self.median(&format!("perago jsonl python body j={jobs}"));
            let py = self.median(&format!("conductor-python j={jobs}"));
            self.runtime_split(jobs);
            if let (Some(j), Some(p)) = (jsonl, py) {
                self.figure(&format!("ratio perago jsonl python / python j={jobs}"), "x")
                    .runs
                    .push(j / p);
            }
            self.ratio(
                &format!("ratio cpu/task conductor-python / perago jsonl python runtime j={jobs}"),
                &format!("cpu/task whole worker side, conductor-python j={jobs}"),
                &format!(
                    "cpu/task runtime (broker+executors+supervisor), perago jsonl python body j={jobs}"
                ),
            );
            if let (Some(r), Some(e), Some(p), Some(c)) = (rust, exec, py, ceiling) {
                self.figure(&format!("ratio perago rust / python j={jobs}"), "x")
                    .runs
                    .push(r / p);
                self.figure(&format!("ratio perago exec / python j={jobs}"), "x")
                    .runs
                    .push(e / p);
                self.figure(&format!("ratio perago rust / ceiling j={jobs}"), "x")
                    .runs
                    .push(r / c);
            }
        }
        Ok(())
    }

    /// The `exec` body alone (j = 2 and 4): the figures the `spawn` floor is compared with,
    /// without the rest of the throughput scenario. Not in the default set (throughput
    /// measures the same).
    async fn exec(&mut self) -> Result<(), String> {
        let tasks = self.o.tasks;
        for _ in 0..self.o.runs {
            for jobs in [2, 4] {
                let exec = self.perago_run(Body::Exec, jobs, tasks).await?;
                self.figure(&format!("perago exec body j={jobs}"), "tasks/s")
                    .runs
                    .push(exec);
            }
        }
        Ok(())
    }

    /// How CPU and throughput grow with the input size: the Python function behind `jsonl`
    /// and conductor-python, j = 2, 1 KiB, 64 KiB and 1 MiB of input per task.
    async fn payload(&mut self) -> Result<(), String> {
        let tasks = self.o.tasks;
        let sizes: [(usize, &str, usize); 3] = if self.o.smoke {
            [
                (1 << 10, "1KiB", 4),
                (64 << 10, "64KiB", 4),
                (1 << 20, "1MiB", 2),
            ]
        } else {
            [
                (1 << 10, "1KiB", tasks.min(2000)),
                (64 << 10, "64KiB", tasks.min(500)),
                (1 << 20, "1MiB", tasks.min(60)),
            ]
        };
        for _ in 0..self.o.runs {
            for (pad, label, n) in sizes {
                let tag = format!(" {label}");
                let perago = self
                    .perago_measured(Body::JsonlPython, 2, n, pad, &[], &tag)
                    .await?;
                self.figure(&format!("perago jsonl python body j=2{tag}"), "tasks/s")
                    .runs
                    .push(perago);
                let python = self.python_measured(2, n, pad, &tag).await?;
                self.figure(&format!("conductor-python j=2{tag}"), "tasks/s")
                    .runs
                    .push(python);
            }
        }
        Ok(())
    }

    /// The cost of the default `info` logging: the Rust body at j = 2 with and without it.
    async fn logging(&mut self) -> Result<(), String> {
        let tasks = self.o.tasks;
        let warn = [("RUST_LOG".to_owned(), "warn".to_owned())];
        for _ in 0..self.o.runs {
            let info = self
                .perago_measured(Body::Rust, 2, tasks, 0, &[], " info")
                .await?;
            self.figure("perago rust body j=2 info", "tasks/s")
                .runs
                .push(info);
            let quiet = self
                .perago_measured(Body::Rust, 2, tasks, 0, &warn, " RUST_LOG=warn")
                .await?;
            self.figure("perago rust body j=2 RUST_LOG=warn", "tasks/s")
                .runs
                .push(quiet);
        }
        self.ratio(
            "ratio throughput info / RUST_LOG=warn, rust body j=2",
            "perago rust body j=2 info",
            "perago rust body j=2 RUST_LOG=warn",
        );
        Ok(())
    }

    /// The cost of exporting traces (issue #29): the Rust and the `exec` body at j = 2 without
    /// an endpoint and exporting every attempt's trace over OTLP/HTTP to a local collector that
    /// answers at once ([`otlp_sink`]); the spans it received per task say the export happened.
    async fn tracing(&mut self) -> Result<(), String> {
        let tasks = self.o.tasks;
        for body in [Body::Rust, Body::Exec] {
            let who = format!("perago {} j=2", body.name());
            for _ in 0..self.o.runs {
                let off = self
                    .perago_measured(body, 2, tasks, 0, &[], " traces off")
                    .await?;
                self.figure(&format!("{who} traces off"), "tasks/s")
                    .runs
                    .push(off);
                let sink = otlp_sink::Sink::start().await?;
                let env = [
                    (
                        "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
                        sink.url().to_owned(),
                    ),
                    ("OTEL_SERVICE_NAME".to_owned(), "perago-bench".to_owned()),
                ];
                let on = self
                    .perago_measured(body, 2, tasks, 0, &env, " traces on")
                    .await?;
                self.figure(&format!("{who} traces on"), "tasks/s")
                    .runs
                    .push(on);
                // The runtime has stopped: what it flushed at the drain has arrived.
                self.figure(&format!("spans exported per task, {who}"), "spans")
                    .runs
                    .push(sink.spans() as f64 / tasks as f64);
            }
            self.ratio(
                &format!("ratio throughput traces on / off, {who}"),
                &format!("{who} traces on"),
                &format!("{who} traces off"),
            );
            self.ratio(
                &format!("ratio cpu/task runtime traces on / off, {who}"),
                &format!("cpu/task runtime (broker+executors+supervisor), {who} traces on"),
                &format!("cpu/task runtime (broker+executors+supervisor), {who} traces off"),
            );
        }
        Ok(())
    }

    /// The floor for an `exec` body: a small Rust loop that spawns `cat`, writes a task's
    /// input to it and reads its output, with nothing else; its own CPU per spawn beside what
    /// the executors spend per task in the exec throughput runs.
    fn spawn(&mut self) -> Result<(), String> {
        let rounds = if self.o.smoke { 20 } else { 2000 };
        let input = br#"{"params":{"n":1}}"#;
        // Setting the uid (to our own) keeps std from posix_spawn (vfork-like): it forks, as
        // any spawn with pre-exec steps must, which is how the executor starts a body.
        let me_uid = std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .map_err(|e| perago_core::errors::chain(&e))?;
        for _ in 0..self.o.runs {
            for (how, uid) in [("", None), (" forking", Some(me_uid))] {
                let me = std::process::id();
                let (own_before, reaped_before) = procs::cpu_seconds(me).unwrap_or_default();
                for _ in 0..rounds {
                    spawn_cat(input, uid)?;
                }
                let (own_after, reaped_after) = procs::cpu_seconds(me).unwrap_or_default();
                self.figure(
                    &format!("cpu/task bare spawn loop{how} (cat), spawner"),
                    "µs",
                )
                .runs
                .push((own_after - own_before) * 1e6 / rounds as f64);
                self.figure(&format!("cpu/task bare spawn loop{how} (cat), cat"), "µs")
                    .runs
                    .push((reaped_after - reaped_before) * 1e6 / rounds as f64);
            }
        }
        for jobs in [2, 4] {
            self.ratio(
                &format!("ratio exec executors cpu/task / bare spawn loop j={jobs}"),
                &format!("cpu/task executors, perago exec body j={jobs}"),
                "cpu/task bare spawn loop (cat), spawner",
            );
            self.ratio(
                &format!("ratio exec executors cpu/task / bare forking spawn loop j={jobs}"),
                &format!("cpu/task executors, perago exec body j={jobs}"),
                "cpu/task bare spawn loop forking (cat), spawner",
            );
        }
        Ok(())
    }

    async fn latency(&mut self) -> Result<(), String> {
        let rounds = if self.o.smoke { 5 } else { 100 };
        // On immediate queues, as before issue #24, so the figures compare with earlier runs
        // (the `polls` scenario measures both queue semantics).
        // perago
        let conductor = Conductor::start_semantics(QueueSemantics::Immediate).await?;
        conductor.register(TASK).await?;
        let (runtime, _) =
            Runtime::start(&self.o.binaries, &conductor.url(), TASK, Body::Rust, 1, &[]).await?;
        let perago = self.one_at_a_time(&conductor, rounds).await?;
        runtime.stop().await;
        conductor.server.shutdown().await;
        // conductor-python
        let conductor = Conductor::start_semantics(QueueSemantics::Immediate).await?;
        conductor.register(TASK).await?;
        let script = workspace_root().join("bench/python/python_worker.py");
        let workers = PythonWorkers::start(&self.o.python, &script, &conductor.url(), TASK, 1)?;
        let python = self.one_at_a_time(&conductor, rounds).await?;
        workers.stop().await;
        conductor.server.shutdown().await;
        for (who, samples) in [("perago", perago), ("conductor-python", python)] {
            self.figure(&format!("schedule-to-start p50 {who}"), "ms")
                .runs
                .push(quantile(&samples, 0.5));
            self.figure(&format!("schedule-to-start p99 {who}"), "ms")
                .runs
                .push(quantile(&samples, 0.99));
        }
        Ok(())
    }

    /// Issue #24, item 3, under both queue semantics at `-j 4` (the default long-poll wait):
    /// schedule-to-start of lone tasks (one at a time, each once the previous one is done), and
    /// throughput on a full queue (every task queued at once).
    async fn polls(&mut self) -> Result<(), String> {
        let rounds = if self.o.smoke { 5 } else { 100 };
        let tasks = self.o.tasks;
        for _ in 0..self.o.runs {
            for semantics in [QueueSemantics::FillOrTimeout, QueueSemantics::Immediate] {
                let conductor = Conductor::start_semantics(semantics).await?;
                conductor.register(TASK).await?;
                let (runtime, _) =
                    Runtime::start(&self.o.binaries, &conductor.url(), TASK, Body::Rust, 4, &[])
                        .await?;
                let samples = self.one_at_a_time(&conductor, rounds).await?;
                let ids = conductor.start_many(TASK, tasks).await?;
                let times = conductor.wait_all(&ids, self.patience()).await?;
                runtime.stop().await;
                conductor.server.shutdown().await;
                let who = format!("perago j=4 {semantics}");
                self.figure(&format!("schedule-to-start p50 {who}"), "ms")
                    .runs
                    .push(quantile(&samples, 0.5));
                self.figure(&format!("schedule-to-start p99 {who}"), "ms")
                    .runs
                    .push(quantile(&samples, 0.99));
                self.figure(
                    &format!("full queue, perago rust body j=4 {semantics}"),
                    "tasks/s",
                )
                .runs
                .push(throughput(&times));
            }
        }
        Ok(())
    }

    async fn one_at_a_time(
        &self,
        conductor: &Conductor,
        rounds: usize,
    ) -> Result<Vec<f64>, String> {
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let ids = conductor.start_many(TASK, 1).await?;
            let times = conductor.wait_all(&ids, self.patience()).await?;
            samples.push((times[0].start - times[0].scheduled) as f64);
        }
        Ok(samples)
    }

    fn slot(&mut self) -> Result<(), String> {
        let rounds = if self.o.smoke { 200 } else { 20_000 };
        for _ in 0..self.o.runs {
            let slot = slot::slot_round_trips(rounds)?;
            let uds = slot::uds_round_trips(rounds)?;
            self.figure("slot round trip p50", "µs")
                .runs
                .push(quantile(&slot, 0.5));
            self.figure("slot round trip p99", "µs")
                .runs
                .push(quantile(&slot, 0.99));
            self.figure("raw unix socket ping-pong p50", "µs")
                .runs
                .push(quantile(&uds, 0.5));
            self.figure("raw unix socket ping-pong p99", "µs")
                .runs
                .push(quantile(&uds, 0.99));
        }
        Ok(())
    }

    async fn memory(&mut self) -> Result<(), String> {
        // Idle and loaded RSS are recorded by every Rust-body throughput run; run one if the
        // throughput scenario did not.
        if self.median("rss broker idle").is_none() {
            let tasks = self.o.tasks;
            self.perago_run(Body::Rust, 2, tasks).await?;
            self.python_run(2, tasks).await?;
        }
        Ok(())
    }

    async fn startup(&mut self) -> Result<(), String> {
        let counts: &[u32] = if self.o.smoke { &[1, 2] } else { &[1, 8, 32] };
        for _ in 0..self.o.runs {
            for &jobs in counts {
                let conductor = Conductor::start().await?;
                conductor.register(TASK).await?;
                let (runtime, took) = Runtime::start(
                    &self.o.binaries,
                    &conductor.url(),
                    TASK,
                    Body::Rust,
                    jobs,
                    &[],
                )
                .await?;
                runtime.stop().await;
                conductor.server.shutdown().await;
                self.figure(&format!("start-up to all slots attached j={jobs}"), "ms")
                    .runs
                    .push(took.as_secs_f64() * 1000.0);
            }
        }
        Ok(())
    }

    /// Workspace tasks: each downloads 10 small files from a pinned commit, adds one, and
    /// publishes it (stage, commit, fenced merge) to the same branch. Once with files uploaded
    /// through the API (lakeFS lists their MD5), once with files linked with the checksum the
    /// S3 gateway stores for a multipart upload (issue #24, item 4): the uploads per task show
    /// that only the new file is sent either way.
    async fn workspace(&mut self) -> Result<(), String> {
        for _ in 0..self.o.runs {
            for linked in [false, true] {
                self.workspace_run(linked).await?;
            }
        }
        Ok(())
    }

    async fn workspace_run(&mut self, linked: bool) -> Result<(), String> {
        use perago_core::lakefs::{LakefsClient, LakefsConfig};
        let tasks = if self.o.smoke { 4 } else { 300 };
        let conductor = Conductor::start().await?;
        let lakefs = perago_devstack::lakefs::LakefsServer::builder()
            .bind("127.0.0.1:0")
            .await
            .map_err(|e| perago_core::errors::chain(&e))?;
        let config = LakefsConfig {
            endpoint: lakefs.endpoint(),
            access_key_id: lakefs.credentials().access_key_id.clone(),
            secret_access_key: lakefs.credentials().secret_access_key.clone(),
        };
        let client = LakefsClient::new(&config).map_err(|e| perago_core::errors::chain(&e))?;
        client
            .ensure_repository("bench", "mem://bench", "main")
            .await
            .map_err(|e| perago_core::errors::chain(&e))?;
        if linked {
            client
                .ensure_repository("store", "mem://store", "main")
                .await
                .map_err(|e| perago_core::errors::chain(&e))?;
            client
                .upload("store", "main", "blob", vec![b'x'; 1024])
                .await
                .map_err(|e| perago_core::errors::chain(&e))?;
        }
        for i in 0..10 {
            let key = format!("in/seed-{i}.csv");
            if linked {
                link_gateway_style(&config, "store", "blob", "bench", &key, 1024).await?;
            } else {
                client
                    .upload("bench", "main", &key, vec![b'x'; 1024])
                    .await
                    .map_err(|e| perago_core::errors::chain(&e))?;
            }
        }
        let seed = client
            .commit("bench", "main", "seed", &serde_json::Map::new())
            .await
            .map_err(|e| perago_core::errors::chain(&e))?
            .id;
        // Every task reads the seed commit, so its download does not grow with the branch.
        let ws = json!({"repository": "bench", "branch": "main", "prefix": "in/", "ref": seed});
        conductor.register_with(TASK, Some(ws)).await?;
        let env = vec![
            ("LAKEFS_ENDPOINT".to_owned(), config.endpoint.clone()),
            (
                "LAKEFS_ACCESS_KEY_ID".to_owned(),
                config.access_key_id.clone(),
            ),
            (
                "LAKEFS_SECRET_ACCESS_KEY".to_owned(),
                config.secret_access_key.clone(),
            ),
        ];
        let (runtime, _) = Runtime::start(
            &self.o.binaries,
            &conductor.url(),
            TASK,
            Body::Workspace,
            2,
            &env,
        )
        .await?;
        let ids = conductor.start_many(TASK, tasks).await?;
        let times = conductor.wait_all(&ids, self.patience()).await?;
        runtime.stop().await;
        conductor.server.shutdown().await;
        lakefs.shutdown().await;
        let (name, uploads) = if linked {
            (
                "perago workspace task (10 gateway-checksum files in, 1 published) j=2",
                "uploads/task, workspace task (10 gateway-checksum files in, 1 published)",
            )
        } else {
            (
                "perago workspace task (10 files in, 1 published) j=2",
                "uploads/task, workspace task (10 files in, 1 published)",
            )
        };
        self.figure(name, "tasks/s").runs.push(throughput(&times));
        let uploaded: u64 = times.iter().map(|t| t.uploaded).sum();
        self.figure(uploads, "objects")
            .runs
            .push(uploaded as f64 / times.len().max(1) as f64);
        Ok(())
    }

    /// Many slots of I/O-bound tasks (issue #30, the common case): a body that sleeps 100 ms,
    /// 800 tasks (at least eight per slot) at j = 4, 16, 32, 64. The broker's CPU per task should stay flat as
    /// j grows, and start-up at j = 64 under 150 ms.
    async fn io_scale(&mut self) -> Result<(), String> {
        let counts: &[u32] = if self.o.smoke {
            &[1, 2]
        } else {
            &[4, 16, 32, 64]
        };
        for &jobs in counts {
            // At least 800: /proc's CPU times count 10 ms ticks, so fewer tasks at small j
            // would read as whole ticks per task.
            let tasks = if self.o.smoke {
                self.o.tasks.min(8)
            } else {
                (8 * jobs as usize).max(800)
            };
            for _ in 0..self.o.runs {
                let t = self
                    .perago_measured(Body::Sleep, jobs, tasks, 0, &[], "")
                    .await?;
                self.figure(&format!("perago sleep 100ms body j={jobs}"), "tasks/s")
                    .runs
                    .push(t);
            }
        }
        Ok(())
    }

    async fn scaling(&mut self) -> Result<(), String> {
        let counts: &[u32] = if self.o.smoke {
            &[1, 2]
        } else {
            &[1, 2, 4, 8, 16]
        };
        let tasks = if self.o.smoke {
            self.o.tasks
        } else {
            self.o.tasks.min(3000)
        };
        let mut points = Vec::new();
        for &jobs in counts {
            let name = format!("scaling perago rust body j={jobs}");
            for _ in 0..self.o.runs {
                let t = self.perago_run(Body::Rust, jobs, tasks).await?;
                self.figure(&name, "tasks/s").runs.push(t);
            }
            points.push((f64::from(jobs), self.median(&name).unwrap_or(0.0)));
        }
        self.scaling.push(("perago (rust body)".to_owned(), points));
        let python: Vec<(f64, f64)> = [2.0, 4.0]
            .into_iter()
            .filter_map(|j| Some((j, self.median(&format!("conductor-python j={j}"))?)))
            .collect();
        if !python.is_empty() {
            self.scaling.push(("conductor-python".to_owned(), python));
        }
        Ok(())
    }
}

/// One `cat` with piped stdin and stdout: write `input`, close, read to the end, wait. With
/// `uid`, the child sets it before exec (which makes std fork instead of posix_spawn).
fn spawn_cat(input: &[u8], uid: Option<u32>) -> Result<(), String> {
    use std::io::{Read as _, Write as _};
    use std::os::unix::process::CommandExt as _;
    let mut cmd = std::process::Command::new("cat");
    if let Some(uid) = uid {
        cmd.uid(uid);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot spawn cat: {}",
                perago_core::errors::DisplayChain(&e)
            )
        })?;
    let mut stdin = child.stdin.take().expect("piped");
    stdin
        .write_all(input)
        .map_err(|e| perago_core::errors::chain(&e))?;
    drop(stdin);
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_end(&mut out)
        .map_err(|e| perago_core::errors::chain(&e))?;
    child.wait().map_err(|e| perago_core::errors::chain(&e))?;
    if out != input {
        return Err("cat did not echo its input".to_owned());
    }
    Ok(())
}

/// Runs the selected scenarios; prints the table; writes `results.json` and `scaling.svg`.
pub async fn run(options: Options) -> Result<(), String> {
    ensure_binaries(&options.binaries)?;
    let scenarios: Vec<String> = if options.scenarios.is_empty() {
        SCENARIOS
            .iter()
            .filter(|s| **s != "exec")
            .map(|s| (*s).to_owned())
            .collect()
    } else {
        options.scenarios.clone()
    };
    let mut bench = Bench {
        o: options,
        figures: Vec::new(),
        scaling: Vec::new(),
    };
    for scenario in &scenarios {
        eprintln!("running {scenario}…");
        match scenario.as_str() {
            "throughput" => bench.throughput().await?,
            "exec" => bench.exec().await?,
            "payload" => bench.payload().await?,
            "logging" => bench.logging().await?,
            "tracing" => bench.tracing().await?,
            "spawn" => bench.spawn()?,
            "latency" => bench.latency().await?,
            "slot" => bench.slot()?,
            "memory" => bench.memory().await?,
            "startup" => bench.startup().await?,
            "scaling" => bench.scaling().await?,
            "io-scale" => bench.io_scale().await?,
            "workspace" => bench.workspace().await?,
            "polls" => bench.polls().await?,
            _ => unreachable!("checked by parse_args"),
        }
    }
    print!("{}", table(&bench.figures));
    // Against the figures kept beside docs/performance.md, so a regression shows up in the
    // run that makes it (copy a results.json there to make it the new reference).
    match std::fs::read_to_string(&bench.o.previous) {
        Ok(text) => match serde_json::from_str(&text) {
            Ok(previous) => {
                println!("\nagainst {}:", bench.o.previous.display());
                let compared = report::comparison(&bench.figures, &previous);
                print!("{compared}");
                // Loud on stderr too, where a CI log or a terminal shows it last.
                if let Some(summary) = compared.lines().find(|l| l.starts_with(report::REGRESSED)) {
                    eprintln!("{summary}");
                }
            }
            Err(e) => eprintln!(
                "cannot read {}: {}",
                bench.o.previous.display(),
                perago_core::errors::DisplayChain(&e)
            ),
        },
        Err(e) => eprintln!(
            "no previous figures at {}: {}",
            bench.o.previous.display(),
            perago_core::errors::DisplayChain(&e)
        ),
    }
    std::fs::create_dir_all(&bench.o.out).map_err(|e| perago_core::errors::chain(&e))?;
    let results = json!({
        "runs": bench.o.runs, "tasks": bench.o.tasks, "smoke": bench.o.smoke,
        "machine": {"cpus": std::thread::available_parallelism().map_or(0, |n| n.get())},
        "figures": bench.figures.iter().map(Figure::json).collect::<Vec<_>>(),
    });
    let json_path = bench.o.out.join("results.json");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&results).expect("json"),
    )
    .map_err(|e| perago_core::errors::chain(&e))?;
    eprintln!("wrote {}", json_path.display());
    if !bench.scaling.is_empty() {
        let svg_path = bench.o.out.join("scaling.svg");
        std::fs::write(&svg_path, scaling_svg(&bench.scaling))
            .map_err(|e| perago_core::errors::chain(&e))?;
        eprintln!("wrote {}", svg_path.display());
    }
    Ok(())
}

/// The binary's entry; returns the exit code.
pub fn main() -> i32 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Hidden modes: the far ends of the round-trip measurements.
    match args.first().map(String::as_str) {
        Some("__slot-server") => return slot::serve_slot(Path::new(&args[1])),
        Some("__uds-server") => return slot::serve_uds(Path::new(&args[1])),
        _ => {}
    }
    let options = match parse_args(&args) {
        Ok(o) => o,
        Err(message) => {
            eprintln!("{message}");
            return 2;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    match runtime.block_on(run(options)) {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("error: {message}");
            1
        }
    }
}

/// Stages `key` on `repo`'s `main` as the bytes of `store`'s `source` (`size` bytes) through
/// lakeFS's `PUT .../staging/backing`, with the checksum the S3 gateway stores for a two-part
/// multipart upload of them (the MD5 of the parts' MD5s): not the content's MD5.
async fn link_gateway_style(
    config: &perago_core::lakefs::LakefsConfig,
    store: &str,
    source: &str,
    repo: &str,
    key: &str,
    size: usize,
) -> Result<(), String> {
    use md5::{Digest as _, Md5};
    let api = format!("{}/api/v1", config.endpoint.trim_end_matches('/'));
    let http = perago_core::http::client_builder(&api)
        .build()
        .map_err(|e| perago_core::errors::chain(&e))?;
    let auth = (&config.access_key_id, Some(&config.secret_access_key));
    let stat: serde_json::Value = http
        .get(format!("{api}/repositories/{store}/refs/main/objects/stat"))
        .query(&[("path", source)])
        .basic_auth(auth.0, auth.1)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| perago_core::errors::chain(&e))?
        .json()
        .await
        .map_err(|e| perago_core::errors::chain(&e))?;
    let content = vec![b'x'; size];
    let (first, second) = content.split_at(size / 2);
    let mut outer = Md5::new();
    outer.update(Md5::digest(first));
    outer.update(Md5::digest(second));
    let checksum: String = outer
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    http.put(format!(
        "{api}/repositories/{repo}/branches/main/staging/backing"
    ))
    .query(&[("path", key)])
    .basic_auth(auth.0, auth.1)
    .json(
        &json!({"staging": {"physical_address": stat["physical_address"]},
            "checksum": checksum, "size_bytes": size}),
    )
    .send()
    .await
    .and_then(reqwest::Response::error_for_status)
    .map_err(|e| perago_core::errors::chain(&e))?;
    Ok(())
}
