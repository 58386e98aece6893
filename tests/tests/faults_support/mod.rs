//! The fault seams of the cross-crate tests, one module per fault family of docs/FAULTS.md.
//! Each is a real part with a seam in front of it, never a stand-in for it: the events the
//! embedded network service really sends pass through [`events::TeeSink`], its calls
//! through [`network::FaultyNetwork`], the recording plugger's calls through
//! [`plug::GatedPlugger`], and [`libvirt::LibvirtHold`] occupies a real connection's workers.
//! [`common::TestCloud`](super::common::TestCloud) puts one of each in front of every host;
//! the fault matrix (`fault_matrix`) and the flow tests arm them.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

pub mod events;
pub mod libvirt;
pub mod network;
pub mod plug;

// Each test file uses the families it arms.
#[allow(unused_imports)]
pub use events::*;
#[allow(unused_imports)]
pub use libvirt::*;
#[allow(unused_imports)]
pub use network::*;
#[allow(unused_imports)]
pub use plug::*;

/// A point an operation is held at until the test lets it go.
#[derive(Debug)]
pub struct Hold {
    reached: tokio::sync::watch::Sender<bool>,
    released: tokio::sync::watch::Sender<bool>,
}

impl Default for Hold {
    fn default() -> Self {
        Hold {
            reached: tokio::sync::watch::channel(false).0,
            released: tokio::sync::watch::channel(false).0,
        }
    }
}

impl Hold {
    pub fn new() -> Arc<Hold> {
        Arc::new(Hold::default())
    }

    /// Called by the seam: mark the hold reached and wait for the release.
    pub async fn pass(&self) {
        self.reached.send_replace(true);
        let mut rx = self.released.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    pub fn is_reached(&self) -> bool {
        *self.reached.borrow()
    }

    /// Wait (10 s at most) until the operation is held here.
    pub async fn reached(&self, what: &str) {
        let mut rx = self.reached.subscribe();
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|r| *r))
            .await
            .unwrap_or_else(|_| panic!("the operation never reached {what}"))
            .unwrap();
    }

    pub fn release(&self) {
        self.released.send_replace(true);
    }
}
