//! vireo: the virt driver a compute agent loads.
//!
//! # Layout
//! `ComputeDriver`, VIF plugging, network-service clients and the agent.
//! The `vireo` binary.
//!
//! - [`plug`]: host VIF plugging (OVS, OVS hybrid, Linux bridge, SR-IOV) and the wiring
//!   watcher.

pub mod plug;
