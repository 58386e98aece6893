//! `vireo demo`: runs [`crate::demo`] on a tokio runtime and prints its timeline.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::demo::{run as run_demo, DemoOptions};

use super::{EXIT_FAILED, EXIT_IO};

/// Options of `vireo demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// `h1`'s libvirt URI (default: libvirt's test driver). With `qemu:///system`, `h1` runs on
    /// this machine's libvirtd with real devices (Open vSwitch, kernel bridges).
    #[arg(long, value_name = "URI")]
    pub libvirt: Option<String>,
    /// Delay of the embedded network service's events, in milliseconds (Neutron: 300–1600).
    #[arg(long, value_name = "MS", default_value_t = 300)]
    pub event_delay_ms: u64,
    /// `vif_plugging_timeout` in seconds.
    #[arg(long, value_name = "S", default_value_t = 300)]
    pub timeout: u64,
    /// Where the test driver's files go (default: a fresh directory under the temp dir).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The real host's OVS integration bridge (never Neutron's br-int).
    #[arg(long, value_name = "NAME", default_value = "br-vireo-demo")]
    pub bridge: String,
    /// Print the summary as JSON after the timeline.
    #[arg(long)]
    pub json: bool,
    /// Each operation's progress while it runs, on standard error (auto: live on a
    /// terminal, plain lines otherwise).
    #[arg(long, value_enum, default_value_t = super::instance::ProgressStyle::Auto)]
    pub progress: super::instance::ProgressStyle,
}

/// Run the demo. Exit 0 when every scenario behaved and nothing leaked.
pub fn run(args: DemoArgs, stdout: &mut dyn Write, stderr: &mut dyn Write) -> u8 {
    let defaults = DemoOptions::default();
    let opts = DemoOptions {
        libvirt: args.libvirt,
        event_delay: Duration::from_millis(args.event_delay_ms),
        timeout: Duration::from_secs(args.timeout),
        state_dir: args.state_dir.unwrap_or(defaults.state_dir),
        bridge: args.bridge,
        progress: Some(match args.progress {
            super::instance::ProgressStyle::Live => true,
            super::instance::ProgressStyle::Plain => false,
            super::instance::ProgressStyle::Auto => {
                std::io::IsTerminal::is_terminal(&std::io::stderr())
            }
        }),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(stderr, "vireo demo: start the runtime: {e}");
            return EXIT_FAILED;
        }
    };
    let result = rt.block_on(run_demo(opts, stdout));
    match result {
        Ok(summary) => {
            if args.json {
                match serde_json::to_string_pretty(&summary) {
                    Ok(j) => {
                        if writeln!(stdout, "{j}").is_err() {
                            return EXIT_IO;
                        }
                    }
                    Err(e) => {
                        let _ = writeln!(stderr, "vireo demo: {e}");
                        return EXIT_IO;
                    }
                }
            }
            if summary.leaks.is_empty() && summary.timeouts == 0 {
                0
            } else {
                EXIT_FAILED
            }
        }
        Err(e) => {
            let _ = writeln!(
                stderr,
                "vireo demo: {}",
                vireo_actors::instance::error_chain(&e)
            );
            EXIT_FAILED
        }
    }
}
