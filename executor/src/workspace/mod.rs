//! The lakeFS workspace of a workspace task: download, stage, fence, publish, clean up.

pub mod contention;
pub mod flow;
pub mod paths;
pub mod refusal;
pub mod scan;
pub mod settle;
