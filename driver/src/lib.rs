//! vireo: the virt driver a compute agent loads.
//!
//! # Layout
//! - [`network`]: the network service (Neutron REST client, embedded service).
//! - [`agent`]: the compute agent (`vireo agent`): HTTP API, external-events endpoint,
//!   metrics, shutdown.
//! - [`config`]: the agent's TOML configuration.
//! - [`client`]: the HTTP client of the agent's API (the CLI, other hosts).
//! - [`cli`]: the `vireo` command line.

pub mod agent;
pub mod cli;
pub mod client;
pub mod config;
pub mod network;
