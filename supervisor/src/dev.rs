//! `dev`: a first run with nothing to install. Starts devstack's Conductor in this process,
//! registers the manifest's TaskDef and a one-task workflow, starts one workflow per
//! `--input`, runs the runtime and prints each result as it completes. Exits 0 when every
//! workflow completed, 1 if any failed.
//!
//! The runtime is the real process split by default (`ps` shows `perago-conductor-broker` and
//! `perago-executor-000N`), yet `cargo run -p perago-supervisor` is enough: the broker and the
//! stock executor are this same program in a role (`__perago-broker`, `__perago-executor`), so
//! no other binary has to be built, and none from an older build is picked up.
//! `PERAGO_BROKER_BIN` / `PERAGO_EXECUTOR_BIN` and a manifest's `body.executor` still name
//! binaries of their own; `--execution-mode thread` runs everything in this process.

use crate::{
    cli::DevArgs,
    errors::ExpectedError,
    plan::{Plan, Programs, TaskPlan},
    runtime::supervise::supervise_all,
};
use perago_core::lakefs::{LakefsClient, LakefsConfig, LakefsConfigError, LakefsError};
use perago_core::{
    conductor::ConductorClient,
    identity::WorkerPrefix,
    manifest::{Manifest, TaskKind},
    mode::{ExecutionMode, WorkerCount},
    taskdef::task_def,
};
use perago_devstack::conductor::ConductorServer;
use serde_json::{Value, json};
use std::{collections::BTreeMap, time::Duration};

/// What failed in `dev` around the runtime: its devstack, or the workflows it started.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// devstack's Conductor cannot start.
    #[error("cannot start devstack")]
    Conductor(#[source] perago_devstack::DevstackError),
    /// devstack's Conductor URL makes no client.
    #[error(transparent)]
    ConductorUrl(#[from] perago_core::conductor::BaseUrlError),
    /// The TaskDef, the workflow or a workflow run cannot be created.
    #[error("cannot set up devstack")]
    Setup(#[source] perago_core::conductor::ConductorError),
    /// This program's path (to run it in a role) is unknown.
    #[error("cannot find this program to run the {role} role")]
    ThisProgram {
        /// The role argument.
        role: &'static str,
        /// The error of `current_exe`.
        #[source]
        source: std::io::Error,
    },
    /// Workflows that did not complete.
    #[error("{count} workflow(s) did not complete")]
    Incomplete {
        /// How many.
        count: usize,
    },
    /// devstack's lakeFS cannot start.
    #[error("cannot start devstack lakeFS")]
    LakefsStart(#[source] perago_devstack::DevstackError),
    /// devstack's lakeFS endpoint makes no client.
    #[error("cannot reach devstack lakeFS")]
    LakefsClient(#[source] LakefsConfigError),
    /// The dev repository cannot be created.
    #[error("cannot create the dev repository")]
    Repository(#[source] LakefsError),
    /// A folder of the seed cannot be listed.
    #[error("cannot read the seed folder {}", dir.display())]
    SeedFolder {
        /// The folder.
        dir: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file of the seed cannot be read.
    #[error("cannot read {}", path.display())]
    SeedFile {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A seed file cannot be uploaded.
    #[error("cannot seed the dev repository")]
    Seed(#[source] LakefsError),
    /// The seed cannot be committed.
    #[error("cannot commit the seed")]
    CommitSeed(#[source] LakefsError),
}

/// How often the watcher reads the workflows back from the embedded server.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// The `--input`s, by task: `NAME=JSON` is one workflow of the task NAME, a plain JSON object
/// one workflow of every task given. Every task needs at least one.
fn parse_inputs(inputs: &[String], names: &[String]) -> Result<Vec<Vec<Value>>, ExpectedError> {
    if inputs.is_empty() {
        return Err(ExpectedError::Config(vec![
            "give at least one --input with the task input, e.g. --input '{\"params\": {}}'"
                .to_owned(),
        ]));
    }
    let mut problems = Vec::new();
    let mut out: Vec<Vec<Value>> = names.iter().map(|_| Vec::new()).collect();
    for (n, text) in inputs.iter().enumerate() {
        let named = text.split_once('=').and_then(|(name, json)| {
            names
                .iter()
                .position(|known| known == name.trim())
                .map(|index| (index, json))
        });
        let (targets, json): (Vec<usize>, &str) = match named {
            Some((index, json)) => (vec![index], json),
            None => ((0..names.len()).collect(), text.as_str()),
        };
        match serde_json::from_str::<Value>(json) {
            Ok(v @ Value::Object(_)) => {
                for index in targets {
                    out[index].push(v.clone());
                }
            }
            Ok(_) => problems.push(format!("--input {}: expected a JSON object", n + 1)),
            Err(e) => problems.push(format!(
                "--input {}: not valid JSON: {}",
                n + 1,
                perago_core::errors::DisplayChain(&e)
            )),
        }
    }
    if problems.is_empty() {
        for (name, inputs) in names.iter().zip(&out) {
            if inputs.is_empty() {
                problems.push(format!(
                    "no --input for the task {name}: give --input '{name}={{\"params\": {{}}}}' or an input for every task"
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(ExpectedError::Config(problems))
    }
}

/// One task type of a `dev` run.
struct DevTask {
    manifest: Manifest,
    manifest_path: std::path::PathBuf,
    inputs: Vec<Value>,
    ids: Vec<String>,
}

pub(crate) fn dev(args: &DevArgs, vars: &BTreeMap<String, String>) -> Result<(), ExpectedError> {
    let workers = WorkerCount::new(args.jobs)?;
    let stall_timeout = perago_core::liveness::stall_timeout(
        vars.get(perago_core::liveness::PERAGO_STALL_TIMEOUT)
            .map(String::as_str),
    )
    .map_err(|e| ExpectedError::Config(vec![perago_core::errors::chain(&e)]))?;
    let mode: ExecutionMode = args
        .execution_mode
        .map_or(ExecutionMode::Process, Into::into);
    let manifests = crate::start::load_manifests(&args.manifests)?;
    let names: Vec<String> = manifests.iter().map(|(_, m)| m.task.name.clone()).collect();
    let inputs = parse_inputs(&args.input, &names)?;
    let several = manifests.len() > 1;
    let mut tasks: Vec<DevTask> = manifests
        .into_iter()
        .zip(inputs)
        .map(|((path, manifest), inputs)| DevTask {
            manifest_path: std::fs::canonicalize(&path).unwrap_or(path),
            manifest,
            inputs,
            ids: Vec::new(),
        })
        .collect();
    perago_core::logging::init_stderr_at("warn");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ExpectedError::AsyncRuntime)?;
    runtime.block_on(async {
        let server = ConductorServer::builder()
            .bind("127.0.0.1:0")
            .await
            .map_err(DevError::Conductor)?;
        let url = server.base_url();
        eprintln!("devstack Conductor at {url}");
        let client = ConductorClient::new(&url).map_err(DevError::from)?;
        let mut child_env = vec![(
            perago_core::env::PERAGO_POLL_WAIT_MS.to_owned(),
            "500".to_owned(),
        )];
        let lakefs = if tasks
            .iter()
            .any(|t| t.manifest.task.kind == TaskKind::Workspace)
        {
            let (server, client) = start_lakefs().await?;
            for task in tasks
                .iter_mut()
                .filter(|t| t.manifest.task.kind == TaskKind::Workspace)
            {
                seed(&server, &client, &task.manifest).await?;
                let dev = &task.manifest.dev;
                let prefix = task
                    .manifest
                    .workspace
                    .as_ref()
                    .map_or("", |w| w.prefix.as_str());
                for input in &mut task.inputs {
                    if input.get("workspace").is_none() {
                        input["workspace"] = json!({
                            "repository": dev.repository, "branch": dev.branch, "prefix": prefix,
                        });
                    }
                }
            }
            child_env.extend([
                ("LAKEFS_ENDPOINT".to_owned(), server.endpoint()),
                (
                    "LAKEFS_ACCESS_KEY_ID".to_owned(),
                    server.credentials().access_key_id.clone(),
                ),
                (
                    "LAKEFS_SECRET_ACCESS_KEY".to_owned(),
                    server.credentials().secret_access_key.clone(),
                ),
            ]);
            Some((server, client))
        } else {
            None
        };
        for task in &mut tasks {
            let manifest = &task.manifest;
            let name = manifest.task.name.clone();
            let workflow = format!("{name}.dev");
            let setup = async {
                client.register_task_defs(&[task_def(manifest)]).await?;
                let params = manifest
                    .task
                    .kind
                    .input_keys()
                    .iter()
                    .map(|k| ((*k).to_owned(), json!(format!("${{workflow.input.{k}}}"))))
                    .collect::<serde_json::Map<_, _>>();
                client
                    .upsert_workflow_defs(&[json!({
                        "name": workflow, "version": 1, "schemaVersion": 2,
                        "tasks": [{"name": name, "taskReferenceName": "task", "type": "SIMPLE",
                                   "inputParameters": params}],
                        "outputParameters": {"result": "${task.output.result}"},
                    })])
                    .await?;
                let mut ids = Vec::new();
                for input in &task.inputs {
                    ids.push(client.start_workflow(&workflow, input).await?);
                }
                Ok::<_, perago_core::conductor::ConductorError>(ids)
            };
            task.ids = setup.await.map_err(DevError::Setup)?;
            eprintln!(
                "started {} workflow(s) of {name}; running with {} executor(s) in {mode} mode",
                task.ids.len(),
                workers.get()
            );
        }

        let base = std::env::temp_dir().join(format!("perago-dev-{}", std::process::id()));
        // dev's own: the embedded Conductor, a fixed capacity, a private root and log root, no
        // shutdown deadline; the rest is the plan `start` runs with.
        let mut plan = Plan::new(Programs::ThisProgram, url.clone());
        plan.log_root = base.join("logs");
        plan.child_env = child_env;
        plan.stall_timeout = stall_timeout;
        plan.several = several;
        let mut locks = Vec::new();
        let mut runs = Vec::new();
        for task in &tasks {
            let manifest = &task.manifest;
            let name = manifest.task.name.clone();
            // A fresh root of this process's own: nothing can be draining there.
            let root = if several {
                base.join(&name)
            } else {
                base.clone()
            };
            let locked = crate::runtime::root::lock(&root, vars, Duration::ZERO).await?;
            let prefix = WorkerPrefix::derive(&name)
                .map_err(|e| ExpectedError::Config(vec![perago_core::errors::chain(&e)]))?;
            let task = TaskPlan::new(
                manifest.clone(),
                task.manifest_path.clone(),
                perago_core::capacity::Capacity::fixed(workers.get()),
                prefix,
                mode,
            );
            let lakefs = lakefs.as_ref().map(|(_, c)| c.clone());
            runs.push(plan.runtime(task, &locked, lakefs, None, vars)?);
            locks.push(locked);
        }

        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let lakefs_client = lakefs.as_ref().map(|(_, c)| c.clone());
        let watched: Vec<(String, String)> = tasks
            .iter()
            .flat_map(|t| {
                t.ids
                    .iter()
                    .map(|id| (id.clone(), t.manifest.task.name.clone()))
            })
            .collect();
        let watcher = tokio::spawn(watch(
            client.clone(),
            lakefs_client,
            watched,
            several,
            done_tx,
        ));
        let stop = async {
            let _ = done_rx.await;
            "all work done".to_owned()
        };
        let results = supervise_all(runs, stop).await;
        let outcome = watcher.await.unwrap_or_default();
        drop(locks);
        let _ = std::fs::remove_dir_all(&base);
        server.shutdown().await;
        if let Some((lakefs, _)) = lakefs {
            lakefs.shutdown().await;
        }
        crate::start::outcome(results)?;
        let failed = outcome.iter().filter(|s| s.as_str() != "COMPLETED").count();
        eprintln!(
            "{} workflow(s): {} completed, {failed} not completed",
            outcome.len(),
            outcome.len() - failed
        );
        if failed > 0 {
            return Err(DevError::Incomplete { count: failed }.into());
        }
        Ok(())
    })
}

/// devstack's lakeFS, with a client.
async fn start_lakefs()
-> Result<(perago_devstack::lakefs::LakefsHandle, LakefsClient), ExpectedError> {
    let server = perago_devstack::lakefs::LakefsServer::builder()
        .bind("127.0.0.1:0")
        .await
        .map_err(DevError::LakefsStart)?;
    let config = LakefsConfig {
        endpoint: server.endpoint(),
        access_key_id: server.credentials().access_key_id.clone(),
        secret_access_key: server.credentials().secret_access_key.clone(),
    };
    let client = LakefsClient::new(&config).map_err(DevError::LakefsClient)?;
    Ok((server, client))
}

/// The manifest's dev repository, seeded from its `[dev] seed` folder.
async fn seed(
    server: &perago_devstack::lakefs::LakefsHandle,
    client: &LakefsClient,
    manifest: &Manifest,
) -> Result<(), ExpectedError> {
    let dev = &manifest.dev;
    client
        .ensure_repository(
            &dev.repository,
            &format!("mem://{}", dev.repository),
            &dev.branch,
        )
        .await
        .map_err(DevError::Repository)?;
    let mut seeded = 0;
    if let Some(seed) = &dev.seed {
        let mut stack = vec![seed.clone()];
        while let Some(dir) = stack.pop() {
            let entries = std::fs::read_dir(&dir).map_err(|source| DevError::SeedFolder {
                dir: dir.clone(),
                source,
            })?;
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let relative = path.strip_prefix(seed).expect("under the seed folder");
                let key = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                let bytes = std::fs::read(&path).map_err(|source| DevError::SeedFile {
                    path: path.clone(),
                    source,
                })?;
                client
                    .upload(&dev.repository, &dev.branch, &key, bytes)
                    .await
                    .map_err(DevError::Seed)?;
                seeded += 1;
            }
        }
        if seeded > 0 {
            client
                .commit(
                    &dev.repository,
                    &dev.branch,
                    "seed",
                    &serde_json::Map::new(),
                )
                .await
                .map_err(DevError::CommitSeed)?;
        }
    }
    eprintln!(
        "devstack lakeFS at {} (repository {}, branch {}, {seeded} seeded file(s))",
        server.endpoint(),
        dev.repository,
        dev.branch
    );
    Ok(())
}

/// Prints each workflow as it ends (one JSON line on stdout), then signals `done`. Returns
/// the final statuses.
async fn watch(
    client: ConductorClient,
    lakefs: Option<LakefsClient>,
    ids: Vec<(String, String)>,
    several: bool,
    done: tokio::sync::oneshot::Sender<()>,
) -> Vec<String> {
    let mut pending: Vec<(String, String)> = ids;
    let mut statuses = Vec::new();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for (id, task_name) in pending {
            let Ok(wf) = client.get_workflow(&id).await else {
                still.push((id, task_name));
                continue;
            };
            let status = wf["status"].as_str().unwrap_or("RUNNING").to_owned();
            if status == "RUNNING" || status == "PAUSED" {
                still.push((id, task_name));
                continue;
            }
            let task = wf["tasks"]
                .as_array()
                .and_then(|t| t.last())
                .cloned()
                .unwrap_or_default();
            let mut line = json!({"workflow_id": id, "status": status});
            if several {
                line["task"] = Value::from(task_name);
            }
            if status == "COMPLETED" {
                line["output"] = task["outputData"].clone();
                let ws = &task["outputData"]["workspace"];
                if let (Some(lakefs), Some(repo), Some(from), Some(to)) = (
                    &lakefs,
                    ws["repository"].as_str(),
                    ws["source_commit_id"].as_str(),
                    ws["commit_id"].as_str(),
                ) && from != to
                    && let Ok(diff) = lakefs.diff(repo, from, to).await
                {
                    line["published"] = diff
                        .into_iter()
                        .map(|(kind, path)| json!({"change": kind, "path": path}))
                        .collect();
                }
            } else {
                line["task_status"] = task["status"].clone();
                line["reason"] = task["reasonForIncompletion"].clone();
            }
            line["worker_id"] = task["workerId"].clone();
            println!("{line}");
            statuses.push(status);
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(WATCH_EVERY).await;
        }
    }
    let _ = done.send(());
    statuses
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::children::{BROKER_ROLE_ARG, Launcher};
    use std::sync::Arc;

    #[test]
    fn dev_errors_keep_their_texts_and_causes() {
        use std::error::Error as _;
        let io = || std::io::Error::other("denied");
        let errors = [
            DevError::ThisProgram {
                role: BROKER_ROLE_ARG,
                source: io(),
            },
            DevError::Incomplete { count: 1 },
            DevError::SeedFolder {
                dir: "/seed".into(),
                source: io(),
            },
            DevError::SeedFile {
                path: "/seed/a".into(),
                source: io(),
            },
            DevError::LakefsClient(LakefsConfigError::Endpoint {
                endpoint: "x".to_owned(),
            }),
        ];
        assert_eq!(
            errors.each_ref().map(perago_core::errors::chain),
            [
                "cannot find this program to run the __perago-broker role: denied",
                "1 workflow(s) did not complete",
                "cannot read the seed folder /seed: denied",
                "cannot read /seed/a: denied",
                "cannot reach devstack lakeFS: LAKEFS_ENDPOINT \"x\" is invalid: expected an http:// or https:// URL",
            ]
        );
        assert!(errors[2].source().is_some());
        assert!(matches!(
            ExpectedError::from(DevError::Incomplete { count: 1 }),
            ExpectedError::Dev(DevError::Incomplete { count: 1 })
        ));
    }

    #[test]
    fn thread_mode_refuses_an_executor_binary_by_its_variant() {
        let manifest = Manifest::parse(
            std::path::Path::new("task.toml"),
            std::path::Path::new("/srv"),
            "[task]\nname = \"t\"\nkind = \"workspace-free\"\ntimeout_seconds = 1\n\n[body]\nexecutor = \"/bin/true\"\n",
        )
        .unwrap();
        assert!(matches!(
            Launcher::thread(Arc::new(manifest)),
            Err(crate::errors::ThreadModeError::ExecutorBinary { .. })
        ));
    }
}
