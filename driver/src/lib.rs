//! vireo: the virt driver a compute agent loads.
//!
//! # Layout
//! `ComputeDriver`, VIF plugging, network-service clients and the agent.
//! The `vireo` binary.
//! - [`network`]: the network service (Neutron REST client, embedded service).

pub mod network;
