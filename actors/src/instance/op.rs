//! One running operation: its context (the host's parts, the operation's id and start time),
//! the timeline it records, and the building blocks every flow is made of — libvirt calls,
//! plugging, network calls and event waits — each timed and attributed to its clock.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::{debug, info, warn};
use uuid::Uuid;
use vireo_xml::metadata::InFlightOperation;

use super::in_flight::{InFlight, Marker};

use crate::events::{OpId, WaitHandle, WaitOutcome, WaitPolicy};
use crate::external::{EventName, ExternalEvent};
use crate::libvirt::{DomainState, LibvirtError, Metadata};
use crate::lifecycle::Request;
use crate::network::{NetworkError, PortStatus};
use crate::plug::{static_attachment, Attachment, DomainForm, PlugContext, PlugKind};
use crate::predict::{ExpectedEvent, Timing};
use crate::storage::StorageError;
use crate::vif::{PortId, Vif};
use crate::vif_config::{interface_for, DeviceConfig, InterfaceOptions};

use super::deps::HostDeps;
use super::operation::{CallerTask, Operation};
use super::record::InstanceRecord;
use super::types::{
    InstanceError, InstanceReply, OpReport, PowerState, Step, StepKind, WaitReport,
};

/// What `show` sees of a running operation.
#[derive(Debug, Clone, Default)]
pub(crate) struct LiveProgress {
    pub phase: String,
    pub waiting_for: Vec<ExpectedEvent>,
    /// When the earliest registered wait times out (none while nothing is awaited, or when
    /// the waits have no deadline).
    pub wait_deadline: Option<tokio::time::Instant>,
}

/// A registered wait, not yet awaited.
#[derive(Debug)]
pub(crate) struct PendingWait {
    timing: Timing,
    events: Vec<ExpectedEvent>,
    handle: WaitHandle,
    registered: tokio::time::Instant,
    policy: WaitPolicy,
}

/// How a domain was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Started {
    /// Paused (START_PAUSED, or start then suspend where the driver lacks START_PAUSED).
    Paused,
}

/// The prefix of the user aliases vireo gives interfaces (`ua-<port id>`), so an interface
/// can be detached by alias on every driver.
pub const ALIAS_PREFIX: &str = "ua-";

/// The context of one operation.
#[derive(Debug)]
pub(crate) struct OpCtx {
    pub deps: Arc<HostDeps>,
    pub uuid: Uuid,
    pub op_id: OpId,
    pub request: Request,
    /// The operation's start on the event clock: events that arrived before never count
    /// (plug-time waits count from their registration, see [`OpCtx::expect`]).
    pub since: tokio::time::Instant,
    /// A caller that runs this half of a move itself (Nova) handed over its task: it may
    /// have caused this operation's events before asking.
    from_caller: bool,
    started: std::time::Instant,
    started_unix_ms: u64,
    pub live: Arc<Mutex<LiveProgress>>,
    pub report: OpReport,
    /// The ports whose libvirt-made devices come and go with the domain.
    devices: Vec<PortId>,
}

impl OpCtx {
    pub fn new(
        deps: Arc<HostDeps>,
        uuid: Uuid,
        op_id: OpId,
        request: Request,
        live: Arc<Mutex<LiveProgress>>,
    ) -> Self {
        let started_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        OpCtx {
            deps,
            uuid,
            op_id,
            request,
            since: tokio::time::Instant::now(),
            from_caller: false,
            started: std::time::Instant::now(),
            started_unix_ms,
            live,
            report: OpReport {
                op_id: op_id.0,
                request: request.as_str().to_owned(),
                ..OpReport::default()
            },
            devices: Vec::new(),
        }
    }

    /// The instance's VIFs are these (for the plugger's device hooks).
    pub fn use_record(&mut self, record: &InstanceRecord) {
        self.devices = record.network_info.port_ids();
        self.deps
            .events
            .track_ports(self.uuid, self.devices.clone());
    }

    /// libvirt created the devices of the domain (it started).
    pub async fn attached(&self) {
        self.deps.plugger.devices_attached(&self.devices).await;
    }

    /// libvirt removed the devices of the domain (it stopped).
    pub async fn detached(&self) {
        self.deps.plugger.devices_detached(&self.devices).await;
    }

    /// Finish the report.
    pub fn into_report(mut self) -> OpReport {
        self.report.took = self.started.elapsed();
        self.report
    }

    /// The in-flight operation element for the metadata: `operation` at `phase`.
    pub fn in_flight(&self, phase: &str, operation: InFlight) -> InFlightOperation {
        let request = operation.request();
        let marker = Marker {
            id: self.op_id.0.to_string(),
            phase: phase.to_owned(),
            started_at: self.started_unix_ms,
            operation,
        };
        marker.to_stored().unwrap_or_else(|error| {
            // Cannot happen (plain data serialises); recovery then reconciles only.
            warn!(instance = %self.uuid, %error, "in-flight operation not encoded");
            InFlightOperation {
                id: marker.id.clone(),
                kind: request.as_str().to_owned(),
                phase: marker.phase.clone(),
                started_at: marker.started_at,
                data: serde_json::Value::Null,
            }
        })
    }

    /// Announce a phase (for `show` and the logs).
    pub fn phase(&self, phase: &str) {
        debug!(instance = %self.uuid, op = %self.op_id, phase, "phase");
        if let Ok(mut l) = self.live.lock() {
            l.phase = phase.to_owned();
        }
    }

    /// Record a step that ran from `start` (for calls timed by their caller).
    pub(crate) fn step(
        &mut self,
        name: String,
        kind: StepKind,
        start: std::time::Instant,
        failed: bool,
    ) {
        self.report.steps.push(Step {
            name,
            kind,
            took: start.elapsed(),
            at: start.duration_since(self.started),
            failed,
        });
    }

    /// A libvirt call, timed.
    pub async fn lv<T>(
        &mut self,
        step: &'static str,
        fut: impl Future<Output = Result<T, LibvirtError>>,
    ) -> Result<T, InstanceError> {
        let start = std::time::Instant::now();
        let r = fut.await;
        self.step(step.to_owned(), StepKind::Libvirt, start, r.is_err());
        r.map_err(|source| InstanceError::Libvirt { step, source })
    }

    /// A network-service call, timed.
    pub async fn net<T>(
        &mut self,
        step: &'static str,
        fut: impl Future<Output = Result<T, NetworkError>>,
    ) -> Result<T, InstanceError> {
        let start = std::time::Instant::now();
        let r = fut.await;
        self.step(step.to_owned(), StepKind::Network, start, r.is_err());
        r.map_err(|source| InstanceError::Network { step, source })
    }

    /// A storage call, timed.
    pub async fn store<T>(
        &mut self,
        step: &'static str,
        fut: impl Future<Output = Result<T, StorageError>>,
    ) -> Result<T, InstanceError> {
        let start = std::time::Instant::now();
        let r = fut.await;
        self.step(step.to_owned(), StepKind::Storage, start, r.is_err());
        r.map_err(|source| InstanceError::Storage { step, source })
    }

    /// Take over what a caller that runs this half of a move itself (Nova) knows: events
    /// since its task began count for this operation's waits (at most `vif_plugging_timeout`
    /// back), and the events it received before asking are delivered as if they came now
    /// (this host may have dropped them: it did not hold the instance yet). Called before
    /// any wait is registered.
    pub fn adopt_caller_task(&mut self, task: &CallerTask) {
        self.from_caller = true;
        if let Some(began) = task.events_since_ms {
            // Both times are whole milliseconds: one more covers what truncation cut off.
            let back = Duration::from_millis(self.started_unix_ms.saturating_sub(began) + 1)
                .min(self.deps.config.wait.timeout);
            if let Some(since) = self.since.checked_sub(back) {
                self.since = since;
            }
        }
        self.deps.events.track(self.uuid);
        let mine: Vec<ExternalEvent> = task
            .events
            .iter()
            .filter(|e| e.server_uuid == self.uuid)
            .cloned()
            .collect();
        if !mine.is_empty() {
            debug!(instance = %self.uuid, events = mine.len(), "events of the caller's task");
            self.deps.events.deliver_batch(mine);
        }
    }

    /// A request to another host, timed.
    pub async fn peer(
        &mut self,
        host: &str,
        step: &'static str,
        request: Operation,
    ) -> Result<InstanceReply, InstanceError> {
        let start = std::time::Instant::now();
        let r = match self.deps.peers.get(host) {
            Ok(peer) => peer.request(self.uuid, request).await,
            Err(e) => Err(e),
        };
        self.step(
            format!("{step} on {host}"),
            StepKind::Peer,
            start,
            r.is_err(),
        );
        r.map_err(|e| InstanceError::Peer {
            host: host.to_owned(),
            step,
            source: Box::new(e),
        })
    }

    // ------------------------------------------------------------------------------------
    // Devices

    /// The device form a VIF uses on this host.
    pub fn form(&self, vif: &Vif) -> DomainForm {
        match PlugKind::for_vif(vif) {
            Ok(PlugKind::OvsNative) => self.deps.config.ovs_native_form,
            _ => DomainForm::LibvirtManaged,
        }
    }

    fn plug_ctx(&self, record: &InstanceRecord, form: DomainForm) -> PlugContext {
        PlugContext {
            instance_uuid: self.uuid,
            instance_name: record.name.clone(),
            form,
        }
    }

    /// The libvirt device for a VIF, with the `ua-<port>` alias.
    pub fn device(&self, vif: &Vif, form: DomainForm) -> Result<DeviceConfig, InstanceError> {
        let mut opts = InterfaceOptions::default();
        let kind = PlugKind::for_vif(vif).map_err(|source| InstanceError::Plug {
            step: "describe VIF",
            source,
        })?;
        if kind == PlugKind::SriovMacvtap {
            if let Attachment::Direct { dev, .. } =
                static_attachment(vif, kind, form).map_err(|source| InstanceError::Plug {
                    step: "describe VIF",
                    source,
                })?
            {
                opts.vf_netdev = Some(dev);
            }
        }
        let mut dev = interface_for(vif, form, &opts).map_err(InstanceError::VifConfig)?;
        if let DeviceConfig::Interface(i) = &mut dev {
            i.alias = Some(format!("{ALIAS_PREFIX}{}", vif.id));
        }
        Ok(dev)
    }

    /// The devices of every VIF, in `network_info` order.
    pub fn devices(&self, record: &InstanceRecord) -> Result<Vec<DeviceConfig>, InstanceError> {
        record
            .network_info
            .vifs
            .iter()
            .map(|v| self.device(v, self.form(v)))
            .collect()
    }

    /// Plug one VIF, timed.
    pub async fn plug(&mut self, record: &InstanceRecord, vif: &Vif) -> Result<(), InstanceError> {
        let form = self.form(vif);
        let ctx = self.plug_ctx(record, form);
        let start = std::time::Instant::now();
        let r = self.deps.plugger.plug(&ctx, vif).await;
        self.step(
            format!("plug {} ({})", short(&vif.id), vif.vif_type),
            StepKind::Plug,
            start,
            r.is_err(),
        );
        r.map(|_| ()).map_err(|source| InstanceError::Plug {
            step: "plug",
            source,
        })
    }

    /// Plug every VIF of the record, in order. On failure the caller unplugs (unplug is
    /// idempotent and removes half-made devices).
    pub async fn plug_all(&mut self, record: &InstanceRecord) -> Result<(), InstanceError> {
        for vif in &record.network_info.vifs {
            self.plug(record, vif).await?;
        }
        Ok(())
    }

    /// Unplug one VIF in the given form, timed.
    pub async fn unplug_as(
        &mut self,
        record: &InstanceRecord,
        vif: &Vif,
        form: DomainForm,
    ) -> Result<(), InstanceError> {
        let ctx = self.plug_ctx(record, form);
        let start = std::time::Instant::now();
        let r = self.deps.plugger.unplug(&ctx, vif).await;
        self.step(
            format!("unplug {} ({})", short(&vif.id), vif.vif_type),
            StepKind::Plug,
            start,
            r.is_err(),
        );
        r.map_err(|source| InstanceError::Plug {
            step: "unplug",
            source,
        })
    }

    /// Unplug every VIF (goes on past failures; returns the first).
    pub async fn unplug_all(&mut self, record: &InstanceRecord) -> Result<(), InstanceError> {
        let mut first = None;
        for vif in &record.network_info.vifs {
            let form = self.form(vif);
            if let Err(e) = self.unplug_as(record, vif, form).await {
                warn!(instance = %self.uuid, port = %vif.id, error = %e, "unplug failed");
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    // ------------------------------------------------------------------------------------
    // libvirt

    /// Define (or redefine) the domain from the record, naming this host its owner.
    pub async fn define(
        &mut self,
        record: &InstanceRecord,
        op: Option<InFlightOperation>,
    ) -> Result<(), InstanceError> {
        let devices = self.devices(record)?;
        record
            .prepare_console_log_dir(&self.deps.config.domain)
            .map_err(InstanceError::Record)?;
        let xml = record
            .domain(&self.deps.config.domain, &self.deps.host, devices, op)
            .and_then(|d| d.to_xml().map_err(Into::into))
            .map_err(InstanceError::Record)?;
        let lv = self.deps.libvirt.clone();
        self.lv("define", lv.define_xml(xml, true))
            .await
            .map(|_| ())
    }

    /// Store the record (and the operation in flight) in the domain's metadata, naming this
    /// host its owner (a migrated domain keeps its source's name until the destination saves).
    pub async fn save(
        &mut self,
        record: &InstanceRecord,
        op: Option<InFlightOperation>,
    ) -> Result<(), InstanceError> {
        let xml = record
            .metadata(&self.deps.host, op)
            .and_then(|m| m.to_xml().map_err(Into::into))
            .map_err(InstanceError::Record)?;
        let meta = Metadata {
            xml,
            key: vireo_xml::metadata::NAMESPACE_PREFIX.to_owned(),
            uri: vireo_xml::metadata::NAMESPACE_URI.to_owned(),
        };
        let lv = self.deps.libvirt.clone();
        self.lv("set-metadata", lv.save_metadata(self.uuid, meta))
            .await
    }

    /// Start the domain paused. Where the driver has no START_PAUSED (libvirt's test driver)
    /// the libvirt layer starts the domain and suspends it at once: the guest may run a few
    /// instructions, which is harmless for what the pause is for (nothing guest-visible happens
    /// before the awaited events), and the same sequence is valid on real libvirt.
    pub async fn start_paused(&mut self) -> Result<Started, InstanceError> {
        let lv = self.deps.libvirt.clone();
        self.lv("start paused", lv.start_paused(self.uuid)).await?;
        self.attached().await;
        Ok(Started::Paused)
    }

    /// Resume a paused domain.
    pub async fn resume(&mut self) -> Result<(), InstanceError> {
        let lv = self.deps.libvirt.clone();
        self.lv("resume", lv.resume(self.uuid)).await
    }

    /// The domain's power state (`NoDomain` when it does not exist).
    pub async fn power(&mut self) -> Result<PowerState, InstanceError> {
        let lv = self.deps.libvirt.clone();
        match self.lv("info", lv.info(self.uuid)).await {
            Ok(info) => Ok(power_of(info.state)),
            Err(InstanceError::Libvirt {
                source: LibvirtError::NoDomain { .. },
                ..
            }) => Ok(PowerState::NoDomain),
            Err(e) => Err(e),
        }
    }

    /// Stop the domain hard if it runs; nothing to do when it is shut off or gone.
    pub async fn destroy_domain(&mut self) -> Result<(), InstanceError> {
        let lv = self.deps.libvirt.clone();
        if self.lv("destroy", lv.destroy_if_running(self.uuid)).await? {
            self.detached().await;
        }
        Ok(())
    }

    /// Undefine the domain; nothing to do when it is gone.
    pub async fn undefine_domain(&mut self) -> Result<(), InstanceError> {
        let lv = self.deps.libvirt.clone();
        match self.lv("undefine", lv.undefine(self.uuid)).await {
            Ok(())
            | Err(InstanceError::Libvirt {
                source: LibvirtError::NoDomain { .. },
                ..
            }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Graceful shutdown within `timeout`, then hard.
    pub async fn shutdown_domain(&mut self, timeout: Duration) -> Result<(), InstanceError> {
        if !self.shut_down_gracefully(timeout).await? {
            info!(instance = %self.uuid, ?timeout, "guest did not shut down in time; destroying");
            self.destroy_domain().await?;
        }
        Ok(())
    }

    /// Ask the guest to shut down (ACPI) and wait up to `timeout` for the domain to be off:
    /// whether it is (true when it was off already; false when the guest ignored the request
    /// or the driver could not make it).
    pub async fn shut_down_gracefully(&mut self, timeout: Duration) -> Result<bool, InstanceError> {
        match self.power().await? {
            PowerState::NoDomain | PowerState::Shutoff => return Ok(true),
            _ => {}
        }
        let lv = self.deps.libvirt.clone();
        if self.lv("shutdown", lv.shutdown(self.uuid)).await.is_err() {
            return Ok(false);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let poll = self.deps.config.power_off_poll;
        loop {
            if matches!(
                self.power().await?,
                PowerState::Shutoff | PowerState::NoDomain
            ) {
                self.detached().await;
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(poll).await;
        }
    }

    // ------------------------------------------------------------------------------------
    // Events

    /// Register a wait before the action that triggers its events.
    pub async fn expect(
        &mut self,
        timing: Timing,
        events: Vec<ExpectedEvent>,
        policy: WaitPolicy,
    ) -> Result<PendingWait, InstanceError> {
        // A plug-time event is caused by this operation's plug (or a bind of a port whose
        // devices are here), and every flow registers the wait before it moves a binding or
        // plugs: an event that arrived before the registration cannot be this operation's —
        // it is a leftover (a duplicate of an earlier plug, Neutron re-reporting the port on
        // an update) and would release the wait before the port is wired. A bind-time event
        // may come from a step before the registration (a spawn binds its ports when it
        // allocates them): it counts from the operation's start. A caller that runs the move
        // itself may have caused either before it asked.
        let since = if timing == Timing::PlugTime && !self.from_caller {
            tokio::time::Instant::now()
        } else {
            self.since
        };
        self.expect_since(timing, events, policy, since).await
    }

    /// [`OpCtx::expect`] counting the events that arrived from `since` on: for a flow that
    /// registers after its trigger (at most back to the operation's start).
    pub async fn expect_since(
        &mut self,
        timing: Timing,
        events: Vec<ExpectedEvent>,
        policy: WaitPolicy,
        since: tokio::time::Instant,
    ) -> Result<PendingWait, InstanceError> {
        let since = since.max(self.since);
        let handle = self
            .deps
            .events
            .expect(self.uuid, events.clone(), since, policy, self.op_id)
            .await
            .map_err(|_| InstanceError::Unavailable)?;
        if let Ok(mut l) = self.live.lock() {
            l.waiting_for.extend(events.iter().cloned());
            if !events.is_empty() && !policy.timeout.is_zero() {
                let deadline = tokio::time::Instant::now() + policy.timeout;
                l.wait_deadline = Some(l.wait_deadline.map_or(deadline, |d| d.min(deadline)));
            }
        }
        Ok(PendingWait {
            timing,
            events,
            handle,
            registered: tokio::time::Instant::now(),
            policy,
        })
    }

    /// Await a registered wait, then confirm its `network-vif-plugged` events against the
    /// network service (see [`OpCtx::confirm_up`]).
    pub async fn wait(&mut self, pending: PendingWait) -> Result<WaitOutcome, InstanceError> {
        let PendingWait {
            timing,
            events,
            handle,
            registered,
            policy,
        } = pending;
        let start = std::time::Instant::now();
        let (mut stale, mut unconfirmed) = (Vec::new(), Vec::new());
        let result = match handle.await {
            Ok(o) if o.waited => {
                let deadline = registered + policy.timeout;
                Ok(self
                    .confirm_up(&events, o, deadline, &mut stale, &mut unconfirmed)
                    .await)
            }
            other => other,
        };
        let took = registered.elapsed();
        if let Ok(mut l) = self.live.lock() {
            l.waiting_for.retain(|e| !events.contains(e));
            if l.waiting_for.is_empty() {
                l.wait_deadline = None;
            }
        }
        let label = timing_label(timing);
        self.step(
            format!("wait {label} ({} events)", events.len()),
            StepKind::EventWait,
            start,
            result.is_err(),
        );
        let (complete, missing, outcome) = match &result {
            Ok(o) if !o.waited => (true, vec![], "nothing to wait for".to_owned()),
            Ok(o) if o.complete() => (true, vec![], "all arrived".to_owned()),
            Ok(o) => {
                let mut m = o.missing.clone();
                m.extend(o.failed.iter().copied());
                warn!(instance = %self.uuid, missing = ?o.missing, failed = ?o.failed,
                    "proceeding without every {label} event (vif_plugging_is_fatal = false)");
                (false, m, "incomplete, proceeded (not fatal)".to_owned())
            }
            Err(e) => (false, vec![], e.to_string()),
        };
        self.report.waits.push(WaitReport {
            timing,
            expected: events,
            took,
            complete,
            missing,
            stale,
            unconfirmed,
            outcome,
        });
        result.map_err(|source| InstanceError::EventWait {
            timing: label,
            source,
        })
    }

    /// A wait's events are Neutron's word that the ports went ACTIVE, but Neutron events carry
    /// no operation: a stale copy (a duplicate of an earlier plug, a port re-reported on an
    /// update, docs/EVENT_MODEL.md section 9) that arrives while the wait is open releases it
    /// as well as the real one. So the ports whose `network-vif-plugged` released the wait are
    /// read back (one listing of the instance's ports) until each shows ACTIVE, up to the
    /// confirmation window (`InstanceConfig::confirm_window`) and never past the wait's own
    /// deadline: first at once, then after 100 ms, doubling up to 5 s. Neutron sends the
    /// event as it sets the status, before its transaction commits, so a read right after a
    /// real event may still show the old status for some milliseconds (seen here: a listing
    /// 34 ms after the event still had the port DOWN); a port still not ACTIVE a second after
    /// the first read had a stale event: the phase says so, `stale` collects it for the
    /// report, and the polling goes on until the real plug shows.
    ///
    /// The status is not the truth either: Neutron can lose it. ML2/OVN on a cross-host
    /// revert (measured here, docs/EVENT_MODEL.md section 7) sends `network-vif-plugged`
    /// twice while the binding moves back, and the status update that goes with them gives
    /// up (the port looked unbound for its ten tries in 5 s): the port forwards and stays
    /// DOWN until its next change. So at the end of the window the events are trusted and
    /// the ports still not ACTIVE go to `unconfirmed`: the check only ever keeps a wait open
    /// for a while, it never fails an operation. A port that is administratively down, one
    /// the listing does not show and a listing that fails are taken on the events' word.
    async fn confirm_up(
        &mut self,
        events: &[ExpectedEvent],
        outcome: WaitOutcome,
        deadline: tokio::time::Instant,
        stale: &mut Vec<PortId>,
        unconfirmed: &mut Vec<PortId>,
    ) -> WaitOutcome {
        const FIRST_PAUSE: Duration = Duration::from_millis(100);
        const MAX_PAUSE: Duration = Duration::from_secs(5);
        const STALE_AFTER: Duration = Duration::from_secs(1);
        let mut check: Vec<PortId> = events
            .iter()
            .filter(|e| e.name == EventName::NetworkVifPlugged)
            .map(|e| e.tag)
            .filter(|p| !outcome.missing.contains(p) && !outcome.failed.contains(p))
            .collect();
        let window = self.deps.config.confirm_window;
        if window.is_zero() {
            return outcome;
        }
        let first = tokio::time::Instant::now();
        let until = deadline.min(first + window);
        let mut pause = FIRST_PAUSE;
        while !check.is_empty() {
            let net = self.deps.network.clone();
            let ports = match net.list_instance_ports(self.uuid).await {
                Ok(ports) => ports,
                Err(e) => {
                    warn!(instance = %self.uuid, error = %e,
                        "ports not read back after their events; trusting the events");
                    return outcome;
                }
            };
            check.retain(|id| {
                ports
                    .iter()
                    .any(|p| p.id == *id && p.admin_state_up && p.status != PortStatus::Active)
            });
            if check.is_empty() {
                break;
            }
            let now = tokio::time::Instant::now();
            if stale.is_empty() && now.saturating_duration_since(first) >= STALE_AFTER {
                info!(instance = %self.uuid, ports = ?check,
                    "network-vif-plugged came but the port is not ACTIVE: a stale event; \
                     waiting for the port to come up");
                stale.extend(check.iter().copied());
                self.phase("wait again after a stale event");
            }
            let left = until.saturating_duration_since(now);
            if left.is_zero() {
                warn!(instance = %self.uuid, ports = ?check, window = ?window,
                    "network-vif-plugged came but the port is still not ACTIVE: trusting \
                     the event");
                unconfirmed.extend(check);
                break;
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
        outcome
    }

    /// Cancel every wait of this operation (before rolling back).
    pub async fn cancel_waits(&self) {
        let _ = self.deps.events.cancel(self.uuid, self.op_id).await;
        if let Ok(mut l) = self.live.lock() {
            l.waiting_for.clear();
            l.wait_deadline = None;
        }
    }
}

fn short(p: &PortId) -> String {
    p.to_string().chars().take(8).collect()
}

/// The event wait's name in logs and errors.
pub(crate) fn timing_label(t: Timing) -> &'static str {
    match t {
        Timing::BindTime => "bind-time",
        Timing::PlugTime => "plug-time",
        Timing::None => "no",
    }
}

/// libvirt's state as vireo's power state.
pub(crate) fn power_of(state: DomainState) -> PowerState {
    match state {
        DomainState::Running | DomainState::Blocked | DomainState::ShuttingDown => {
            PowerState::Running
        }
        DomainState::Paused => PowerState::Paused,
        DomainState::Shutoff | DomainState::Crashed => PowerState::Shutoff,
        DomainState::PmSuspended => PowerState::Suspended,
        DomainState::NoState | DomainState::Unknown(_) => PowerState::Unknown,
    }
}
