//! The `claimgate` binary: parse arguments, start logging, run, map the result to an exit code.
//!
//! Exit codes: 0 success, 2 bad usage or configuration, 1 any other failure.

use std::process::ExitCode;

/// mimalloc, not the system allocator: see `claimgate::support::allocator`.
#[global_allocator]
static ALLOCATOR: claimgate::support::allocator::MiMalloc = claimgate::support::allocator::MiMalloc;

fn main() -> ExitCode {
    claimgate::support::allocator::tune();
    let cli = claimgate::cli::parse();
    if cli.command.scans_the_ledger() {
        claimgate::support::allocator::keep_freed_pages();
    }
    let result = claimgate::observe::logging::init(&cli.global.logging())
        .and_then(|()| claimgate::cli::dispatch(cli));
    match result {
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
