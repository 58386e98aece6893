//! The `vireo` command line under another name: the same [`vireo::cli::run`] as
//! `driver/src/main.rs`, built with the integration package so that its tests can run
//! `vireo agent` inside host B's namespaces.

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
