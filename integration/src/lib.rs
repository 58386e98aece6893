//! The integration tier's harness: vireo's real `LibvirtDriver` on `qemu:///system`, this
//! machine's Open vSwitch and kernel bridges, the real Neutron of
//! `integration/host-setup.sh up --with-neutron`, and Neutron's Nova notifier posting to the
//! vireo agent's own events endpoint. The tests are in `integration/tests/stack.rs`, the
//! benchmarks in `integration/benches/`.
//!
//! # Layout
//! - [`env`]: the running set-up's facts (`/var/lib/vireo-integration/neutron.env`).
//! - [`endpoint`]: the events endpoint on `127.0.0.1:8774` and the log of event arrivals.
//! - [`host`]: one compute host of a test (driver, plugger, event actor, network service).
//! - [`split`]: Neutron and the embedded service behind one `NetworkApi`.
//! - [`neutron`]: raw Neutron calls, the test's ports, their clean-up guard.
//! - [`leak`]: the end-of-scenario leak check.
//! - [`timing`]: where an operation's time went; the timing table.
//! - [`firewall`]: the OVS agent's firewall driver (hybrid or native plugging).
//! - [`guest`]: the bootable guest and its console.
//! - [`scene`]: one scenario's context; [`runner`]: the test binary's own harness.

pub mod endpoint;
pub mod env;
pub mod firewall;
pub mod guest;
pub mod host;
pub mod leak;
pub mod neutron;
pub mod runner;
pub mod scene;
pub mod split;
pub mod timing;

/// What went wrong in the harness (not in vireo: vireo's errors are the tests' subject).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The set-up is missing or unusable.
    #[error("set-up: {0}")]
    Setup(String),
    /// An I/O operation failed.
    #[error("{what}")]
    Io {
        /// What was attempted.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The leak check found something.
    #[error("leak check:\n  {0}")]
    Leak(String),
}

/// An error and its sources on one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}
