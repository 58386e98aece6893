//! Plug faults' pause seam: a gate in front of the recording plugger that holds an
//! operation at a plug or unplug call until the test lets it go.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use vireo_actors::plug::testing::RecordingPlugger;
use vireo_actors::plug::VifPlugger;
use vireo_actors::vif::PortId;

use super::Hold;

/// A plugger call a [`PlugGate`] can hold an operation at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PlugPoint {
    Plug,
    Unplug,
    /// libvirt made the domain's devices (it started).
    Attached,
    /// libvirt removed the domain's devices (it stopped).
    Detached,
}

/// The pause seam of the plugger: holds an operation at a [`PlugPoint`].
#[derive(Debug, Default)]
pub struct PlugGate {
    holds: Mutex<Vec<(PlugPoint, usize, Arc<Hold>)>>,
}

impl PlugGate {
    /// Hold the operation at the next call of `point` after `skip` others.
    pub fn hold(&self, point: PlugPoint, skip: usize) -> Arc<Hold> {
        let h = Hold::new();
        self.holds.lock().unwrap().push((point, skip, h.clone()));
        h
    }

    pub fn clear(&self) {
        self.holds.lock().unwrap().clear();
    }

    async fn pass(&self, point: PlugPoint) {
        let hold = {
            let mut holds = self.holds.lock().unwrap();
            match holds.iter().position(|(p, _, _)| *p == point) {
                Some(i) if holds[i].1 == 0 => Some(holds.remove(i).2),
                Some(i) => {
                    holds[i].1 -= 1;
                    None
                }
                None => None,
            }
        };
        if let Some(h) = hold {
            h.pass().await;
        }
    }
}

/// The recording plugger behind a [`PlugGate`] (the hosts of a [`TestCloud`] use it).
#[derive(Debug)]
pub struct GatedPlugger {
    inner: Arc<RecordingPlugger>,
    gate: Arc<PlugGate>,
}

impl GatedPlugger {
    /// `inner` behind `gate`.
    pub fn new(inner: Arc<RecordingPlugger>, gate: Arc<PlugGate>) -> GatedPlugger {
        GatedPlugger { inner, gate }
    }
}

#[async_trait]
impl VifPlugger for GatedPlugger {
    async fn plug(
        &self,
        ctx: &vireo_actors::plug::PlugContext,
        vif: &vireo_actors::vif::Vif,
    ) -> Result<vireo_actors::plug::Plugged, vireo_actors::plug::PlugError> {
        self.gate.pass(PlugPoint::Plug).await;
        self.inner.plug(ctx, vif).await
    }

    async fn unplug(
        &self,
        ctx: &vireo_actors::plug::PlugContext,
        vif: &vireo_actors::vif::Vif,
    ) -> Result<(), vireo_actors::plug::PlugError> {
        self.gate.pass(PlugPoint::Unplug).await;
        self.inner.unplug(ctx, vif).await
    }

    fn wiring(&self) -> Arc<dyn vireo_actors::wiring::WiringSource> {
        self.inner.wiring()
    }

    async fn devices_attached(&self, ports: &[PortId]) {
        self.gate.pass(PlugPoint::Attached).await;
        self.inner.devices_attached(ports).await
    }

    async fn devices_detached(&self, ports: &[PortId]) {
        self.gate.pass(PlugPoint::Detached).await;
        self.inner.devices_detached(ports).await
    }
}
