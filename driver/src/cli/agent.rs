//! `vireo agent --config FILE`: run the compute agent until SIGTERM/SIGINT.
//!
//! Exit codes: 0 after a clean shutdown, 2 when the configuration or a token file it names is
//! invalid (one line on stderr naming the key), 1 when the agent failed otherwise.

use std::io::Write;

use super::AgentArgs;

/// Run the agent; returns the exit code.
pub fn run(args: &AgentArgs, stderr: &mut dyn Write) -> u8 {
    crate::agent::run(&args.config, stderr)
}
