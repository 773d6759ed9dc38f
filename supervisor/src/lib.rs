//! The perago command line: `check`, `extract`, `start`, `dev` (the `dev` feature, on by
//! default), `status`, `pause`, `resume`, `scale`, `reload`, `scaler`, `completions`. `start` and `dev` build their runtimes from one
//! [`plan`](crate::plan).
//! `main` calls [`run`], which parses the arguments, runs the command and maps every expected error to its exit
//! code (see [`errors::exit_codes`]).

#![forbid(unsafe_code)]

mod check;
pub mod cli;
mod control;
#[cfg(feature = "dev")]
mod dev;
#[cfg(test)]
mod error_texts;
pub mod errors;
mod extract;
mod out;
mod pause;
mod plan;
mod reload;
mod runtime;
mod scale;
mod scaler;
mod sdk_settings;
mod share;
mod start;
mod status;

use cli::{Cli, Command};
use errors::{ExpectedError, exit_codes};
use std::collections::BTreeMap;

/// Runs the command line with the process's arguments and environment; returns the exit code.
/// `bin_name` is the name help and usage show (`perago-supervisor` or `perago`).
pub fn run(bin_name: &'static str) -> i32 {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args
        .get(1)
        .is_some_and(|a| a == perago_sys::guard::BODY_GUARD_ARG)
    {
        // This process is the guard of one thread-mode body (see children.rs).
        return perago_sys::guard::body_guard_main(&args[2..]);
    }
    // `dev` runs the broker and the stock executor as this program (see dev.rs); both take
    // their configuration from the environment, as their own binaries do.
    match args.get(1).and_then(|a| a.to_str()) {
        Some(runtime::children::BROKER_ROLE_ARG) => return perago_broker::cli::main(),
        Some(runtime::children::EXECUTOR_ROLE_ARG) => return perago_executor::cli::main(),
        _ => {}
    }
    // Its environment may hold Conductor and lakeFS secrets, and it keeps the control and
    // slot tokens: no other process of this user (a body) may read them from /proc.
    if let Err(e) = perago_sys::memory::set_non_dumpable() {
        eprintln!(
            "warning: cannot make the supervisor non-dumpable: {}",
            perago_core::errors::DisplayChain(&e)
        );
    }
    // A setting that is not UTF-8 is an error naming it, never a silent default.
    let vars = match perago_core::env::utf8_environment(std::env::vars_os()) {
        Ok(vars) => vars,
        Err(errors) => {
            for e in errors {
                eprintln!("error: {}", perago_core::errors::DisplayChain(&e));
            }
            return exit_codes::FAILURE;
        }
    };
    run_with(bin_name, std::env::args_os(), &vars)
}

/// Runs the command line with the given arguments (argv[0] first) and environment.
pub fn run_with<I, T>(bin_name: &'static str, args: I, vars: &BTreeMap<String, String>) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::{CommandFactory as _, FromArgMatches as _};
    let parsed = Cli::command()
        .name(bin_name)
        .bin_name(bin_name)
        .try_get_matches_from(args)
        .and_then(|matches| {
            let mut cli = Cli::from_arg_matches(&matches)?;
            if let Command::Start(args) = &mut cli.command {
                // `-j` has a default: the SDK's thread_count applies only when it was not given.
                args.jobs_given = matches
                    .subcommand_matches("start")
                    .and_then(|m| m.value_source("jobs"))
                    == Some(clap::parser::ValueSource::CommandLine);
            }
            Ok(cli)
        });
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            // clap prints help/version to stdout with exit 0, usage errors to stderr with 2.
            let _ = e.print();
            return e.exit_code();
        }
    };
    if let Command::Completions(args) = &cli.command {
        use clap::CommandFactory as _;
        let mut command = Cli::command().name(bin_name).bin_name(bin_name);
        clap_complete::generate(args.shell, &mut command, bin_name, &mut std::io::stdout());
        return exit_codes::OK;
    }
    match dispatch(cli, vars) {
        Ok(()) => exit_codes::OK,
        Err(e) => {
            // A message may carry what a server answered: it must not drive the terminal.
            for line in perago_core::errors::DisplayChain(&e).to_string().lines() {
                eprintln!("error: {}", perago_core::result::escape_controls(line));
            }
            e.process_exit_code()
        }
    }
}

fn dispatch(cli: Cli, vars: &BTreeMap<String, String>) -> Result<(), ExpectedError> {
    match cli.command {
        Command::Check(args) => {
            let path = vars.get("PATH").map(std::ffi::OsString::from);
            out::print(&check::check_all(&args.manifests, path.as_ref(), vars)?)?;
        }
        Command::Extract(args) => {
            for note in extract::extract(&args.manifests, &args.output)? {
                eprintln!("{note}");
            }
        }
        Command::Start(args) => start::start(&args, vars)?,
        #[cfg(feature = "dev")]
        Command::Dev(args) => dev::dev(&args, vars)?,
        Command::Status(args) => status::status(&args, vars)?,
        Command::Pause(args) => pause::pause(&args, vars)?,
        Command::Resume(args) => pause::resume(&args, vars)?,
        Command::Scale(args) => scale::scale(&args, vars)?,
        Command::Reload(args) => control::reload(&args, vars)?,
        Command::Scaler(args) => scaler::scaler(&args, vars)?,
        Command::Completions(_) => unreachable!("handled before dispatch"),
    }
    Ok(())
}
