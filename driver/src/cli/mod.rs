//! The `vireo` command line: argument parsing and dispatch to subcommands.
//!
//! This module owns the clap definition. Each subcommand lives in its own module and is a
//! testable function over (input reader, output writers) returning the exit code; `main` only
//! hands it the process's stdio.

pub mod explain;

use std::ffi::OsString;
use std::io::{Read, Write};

use clap::{Args, Parser, Subcommand};

/// vireo: the libvirt virt driver, its agent and tools.
#[derive(Debug, Parser)]
#[command(name = "vireo", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Neutron external events.
    Events {
        /// The events subcommand.
        #[command(subcommand)]
        command: EventsCommand,
    },
}

/// `vireo events ...`.
#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// Read {"operation", "network_info", "migration"} on stdin and show which VIF produces a
    /// bind-time, plug-time or no network-vif-plugged event, and why.
    Explain(ExplainArgs),
}

/// Options of `vireo events explain`.
#[derive(Debug, Clone, Copy, Args)]
pub struct ExplainArgs {
    /// Print JSON: {"bind_time": [...], "plug_time": [...], "none": [...]}.
    #[arg(long)]
    pub json: bool,
}

/// Exit code for invalid input (clap uses the same for bad arguments).
pub const EXIT_INVALID_INPUT: u8 = 2;
/// Exit code when output could not be written.
pub const EXIT_IO: u8 = 1;

/// Parse `args` (program name first) and run the subcommand. Returns the exit code.
pub fn run<I, T>(
    args: I,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let sink: &mut dyn Write = if e.use_stderr() { stderr } else { stdout };
            let _ = write!(sink, "{e}");
            return u8::try_from(e.exit_code()).unwrap_or(EXIT_INVALID_INPUT);
        }
    };
    match cli.command {
        Command::Events {
            command: EventsCommand::Explain(args),
        } => explain::run(args, stdin, stdout, stderr),
    }
}
