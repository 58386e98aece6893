//! vireo: the virt driver a compute agent loads.
//!
//! # Layout
//! `ComputeDriver`, VIF plugging, network-service clients and the agent.
//! - [`cli`]: the `vireo` command line (`vireo events explain`).

pub mod cli;
