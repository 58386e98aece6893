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
//! - [`cli`]: the `vireo` command line (`vireo events explain`).
//! - [`plug`]: host VIF plugging (OVS, OVS hybrid, Linux bridge, SR-IOV) and the wiring
//!   watcher.

pub mod cli;
pub mod compute;
pub mod demo;
pub mod local;
pub mod network;
pub mod plug;
