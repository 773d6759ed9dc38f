//! `extract`: write the TaskDef JSON a manifest describes.

use crate::errors::ExpectedError;
use perago_core::{manifest::Manifest, taskdef::task_def};
use std::{fs, io::Write as _, path::Path};

/// Writes the TaskDef to `output` (`-` = stdout) atomically: a temporary file in the same
/// folder, then a rename, so a failed write never leaves half a TaskDef behind.
pub(crate) fn extract(manifest: &Path, output: &Path) -> Result<Option<String>, ExpectedError> {
    let manifest = Manifest::load(manifest)?;
    let mut json = serde_json::to_string_pretty(&task_def(&manifest))
        .expect("a serde_json::Value always serializes");
    json.push('\n');
    if output == Path::new("-") {
        crate::out::print(&json)?;
        return Ok(None);
    }
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
    Ok(Some(format!(
        "wrote TaskDef {} to {}",
        manifest.task.name,
        output.display()
    )))
}
