//! The instance actor: one per instance on this host. It owns the instance's lifecycle state
//! and runs one operation at a time; reads (`show`) are answered while an operation runs.
//!
//! Concurrency rule: a second mutating request while an operation runs is refused with
//! [`AdmissionError::Busy`] (HTTP 409) — except destroy, which cancels the running
//! operation's event waits (so it rolls back promptly) and runs right after it.
//!
//! Left behind: an instance that left this host (`gone`) while libvirt kept part of it (a
//! finish-resize whose rollback lost the libvirt connection; the source took the instance
//! back) keeps its actor and record, hidden from show and list. Its actor removes the
//! leftovers on the next resync (libvirt reconnected) or destroy — never releasing the
//! networking, which belongs to the host that has the instance — and then leaves. While it
//! stays registered, the recovery after a reconnect does not adopt the domain again.
//!
//! A confirmed resize's source under Nova (`remove_after`) leaves that way on purpose: it
//! answers once its domain is off and recorded as gone, and its actor removes the old
//! instance at once, before it takes another request (any but destroy is `not found` from
//! the answer on). A domain recorded as gone is recovered as left behind at start-up and
//! removed then.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::in_flight::{InFlight, Interrupted};
use actix::prelude::*;
use futures::channel::oneshot;
use tracing::{debug, error, info, warn, Instrument};
use uuid::Uuid;

use crate::events::OpId;
use crate::libvirt::LifecycleEvent;
use crate::lifecycle::{accepts, check_end, valid_transition, InstanceState, Request};

use super::admission::{AdmissionError, Admitted, Completion, Ticket};
use super::deps::HostDeps;
use super::op::{power_of, LiveProgress, OpCtx};
use super::operation::Operation;
use super::ops::{dispatch, Finished};
use super::record::{InstanceRecord, ResizeRole};
use super::types::{
    DestroyArgs, InstanceError, InstanceReply, InstanceView, OpReport, PowerState, Progress,
    VifView,
};

/// Submit a request to the instance: admitted (a [`Ticket`], the operation runs) or refused
/// (an [`AdmissionError`], nothing runs), answered before the operation runs.
#[derive(Debug, Message)]
#[rtype(result = "Result<Ticket, AdmissionError>")]
pub struct Submit(pub Operation);

/// What `show` reports.
#[derive(Debug, Message)]
#[rtype(result = "InstanceView")]
pub struct Show;

/// A libvirt lifecycle event for this instance's domain (a hint: the actor reads the real
/// state from libvirt before it believes it).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct DomainEvent {
    /// What happened.
    pub event: LifecycleEvent,
}

/// Re-read the domain's state (after a libvirt reconnect).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Resync;

/// Finish or roll back an operation that was in flight when the agent stopped.
#[derive(Debug, Message)]
#[rtype(result = "Result<InstanceReply, InstanceError>")]
pub struct RecoverInterrupted(pub Interrupted);

/// Stop: cancel the running operation's waits; the actor stops once it is idle.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Stop;

/// Tells the host actor an instance actor has nothing left on this host.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct InstanceGone {
    /// The instance.
    pub uuid: Uuid,
    /// The actor that is gone (a newer actor for the same uuid must not be removed).
    pub addr: Addr<InstanceActor>,
}

#[derive(Debug)]
struct RunningOp {
    op_id: OpId,
    request: Request,
    started: Instant,
    live: Arc<Mutex<LiveProgress>>,
}

type Reply = Result<InstanceReply, InstanceError>;

/// One instance on this host.
#[derive(Debug)]
pub struct InstanceActor {
    uuid: Uuid,
    deps: Arc<HostDeps>,
    gone: Recipient<InstanceGone>,
    op_ids: Arc<AtomicU64>,
    state: InstanceState,
    record: Option<InstanceRecord>,
    power: PowerState,
    running: Option<RunningOp>,
    queued_destroys: Vec<(DestroyArgs, oneshot::Sender<Completion>)>,
    last_report: Option<OpReport>,
    stopping: bool,
    /// Operations started so far: a state read that began before the latest is stale.
    ops_started: u64,
}

impl InstanceActor {
    /// A new actor for `uuid` in `state`, with what is known of it.
    pub fn new(
        uuid: Uuid,
        deps: Arc<HostDeps>,
        gone: Recipient<InstanceGone>,
        op_ids: Arc<AtomicU64>,
        state: InstanceState,
        record: Option<InstanceRecord>,
        power: PowerState,
    ) -> Self {
        InstanceActor {
            uuid,
            deps,
            gone,
            op_ids,
            state,
            record,
            power,
            running: None,
            queued_destroys: Vec::new(),
            last_report: None,
            stopping: false,
            ops_started: 0,
        }
    }

    /// Gone from this host, with leftovers in libvirt still to remove (see the module doc).
    fn left_behind(&self) -> bool {
        self.state == InstanceState::Gone && self.record.is_some()
    }

    /// Remove what a left-behind instance left in libvirt; the actor leaves once it is gone.
    fn remove_leftovers(&mut self, ctx: &mut Context<Self>) {
        if !self.left_behind() || self.running.is_some() || self.stopping {
            return;
        }
        info!(instance = %self.uuid, "removing what libvirt kept of an instance that left this host");
        let fut = self.start(
            Operation::Destroy(DestroyArgs {
                deallocate_network: false,
            }),
            ctx,
        );
        ctx.spawn(fut.map(|reply, act, _ctx| {
            if let Err(e) = reply {
                warn!(instance = %act.uuid, error = %error_chain(&e), "leftovers not removed yet; again on the next resync");
            }
        }));
    }

    /// Whether the instance takes `request` now (see [`super::admission`]).
    fn refuse(&self, request: &Operation) -> Option<AdmissionError> {
        let kind = request.kind();
        // An instance that left this host is not here, whether or not what it left is being
        // removed (a confirmed resize's source asked again while its removal runs).
        if self.state == InstanceState::Gone {
            return Some(AdmissionError::NotFound(self.uuid));
        }
        if let Some(running) = &self.running {
            return Some(AdmissionError::Busy {
                running: running.request,
            });
        }
        if self.stopping {
            return Some(AdmissionError::Unavailable);
        }
        if !accepts(self.state, kind) {
            if self.state == InstanceState::Absent {
                return Some(AdmissionError::NotFound(self.uuid));
            }
            return Some(AdmissionError::IllegalState {
                state: self.state,
                request: kind,
            });
        }
        if let Some(host) = self.unreachable_destination(request) {
            return Some(AdmissionError::CrossHost { host });
        }
        if let Operation::DetachInterface { port_id: port } = request {
            let attached = self
                .record
                .as_ref()
                .is_some_and(|r| r.network_info.vifs.iter().any(|v| v.id == *port));
            if !attached {
                return Some(AdmissionError::NotAttached { port: *port });
            }
        }
        None
    }

    /// The destination of a move between hosts that this host's own flow would drive (no
    /// caller runs the other host's half) and that is not in its directory of hosts: the
    /// agent's directory holds only itself, so under the agent every such request is
    /// refused (Nova runs each host's half itself: `caller_finishes`, `caller`).
    fn unreachable_destination(&self, request: &Operation) -> Option<String> {
        let dest = match request {
            Operation::Resize(args) if !args.caller_finishes => args.dest_host.as_deref()?,
            Operation::LiveMigrate(args) if args.caller.is_none() => args.dest_host.as_str(),
            _ => return None,
        };
        if dest == self.deps.host || self.deps.peers.get(dest).is_ok() {
            return None;
        }
        Some(dest.to_owned())
    }

    /// A live migration's hand-over this host completed already (the record names the
    /// migration that brought the guest): the source asks again because this host's answer
    /// was lost with its agent. Done at once, with the guest's state — refusing it as illegal
    /// in `running` would fail a migration whose guest runs here.
    fn taken_over_already(&self, request: &Operation) -> Option<Ticket> {
        let Operation::PostLiveMigrationAtDestination { migration, .. } = request else {
            return None;
        };
        if self.running.is_some() || self.stopping {
            return None;
        }
        let record = self.record.as_ref()?;
        if record.arrived_by != Some(migration.id)
            || !matches!(self.state, InstanceState::Running | InstanceState::Paused)
        {
            return None;
        }
        info!(instance = %self.uuid, migration = %migration.id, "hand-over asked again: done already");
        let request = Request::PostLiveMigrationAtDestination;
        let report = OpReport {
            request: request.as_str().to_owned(),
            ..OpReport::default()
        };
        Some(Ticket::done_already(
            request,
            Ok(InstanceReply::Done {
                state: self.state,
                report,
            }),
        ))
    }

    /// Start an admitted request; its completion goes to the ticket.
    fn admit(&mut self, request: Operation, ctx: &mut Context<Self>) -> Ticket {
        let kind = request.kind();
        let (op_id, fut) = self.begin(request, ctx);
        let (ticket, tx) = Ticket::new(kind, Admitted::Started(op_id));
        ctx.spawn(fut.map(move |reply, _act, _ctx| {
            let _ = tx.send(reply);
        }));
        ticket
    }

    /// The transient state an operation shows while it runs.
    fn transient(&self, request: Request) -> InstanceState {
        let t = match request {
            Request::Spawn => InstanceState::Building,
            Request::LiveMigrate => InstanceState::Migrating,
            _ => self.state,
        };
        if t != self.state && valid_transition(self.state, t) {
            t
        } else {
            self.state
        }
    }

    fn start(
        &mut self,
        request: Operation,
        ctx: &mut Context<Self>,
    ) -> ResponseActFuture<Self, Reply> {
        self.begin(request, ctx).1
    }

    /// Start `request` now: its operation id, and the future that runs it.
    fn begin(
        &mut self,
        request: Operation,
        ctx: &mut Context<Self>,
    ) -> (OpId, ResponseActFuture<Self, Reply>) {
        let kind = request.kind();
        let op_id = OpId(self.op_ids.fetch_add(1, Ordering::Relaxed) + 1);
        let live = Arc::new(Mutex::new(LiveProgress::default()));
        self.ops_started += 1;
        self.running = Some(RunningOp {
            op_id,
            request: kind,
            started: Instant::now(),
            live: live.clone(),
        });
        let from = self.state;
        self.state = self.transient(kind);
        let record = self.record.clone();
        let mut op = OpCtx::new(self.deps.clone(), self.uuid, op_id, kind, live);
        let span =
            tracing::info_span!("op", instance = %self.uuid, op = op_id.0, request = kind.as_str());
        let _ = ctx;
        let fut = async move {
            info!("started");
            let fin = dispatch(&mut op, request, record, from).await;
            match &fin.result {
                Ok(()) => info!(state = %fin.state, "done"),
                Err(e) => warn!(state = %fin.state, error = %error_chain(e), "failed"),
            }
            // The power state as libvirt has it now, for the states that do not say whether
            // the guest runs (error, resize-target, ...).
            let power = match implied_power(fin.state) {
                Some(p) => Some(p),
                None => match op.deps.libvirt.info(op.uuid).await {
                    Ok(info) => Some(power_of(info.state)),
                    Err(crate::libvirt::LibvirtError::NoDomain { .. }) => {
                        Some(PowerState::NoDomain)
                    }
                    Err(_) => None,
                },
            };
            (fin, power, op.into_report())
        }
        .instrument(span);
        let fut = fut
            .into_actor(self)
            .map(move |(fin, power, report), act, ctx| {
                act.finish(kind, from, fin, power, report, ctx)
            });
        (op_id, Box::pin(fut))
    }

    fn finish(
        &mut self,
        request: Request,
        from: InstanceState,
        fin: Finished,
        power: Option<PowerState>,
        report: OpReport,
        ctx: &mut Context<Self>,
    ) -> Reply {
        // The operation went from `from` through the transient state it showed while it ran
        // (`self.state`, e.g. building) to where it ended.
        let via = self.state;
        let mut fin = fin;
        if let Err(transition) = check_end(request, from, via, fin.state, fin.result.is_ok()) {
            // A flow ended where the lifecycle does not allow: a bug, reported as the result.
            error!(instance = %self.uuid, %transition, "unexpected lifecycle transition");
            let cause = fin.result.err().map(Box::new);
            fin.result = Err(InstanceError::UnexpectedTransition { transition, cause });
        }
        let mut fin = fin;
        if from == InstanceState::Gone && fin.result.is_err() {
            // Removing a left-behind instance's leftovers failed: it stays gone from this
            // host, with what is left for the next attempt.
            fin.state = InstanceState::Gone;
        }
        self.state = fin.state;
        self.record = fin.record;
        self.running = None;
        self.power = power.unwrap_or(self.power);
        self.last_report = Some(report.clone());
        let reply = fin.result.map(|()| InstanceReply::Done {
            state: self.state,
            report,
        });
        self.after_op(request, ctx);
        reply
    }

    /// Run queued destroys, or leave once nothing of the instance is here. A confirmed
    /// resize's source that answered before its removal (`remove_after`) removes the old
    /// instance now, before anything else the actor is asked.
    fn after_op(&mut self, request: Request, ctx: &mut Context<Self>) {
        if !self.queued_destroys.is_empty() {
            let waiters = std::mem::take(&mut self.queued_destroys);
            let args = DestroyArgs {
                // A left-behind instance's networking belongs to the host that has it.
                deallocate_network: !self.left_behind()
                    && waiters.iter().any(|(a, _)| a.deallocate_network),
            };
            let fut = self.start(Operation::Destroy(args), ctx);
            ctx.spawn(fut.map(move |reply, _act, _ctx| {
                let reply = reply.map_err(Arc::new);
                for (_, tx) in waiters {
                    let _ = tx.send(match &reply {
                        Ok(r) => Ok(r.clone()),
                        Err(e) => Err(InstanceError::QueuedDestroy { cause: e.clone() }),
                    });
                }
            }));
            return;
        }
        if self.left_behind() && !self.stopping {
            if request == Request::ConfirmResizeSource {
                self.remove_leftovers(ctx);
                return;
            }
            info!(instance = %self.uuid, "gone from this host; libvirt keeps some of it: removed on the next resync or destroy");
            return;
        }
        if matches!(self.state, InstanceState::Gone) || self.stopping {
            self.leave(ctx);
        }
    }

    /// Tell the host actor and stop. (The replies of queued destroys are sent before: they
    /// go to tickets the callers hold, not to futures of this actor's context.)
    fn leave(&mut self, ctx: &mut Context<Self>) {
        self.gone.do_send(InstanceGone {
            uuid: self.uuid,
            addr: ctx.address(),
        });
        ctx.stop();
    }

    fn view(&self) -> InstanceView {
        let operation = self.running.as_ref().map(|r| {
            let (phase, waiting_for, deadline) = r
                .live
                .lock()
                .map(|l| (l.phase.clone(), l.waiting_for.clone(), l.wait_deadline))
                .unwrap_or_default();
            Progress {
                op_id: r.op_id.0,
                request: r.request.as_str().to_owned(),
                phase,
                elapsed: r.started.elapsed(),
                waiting_for,
                wait_remaining: deadline
                    .map(|d| d.saturating_duration_since(tokio::time::Instant::now())),
            }
        });
        let vifs = self
            .record
            .as_ref()
            .map(|r| {
                r.network_info
                    .vifs
                    .iter()
                    .map(|v| VifView {
                        port: v.id,
                        mac: v.address.to_string(),
                        vif_type: v.vif_type.as_str().to_owned(),
                        vnic_type: v.vnic_type.as_str().to_owned(),
                        hybrid: v.details.ovs_hybrid_plug,
                        device: v.tap_name(),
                        bound_by: v.details.bound_by.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        InstanceView {
            uuid: self.uuid,
            host: self.deps.host.clone(),
            name: self.record.as_ref().map(|r| r.name.clone()),
            state: self.state,
            power: self.power,
            flavor: self.record.as_ref().map(|r| r.flavor.name.clone()),
            size: self
                .record
                .as_ref()
                .map(|r| (r.flavor.vcpus, r.flavor.memory_mb)),
            vifs,
            disks: self
                .record
                .as_ref()
                .map(|r| r.storage.disks.clone())
                .unwrap_or_default(),
            operation,
            last_operation: self.last_report.clone(),
            handover: self.record.as_ref().map(|r| {
                super::ops::handover(
                    r,
                    &r.flavor,
                    self.power == super::types::PowerState::Running,
                )
            }),
        }
    }

    /// Read the domain's real state and follow it (events are hints).
    fn reconcile(&mut self, ctx: &mut Context<Self>) {
        if self.running.is_some() {
            return;
        }
        let lv = self.deps.libvirt.clone();
        let uuid = self.uuid;
        let seq = self.ops_started;
        let fut = async move { lv.info(uuid).await };
        ctx.spawn(fut.into_actor(self).map(move |res, act, ctx| {
            // An operation that ran meanwhile knows better than a read taken before it.
            if act.running.is_some() || act.ops_started != seq {
                return;
            }
            let power = match res {
                Ok(info) => power_of(info.state),
                Err(crate::libvirt::LibvirtError::NoDomain { .. }) => PowerState::NoDomain,
                Err(e) => {
                    debug!(instance = %act.uuid, error = %e, "reconcile: cannot read state");
                    return;
                }
            };
            act.follow_power(power, ctx);
        }));
    }

    fn follow_power(&mut self, power: PowerState, ctx: &mut Context<Self>) {
        self.power = power;
        let next = match (self.state, power) {
            (InstanceState::Stopped | InstanceState::Paused, PowerState::Running) => {
                InstanceState::Running
            }
            (InstanceState::Running, PowerState::Paused) => InstanceState::Paused,
            (InstanceState::Running | InstanceState::Paused, PowerState::Shutoff) => {
                InstanceState::Stopped
            }
            // The instance's devices and ports are still here: keep the record so destroy
            // (or the reschedule clean-up) can release them. An errored instance may have
            // lost its domain in vireo's own rollback.
            (s, PowerState::NoDomain)
                if s.has_domain()
                    && !matches!(s, InstanceState::Incoming | InstanceState::Error) =>
            {
                warn!(instance = %self.uuid, state = %s, "domain vanished outside vireo");
                InstanceState::Error
            }
            (s, _) => s,
        };
        if next != self.state && valid_transition(self.state, next) {
            info!(instance = %self.uuid, from = %self.state, to = %next, "power state changed outside an operation");
            // libvirt made or removed the domain's devices without vireo: tell the plugger,
            // as an operation does (before the next request is handled).
            let was_up = matches!(self.state, InstanceState::Running | InstanceState::Paused);
            let is_up = matches!(next, InstanceState::Running | InstanceState::Paused);
            if was_up != is_up {
                let ports: Vec<_> = self
                    .record
                    .as_ref()
                    .map(|r| r.network_info.port_ids())
                    .unwrap_or_default();
                let plugger = self.deps.plugger.clone();
                ctx.wait(
                    async move {
                        if is_up {
                            plugger.devices_attached(&ports).await;
                        } else {
                            plugger.devices_detached(&ports).await;
                        }
                    }
                    .into_actor(self),
                );
            }
            self.state = next;
            if let Some(r) = &mut self.record {
                r.state = next;
            }
        }
    }
}

impl Actor for InstanceActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        debug!(instance = %self.uuid, state = %self.state, "instance actor started");
        // Recovered as gone (an agent stopped between a confirmed resize's answer and the
        // removal of the old instance): removed now.
        if self.left_behind() {
            self.remove_leftovers(ctx);
        }
    }
}

impl Handler<Submit> for InstanceActor {
    type Result = Result<Ticket, AdmissionError>;

    fn handle(&mut self, msg: Submit, ctx: &mut Self::Context) -> Self::Result {
        let request = msg.0;
        let kind = request.kind();
        if let Operation::Destroy(args) = &request {
            if let Some(running) = &self.running {
                // One destroy at a time (a left-behind instance's own clean-up aside).
                let destroying = running.request == Request::Destroy && !self.left_behind();
                if destroying || !self.queued_destroys.is_empty() {
                    return Err(AdmissionError::Busy {
                        running: running.request,
                    });
                }
                // Cancel the running operation's waits so it rolls back now; destroy next.
                let (ticket, tx) = Ticket::new(kind, Admitted::Queued);
                self.queued_destroys.push((*args, tx));
                let events = self.deps.events.clone();
                let (uuid, op_id) = (self.uuid, running.op_id);
                actix::spawn(async move {
                    let _ = events.cancel(uuid, op_id).await;
                });
                return Ok(ticket);
            }
            if self.left_behind() {
                // Its networking belongs to the host that has the instance now.
                let leftovers = Operation::Destroy(DestroyArgs {
                    deallocate_network: false,
                });
                return Ok(self.admit(leftovers, ctx));
            }
            if matches!(self.state, InstanceState::Absent | InstanceState::Gone)
                && self.record.is_none()
            {
                return Ok(nothing_to_destroy());
            }
        }
        if let Some(done) = self.taken_over_already(&request) {
            return Ok(done);
        }
        if let Some(e) = self.refuse(&request) {
            return Err(e);
        }
        Ok(self.admit(request, ctx))
    }
}

/// Destroy is idempotent: with nothing of the instance here it is done at once.
pub(crate) fn nothing_to_destroy() -> Ticket {
    let report = OpReport {
        request: Request::Destroy.as_str().to_owned(),
        ..OpReport::default()
    };
    Ticket::nothing_here(
        Request::Destroy,
        Ok(InstanceReply::Done {
            state: InstanceState::Gone,
            report,
        }),
    )
}

impl Handler<Show> for InstanceActor {
    type Result = MessageResult<Show>;

    fn handle(&mut self, _msg: Show, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.view())
    }
}

impl Handler<DomainEvent> for InstanceActor {
    type Result = ();

    fn handle(&mut self, msg: DomainEvent, ctx: &mut Self::Context) {
        if self.running.is_some() {
            return;
        }
        match msg.event {
            // A stop may be the first half of a reboot: look again a little later.
            LifecycleEvent::Stopped | LifecycleEvent::Shutdown | LifecycleEvent::Crashed => {
                ctx.run_later(self.deps.config.lifecycle_debounce, |act, ctx| {
                    act.reconcile(ctx)
                });
            }
            // Nothing to read: the event says what this actor knows already (typically the
            // late echo of an operation's own start or resume; a pause or stop in between
            // would have come as its own event and been read).
            LifecycleEvent::Started | LifecycleEvent::Resumed
                if self.power == PowerState::Running => {}
            LifecycleEvent::Defined if self.power != PowerState::NoDomain => {}
            _ => self.reconcile(ctx),
        }
    }
}

impl Handler<Resync> for InstanceActor {
    type Result = ();

    fn handle(&mut self, _msg: Resync, ctx: &mut Self::Context) {
        if self.left_behind() {
            self.remove_leftovers(ctx);
        } else {
            self.reconcile(ctx);
        }
    }
}

impl Handler<Stop> for InstanceActor {
    type Result = ();

    fn handle(&mut self, _msg: Stop, ctx: &mut Self::Context) {
        self.stopping = true;
        match &self.running {
            Some(running) => {
                let events = self.deps.events.clone();
                let (uuid, op_id) = (self.uuid, running.op_id);
                actix::spawn(async move {
                    let _ = events.cancel(uuid, op_id).await;
                });
            }
            None => ctx.stop(),
        }
    }
}

impl Handler<RecoverInterrupted> for InstanceActor {
    type Result = ResponseActFuture<Self, Reply>;

    fn handle(&mut self, msg: RecoverInterrupted, ctx: &mut Self::Context) -> Self::Result {
        if let Some(running) = &self.running {
            return Box::pin(fut::ready(Err(AdmissionError::Busy {
                running: running.request,
            }
            .into())));
        }
        let interrupted = msg.0;
        info!(instance = %self.uuid, interrupted = %interrupted.describe(), "recovering an interrupted operation");
        let role = self
            .record
            .as_ref()
            .and_then(|r| r.resize.as_ref())
            .map(|r| r.role);
        let target = role == Some(ResizeRole::Target);
        let direct = match &interrupted {
            Interrupted::Marked(marker) => match &marker.operation {
                // A build that did not finish is rolled back: nothing stays, networking released.
                InFlight::Spawn => Some(Operation::CleanupForReschedule {}),
                // A finish Nova runs: only this host's copy goes (ops::recover); Nova's
                // driver asks for the finish again.
                InFlight::FinishResize(step) | InFlight::FinishRevertResize(step)
                    if step.by_caller =>
                {
                    None
                }
                // The destination of a resize: remove the copy, have the source take it back.
                InFlight::FinishResize(_) | InFlight::RevertResize(_) if target => {
                    Some(Operation::RevertResize {})
                }
                // A start that did not finish (a soft reboot's too, which shuts the guest
                // down and starts it): start again, waiting for what the model predicts.
                InFlight::PowerOn | InFlight::RebootHard | InFlight::RebootSoft => {
                    Some(Operation::RebootHard {})
                }
                // Everything else (a live migration the guest never left for, a resize handed
                // over or not, a revert bringing the guest back on the source, an interface
                // half attached or detached): see ops::recover.
                InFlight::FinishResize(_)
                | InFlight::RevertResize(_)
                | InFlight::FinishRevertResize(_)
                | InFlight::Resize(_)
                | InFlight::LiveMigrate(_)
                | InFlight::AttachInterface(_)
                | InFlight::DetachInterface(_) => None,
            },
            // Written by another version or damaged: reconcile with libvirt.
            Interrupted::Unreadable(error) => {
                warn!(instance = %self.uuid, error = %error_chain(error.as_ref()), "in-flight operation unreadable; reconciling only");
                None
            }
        };
        match direct {
            Some(request) if accepts(self.state, request.kind()) => self.start(request, ctx),
            Some(request) => {
                let kind = request.kind();
                warn!(instance = %self.uuid, state = %self.state, request = %kind,
                    "cannot recover with {kind} from {}; reconciling only", self.state);
                self.start(Operation::Recover(Box::new(interrupted)), ctx)
            }
            None => self.start(Operation::Recover(Box::new(interrupted)), ctx),
        }
    }
}

/// The power state a stable state implies (None: only libvirt can tell).
fn implied_power(state: InstanceState) -> Option<PowerState> {
    match state {
        InstanceState::Running => Some(PowerState::Running),
        InstanceState::Paused => Some(PowerState::Paused),
        InstanceState::Stopped | InstanceState::ResizeSource => Some(PowerState::Shutoff),
        InstanceState::Suspended => Some(PowerState::Suspended),
        InstanceState::Gone | InstanceState::Absent => Some(PowerState::NoDomain),
        _ => None,
    }
}

/// The error and its sources on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        s.push_str(": ");
        s.push_str(&src.to_string());
        cur = src.source();
    }
    s
}
