//! vireo: the virt driver a compute agent loads.
//!
//! # Layout
//! - [`compute`]: the [`compute::ComputeDriver`] API a compute agent loads, and
//!   [`compute::load_driver`].
//! - [`demo`]: `vireo demo`, the main job: a normal life and the three seed scenarios on the
//!   embedded default.
//! - [`local`]: the embedded default: hosts on libvirt's test driver sharing the embedded
//!   network service (the demo and the `test:///` tier).
//! - [`network`]: the network service (Neutron REST client, embedded service).
//! - [`plug`]: host VIF plugging (OVS, OVS hybrid, Linux bridge, SR-IOV) and the wiring
//!   watcher.
//! - [`storage`]: instance storage on the host: the image cache.
//! - [`agent`]: the compute agent (`vireo agent`): HTTP API, external-events endpoint,
//!   metrics, shutdown.
//! - [`config`]: the agent's TOML configuration.
//! - [`client`]: the HTTP client of the agent's API (the CLI, other hosts).
//! - [`cli`]: the `vireo` command line.

pub mod agent;
pub mod cli;
pub mod client;
pub mod compute;
pub mod config;
pub mod demo;
pub mod local;
pub mod network;
pub mod plug;
pub mod storage;
