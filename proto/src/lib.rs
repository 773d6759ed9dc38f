//! The wire protocols of perago, generated from the `.proto` files beside this crate.
//!
//! - [`slot::v1`]: broker ⇄ executor (`Slot.Attach`, `Slot.ReloadAttempt`) and supervisor →
//!   broker (`Control`). The message sequence is documented at the top of
//!   `perago/slot/v1/slot.proto`.
//! - [`admin::v1`]: `Admin.Status`, `Admin.Drain`, `Admin.Metrics` and `Admin.Watch`, for
//!   operators, `perago-supervisor status` and a multi-task supervisor's merged `/metrics`.
//! - [`supervisor::v1`]: `Supervisor.Reload`, the supervisor's own control socket
//!   (`perago-supervisor reload`).
//! - [`externalscaler`]: KEDA's `externalscaler.ExternalScaler`, served by
//!   `perago-supervisor scaler` ([`EXTERNALSCALER_DESCRIPTOR_SET`] for its reflection).
//!
//! [`FILE_DESCRIPTOR_SET`] is the encoded descriptor set of both files, for gRPC server
//! reflection. Code generation runs in `build.rs` with protox; see `README.md`.

#![forbid(unsafe_code)]

/// The slot protocol.
pub mod slot {
    /// Version 1 of the slot protocol.
    #[allow(missing_debug_implementations, unreachable_pub, clippy::all)]
    pub mod v1 {
        tonic::include_proto!("perago.slot.v1");
    }
}

/// The admin protocol.
pub mod admin {
    /// Version 1 of the admin protocol.
    #[allow(missing_debug_implementations, unreachable_pub, clippy::all)]
    pub mod v1 {
        tonic::include_proto!("perago.admin.v1");
    }
}

/// The supervisor's control protocol (`perago-supervisor reload`).
pub mod supervisor {
    /// Version 1 of the supervisor's control protocol.
    #[allow(missing_debug_implementations, unreachable_pub, clippy::all)]
    pub mod v1 {
        tonic::include_proto!("perago.supervisor.v1");
    }
}

/// KEDA's external scaler protocol (`externalscaler.ExternalScaler`), which
/// `perago-supervisor scaler` serves: KEDA's wire contract, see
/// `externalscaler/externalscaler.proto`.
#[allow(missing_debug_implementations, unreachable_pub, clippy::all)]
pub mod externalscaler {
    tonic::include_proto!("externalscaler");
}

/// OpenTelemetry's OTLP trace protocol (`opentelemetry.proto.*`, vendored from
/// open-telemetry/opentelemetry-proto under `opentelemetry/`): the broker's trace exporter
/// sends `collector::trace::v1::ExportTraceServiceRequest`s; the test suite serves
/// `TraceService` to receive them.
#[allow(missing_debug_implementations, unreachable_pub, clippy::all)]
pub mod otlp {
    /// `opentelemetry.proto.common.v1`: attribute values.
    pub mod common {
        /// Version 1.
        pub mod v1 {
            tonic::include_proto!("opentelemetry.proto.common.v1");
        }
    }
    /// `opentelemetry.proto.resource.v1`: the exporting service.
    pub mod resource {
        /// Version 1.
        pub mod v1 {
            tonic::include_proto!("opentelemetry.proto.resource.v1");
        }
    }
    /// `opentelemetry.proto.trace.v1`: spans.
    pub mod trace {
        /// Version 1.
        pub mod v1 {
            tonic::include_proto!("opentelemetry.proto.trace.v1");
        }
    }
    /// `opentelemetry.proto.collector.trace.v1`: the `TraceService.Export` RPC.
    pub mod collector {
        /// The trace collector.
        pub mod trace {
            /// Version 1.
            pub mod v1 {
                tonic::include_proto!("opentelemetry.proto.collector.trace.v1");
            }
        }
    }
}

mod phase;

/// The encoded `FileDescriptorSet` of every perago `.proto` file, for tonic-reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("perago_descriptor");

/// The encoded `FileDescriptorSet` of KEDA's external scaler protocol, for the scaler's
/// reflection.
pub const EXTERNALSCALER_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("externalscaler_descriptor");

/// The metadata key that carries the control token on `Control` calls.
pub const CONTROL_TOKEN_METADATA: &str = "x-perago-control-token";

/// The largest task input (and output) perago carries inline: Conductor's largest default
/// payload threshold (above it Conductor fails the task or needs external storage).
pub const MAX_TASK_PAYLOAD_BYTES: usize = 10 * 1024 * 1024;

/// The slot protocol's message limit on both sides: a payload of [`MAX_TASK_PAYLOAD_BYTES`]
/// plus the attempt's other fields (tonic's default of 4 MiB would kill an executor on a
/// 5 MiB input).
pub const MAX_SLOT_MESSAGE_BYTES: usize = MAX_TASK_PAYLOAD_BYTES + 1024 * 1024;

/// The largest HTTP/2 frame a perago socket's peer may send it (`SETTINGS_MAX_FRAME_SIZE`):
/// 1 MiB, so a big assignment or completion crosses in a few frames instead of 16 KiB ones
/// (h2's default, 64 frames per MiB, each framed, counted and buffered on its own). A peer may
/// still send smaller ones; HTTP/2 allows at most 16 MiB − 1.
pub const SLOT_FRAME_BYTES: u32 = 1024 * 1024;
