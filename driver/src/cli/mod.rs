//! The `vireo` command line: argument parsing and dispatch to subcommands.
//!
//! This module owns the clap definition. Each subcommand lives in its own module and is a
//! testable function over (input reader, output writers) returning the exit code; `main` only
//! hands it the process's stdio.
//!
//! - `vireo demo` ([`demo`]): the main job on the embedded default.
//! - `vireo agent --config FILE` ([`agent`]): run the compute agent.
//! - `vireo instance create|list|show|delete|action|operation` ([`instance`]) and
//!   `vireo events send` ([`send`]): clients of a running agent.
//! - `vireo events explain` ([`explain`]): the event model for an operation.

pub mod agent;
pub mod demo;
pub mod explain;
pub mod instance;
mod remote;
pub mod send;

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// vireo: the hypervisor layer of one compute host, over libvirt.
///
/// `vireo agent` runs the compute agent: an HTTP API over the virt driver (instances, their
/// operations, the host), Nova's external-events endpoint for Neutron, and metrics. The
/// `instance` and `events send` commands are its clients (`--url`, `--token-file`, or
/// $VIREO_URL and $VIREO_TOKEN_FILE). `events explain` shows, without an agent, which Neutron
/// events an operation waits for and why. `demo` walks a normal life and three Nova bugs
/// vireo must never have on libvirt's test driver.
#[derive(Debug, Parser)]
#[command(name = "vireo", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Walk a normal life and the three seed scenarios on the embedded default (libvirt's
    /// test driver and the in-process network service), printing a timeline and a leak check.
    Demo(demo::DemoArgs),
    /// Run the compute agent (HTTP API, external-events endpoint, metrics) until SIGTERM.
    Agent(AgentArgs),
    /// Instances on a running agent.
    Instance {
        /// The instance subcommand.
        #[command(subcommand)]
        command: instance::InstanceCommand,
    },
    /// Neutron external events.
    Events {
        /// The events subcommand.
        #[command(subcommand)]
        command: EventsCommand,
    },
}

/// Options of `vireo agent`.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// The agent's TOML configuration file (every key is optional; an empty file drives
    /// qemu:///system with the token in /etc/vireo/api-token).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
}

/// How the client commands reach the agent.
#[derive(Debug, Clone, Default, Args)]
pub struct ClientOpts {
    /// The agent's URL [default: $VIREO_URL, else http://127.0.0.1:8774].
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// File holding the API token, mode 0600 [default: $VIREO_TOKEN_FILE, else
    /// /etc/vireo/api-token].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Header carrying the token [default: X-Auth-Token].
    #[arg(long, value_name = "NAME")]
    pub token_header: Option<String>,
    /// Print the agent's JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// How --wait shows a running operation on standard error.
    #[arg(long, value_enum, default_value_t = instance::ProgressStyle::Auto)]
    pub progress: instance::ProgressStyle,
}

/// `vireo events ...`.
#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// Read {"operation", "network_info", "migration"} on stdin and show which VIF produces a
    /// bind-time, plug-time or no network-vif-plugged event, and why.
    Explain(ExplainArgs),
    /// Post external events to a running agent, as Neutron's Nova notifier does.
    Send(send::SendArgs),
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
/// Exit code when the agent refused a request, could not be reached, or an awaited operation
/// failed.
pub const EXIT_FAILED: u8 = 1;

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
        Command::Demo(args) => demo::run(args, stdout, stderr),
        Command::Agent(args) => agent::run(&args, stderr),
        Command::Instance { command } => instance::run(command, stdin, stdout, stderr),
        Command::Events {
            command: EventsCommand::Explain(args),
        } => explain::run(args, stdin, stdout, stderr),
        Command::Events {
            command: EventsCommand::Send(args),
        } => send::run(args, stdin, stdout, stderr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(args: &[&str]) -> (u8, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut stdin: &[u8] = b"";
        let code = run(
            std::iter::once("vireo").chain(args.iter().copied()),
            &mut stdin,
            &mut out,
            &mut err,
        );
        (
            code,
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        )
    }

    #[test]
    fn free_strings_are_checked_before_anything_is_sent() {
        let uuid = "00000000-0000-0000-0000-000000000001";
        let (code, _, err) = run_args(&["instance", "action", uuid, "explode"]);
        assert_eq!(code, EXIT_INVALID_INPUT, "{err}");
        assert!(err.contains("invalid value 'explode'"), "{err}");
        assert!(err.contains("power-on"), "names the possible values: {err}");
        for (flag, value) in [("--status", "done"), ("--name", "network-vif-exploded")] {
            let (code, _, err) = run_args(&["events", "send", "--server", uuid, flag, value]);
            assert_eq!(code, EXIT_INVALID_INPUT, "{flag}: {err}");
            assert!(err.contains(&format!("invalid value '{value}'")), "{err}");
        }
        let (code, _, err) = run_args(&["instance", "list", "--progress", "fancy"]);
        assert_eq!(code, EXIT_INVALID_INPUT, "{err}");
    }

    #[test]
    fn help_says_what_the_api_wants_and_names_no_source_path() {
        let (code, out, _) = run_args(&["instance", "create", "--help"]);
        assert_eq!(code, 0);
        assert!(out.contains("\"memory_mb\""), "{out}");
        assert!(!out.contains("memory_mib"), "{out}");
        let (_, out, _) = run_args(&["instance", "action", "--help"]);
        assert!(out.contains("\"memory_mb\""), "{out}");
        let (_, top, _) = run_args(&["--help"]);
        assert!(top.contains("hypervisor layer"), "{top}");
        for args in [
            &["--help"][..],
            &["agent", "--help"][..],
            &["instance", "create", "--help"][..],
        ] {
            let (_, out, _) = run_args(args);
            assert!(!out.contains("docs/"), "{args:?}: {out}");
        }
    }
}
