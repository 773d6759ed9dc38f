//! The batch exporter: a bounded queue and one task that sends batches to the collector.

use super::{Config, ConfigError, SpanData, Stats};

/// What a [`super::Tracer`] shares with its export task.
pub(super) struct Shared {
    pub(super) config: Config,
}

impl Shared {
    pub(super) fn record(&self, span: SpanData) {
        todo!()
    }
    pub(super) async fn flush(&self, deadline: std::time::Duration) {
        todo!()
    }
    pub(super) fn stats(&self) -> Stats {
        todo!()
    }
}

pub(super) fn start(config: Config) -> Result<std::sync::Arc<Shared>, ConfigError> {
    todo!()
}
