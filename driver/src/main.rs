//! The `vireo` binary: hands the process's arguments and stdio to [`vireo::cli::run`].

use std::io;
use std::process::ExitCode;

fn main() -> ExitCode {
    let code = vireo::cli::run(
        std::env::args_os(),
        &mut io::stdin().lock(),
        &mut io::stdout().lock(),
        &mut io::stderr().lock(),
    );
    ExitCode::from(code)
}
