//! vireo: the virt driver a compute agent loads.
//!
//! # Layout
//! - [`network`]: the network service (Neutron REST client, embedded service).

pub mod network;
