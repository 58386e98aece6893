//! The `vireo` binary: hands the process's arguments and stdio to [`vireo::cli::run`].
//!
//! The stdio handles are passed unlocked: `vireo agent` logs to stderr from several threads,
//! and a lock held here for the whole run would block them.

use std::io;
use std::process::ExitCode;

fn main() -> ExitCode {
    let code = vireo::cli::run(
        std::env::args_os(),
        &mut io::stdin(),
        &mut io::stdout(),
        &mut io::stderr(),
    );
    ExitCode::from(code)
}
