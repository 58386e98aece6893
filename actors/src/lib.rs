//! vireo's actor system.
//!
//! # Layout
//! - [`vif`]: the VIF model, parsed strictly from Nova's `network_info`.
//! - [`external`]: Nova-shaped external events and the sink that receives them.
//! - [`lifecycle`]: the instance lifecycle state machine and which requests each state accepts.
//! - [`wiring`]: what is wired on this host, as a stream.
//! - [`network`]: the network service as the flows see it (`NetworkApi`).
//! - [`libvirt`]: every libvirt call, on dedicated threads, with events and reconnects.

pub mod external;
pub mod libvirt;
pub mod lifecycle;
pub mod network;
pub mod vif;
pub mod wiring;
