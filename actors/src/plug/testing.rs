//! Test doubles for plugging, compiled only with the `test-support` feature (and in this
//! crate's unit tests): the [`FaultPlan`] seam pluggers check before each [`PlugStep`], and the
//! [`RecordingPlugger`] — the production [`StaticPlugger`] plus a call log and fault
//! injection. The agent binary is built without them.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use uuid::Uuid;

use super::{
    DomainForm, PlugContext, PlugError, PlugStep, Plugged, StaticOutcome, StaticPlugger, VifPlugger,
};
use crate::vif::{PortId, Vif};
use crate::wiring::WiringSource;

/// Whether a fault fires once or every time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// Fire on the first matching step, then disarm.
    Once,
    /// Fire on every matching step until cleared.
    Always,
}

/// An armed fault: fail `step` (for `port`, or for any port when `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InjectedFault {
    /// The step that fails.
    pub step: PlugStep,
    /// Only for this port; any port when `None`.
    pub port: Option<PortId>,
    /// Once or always.
    pub mode: FaultMode,
}

/// The fault seam a plugger checks before each [`PlugStep`]. Empty (and free) in production.
#[derive(Debug, Default)]
pub struct FaultPlan {
    faults: Mutex<Vec<InjectedFault>>,
}

impl FaultPlan {
    /// An empty plan.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<InjectedFault>> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Arm a fault.
    pub fn inject(&self, fault: InjectedFault) {
        self.lock().push(fault);
    }

    /// Arm a one-shot fault at `step` for `port` (any port when `None`).
    pub fn fail_once(&self, step: PlugStep, port: Option<PortId>) {
        self.inject(InjectedFault {
            step,
            port,
            mode: FaultMode::Once,
        });
    }

    /// Disarm every fault.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Called by a plugger before `step` for `port`: the injected error when a fault matches.
    pub fn check(&self, step: PlugStep, port: PortId) -> Result<(), PlugError> {
        let mut faults = self.lock();
        let hit = faults
            .iter()
            .position(|f| f.step == step && f.port.is_none_or(|p| p == port));
        match hit {
            None => Ok(()),
            Some(i) => {
                if faults[i].mode == FaultMode::Once {
                    faults.remove(i);
                }
                Err(PlugError::Injected { port, step })
            }
        }
    }
}

/// Plug or unplug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlugOp {
    /// A plug call.
    Plug,
    /// An unplug call.
    Unplug,
}

/// How a recorded call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// It changed the recorded state.
    Done,
    /// Nothing to do: already plugged (plug) or already gone (unplug).
    AlreadyDone,
    /// An injected fault failed it at this step.
    Failed(PlugStep),
}

/// One call to the [`RecordingPlugger`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCall {
    /// Plug or unplug.
    pub op: PlugOp,
    /// The port.
    pub port: PortId,
    /// The instance.
    pub instance_uuid: Uuid,
    /// The domain form asked for.
    pub form: DomainForm,
    /// How it ended.
    pub outcome: CallOutcome,
}

/// How many calls a [`RecordingPlugger`] keeps (the oldest are dropped first), so that a
/// long-running process on the `test:///` tier does not grow with every operation.
pub const RECORDED_CALLS_CAPACITY: usize = 4096;

/// The `test:///` tier's plugger for tests: a [`StaticPlugger`] (same attachments, same
/// wiring, same contract) that also records the last [`RECORDED_CALLS_CAPACITY`] calls and
/// honours a [`FaultPlan`]: an injected failure fails the call before its state changes, so
/// nothing is left plugged (plug) or the port stays plugged (unplug).
#[derive(Debug, Clone)]
pub struct RecordingPlugger {
    inner: StaticPlugger,
    calls: Arc<Mutex<VecDeque<RecordedCall>>>,
    faults: Arc<FaultPlan>,
}

impl Default for RecordingPlugger {
    fn default() -> Self {
        Self::new()
    }
}

impl RecordingPlugger {
    /// A plugger with nothing plugged and no faults armed.
    pub fn new() -> Self {
        RecordingPlugger {
            inner: StaticPlugger::new(),
            calls: Arc::default(),
            faults: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<RecordedCall>> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fault seam.
    pub fn faults(&self) -> &FaultPlan {
        &self.faults
    }

    /// The plugger it records.
    pub fn inner(&self) -> &StaticPlugger {
        &self.inner
    }

    /// The calls so far (the last [`RECORDED_CALLS_CAPACITY`]), in order.
    pub fn calls(&self) -> Vec<RecordedCall> {
        self.lock().iter().cloned().collect()
    }

    /// The calls for one port.
    pub fn calls_for(&self, port: PortId) -> Vec<RecordedCall> {
        self.lock()
            .iter()
            .filter(|c| c.port == port)
            .cloned()
            .collect()
    }

    /// Ports plugged right now.
    pub fn plugged(&self) -> BTreeSet<PortId> {
        self.inner.plugged()
    }

    /// What a port was plugged as, when it is plugged.
    pub fn plugged_as(&self, port: PortId) -> Option<Plugged> {
        self.inner.plugged_as(port)
    }

    fn record(&self, op: PlugOp, ctx: &PlugContext, port: PortId, outcome: CallOutcome) {
        let mut calls = self.lock();
        if calls.len() >= RECORDED_CALLS_CAPACITY {
            calls.pop_front();
        }
        calls.push_back(RecordedCall {
            op,
            port,
            instance_uuid: ctx.instance_uuid,
            form: ctx.form,
            outcome,
        });
    }

    /// The step check of one call: the fault plan, recording the step that failed.
    fn check<'a>(
        &'a self,
        op: PlugOp,
        ctx: &'a PlugContext,
        port: PortId,
    ) -> impl FnMut(PlugStep) -> Result<(), PlugError> + 'a {
        move |step| {
            self.faults.check(step, port).inspect_err(|_| {
                self.record(op, ctx, port, CallOutcome::Failed(step));
            })
        }
    }

    fn done<'a>(
        &'a self,
        op: PlugOp,
        ctx: &'a PlugContext,
        port: PortId,
    ) -> impl FnOnce(StaticOutcome) + 'a {
        move |o| {
            let outcome = match o {
                StaticOutcome::Done => CallOutcome::Done,
                StaticOutcome::AlreadyDone => CallOutcome::AlreadyDone,
            };
            self.record(op, ctx, port, outcome);
        }
    }
}

#[async_trait]
impl VifPlugger for RecordingPlugger {
    async fn plug(&self, ctx: &PlugContext, vif: &Vif) -> Result<Plugged, PlugError> {
        self.inner.plug_with(
            ctx,
            vif,
            self.check(PlugOp::Plug, ctx, vif.id),
            self.done(PlugOp::Plug, ctx, vif.id),
        )
    }

    async fn unplug(&self, ctx: &PlugContext, vif: &Vif) -> Result<(), PlugError> {
        self.inner.unplug_with(
            ctx,
            vif,
            self.check(PlugOp::Unplug, ctx, vif.id),
            self.done(PlugOp::Unplug, ctx, vif.id),
        )
    }

    fn wiring(&self) -> Arc<dyn WiringSource> {
        self.inner.wiring()
    }

    async fn devices_attached(&self, ports: &[PortId]) {
        self.inner.devices_attached(ports).await
    }

    async fn devices_detached(&self, ports: &[PortId]) {
        self.inner.devices_detached(ports).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plug::PlugKind;
    use crate::vif::NetworkInfo;
    use serde_json::json;

    const P1: &str = "3b2c4d5e-0000-4000-8000-000000000001";

    fn vif(v: serde_json::Value) -> Vif {
        NetworkInfo::from_value(&json!([v])).unwrap().vifs.remove(0)
    }

    fn ovs(hybrid: bool) -> Vif {
        vif(json!({
            "id": P1, "address": "fa:16:3e:00:00:01", "type": "ovs",
            "details": {"ovs_hybrid_plug": hybrid},
            "network": {"id": "net-1", "bridge": "br-int", "meta": {"mtu": 1450}}
        }))
    }

    fn ctx(form: DomainForm) -> PlugContext {
        PlugContext {
            instance_uuid: Uuid::from_u128(7),
            instance_name: "instance-7".into(),
            form,
        }
    }

    #[tokio::test]
    async fn recording_plugger_is_idempotent_and_reports_wiring() {
        let p = RecordingPlugger::new();
        let w = p.wiring();
        let mut rx = w.subscribe();
        let v = ovs(false);
        let c = ctx(DomainForm::PreCreated);

        let first = p.plug(&c, &v).await.unwrap();
        let second = p.plug(&c, &v).await.unwrap();
        assert_eq!(first.attachment, second.attachment);
        assert_eq!(p.plugged(), BTreeSet::from([v.id]));
        assert_eq!(w.wired(), vec![v.id]);
        let change = rx.recv().await.unwrap();
        assert!(change.wired && change.port == v.id && change.device == "tap3b2c4d5e-00");
        assert!(
            rx.try_recv().is_err(),
            "a second plug is not a second change"
        );

        p.unplug(&c, &v).await.unwrap();
        p.unplug(&c, &v).await.unwrap();
        assert!(p.plugged().is_empty());
        assert!(w.wired().is_empty());
        assert!(!rx.recv().await.unwrap().wired);
        let outcomes: Vec<_> = p
            .calls_for(v.id)
            .iter()
            .map(|c| (c.op, c.outcome))
            .collect();
        assert_eq!(
            outcomes,
            vec![
                (PlugOp::Plug, CallOutcome::Done),
                (PlugOp::Plug, CallOutcome::AlreadyDone),
                (PlugOp::Unplug, CallOutcome::Done),
                (PlugOp::Unplug, CallOutcome::AlreadyDone),
            ]
        );
    }

    #[tokio::test]
    async fn the_call_log_keeps_only_the_newest_calls() {
        let p = RecordingPlugger::new();
        let v = ovs(false);
        let c = ctx(DomainForm::PreCreated);
        // Plug, then the rest unplugs (all but the first of them already done).
        p.plug(&c, &v).await.unwrap();
        for _ in 0..RECORDED_CALLS_CAPACITY + 9 {
            p.unplug(&c, &v).await.unwrap();
        }
        let calls = p.calls();
        assert_eq!(calls.len(), RECORDED_CALLS_CAPACITY);
        // The plug and the first unplug were the oldest: dropped.
        assert!(calls
            .iter()
            .all(|c| (c.op, c.outcome) == (PlugOp::Unplug, CallOutcome::AlreadyDone)));
        assert_eq!(p.calls_for(v.id).len(), RECORDED_CALLS_CAPACITY);
        // Still a plugger: plug again, and it is the newest call.
        p.plug(&c, &v).await.unwrap();
        assert_eq!(
            p.calls().last().map(|c| (c.op, c.outcome)),
            Some((PlugOp::Plug, CallOutcome::Done))
        );
        assert_eq!(p.calls().len(), RECORDED_CALLS_CAPACITY);
    }

    #[tokio::test]
    async fn injected_faults_leave_nothing_plugged() {
        let p = RecordingPlugger::new();
        let v = ovs(true);
        let c = ctx(DomainForm::PreCreated);
        for step in PlugKind::OvsHybrid.plug_steps(DomainForm::PreCreated) {
            p.faults().fail_once(*step, Some(v.id));
            let err = p.plug(&c, &v).await.unwrap_err();
            assert!(
                matches!(err, PlugError::Injected { step: s, port } if s == *step && port == v.id)
            );
            assert!(p.plugged().is_empty(), "{step:?}");
            assert!(p.wiring().wired().is_empty());
        }
        // Once-faults are consumed: the next plug works.
        p.plug(&c, &v).await.unwrap();
        // A fault for another port does not fire.
        p.faults()
            .fail_once(PlugStep::DeleteTap, Some(PortId(Uuid::from_u128(9))));
        p.unplug(&c, &v).await.unwrap();
        assert!(p.plugged().is_empty());
    }

    #[tokio::test]
    async fn failed_unplug_keeps_the_port_plugged() {
        let p = RecordingPlugger::new();
        let v = ovs(false);
        let c = ctx(DomainForm::LibvirtManaged);
        p.plug(&c, &v).await.unwrap();
        p.faults().inject(InjectedFault {
            step: PlugStep::DeleteOvsPort,
            port: None,
            mode: FaultMode::Always,
        });
        assert!(p.unplug(&c, &v).await.is_err());
        assert!(p.unplug(&c, &v).await.is_err());
        assert_eq!(p.plugged(), BTreeSet::from([v.id]));
        p.faults().clear();
        p.unplug(&c, &v).await.unwrap();
        assert!(p.plugged().is_empty());
    }
}
