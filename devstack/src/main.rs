#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let args = perago_devstack::cli::Args::parse();
    perago_devstack::cli::init_tracing(args.verbose);
    match perago_devstack::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            perago_devstack::cli::report(&error);
            ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(1))
        }
    }
}
