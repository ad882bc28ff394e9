//! The `claimgate` binary: parse arguments, start logging, run, map the result to an exit code.
//!
//! Exit codes: 0 success, 2 bad usage or configuration, 1 any other failure.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = claimgate::cli::Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match claimgate::cli::dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("claimgate: {e}");
            match e {
                claimgate::Error::Config(_) => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}
