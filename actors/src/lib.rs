//! vireo's actor system.
//!
//! # Layout
//! - [`vif`]: the VIF model, parsed strictly from Nova's `network_info`.
//! - [`external`]: Nova-shaped external events and the sink that receives them.
//! - [`wiring`]: what is wired on this host, as a stream.
//! - [`plug`]: the VIF plugging trait, its data types and the recording plugger of `test:///`.

pub mod external;
pub mod plug;
pub mod vif;
pub mod wiring;
