//! `scale`: change a running runtime's executor count over `Admin.Scale` (issue #26 item 4).
//! The broker takes the new range; the supervisor follows the slots it wants over
//! `Admin.Watch`, as it does for an adaptive runtime.

use crate::{cli::ScaleArgs, errors::ExpectedError, status};
use perago_proto::admin::v1::{ScaleRequest, admin_client::AdminClient};
use std::collections::BTreeMap;

/// `N` or `MIN..MAX`.
fn range(min: u32, max: u32) -> String {
    if min == max {
        min.to_string()
    } else {
        format!("{min}..{max}")
    }
}

pub(crate) fn scale(
    args: &ScaleArgs,
    vars: &BTreeMap<String, String>,
) -> Result<(), ExpectedError> {
    let (min, max) = perago_core::capacity::parse_jobs(&args.jobs).map_err(|e| {
        let text = perago_core::errors::chain(&e);
        // Every message names the setting.
        ExpectedError::Usage(if text.starts_with("-j") {
            text
        } else {
            format!("-j {:?}: {text}", args.jobs)
        })
    })?;
    // Every runtime is tried, each failure reported after the others were scaled.
    crate::pause::each_of(
        args.socket.as_ref(),
        &args.manifests,
        vars,
        |socket, runtime| {
            let answer = status::call_broker(socket, runtime, |channel| async move {
                AdminClient::new(channel)
                    .scale(ScaleRequest {
                        min_executors: min,
                        max_executors: max,
                    })
                    .await
                    .map(tonic::Response::into_inner)
            })?;
            Ok(format!(
                "scaled {}: -j {} -> -j {}",
                socket.display(),
                range(answer.previous_min_executors, answer.previous_max_executors),
                range(min, max)
            ))
        },
    )
}
