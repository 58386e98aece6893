//! vireo's actor system.
//!
//! # Layout
//! - [`vif`]: the VIF model, parsed strictly from Nova's `network_info`.
//! - [`external`]: Nova-shaped external events and the sink that receives them.
//! - [`lifecycle`]: the instance lifecycle state machine and which requests each state accepts.
//! - [`wiring`]: what is wired on this host, as a stream.
//! - [`network`]: the network service as the flows see it (`NetworkApi`).
//! - [`libvirt`]: every libvirt call, on dedicated threads, with events and reconnects.
//! - [`predict`]: which VIF produces a bind-time, plug-time or no event for an operation.
//! - [`events`]: the NetworkEventActor that holds waits and buffers early events.
//! - [`instance`]: one actor per instance: lifecycle, operations and their rollbacks.
//! - [`host`]: the registry of instance actors, libvirt event routing, recovery at start-up.
//! - [`runtime`]: the named thread the actors run on.
//! - [`vif_config`]: which libvirt device connects a VIF (Nova's libvirt VIF driver facts).
//! - [`plug`]: the VIF plugging trait, its data types and the static plugger of `test:///`
//!   (its test doubles in `plug::testing`, feature `test-support`).

pub mod events;
pub mod external;
pub mod host;
pub mod instance;
pub mod libvirt;
pub mod lifecycle;
pub mod network;
pub mod plug;
pub mod predict;
pub mod runtime;
pub mod storage;
pub mod vif;
pub mod vif_config;
pub mod wiring;
