//! What is wired on this host: the event model's "wired" input.
//!
//! A [`WiringSource`] reports, per port id, when the port's host device becomes wired (an OVS
//! Interface with the port's `iface-id` got an `ofport`; a tap was enslaved to its bridge) or
//! unwired. The real source watches OVSDB and netlink; the embedded network service and the
//! instance actors consume the stream.

use std::fmt;

use tokio::sync::broadcast;

use crate::vif::PortId;

/// A port's device became wired or unwired on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WiringChange {
    /// The port.
    pub port: PortId,
    /// The host device that changed (tap, qvo, ...).
    pub device: String,
    /// True when now wired.
    pub wired: bool,
}

/// A stream of wiring changes plus the current wired set.
pub trait WiringSource: Send + Sync + fmt::Debug + 'static {
    /// Changes from now on. A receiver that lags loses the oldest changes (see
    /// [`broadcast::error::RecvError::Lagged`]) and should re-read [`WiringSource::wired`].
    fn subscribe(&self) -> broadcast::Receiver<WiringChange>;
    /// Ports wired right now.
    fn wired(&self) -> Vec<PortId>;
}
