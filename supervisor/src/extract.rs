//! `extract`: write the TaskDef JSON a manifest describes.

use crate::errors::ExpectedError;
use perago_core::taskdef::task_def;
use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
};

/// Writes the TaskDef of each manifest: one to `output` (`-` = stdout), several into the
/// folder `output` as `<task name>.json` each, or to stdout as one JSON array. Every manifest
/// is loaded (and checked for a task name given twice) before anything is written.
pub(crate) fn extract(manifests: &[PathBuf], output: &Path) -> Result<Vec<String>, ExpectedError> {
    let loaded = crate::start::load_manifests(manifests)?;
    let defs: Vec<(String, serde_json::Value)> = loaded
        .iter()
        .map(|(_, m)| (m.task.name.clone(), task_def(m)))
        .collect();
    let pretty = |value: &serde_json::Value| {
        let mut json =
            serde_json::to_string_pretty(value).expect("a serde_json::Value always serializes");
        json.push('\n');
        json
    };
    let to_stdout = output == Path::new("-");
    match defs.as_slice() {
        [(name, def)] => {
            if to_stdout {
                crate::out::print(&pretty(def))?;
                return Ok(Vec::new());
            }
            write_atomically(output, &pretty(def))?;
            Ok(vec![format!(
                "wrote TaskDef {name} to {}",
                output.display()
            )])
        }
        _ if to_stdout => {
            let all: Vec<serde_json::Value> = defs.into_iter().map(|(_, def)| def).collect();
            crate::out::print(&pretty(&serde_json::Value::from(all)))?;
            Ok(Vec::new())
        }
        _ => {
            match fs::symlink_metadata(output) {
                Ok(meta) if !meta.is_dir() => {
                    return Err(ExpectedError::Write {
                        path: output.to_owned(),
                        source: std::io::Error::other(
                            "it exists and is not a folder; several manifests write one TaskDef file each into a folder",
                        ),
                    });
                }
                _ => {}
            }
            let mut notes = Vec::new();
            for (name, def) in &defs {
                let path = output.join(format!("{name}.json"));
                write_atomically(&path, &pretty(def))?;
                notes.push(format!("wrote TaskDef {name} to {}", path.display()));
            }
            Ok(notes)
        }
    }
}

/// Writes `json` to `output` atomically: a temporary file in the same folder, then a rename,
/// so a failed write never leaves half a TaskDef behind.
fn write_atomically(output: &Path, json: &str) -> Result<(), ExpectedError> {
    let write_err = |source| ExpectedError::Write {
        path: output.to_owned(),
        source,
    };
    // The rename below would replace whatever is at the path: only a regular file may be
    // replaced, never a symlink (or what it points to), a FIFO or a device.
    match fs::symlink_metadata(output) {
        Ok(meta) if !meta.file_type().is_file() => {
            return Err(write_err(std::io::Error::other(
                "it exists and is not a regular file (a symlink, folder, FIFO or device); refusing to replace it",
            )));
        }
        _ => {}
    }
    let dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir).map_err(write_err)?;
    let file_name = output
        .file_name()
        .ok_or_else(|| write_err(std::io::Error::other("the output path names no file")))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    // `create_new`: never through a symlink or file someone left at the temporary name.
    let result = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(json.as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| fs::rename(&tmp, output));
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(write_err(e));
    }
    Ok(())
}
