//! The operations, one module per family, each a sequence of building blocks from
//! [`super::op`] with its rollback.
//!
//! Every operation takes the instance's record and state as they were when it started and
//! returns a [`Finished`]: the state (and record) the instance is left in, and the result. On
//! failure an operation rolls back what it did before it returns; the state then says where
//! the instance is (`rolled back` = the state it started in; `error` = consistent but needs
//! destroy, hard reboot or power on). docs/ARCHITECTURE.md has the table.
//!
//! # Layout
//! - [`spawn`]: spawn, destroy, the reschedule clean-up, releasing the networking.
//! - [`power`]: power off/on, reboots, pause, suspend/resume.
//! - [`resize`]: resize on both hosts, confirm, revert, the same-host variants.
//! - [`migrate`]: live migration, its rollback, the destination's side.
//! - [`interfaces`]: attach and detach a port.
//! - [`recover`]: operations interrupted by an agent stop.
//! - here: what they share — [`Finished`], the prediction and wait policy, the state read
//!   back after a failure, [`boot_with_events`], the one rollback shape ([`with_rollback`]),
//!   the hand-over between hosts, and [`dispatch`], which picks the operation for a request.
//!
//! Why split this way: each family owns its requests' in-flight markers (the
//! [`InFlight`](crate::instance::InFlight) variants) and their rollbacks, so what an
//! interrupted or failed operation leaves behind is read in one file.

mod interfaces;
mod migrate;
mod power;
mod recover;
mod resize;
mod spawn;

use crate::events::WaitPolicy;
use crate::lifecycle::{InstanceState, Request};
use crate::network::PortStatus;
use crate::predict::{predict, EventOp, Prediction, Timing};
use crate::vif::{NetworkInfo, Vif};

use crate::instance::admission::AdmissionError;
use crate::instance::op::{OpCtx, PendingWait};
use crate::instance::operation::Operation;
use crate::instance::record::InstanceRecord;
use crate::instance::types::{DestroyArgs, Handover, InstanceError, InvalidOperation, PowerState};

/// Where an operation left the instance.
#[derive(Debug)]
pub(crate) struct Finished {
    /// The state now.
    pub state: InstanceState,
    /// The record now (None: nothing of the instance is left on this host). With
    /// [`InstanceState::Gone`]: the instance left this host, but libvirt still has what
    /// could not be removed (see [`super::actor`]: removed on the next resync or destroy).
    pub record: Option<InstanceRecord>,
    /// The operation's result.
    pub result: Result<(), InstanceError>,
}

impl Finished {
    fn ok(state: InstanceState, record: Option<InstanceRecord>) -> Self {
        Finished {
            state,
            record: record.map(|mut r| {
                r.state = state;
                r
            }),
            result: Ok(()),
        }
    }

    fn err(state: InstanceState, record: Option<InstanceRecord>, e: InstanceError) -> Self {
        Finished {
            state,
            record: record.map(|mut r| {
                r.state = state;
                r
            }),
            result: Err(e),
        }
    }
}

impl Finished {
    /// A failure an operation rolled back from: [`InstanceError::RolledBack`] in `state`
    /// when the rollback did all it had to, [`InstanceError::RollbackFailed`] (with what it
    /// could not undo) in `error` otherwise. The record is the one the rollback left.
    fn rolled_back(
        request: Request,
        state: InstanceState,
        record: Option<InstanceRecord>,
        cause: InstanceError,
        rollback: Result<(), String>,
    ) -> Self {
        match rollback {
            Ok(()) => Finished::err(
                state,
                record,
                InstanceError::RolledBack {
                    request,
                    cause: Box::new(cause),
                },
            ),
            Err(rollback) => Finished::err(
                InstanceState::Error,
                record,
                InstanceError::RollbackFailed {
                    request,
                    rollback,
                    cause: Box::new(cause),
                },
            ),
        }
    }
}

/// Run an operation's steps; when one fails, end the operation's event waits (none it
/// registered outlives it: a late event is not taken for a later operation's) and run its
/// rollback with the failure. `Ok`: what the steps returned; `Err`: where the rollback left
/// the instance. The shared shape of every operation that registers event waits; those
/// that register none keep a plain `match` (no waits to end).
async fn with_rollback<T>(
    op: &mut OpCtx,
    steps: impl AsyncFnOnce(&mut OpCtx) -> Result<T, InstanceError>,
    rollback: impl AsyncFnOnce(&mut OpCtx, InstanceError) -> Finished,
) -> Result<T, Finished> {
    match steps(op).await {
        Ok(done) => Ok(done),
        Err(cause) => {
            op.cancel_waits().await;
            Err(rollback(op, cause).await)
        }
    }
}

fn predicted(op: &OpCtx, operation: &EventOp, vifs: &[Vif]) -> Result<Prediction, InstanceError> {
    predict(operation, vifs, &op.deps.config.wiring()).map_err(InstanceError::Predict)
}

fn policy(op: &OpCtx) -> WaitPolicy {
    op.deps.config.wait
}

/// Remove this host's copy of the instance (a resize's other side): destroy its domain,
/// unplug its VIFs, undefine it, then remove its disks here (only once the domain is gone:
/// nothing may still use them). Each step is tried whatever the one before did; the first
/// failure is the answer.
pub(crate) async fn remove_domain(
    op: &mut OpCtx,
    record: &InstanceRecord,
) -> Result<(), InstanceError> {
    let destroyed = op.destroy_domain().await;
    let unplugged = op.unplug_all(record).await;
    let undefined = op.undefine_domain().await;
    let removed = destroyed.and(unplugged).and(undefined);
    // A resize's disks shared with the other host are not this host's to remove.
    let shared = record.resize_shares_disks();
    if removed.is_ok() && !record.storage.disks.is_empty() && !shared {
        let storage = op.deps.storage.clone();
        let uuid = op.uuid;
        return op.store("remove disks", storage.remove(uuid)).await;
    }
    removed
}

/// Register the prediction's bind-time and plug-time waits: before whatever triggers either
/// (binding the ports, plugging), so that no event of theirs can come first.
pub(crate) async fn expect_predicted(
    op: &mut OpCtx,
    prediction: &Prediction,
) -> Result<(PendingWait, PendingWait), InstanceError> {
    let pol = policy(op);
    let bind = op
        .expect(Timing::BindTime, prediction.bind_time_events(), pol)
        .await?;
    let plug = op
        .expect(Timing::PlugTime, prediction.plug_time_events(), pol)
        .await?;
    Ok((bind, plug))
}

/// The power a stable state implies after an operation that may have started the guest.
fn running_or_stopped(running: bool) -> InstanceState {
    if running {
        InstanceState::Running
    } else {
        InstanceState::Stopped
    }
}

/// Mark VIFs whose port is ACTIVE on this host already as active.
async fn refresh_active(op: &mut OpCtx, ni: &mut NetworkInfo) -> Result<(), InstanceError> {
    let net = op.deps.network.clone();
    for vif in &mut ni.vifs {
        if vif.active {
            continue;
        }
        let port = op.net("get port", net.get_port(vif.id)).await?;
        if port.status == PortStatus::Active && port.host_id == op.deps.host {
            vif.active = true;
        }
    }
    Ok(())
}

/// What state the domain is really in after a failed operation.
async fn settle_state(op: &mut OpCtx, fallback: InstanceState) -> InstanceState {
    match op.power().await {
        Ok(PowerState::Running) => InstanceState::Running,
        Ok(PowerState::Paused) => InstanceState::Paused,
        Ok(PowerState::Shutoff) => InstanceState::Stopped,
        Ok(PowerState::Suspended) => InstanceState::Suspended,
        Ok(PowerState::NoDomain) => InstanceState::Error,
        _ => fallback,
    }
}

/// Start the guest with the devices wired and the predicted events awaited: the common tail
/// of power on, hard reboot, resume and the same-host resize and revert. `operation` picks
/// the prediction.
async fn boot_with_events(
    op: &mut OpCtx,
    record: &InstanceRecord,
    operation: EventOp,
    run: bool,
) -> Result<(), InstanceError> {
    let prediction = predicted(op, &operation, &record.network_info.vifs)?;
    boot_predicted(op, record, &prediction, run).await
}

/// [`boot_with_events`] with the prediction made already: spawn predicts before it defines
/// the domain (a VIF the model refuses fails the build before anything exists), then boots.
/// Register the waits, plug, start paused, await, then resume (`run`) or stop again.
async fn boot_predicted(
    op: &mut OpCtx,
    record: &InstanceRecord,
    prediction: &Prediction,
    run: bool,
) -> Result<(), InstanceError> {
    let (bind, plug) = expect_predicted(op, prediction).await?;
    start_awaited(op, record, bind, plug, run).await
}

/// The tail of a boot once its waits are registered: plug, start paused, await the
/// bind-time and plug-time events (the domain's start overlaps them; nothing runs in the
/// guest before both came), then resume (`run`) or stop again.
async fn start_awaited(
    op: &mut OpCtx,
    record: &InstanceRecord,
    bind: PendingWait,
    plug: PendingWait,
    run: bool,
) -> Result<(), InstanceError> {
    op.phase("plug");
    op.plug_all(record).await?;
    op.phase("start paused");
    op.start_paused().await?;
    op.phase("wait for events");
    op.wait(bind).await?;
    op.wait(plug).await?;
    if run {
        op.phase("resume");
        op.resume().await
    } else {
        op.destroy_domain().await
    }
}

pub(crate) fn handover(
    record: &InstanceRecord,
    flavor: &vireo_xml::metadata::Flavor,
    power_on: bool,
) -> Handover {
    Handover {
        name: record.name.clone(),
        flavor: flavor.clone(),
        old_flavor: record.flavor.clone(),
        boot: record.boot.clone(),
        // A resize's destination copies the disks (`finish_resize`); a live migration's names
        // the same files (an instance directory both hosts share).
        storage: record.storage.clone(),
        network_info: record.network_info.to_value(),
        power_on,
    }
}

fn record_from_handover(op: &OpCtx, h: &Handover) -> Result<InstanceRecord, InstanceError> {
    let network_info =
        NetworkInfo::from_value(&h.network_info).map_err(InvalidOperation::HandoverNetworkInfo)?;
    Ok(InstanceRecord {
        uuid: op.uuid,
        name: h.name.clone(),
        flavor: h.flavor.clone(),
        boot: h.boot.clone(),
        storage: h.storage.clone(),
        network_info,
        state: InstanceState::Absent,
        resize: None,
        arrived_by: None,
    })
}

/// Run the operation a request names (the actor checked it against the lifecycle).
pub(crate) async fn dispatch(
    op: &mut OpCtx,
    request: Operation,
    record: Option<InstanceRecord>,
    from: InstanceState,
) -> Finished {
    use Operation as R;
    match request {
        R::Spawn(args) => return spawn::spawn(op, *args).await,
        R::Destroy(args) => {
            if let Some(r) = &record {
                op.use_record(r);
            }
            return spawn::destroy(op, record, args, from == InstanceState::Error).await;
        }
        R::CleanupForReschedule {} => {
            if let Some(r) = &record {
                op.use_record(r);
            }
            return spawn::destroy(
                op,
                record,
                DestroyArgs {
                    deallocate_network: true,
                },
                from == InstanceState::Error,
            )
            .await;
        }
        R::FinishResize {
            migration,
            handover,
            caller,
        } => return resize::finish_resize(op, migration, *handover, caller).await,
        R::PreLiveMigration {
            migration,
            handover,
            caller,
        } => return migrate::pre_live_migration(op, migration, *handover, caller).await,
        R::RollbackLiveMigrationAtDestination {
            handover,
            do_cleanup,
            destroy_disks,
            migration_id,
            caller,
        } => {
            // Under Nova only what this host prepared is removed: it holds the incoming
            // instance (a pre-live-migration that refused made nothing).
            let prepared_here = caller.is_none() || record.is_some();
            return migrate::rollback_at_destination(
                op,
                from,
                *handover,
                do_cleanup,
                destroy_disks && prepared_here,
                migration_id,
            )
            .await;
        }
        _ => {}
    }
    let Some(record) = record else {
        return Finished {
            state: from,
            record: None,
            result: Err(AdmissionError::NotFound(op.uuid).into()),
        };
    };
    op.use_record(&record);
    match request {
        R::PowerOff { timeout } => power::power_off(op, record, from, timeout).await,
        R::PowerOn {} => power::power_on(op, record, from).await,
        R::RebootSoft {} => power::reboot_soft(op, record).await,
        R::RebootHard {} => power::reboot_hard(op, record).await,
        R::Pause {} => power::pause(op, record, true).await,
        R::Unpause {} => power::pause(op, record, false).await,
        R::Suspend {} => power::suspend(op, record, from).await,
        R::Resume {} => power::resume(op, record).await,
        R::Resize(args) => resize::resize(op, record, from, *args).await,
        R::ConfirmResize {} => resize::confirm_resize(op, record).await,
        R::ConfirmResizeSource { remove_after } => {
            resize::confirm_resize_source(op, record, remove_after).await
        }
        R::RevertResize {} => resize::revert_resize(op, record).await,
        R::FinishRevertResize { caller } => resize::finish_revert_resize(op, record, caller).await,
        R::LiveMigrate(args) => migrate::live_migrate(op, record, from, *args).await,
        R::PostLiveMigrationAtDestination { migration, caller } => {
            migrate::post_live_migration(op, record, migration, caller).await
        }
        R::AttachInterface { vif } => interfaces::attach_interface(op, record, from, *vif).await,
        R::DetachInterface { port_id } => {
            interfaces::detach_interface(op, record, from, port_id).await
        }
        R::PlugVifs {} => interfaces::plug_vifs(op, record, from).await,
        R::UnplugVifs {} => interfaces::unplug_vifs(op, record, from).await,
        R::Recover(interrupted) => recover::recover(op, record, from, *interrupted).await,
        R::Spawn(_)
        | R::Destroy(_)
        | R::CleanupForReschedule {}
        | R::FinishResize { .. }
        | R::PreLiveMigration { .. }
        | R::RollbackLiveMigrationAtDestination { .. } => Finished {
            state: from,
            record: Some(record),
            result: Err(InvalidOperation::Misrouted {
                request: op.request,
            }
            .into()),
        },
    }
}
