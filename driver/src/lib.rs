//! vireo: the virt driver a compute agent loads.
//!
//! # Layout
//! - [`network`]: the network service (Neutron REST client, embedded service).
//! - [`cli`]: the `vireo` command line (`vireo events explain`).

pub mod cli;
pub mod network;
