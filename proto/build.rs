//! Compiles the .proto files with protox (a pure-Rust protobuf compiler, so no system `protoc`
//! is needed), generates the tonic/prost code from the descriptor set, and writes the encoded
//! descriptor set to OUT_DIR for gRPC server reflection.

#![forbid(unsafe_code)]

use prost::Message as _;
use std::{env, fs, path::PathBuf};

const PROTOS: &[&str] = &[
    "perago/slot/v1/slot.proto",
    "perago/admin/v1/admin.proto",
    "perago/supervisor/v1/supervisor.proto",
];

/// KEDA's external scaler protocol (its own package and descriptor set: the scaler reflects
/// only it, the perago sockets only theirs).
const EXTERNAL_SCALER: &str = "externalscaler/externalscaler.proto";

/// OpenTelemetry's OTLP trace protocol, vendored from open-telemetry/opentelemetry-proto
/// (`opentelemetry/`): what the broker exports traces with, and the test suite's receiver
/// serves. Not reflected by any perago socket.
const OTLP_TRACES: &str = "opentelemetry/proto/collector/trace/v1/trace_service.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS.iter().chain([&EXTERNAL_SCALER]) {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-changed=opentelemetry");
    // Source info keeps the comments: they become rustdoc on the generated types, and
    // `grpcurl describe` shows them through reflection.
    let fds = protox::Compiler::new(["."])?
        .include_source_info(true)
        .include_imports(true)
        .open_files(PROTOS.iter().copied())?
        .file_descriptor_set();

    let scaler_fds = protox::Compiler::new(["."])?
        .include_source_info(true)
        .include_imports(true)
        .open_files([EXTERNAL_SCALER])?
        .file_descriptor_set();

    let otlp_fds = protox::Compiler::new(["."])?
        .include_imports(true)
        .open_files([OTLP_TRACES])?
        .file_descriptor_set();

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out_dir.join("perago_descriptor.bin"), fds.encode_to_vec())?;
    fs::write(
        out_dir.join("externalscaler_descriptor.bin"),
        scaler_fds.encode_to_vec(),
    )?;
    let mut all = fds;
    all.file.extend(scaler_fds.file);
    all.file.extend(otlp_fds.file);

    tonic_prost_build::configure()
        // The counters are listed once, in the .proto: `status` prints them by serialising.
        .type_attribute(
            "perago.admin.v1.BrokerCounters",
            "#[derive(serde::Serialize)]",
        )
        // Boxed: most assignments carry no trace, and the broker's `Effect::Send` holds a whole
        // message inline.
        .boxed(".perago.slot.v1.Assignment.trace")
        .build_client(true)
        .build_server(true)
        .compile_fds(all)?;
    Ok(())
}
