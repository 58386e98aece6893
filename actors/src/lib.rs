//! vireo's actor system.
//!
//! # Layout
//! - [`vif`]: the VIF model, parsed strictly from Nova's `network_info`.
//! - [`external`]: Nova-shaped external events and the sink that receives them.
//! - [`wiring`]: what is wired on this host, as a stream.
//! - [`vif_config`]: which libvirt device connects a VIF (Nova's libvirt VIF driver facts).

pub mod external;
pub mod vif;
pub mod vif_config;
pub mod wiring;
