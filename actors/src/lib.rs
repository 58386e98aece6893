//! vireo's actor system.
//!
//! # Layout
//! - [`vif`]: the VIF model, parsed strictly from Nova's `network_info`.
//! - [`external`]: Nova-shaped external events and the sink that receives them.
//! - [`wiring`]: what is wired on this host, as a stream.
//! - [`libvirt`]: every libvirt call, on dedicated threads, with events and reconnects.

pub mod external;
pub mod libvirt;
pub mod vif;
pub mod wiring;
