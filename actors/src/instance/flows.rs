//! The operations, each a sequence of building blocks from [`super::op`] with its rollback.
//!
//! Every flow takes the instance's record and state as they were when it started and returns
//! a [`Finished`]: the state (and record) the instance is left in, and the result. On failure a
//! flow rolls back what it did before it returns; the state then says where the instance is
//! (`rolled back` = the state it started in; `error` = consistent but needs destroy, hard
//! reboot or power on). docs/ARCHITECTURE.md has the table.

use std::collections::BTreeSet;

use tracing::{info, warn};

use crate::events::WaitPolicy;
use crate::lifecycle::{InstanceState, Request};
use crate::network::{
    BindingStatus, MigrationHosts, NetworkError, NewBinding, PortStatus, PortUpdate, MIGRATING_TO,
};
use crate::predict::{predict, ExpectedEvent, Operation, Prediction, Timing};
use crate::vif::{NetworkInfo, PortId, Vif};

use super::admission::AdmissionError;
use super::in_flight::{InFlight, InterfaceStep, Interrupted, MigrationStep, RevertStep};
use super::op::OpCtx;
use super::record::{InstanceRecord, ResizeRecord, ResizeRole};
use super::types::{
    DestroyArgs, Handover, InstanceError, InstanceRequest, LiveMigrateArgs, Migration,
    NetworkRequest, PowerState, Released, ResizeArgs, SpawnArgs,
};

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

fn predicted(op: &OpCtx, operation: &Operation, vifs: &[Vif]) -> Result<Prediction, InstanceError> {
    predict(operation, vifs, &op.deps.config.wiring()).map_err(InstanceError::Predict)
}

fn policy(op: &OpCtx) -> WaitPolicy {
    op.deps.config.wait
}

/// The power a stable state implies after an operation that may have started the guest.
fn running_or_stopped(running: bool) -> InstanceState {
    if running {
        InstanceState::Running
    } else {
        InstanceState::Stopped
    }
}

// ----------------------------------------------------------------------------------------
// Spawn and the reschedule clean-up

/// Build the instance: network (allocate or take the caller's), define, register the
/// predicted waits, plug, start paused, await, resume. Any failure: destroy, unplug,
/// undefine, release the networking, then report a build failure that may be rescheduled.
pub(crate) async fn spawn(op: &mut OpCtx, args: SpawnArgs) -> Finished {
    let SpawnArgs {
        name,
        flavor,
        boot,
        network,
        power_on,
    } = args;
    op.phase("network");
    // Known to the network-event actor from the start: an event that comes from here on
    // (a port going ACTIVE while its status is read below) is kept for the waits
    // registered later, not dropped as one for an unknown instance.
    op.deps.events.track(op.uuid);
    let host = op.deps.host.clone();
    let mut network_info = match network {
        NetworkRequest::Allocate(requests) => {
            let net = op.deps.network.clone();
            match op
                .net(
                    "allocate",
                    net.allocate_for_instance(op.uuid, &host, &requests),
                )
                .await
            {
                Ok(ni) => ni,
                // allocate_for_instance cleaned up after itself.
                Err(cause) => {
                    op.deps.events.forget(op.uuid);
                    return Finished::err(
                        InstanceState::Gone,
                        None,
                        InstanceError::BuildFailed {
                            reschedule: true,
                            released: Released::default(),
                            cause: Box::new(cause),
                        },
                    );
                }
            }
        }
        NetworkRequest::Allocated(ni) => ni,
    };
    let record = InstanceRecord {
        uuid: op.uuid,
        name,
        flavor,
        boot,
        network_info: network_info.clone(),
        state: InstanceState::Building,
        resize: None,
    };
    op.use_record(&record);
    let result = async {
        // The caller's network_info may be older than the ports: a port that is ACTIVE on
        // this host already has no transition left to report. Read after the operation
        // began, so an event that makes it ACTIVE from here on is kept for the wait.
        refresh_active(op, &mut network_info).await?;
        let mut record = record.clone();
        record.network_info = network_info.clone();
        spawn_steps(op, &record, power_on).await
    }
    .await;
    match result {
        Ok(state) => {
            let mut record = record;
            record.network_info = network_info;
            Finished::ok(state, Some(record))
        }
        Err(cause) => {
            op.cancel_waits().await;
            op.phase("rollback");
            let mut leftovers = Vec::new();
            if let Err(e) = op.destroy_domain().await {
                leftovers.push(format!("destroy: {e}"));
            }
            if let Err(e) = op.unplug_all(&record).await {
                leftovers.push(format!("unplug: {e}"));
            }
            if let Err(e) = op.undefine_domain().await {
                leftovers.push(format!("undefine: {e}"));
            }
            let released = release_network(op, &record.network_info).await;
            let reschedule = !matches!(
                cause,
                InstanceError::Invalid(_)
                    | InstanceError::Predict(_)
                    | InstanceError::VifConfig(_)
                    | InstanceError::Record(_)
            );
            let (released, release_err) = match released {
                Ok(r) => (r, None),
                Err(e) => (Released::default(), Some(e)),
            };
            op.report.released = Some(released.clone());
            op.deps.events.forget(op.uuid);
            if let Some(e) = release_err {
                leftovers.push(format!("release networking: {e}"));
            }
            if leftovers.is_empty() {
                Finished::err(
                    InstanceState::Gone,
                    None,
                    InstanceError::BuildFailed {
                        reschedule,
                        released,
                        cause: Box::new(cause),
                    },
                )
            } else {
                warn!(instance = %op.uuid, ?leftovers, "build clean-up incomplete");
                Finished::err(
                    InstanceState::Error,
                    Some(record),
                    InstanceError::RollbackFailed {
                        request: Request::Spawn,
                        rollback: leftovers.join("; "),
                        cause: Box::new(cause),
                    },
                )
            }
        }
    }
}

async fn spawn_steps(
    op: &mut OpCtx,
    record: &InstanceRecord,
    power_on: bool,
) -> Result<InstanceState, InstanceError> {
    let prediction = predicted(op, &Operation::Spawn, &record.network_info.vifs)?;
    op.phase("define");
    let in_flight = op.in_flight("define", InFlight::Spawn);
    op.define(record, Some(in_flight)).await?;
    let pol = policy(op);
    let bind = op
        .expect(Timing::BindTime, prediction.bind_time_events(), pol)
        .await?;
    let plug = op
        .expect(Timing::PlugTime, prediction.plug_time_events(), pol)
        .await?;
    op.phase("plug");
    op.plug_all(record).await?;
    op.phase("start paused");
    op.start_paused().await?;
    op.phase("wait for events");
    op.wait(bind).await?;
    op.wait(plug).await?;
    let state = if power_on {
        op.phase("resume");
        op.resume().await?;
        InstanceState::Running
    } else {
        op.destroy_domain().await?;
        InstanceState::Stopped
    };
    let mut done = record.clone();
    done.state = state;
    op.save(&done, None).await?;
    Ok(state)
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

/// Release the instance's networking (delete the ports vireo created, unbind the others).
async fn release_network(op: &mut OpCtx, ni: &NetworkInfo) -> Result<Released, InstanceError> {
    let net = op.deps.network.clone();
    let uuid = op.uuid;
    op.phase("release networking");
    op.net("deallocate", net.deallocate_for_instance(uuid, ni))
        .await
        .map(Released::from)
}

// ----------------------------------------------------------------------------------------
// Destroy

/// Destroy the domain, unplug every VIF, undefine; optionally release networking.
/// Idempotent: whatever is already gone is skipped.
pub(crate) async fn destroy(
    op: &mut OpCtx,
    record: Option<InstanceRecord>,
    args: DestroyArgs,
) -> Finished {
    op.phase("destroy");
    let mut errors = Vec::new();
    if let Err(e) = op.destroy_domain().await {
        errors.push(e);
    }
    if let Some(r) = &record {
        if let Err(e) = op.unplug_all(r).await {
            errors.push(e);
        }
    }
    if let Err(e) = op.undefine_domain().await {
        errors.push(e);
    }
    if args.deallocate_network {
        if let Some(r) = &record {
            let released = match clear_migration_leftovers(op, &r.network_info).await {
                Ok(()) => release_network(op, &r.network_info).await,
                // Unbinding now would hide what is left: keep the ports for a retry.
                Err(e) => Err(e),
            };
            match released {
                Ok(released) => op.report.released = Some(released),
                Err(e) => errors.push(e),
            }
        }
    }
    if errors.is_empty() {
        op.deps.events.forget(op.uuid);
        Finished::ok(InstanceState::Gone, None)
    } else {
        let first = errors.remove(0);
        Finished::err(InstanceState::Error, record, first)
    }
}

/// A live migration whose rollback could not reach the network service leaves
/// `migrating_to` and inactive bindings for the destination on the ports. The release
/// deletes the ports vireo created, bindings and all, and only unbinds user-supplied ones:
/// take those marks off them first.
async fn clear_migration_leftovers(op: &mut OpCtx, ni: &NetworkInfo) -> Result<(), InstanceError> {
    let net = op.deps.network.clone();
    for vif in ni.vifs.iter().filter(|v| v.preserve_on_delete) {
        let bindings = match op.net("show bindings", net.show_bindings(vif.id)).await {
            Ok(b) => b,
            // Gone, or no longer bound to an instance (released already): nothing of ours.
            Err(InstanceError::Network { source, .. })
                if matches!(source, NetworkError::PortNotFound { .. })
                    || source.http_status() == Some(400) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        for b in &bindings {
            match b.status {
                BindingStatus::Inactive => {
                    op.net(
                        "delete leftover binding",
                        net.delete_binding(vif.id, &b.host),
                    )
                    .await?;
                }
                BindingStatus::Active if b.profile.contains_key(MIGRATING_TO) => {
                    let mut profile = b.profile.clone();
                    profile.remove(MIGRATING_TO);
                    let update = PortUpdate {
                        profile: Some(profile),
                        ..PortUpdate::default()
                    };
                    op.net(
                        "clear leftover migrating_to",
                        net.update_port(vif.id, &update),
                    )
                    .await?;
                }
                BindingStatus::Active => {}
            }
        }
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Power

/// Graceful shutdown, then hard. Devices stay plugged.
pub(crate) async fn power_off(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
    timeout: Option<std::time::Duration>,
) -> Finished {
    op.phase("shutdown");
    let timeout = timeout.unwrap_or(op.deps.config.power_off_timeout);
    let r = async {
        if from == InstanceState::Suspended {
            // A managed-save image would resume the guest on the next start: drop it.
            remove_managed_save(op).await?;
        }
        op.shutdown_domain(timeout).await?;
        let mut done = record.clone();
        done.state = InstanceState::Stopped;
        op.save(&done, None).await
    }
    .await;
    match r {
        Ok(()) => Finished::ok(InstanceState::Stopped, Some(record)),
        Err(e) => {
            let state = settle_state(op, from).await;
            Finished::err(state, Some(record), e)
        }
    }
}

async fn remove_managed_save(op: &mut OpCtx) -> Result<(), InstanceError> {
    let lv = op.deps.libvirt.clone();
    op.lv("managed-save-remove", lv.managed_save_remove(op.uuid))
        .await
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
/// of power on, hard reboot and resume. `operation` picks the prediction.
async fn boot_with_events(
    op: &mut OpCtx,
    record: &InstanceRecord,
    operation: Operation,
    run: bool,
) -> Result<(), InstanceError> {
    let prediction = predicted(op, &operation, &record.network_info.vifs)?;
    let pol = policy(op);
    let bind = op
        .expect(Timing::BindTime, prediction.bind_time_events(), pol)
        .await?;
    let plug = op
        .expect(Timing::PlugTime, prediction.plug_time_events(), pol)
        .await?;
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

/// Start a stopped (or errored) instance.
pub(crate) async fn power_on(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
) -> Finished {
    let r = async {
        let in_flight = op.in_flight("start", InFlight::PowerOn);
        op.save(&record, Some(in_flight)).await?;
        boot_with_events(op, &record, Operation::PowerOn, true).await?;
        let mut done = record.clone();
        done.state = InstanceState::Running;
        op.save(&done, None).await
    }
    .await;
    match r {
        Ok(()) => Finished::ok(InstanceState::Running, Some(record)),
        Err(e) => {
            op.cancel_waits().await;
            let _ = op.destroy_domain().await;
            let _ = op.save(&record, None).await;
            let state = if from == InstanceState::Error {
                InstanceState::Error
            } else {
                InstanceState::Stopped
            };
            Finished::err(
                state,
                Some(record),
                InstanceError::RolledBack {
                    request: op.request,
                    cause: Box::new(e),
                },
            )
        }
    }
}

/// Destroy and recreate the domain; wait only for the events the model predicts.
pub(crate) async fn reboot_hard(op: &mut OpCtx, record: InstanceRecord) -> Finished {
    let r = async {
        let in_flight = op.in_flight("reboot", InFlight::reboot(op.request));
        op.save(&record, Some(in_flight)).await?;
        op.phase("destroy");
        op.destroy_domain().await?;
        boot_with_events(op, &record, Operation::HardReboot, true).await?;
        let mut done = record.clone();
        done.state = InstanceState::Running;
        op.save(&done, None).await
    }
    .await;
    match r {
        Ok(()) => Finished::ok(InstanceState::Running, Some(record)),
        Err(e) => {
            op.cancel_waits().await;
            // The guest was down already; leave it down, devices plugged, recoverable by
            // another hard reboot or power on.
            let _ = op.destroy_domain().await;
            let _ = op.save(&record, None).await;
            Finished::err(InstanceState::Error, Some(record), e)
        }
    }
}

/// ACPI reboot; falls back to a hard reboot when the guest or driver cannot.
pub(crate) async fn reboot_soft(op: &mut OpCtx, record: InstanceRecord) -> Finished {
    let lv = op.deps.libvirt.clone();
    match op.lv("reboot", lv.reboot(op.uuid)).await {
        Ok(()) => Finished::ok(InstanceState::Running, Some(record)),
        Err(e) => {
            info!(instance = %op.uuid, error = %e, "soft reboot failed; rebooting hard");
            reboot_hard(op, record).await
        }
    }
}

/// Pause or unpause the vCPUs.
pub(crate) async fn pause(op: &mut OpCtx, record: InstanceRecord, pause: bool) -> Finished {
    let lv = op.deps.libvirt.clone();
    let uuid = op.uuid;
    let (r, ok_state, from) = if pause {
        (
            op.lv("suspend", lv.suspend(uuid)).await,
            InstanceState::Paused,
            InstanceState::Running,
        )
    } else {
        (
            op.lv("resume", lv.resume(uuid)).await,
            InstanceState::Running,
            InstanceState::Paused,
        )
    };
    match r {
        Ok(()) => Finished::ok(ok_state, Some(record)),
        Err(e) => {
            let state = settle_state(op, from).await;
            Finished::err(state, Some(record), e)
        }
    }
}

/// Save the guest to disk (managed save).
pub(crate) async fn suspend(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
) -> Finished {
    let lv = op.deps.libvirt.clone();
    let r = op.lv("managed-save", lv.managed_save(op.uuid)).await;
    if r.is_ok() {
        op.detached().await;
    }
    match r {
        Ok(()) => {
            let mut done = record.clone();
            done.state = InstanceState::Suspended;
            let saved = op.save(&done, None).await;
            match saved {
                Ok(()) => Finished::ok(InstanceState::Suspended, Some(record)),
                Err(e) => Finished::err(InstanceState::Suspended, Some(record), e),
            }
        }
        Err(e) => {
            let state = settle_state(op, from).await;
            Finished::err(state, Some(record), e)
        }
    }
}

/// Restore a suspended guest: like a power on (libvirt restores the managed-save image),
/// with the same event rules.
pub(crate) async fn resume(op: &mut OpCtx, record: InstanceRecord) -> Finished {
    let r = async {
        boot_with_events(op, &record, Operation::PowerOn, true).await?;
        let mut done = record.clone();
        done.state = InstanceState::Running;
        op.save(&done, None).await
    }
    .await;
    match r {
        Ok(()) => Finished::ok(InstanceState::Running, Some(record)),
        Err(e) => {
            op.cancel_waits().await;
            let state = settle_state(op, InstanceState::Error).await;
            let state = match state {
                InstanceState::Running | InstanceState::Paused => {
                    let _ = op.destroy_domain().await;
                    InstanceState::Error
                }
                s => s,
            };
            Finished::err(state, Some(record), e)
        }
    }
}

// ----------------------------------------------------------------------------------------
// Resize

fn handover(
    record: &InstanceRecord,
    flavor: &vireo_xml::metadata::Flavor,
    power_on: bool,
) -> Handover {
    Handover {
        name: record.name.clone(),
        flavor: flavor.clone(),
        old_flavor: record.flavor.clone(),
        boot: record.boot.clone(),
        network_info: record.network_info.to_value(),
        power_on,
    }
}

fn record_from_handover(op: &OpCtx, h: &Handover) -> Result<InstanceRecord, InstanceError> {
    let network_info = NetworkInfo::from_value(&h.network_info)
        .map_err(|e| InstanceError::Invalid(format!("handover network_info: {e}")))?;
    Ok(InstanceRecord {
        uuid: op.uuid,
        name: h.name.clone(),
        flavor: h.flavor.clone(),
        boot: h.boot.clone(),
        network_info,
        state: InstanceState::Absent,
        resize: None,
    })
}

/// Source side of a resize. Same host: the whole resize here. Otherwise: power off (devices
/// vireo created stay wired), hand the instance over to the destination, and wait there for
/// confirm or revert. If the destination fails, the instance comes back here.
pub(crate) async fn resize(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
    args: ResizeArgs,
) -> Finished {
    let ResizeArgs {
        migration,
        new_flavor,
    } = args;
    if migration.source_host != op.deps.host {
        return Finished::err(
            from,
            Some(record),
            InstanceError::Invalid(format!(
                "resize source is {}, this host is {}",
                migration.source_host, op.deps.host
            )),
        );
    }
    if migration.same_host() {
        return resize_same_host(op, record, from, migration, new_flavor).await;
    }
    let was_running = from == InstanceState::Running;
    let mut source = record.clone();
    source.resize = Some(ResizeRecord {
        migration: migration.clone(),
        role: ResizeRole::Source,
        old_flavor: record.flavor.clone(),
        was_running,
    });
    source.state = InstanceState::ResizeSource;
    let r = async {
        let in_flight = op.in_flight(
            "power off",
            InFlight::Resize(MigrationStep {
                migration: migration.clone(),
            }),
        );
        op.save(&record, Some(in_flight)).await?;
        op.phase("power off");
        op.shutdown_domain(op.deps.config.power_off_timeout).await?;
        let in_flight = op.in_flight(
            "handover",
            InFlight::Resize(MigrationStep {
                migration: migration.clone(),
            }),
        );
        op.save(&source, Some(in_flight)).await?;
        op.phase("finish on destination");
        let h = handover(&record, &new_flavor, was_running);
        op.peer(
            &migration.dest_host,
            "finish-resize",
            InstanceRequest::FinishResize {
                migration: migration.clone(),
                handover: Box::new(h),
            },
        )
        .await?;
        op.save(&source, None).await
    }
    .await;
    match r {
        Ok(()) => Finished::ok(InstanceState::ResizeSource, Some(source)),
        Err(cause) => {
            warn!(instance = %op.uuid, error = %cause, "resize failed; bringing the instance back");
            // The destination removed its copy; bring the instance back here exactly as a
            // revert does (bindings back where they moved, devices, domain).
            let back = bring_back(op, source.clone()).await;
            match back.result {
                Ok(()) => Finished::err(
                    back.state,
                    back.record,
                    InstanceError::RolledBack {
                        request: Request::Resize,
                        cause: Box::new(cause),
                    },
                ),
                Err(e) => Finished::err(
                    InstanceState::Error,
                    back.record,
                    InstanceError::RollbackFailed {
                        request: Request::Resize,
                        rollback: e.to_string(),
                        cause: Box::new(cause),
                    },
                ),
            }
        }
    }
}

/// Destination side of a cross-host resize: define with the new flavor, register the
/// predicted waits, bind the ports here, plug, start paused, await, resume if it ran.
pub(crate) async fn finish_resize(op: &mut OpCtx, migration: Migration, h: Handover) -> Finished {
    let mut record = match record_from_handover(op, &h) {
        Ok(r) => r,
        Err(e) => return Finished::err(InstanceState::Gone, None, e),
    };
    record.resize = Some(ResizeRecord {
        migration: migration.clone(),
        role: ResizeRole::Target,
        old_flavor: h.old_flavor.clone(),
        was_running: h.power_on,
    });
    record.state = InstanceState::ResizeTarget;
    op.use_record(&record);
    op.deps.events.track(op.uuid);
    let r = async {
        let prediction = predicted(
            op,
            &Operation::FinishResize {
                same_host: migration.same_host(),
            },
            &record.network_info.vifs,
        )?;
        op.phase("define");
        let in_flight = op.in_flight(
            "finish-resize",
            InFlight::FinishResize(MigrationStep {
                migration: migration.clone(),
            }),
        );
        op.define(&record, Some(in_flight)).await?;
        let pol = policy(op);
        let bind = op
            .expect(Timing::BindTime, prediction.bind_time_events(), pol)
            .await?;
        let plug = op
            .expect(Timing::PlugTime, prediction.plug_time_events(), pol)
            .await?;
        op.phase("bind ports here");
        bind_ports_here(op, &record.network_info).await?;
        op.phase("plug");
        op.plug_all(&record).await?;
        op.phase("start paused");
        op.start_paused().await?;
        op.phase("wait for events");
        op.wait(bind).await?;
        op.wait(plug).await?;
        if h.power_on {
            op.resume().await?;
        } else {
            op.destroy_domain().await?;
        }
        op.save(&record, None).await
    }
    .await;
    match r {
        Ok(()) => Finished::ok(InstanceState::ResizeTarget, Some(record)),
        Err(e) => {
            op.cancel_waits().await;
            // The source takes the instance back: this host gives it up whatever happens
            // here. What libvirt could not remove (its connection lost) stays with the
            // record, gone but kept, and the actor removes it once libvirt is back
            // (never adopted again as a resize target by the recovery after a reconnect).
            let destroyed = op.destroy_domain().await;
            let unplugged = op.unplug_all(&record).await;
            let undefined = op.undefine_domain().await;
            op.deps.events.forget(op.uuid);
            match destroyed.and(unplugged).and(undefined) {
                Ok(()) => Finished::err(InstanceState::Gone, None, e),
                Err(left) => {
                    warn!(instance = %op.uuid, error = %left, "finish-resize rollback left the domain behind; it goes once libvirt is back");
                    Finished::err(InstanceState::Gone, Some(record), e)
                }
            }
        }
    }
}

/// Move every port's binding to this host (Nova's `migrate_instance_finish`).
async fn bind_ports_here(op: &mut OpCtx, ni: &NetworkInfo) -> Result<Vec<PortId>, InstanceError> {
    let net = op.deps.network.clone();
    let host = op.deps.host.clone();
    let mut moved = Vec::new();
    for vif in &ni.vifs {
        let port = op.net("get port", net.get_port(vif.id)).await?;
        if port.host_id == host {
            continue;
        }
        let update = PortUpdate {
            host_id: Some(host.clone()),
            ..PortUpdate::default()
        };
        op.net("bind port", net.update_port(vif.id, &update))
            .await?;
        moved.push(vif.id);
    }
    Ok(moved)
}

/// Where the resized instance runs: confirm.
pub(crate) async fn confirm_resize(op: &mut OpCtx, record: InstanceRecord) -> Finished {
    let Some(resize) = record.resize.clone() else {
        return Finished::err(
            InstanceState::Error,
            Some(record),
            InstanceError::Invalid("no resize to confirm".into()),
        );
    };
    let r = async {
        if !resize.migration.same_host() {
            op.phase("clean up the source");
            match op
                .peer(
                    &resize.migration.source_host,
                    "confirm-resize-source",
                    InstanceRequest::ConfirmResizeSource,
                )
                .await
            {
                Ok(_) => {}
                // The source holds nothing of the instance any more: clean already.
                Err(InstanceError::Peer { source, .. })
                    if matches!(*source, InstanceError::Refused(AdmissionError::NotFound(_))) => {}
                Err(e) => return Err(e),
            }
        }
        let running = op.power().await? == PowerState::Running;
        let mut done = record.clone();
        done.resize = None;
        done.state = running_or_stopped(running);
        op.save(&done, None).await?;
        Ok::<_, InstanceError>(done)
    }
    .await;
    match r {
        Ok(done) => Finished::ok(done.state, Some(done)),
        Err(e) => Finished::err(InstanceState::ResizeTarget, Some(record), e),
    }
}

/// The source of a confirmed resize: remove the old instance (domain, kept devices).
pub(crate) async fn confirm_resize_source(op: &mut OpCtx, record: InstanceRecord) -> Finished {
    op.phase("remove the old instance");
    let mut errors = Vec::new();
    if let Err(e) = op.destroy_domain().await {
        errors.push(e);
    }
    if let Err(e) = op.unplug_all(&record).await {
        errors.push(e);
    }
    if let Err(e) = op.undefine_domain().await {
        errors.push(e);
    }
    if errors.is_empty() {
        op.deps.events.forget(op.uuid);
        Finished::ok(InstanceState::Gone, None)
    } else {
        Finished::err(InstanceState::Error, Some(record), errors.remove(0))
    }
}

/// Where the resized instance runs: revert. Same host: all here. Otherwise remove the copy
/// here, then have the source bring the instance back.
pub(crate) async fn revert_resize(op: &mut OpCtx, record: InstanceRecord) -> Finished {
    let Some(resize) = record.resize.clone() else {
        return Finished::err(
            InstanceState::Error,
            Some(record),
            InstanceError::Invalid("no resize to revert".into()),
        );
    };
    if resize.migration.same_host() {
        return revert_same_host(op, record, resize).await;
    }
    op.phase("remove the resized copy");
    let in_flight = op.in_flight(
        "revert",
        InFlight::RevertResize(RevertStep {
            migration: resize.migration.clone(),
            was_running: None,
        }),
    );
    let _ = op.save(&record, Some(in_flight)).await;
    let mut errors = Vec::new();
    if let Err(e) = op.destroy_domain().await {
        errors.push(e);
    }
    if let Err(e) = op.unplug_all(&record).await {
        errors.push(e);
    }
    if let Err(e) = op.undefine_domain().await {
        errors.push(e);
    }
    if !errors.is_empty() {
        return Finished::err(InstanceState::Error, Some(record), errors.remove(0));
    }
    op.deps.events.forget(op.uuid);
    op.phase("bring back on the source");
    match op
        .peer(
            &resize.migration.source_host,
            "finish-revert-resize",
            InstanceRequest::FinishRevertResize,
        )
        .await
    {
        Ok(_) => Finished::ok(InstanceState::Gone, None),
        Err(e) => Finished::err(InstanceState::Gone, None, e),
    }
}

/// The source of a reverted resize: bring the instance back.
pub(crate) async fn finish_revert_resize(op: &mut OpCtx, record: InstanceRecord) -> Finished {
    bring_back(op, record).await
}

/// Bring an instance whose domain waits stopped on this host back to life after the
/// destination let go of it: expect the bind-time events, move the bindings back (only
/// those that moved), await; expect the plug-time events, plug, start paused, await, resume
/// if it ran. The waits are registered before their triggers, so an event Neutron sends at
/// bind time — before any plug — is never missed.
async fn bring_back(op: &mut OpCtx, record: InstanceRecord) -> Finished {
    let Some(resize) = record.resize.clone() else {
        return Finished::err(
            InstanceState::Error,
            Some(record),
            InstanceError::Invalid("no resize to revert".into()),
        );
    };
    let was_running = resize.was_running;
    let r = async {
        let in_flight = op.in_flight(
            "finish-revert",
            InFlight::bring_back(op.request, resize.migration.clone()),
        );
        op.save(&record, Some(in_flight)).await?;
        op.deps.events.track(op.uuid);
        let prediction = predicted(
            op,
            &Operation::RevertResize {
                source: resize.migration.source_host.clone(),
                dest: resize.migration.dest_host.clone(),
            },
            &record.network_info.vifs,
        )?;
        // Bind-time events come only for ports whose binding really moves back.
        let net = op.deps.network.clone();
        let mut away = BTreeSet::new();
        for vif in &record.network_info.vifs {
            let port = op.net("get port", net.get_port(vif.id)).await?;
            if port.host_id != op.deps.host {
                away.insert(vif.id);
            }
        }
        // An agent-served port reports at bind time only while its devices are still wired
        // here (kept through the resize); one whose devices went meanwhile (removed outside
        // vireo, a host reboot) reports once they are plugged again.
        let wired: BTreeSet<PortId> = op.deps.plugger.wiring().wired().into_iter().collect();
        let mut bind_events = Vec::new();
        let mut plug_events = prediction.plug_time_events();
        for v in prediction
            .vifs
            .iter()
            .filter(|v| v.timing == Timing::BindTime && away.contains(&v.port))
        {
            if v.kind.agent_served() && !wired.contains(&v.port) {
                plug_events.push(ExpectedEvent::plugged(v.port));
            } else {
                bind_events.push(ExpectedEvent::plugged(v.port));
            }
        }
        let pol = policy(op);
        let bind = op.expect(Timing::BindTime, bind_events, pol).await?;
        op.phase("bind ports back");
        bind_ports_here(op, &record.network_info).await?;
        op.phase("wait for bind-time events");
        op.wait(bind).await?;
        let plug = op.expect(Timing::PlugTime, plug_events, pol).await?;
        op.phase("plug");
        op.plug_all(&record).await?;
        op.phase("start paused");
        op.start_paused().await?;
        op.phase("wait for plug-time events");
        op.wait(plug).await?;
        if was_running {
            op.resume().await?;
        } else {
            op.destroy_domain().await?;
        }
        let mut done = record.clone();
        done.resize = None;
        done.state = running_or_stopped(was_running);
        op.save(&done, None).await?;
        Ok::<_, InstanceError>(done)
    }
    .await;
    match r {
        Ok(done) => Finished::ok(done.state, Some(done)),
        Err(e) => {
            op.cancel_waits().await;
            let _ = op.destroy_domain().await;
            Finished::err(InstanceState::Error, Some(record), e)
        }
    }
}

async fn resize_same_host(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
    migration: Migration,
    new_flavor: vireo_xml::metadata::Flavor,
) -> Finished {
    let was_running = from == InstanceState::Running;
    let mut target = record.clone();
    target.flavor = new_flavor;
    target.resize = Some(ResizeRecord {
        migration: migration.clone(),
        role: ResizeRole::Target,
        old_flavor: record.flavor.clone(),
        was_running,
    });
    target.state = InstanceState::ResizeTarget;
    let r = async {
        let in_flight = op.in_flight(
            "resize",
            InFlight::Resize(MigrationStep {
                migration: migration.clone(),
            }),
        );
        op.save(&record, Some(in_flight.clone())).await?;
        op.phase("power off");
        op.shutdown_domain(op.deps.config.power_off_timeout).await?;
        op.phase("redefine");
        op.define(&target, Some(in_flight)).await?;
        boot_with_events(
            op,
            &target,
            Operation::FinishResize { same_host: true },
            was_running,
        )
        .await?;
        op.save(&target, None).await
    }
    .await;
    match r {
        Ok(()) => Finished::ok(InstanceState::ResizeTarget, Some(target)),
        Err(cause) => {
            op.cancel_waits().await;
            // Back to the old definition, running again if it ran (with its devices: a
            // failed plug may have been of devices that had gone).
            let back = async {
                op.destroy_domain().await?;
                op.define(&record, None).await?;
                if was_running {
                    op.plug_all(&record).await?;
                    op.lv("start", op.deps.libvirt.clone().start(op.uuid, false))
                        .await?;
                    op.attached().await;
                }
                Ok::<_, InstanceError>(())
            }
            .await;
            match back {
                Ok(()) => Finished::err(
                    from,
                    Some(record),
                    InstanceError::RolledBack {
                        request: Request::Resize,
                        cause: Box::new(cause),
                    },
                ),
                Err(e) => Finished::err(
                    InstanceState::Error,
                    Some(record),
                    InstanceError::RollbackFailed {
                        request: Request::Resize,
                        rollback: e.to_string(),
                        cause: Box::new(cause),
                    },
                ),
            }
        }
    }
}

/// Same-host revert: the resized guest's VIFs are unplugged and plugged again for the
/// original guest (so every agent-served port reports at plug time).
async fn revert_same_host(
    op: &mut OpCtx,
    record: InstanceRecord,
    resize: ResizeRecord,
) -> Finished {
    let mut back = record.clone();
    back.flavor = resize.old_flavor.clone();
    back.resize = None;
    let r = async {
        let in_flight = op.in_flight(
            "revert",
            InFlight::RevertResize(RevertStep {
                migration: resize.migration.clone(),
                was_running: Some(resize.was_running),
            }),
        );
        op.save(&record, Some(in_flight.clone())).await?;
        op.phase("remove the resized guest");
        op.destroy_domain().await?;
        op.unplug_all(&record).await?;
        op.phase("redefine");
        op.define(&back, Some(in_flight)).await?;
        boot_with_events(
            op,
            &back,
            Operation::RevertResize {
                source: resize.migration.source_host.clone(),
                dest: resize.migration.dest_host.clone(),
            },
            resize.was_running,
        )
        .await?;
        back.state = running_or_stopped(resize.was_running);
        op.save(&back, None).await
    }
    .await;
    match r {
        Ok(()) => Finished::ok(running_or_stopped(resize.was_running), Some(back)),
        Err(e) => {
            op.cancel_waits().await;
            let _ = op.destroy_domain().await;
            Finished::err(InstanceState::Error, Some(back), e)
        }
    }
}

// ----------------------------------------------------------------------------------------
// Live migration

/// Source side of a live migration: inactive bindings for the destination, `migrating_to`
/// (its rebind events consumed by a wait of their own), the destination pre-wired, the
/// migration, then the destination takes over and this host cleans up. Any failure before
/// the guest moved: roll back — `migrating_to` cleared and destination bindings deleted from
/// here, whatever the storage, then the destination removes what it prepared.
pub(crate) async fn live_migrate(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
    args: LiveMigrateArgs,
) -> Finished {
    let migration = args.migration.clone();
    if migration.source_host != op.deps.host || migration.same_host() {
        return Finished::err(
            from,
            Some(record),
            InstanceError::Invalid(format!(
                "live migration from {} to {} cannot run on {}",
                migration.source_host, migration.dest_host, op.deps.host
            )),
        );
    }
    let dest = migration.dest_host.clone();
    let h = handover(&record, &record.flavor, from == InstanceState::Running);
    let in_flight = op.in_flight(
        "prepare",
        InFlight::LiveMigrate(MigrationStep {
            migration: migration.clone(),
        }),
    );
    let migrated = async {
        op.save(&record, Some(in_flight)).await?;
        let peer = op.deps.peers.get(&dest)?;
        let uri = peer.migration_uri().ok_or_else(|| {
            InstanceError::Invalid(format!("host {dest} takes no live migrations"))
        })?;
        op.phase("destination bindings");
        let net = op.deps.network.clone();
        for vif in &record.network_info.vifs {
            let binding = NewBinding {
                host: dest.clone(),
                vnic_type: Some(vif.vnic_type),
                profile: None,
            };
            match op
                .net("create binding", net.create_binding(vif.id, &binding))
                .await
            {
                Ok(_) => {}
                Err(InstanceError::Network {
                    source: NetworkError::BindingExists { .. },
                    ..
                }) => {}
                Err(e) => return Err(e),
            }
        }
        if op.deps.config.set_migrating_to {
            op.phase("set migrating_to");
            update_profiles(op, &record, Some(&dest)).await?;
        }
        op.phase("pre-wire the destination");
        op.peer(
            &dest,
            "pre-live-migration",
            InstanceRequest::PreLiveMigration {
                migration: migration.clone(),
                handover: Box::new(h.clone()),
            },
        )
        .await?;
        op.phase("migrate");
        let lv = op.deps.libvirt.clone();
        let flags = virt::sys::VIR_MIGRATE_LIVE
            | virt::sys::VIR_MIGRATE_PERSIST_DEST
            | virt::sys::VIR_MIGRATE_UNDEFINE_SOURCE;
        op.lv(
            "migrate",
            lv.migrate(
                op.uuid,
                uri,
                flags,
                crate::libvirt::MigrateParameters::default(),
            ),
        )
        .await?;
        Ok::<_, InstanceError>(())
    }
    .await;
    match migrated {
        Ok(()) => {
            // The guest runs on the destination now: there is nothing to roll back to.
            op.phase("destination takes over");
            let post = op
                .peer(
                    &dest,
                    "post-live-migration",
                    InstanceRequest::PostLiveMigrationAtDestination {
                        migration: migration.clone(),
                    },
                )
                .await;
            op.phase("clean up the source");
            let _ = op.unplug_all(&record).await;
            let net = op.deps.network.clone();
            let host = op.deps.host.clone();
            for vif in &record.network_info.vifs {
                let _ = op
                    .net("delete source binding", net.delete_binding(vif.id, &host))
                    .await;
            }
            let _ = op.undefine_domain().await;
            op.deps.events.forget(op.uuid);
            match post {
                Ok(_) => Finished::ok(InstanceState::Gone, None),
                Err(e) => Finished::err(InstanceState::Gone, None, e),
            }
        }
        Err(cause) => {
            warn!(instance = %op.uuid, error = %cause, "live migration failed; rolling back");
            op.cancel_waits().await;
            let (do_cleanup, destroy_disks) = args.cleanup_flags();
            let rollback = rollback_live_migration(
                op,
                &record,
                &migration,
                h,
                do_cleanup,
                destroy_disks,
                std::time::Duration::ZERO,
            )
            .await;
            let state = settle_state(op, from).await;
            let state = if matches!(state, InstanceState::Running | InstanceState::Paused) {
                state
            } else {
                InstanceState::Error
            };
            let _ = op.save(&record, None).await;
            match rollback {
                Ok(()) => Finished::err(
                    state,
                    Some(record),
                    InstanceError::RolledBack {
                        request: Request::LiveMigrate,
                        cause: Box::new(cause),
                    },
                ),
                Err(e) => Finished::err(
                    InstanceState::Error,
                    Some(record),
                    InstanceError::RollbackFailed {
                        request: Request::LiveMigrate,
                        rollback: e,
                        cause: Box::new(cause),
                    },
                ),
            }
        }
    }
}

/// Roll a failed live migration back from the source. The network part (clear
/// `migrating_to`, delete the destination's inactive bindings) runs here always — shared
/// storage or not — because the destination's clean-up may not run; then the destination
/// removes its devices and any incoming domain.
async fn rollback_live_migration(
    op: &mut OpCtx,
    record: &InstanceRecord,
    migration: &Migration,
    h: Handover,
    do_cleanup: bool,
    destroy_disks: bool,
    peer_wait: std::time::Duration,
) -> Result<(), String> {
    let mut failures = Vec::new();
    op.phase("roll back: network");
    if let Err(e) = update_profiles(op, record, None).await {
        failures.push(format!("clear migrating_to: {e}"));
    }
    let net = op.deps.network.clone();
    let host = op.deps.host.clone();
    let m = MigrationHosts {
        dest: migration.dest_host.clone(),
    };
    if let Err(e) = op
        .net(
            "tear down destination bindings",
            net.setup_networks_on_host(op.uuid, &host, true, Some(&m)),
        )
        .await
    {
        failures.push(format!("destination bindings: {e}"));
    }
    op.phase("roll back: destination");
    // The destination is the only one to know what it prepared once its agent restarted
    // (nothing of the instance is in its libvirt): one that is not back yet is waited for,
    // up to `peer_wait`.
    let deadline = tokio::time::Instant::now() + peer_wait;
    loop {
        let r = op
            .peer(
                &migration.dest_host,
                "rollback-live-migration-at-destination",
                InstanceRequest::RollbackLiveMigrationAtDestination {
                    handover: Box::new(h.clone()),
                    do_cleanup,
                    destroy_disks,
                },
            )
            .await;
        match r {
            Ok(_) => break,
            Err(InstanceError::Peer { ref source, .. })
                if matches!(
                    **source,
                    InstanceError::UnknownHost(_)
                        | InstanceError::Unavailable
                        | InstanceError::Refused(AdmissionError::Unavailable)
                ) && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => {
                // The destination may be unreachable; the network side is done.
                warn!(instance = %op.uuid, error = %e, "destination rollback failed");
                break;
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// Set (`Some(dest)`) or clear (`None`) `binding:profile.migrating_to` on the ports that need
/// it, consuming the rebind events the change causes with a wait of its own (non-fatal, short)
/// so they can never satisfy a later wait.
async fn update_profiles(
    op: &mut OpCtx,
    record: &InstanceRecord,
    dest: Option<&str>,
) -> Result<(), InstanceError> {
    let net = op.deps.network.clone();
    let mut changing = Vec::new();
    let mut changing_ids = BTreeSet::new();
    for vif in &record.network_info.vifs {
        let port = op.net("get port", net.get_port(vif.id)).await?;
        let needs = match dest {
            Some(d) => port.migrating_to() != Some(d),
            None => port.profile.contains_key(MIGRATING_TO),
        };
        if needs {
            if port.status == PortStatus::Active {
                changing.push(vif.clone());
            }
            changing_ids.insert(vif.id);
        }
    }
    if changing_ids.is_empty() {
        return Ok(());
    }
    let prediction = predicted(op, &Operation::UpdateBindingProfile, &changing)?;
    let consume = WaitPolicy {
        timeout: op.deps.config.profile_wait,
        fatal: false,
    };
    let wait = op
        .expect(Timing::BindTime, prediction.bind_time_events(), consume)
        .await?;
    let host = op.deps.host.clone();
    match dest {
        Some(d) => {
            let m = MigrationHosts { dest: d.to_owned() };
            op.net(
                "set migrating_to",
                net.setup_networks_on_host(op.uuid, &host, false, Some(&m)),
            )
            .await?;
        }
        None => {
            op.net(
                "clear migrating_to",
                net.setup_networks_on_host(op.uuid, &host, true, None),
            )
            .await?;
        }
    }
    op.wait(wait).await?;
    Ok(())
}

/// Destination: pre-wire the devices so the guest has its network the moment it arrives.
pub(crate) async fn pre_live_migration(
    op: &mut OpCtx,
    migration: Migration,
    h: Handover,
) -> Finished {
    let mut record = match record_from_handover(op, &h) {
        Ok(r) => r,
        Err(e) => return Finished::err(InstanceState::Gone, None, e),
    };
    record.state = InstanceState::Incoming;
    op.use_record(&record);
    let _ = migration;
    op.deps.events.track(op.uuid);
    op.phase("plug");
    match op.plug_all(&record).await {
        Ok(()) => Finished::ok(InstanceState::Incoming, Some(record)),
        Err(e) => {
            let _ = op.unplug_all(&record).await;
            Finished::err(InstanceState::Gone, None, e)
        }
    }
}

/// Destination: the guest arrived; activate the bindings here and await the events.
pub(crate) async fn post_live_migration(
    op: &mut OpCtx,
    record: InstanceRecord,
    source: String,
) -> Finished {
    let r = async {
        let prediction = predicted(
            op,
            &Operation::PostLiveMigration {
                source,
                dest: op.deps.host.clone(),
            },
            &record.network_info.vifs,
        )?;
        let pol = policy(op);
        let bind = op
            .expect(Timing::BindTime, prediction.bind_time_events(), pol)
            .await?;
        let plug = op
            .expect(Timing::PlugTime, prediction.plug_time_events(), pol)
            .await?;
        op.phase("activate bindings");
        let net = op.deps.network.clone();
        let host = op.deps.host.clone();
        for vif in &record.network_info.vifs {
            match op
                .net("activate binding", net.activate_binding(vif.id, &host))
                .await
            {
                Ok(_) => {}
                Err(InstanceError::Network {
                    source: NetworkError::BindingAlreadyActive { .. },
                    ..
                }) => {}
                Err(e) => return Err(e),
            }
        }
        op.phase("wait for events");
        op.wait(bind).await?;
        op.wait(plug).await?;
        let state = match op.power().await? {
            PowerState::Paused => InstanceState::Paused,
            _ => InstanceState::Running,
        };
        let mut done = record.clone();
        done.state = state;
        op.save(&done, None).await?;
        Ok::<_, InstanceError>(state)
    }
    .await;
    match r {
        Ok(state) => Finished::ok(state, Some(record)),
        Err(e) => {
            op.cancel_waits().await;
            let state = settle_state(op, InstanceState::Error).await;
            let state = if state == InstanceState::Error || !state.has_domain() {
                InstanceState::Error
            } else {
                state
            };
            Finished::err(state, Some(record), e)
        }
    }
}

/// Destination: the migration failed; remove the pre-wired devices and any incoming domain.
/// Works from the source's handover even when this host lost its own record.
pub(crate) async fn rollback_at_destination(
    op: &mut OpCtx,
    h: Handover,
    do_cleanup: bool,
    destroy_disks: bool,
) -> Finished {
    let record = match record_from_handover(op, &h) {
        Ok(r) => r,
        Err(e) => return Finished::err(InstanceState::Error, None, e),
    };
    op.use_record(&record);
    // vireo keeps no instance directory or disks of its own: the flags only decide whether
    // an incoming domain definition is removed (it always is when it exists and is not the
    // running guest).
    let _ = (do_cleanup, destroy_disks);
    op.phase("remove prepared devices");
    let mut errors = Vec::new();
    if let Err(e) = op.destroy_domain().await {
        errors.push(e);
    }
    if let Err(e) = op.undefine_domain().await {
        errors.push(e);
    }
    if let Err(e) = op.unplug_all(&record).await {
        errors.push(e);
    }
    op.deps.events.forget(op.uuid);
    if errors.is_empty() {
        Finished::ok(InstanceState::Gone, None)
    } else {
        Finished::err(InstanceState::Error, Some(record), errors.remove(0))
    }
}

// ----------------------------------------------------------------------------------------
// Interfaces

/// Hot-plug a port: expect its events, plug, attach the device, await.
pub(crate) async fn attach_interface(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
    vif: Vif,
) -> Finished {
    if record.network_info.get(&vif.id).is_some()
        || record
            .network_info
            .vifs
            .iter()
            .any(|v| v.address == vif.address)
    {
        return Finished::err(
            from,
            Some(record),
            InstanceError::Invalid(format!("port {} or its MAC is attached already", vif.id)),
        );
    }
    let mut vif = vif;
    vif.index = record.network_info.vifs.len();
    let mut with = record.clone();
    with.network_info.vifs.push(vif.clone());
    let mut attached = false;
    let in_flight = op.in_flight(
        "plug",
        InFlight::AttachInterface(InterfaceStep {
            vif: vif.raw_value(),
            index: vif.index,
        }),
    );
    let r = async {
        let mut single = NetworkInfo {
            vifs: vec![vif.clone()],
        };
        refresh_active(op, &mut single).await?;
        let prediction = predicted(op, &Operation::AttachInterface, &single.vifs)?;
        let live = from != InstanceState::Stopped;
        let pol = policy(op);
        let bind = op
            .expect(Timing::BindTime, prediction.bind_time_events(), pol)
            .await?;
        let plug = op
            .expect(Timing::PlugTime, prediction.plug_time_events(), pol)
            .await?;
        // The interface is marked in flight before anything of it exists: an agent that
        // dies before the attach finished has recovery take it away again.
        op.save(&record, Some(in_flight.clone())).await?;
        op.phase("plug");
        op.plug(&with, &vif).await?;
        op.phase("attach");
        let dev = op.device(&vif, op.form(&vif))?;
        let xml = dev.to_xml().map_err(|e| InstanceError::Record(e.into()))?;
        let lv = op.deps.libvirt.clone();
        let affect = if live {
            crate::libvirt::Affect::LiveAndConfig
        } else {
            crate::libvirt::Affect::Config
        };
        match op
            .lv(
                "attach device",
                lv.attach_device(op.uuid, xml.clone(), affect),
            )
            .await
        {
            Ok(()) => {}
            Err(e) if persistent_change_unsupported(&e) => {
                // A driver that changes only live devices (libvirt's test driver): the live
                // device through the API, the definition rewritten from the record.
                if live {
                    op.lv(
                        "attach device (live)",
                        lv.attach_device(op.uuid, xml, crate::libvirt::Affect::Live),
                    )
                    .await?;
                }
                attached = true;
                op.define(&with, Some(in_flight.clone())).await?;
            }
            Err(e) => return Err(e),
        }
        attached = true;
        if live {
            op.deps.plugger.devices_attached(&[vif.id]).await;
        }
        if live {
            op.phase("wait for events");
            op.wait(bind).await?;
            op.wait(plug).await?;
        } else {
            // A stopped guest's devices are not wired until it starts: nothing will come.
            op.cancel_waits().await;
        }
        op.save(&with, None).await
    }
    .await;
    match r {
        Ok(()) => Finished::ok(from, Some(with)),
        Err(e) => {
            op.cancel_waits().await;
            if attached {
                let _ = detach(op, &vif, from != InstanceState::Stopped, &record, None).await;
            }
            let form = op.form(&vif);
            let _ = op.unplug_as(&with, &vif, form).await;
            // Nothing of the interface is left: neither is its in-flight mark.
            let _ = op.save(&record, None).await;
            Finished::err(
                from,
                Some(record),
                InstanceError::RolledBack {
                    request: Request::AttachInterface,
                    cause: Box::new(e),
                },
            )
        }
    }
}

/// libvirt refused a device change because it affects the persistent definition (libvirt's
/// test driver changes live devices only).
fn persistent_change_unsupported(e: &InstanceError) -> bool {
    matches!(
        e,
        InstanceError::Libvirt {
            source: crate::libvirt::LibvirtError::InvalidArgument { .. }
                | crate::libvirt::LibvirtError::Unsupported { .. },
            ..
        }
    )
}

fn no_device(r: &Result<(), InstanceError>) -> bool {
    matches!(
        r,
        Err(InstanceError::Libvirt {
            source: crate::libvirt::LibvirtError::NoDevice { .. },
            ..
        })
    )
}

/// Detach the VIF's device; `without` is the record without it (the definition where the
/// driver cannot change it through the device API, with `in_flight` kept in its metadata).
async fn detach(
    op: &mut OpCtx,
    vif: &Vif,
    live: bool,
    without: &InstanceRecord,
    in_flight: Option<vireo_xml::metadata::InFlightOperation>,
) -> Result<(), InstanceError> {
    let lv = op.deps.libvirt.clone();
    let alias = format!("{}{}", super::op::ALIAS_PREFIX, vif.id);
    let affect = if live {
        crate::libvirt::Affect::LiveAndConfig
    } else {
        crate::libvirt::Affect::Config
    };
    let r = op
        .lv(
            "detach device",
            lv.detach_device_alias(op.uuid, alias.clone(), affect),
        )
        .await;
    match r {
        Ok(()) => {}
        ref r if no_device(r) => {}
        Err(e) if persistent_change_unsupported(&e) => {
            if live {
                let r = op
                    .lv(
                        "detach device (live)",
                        lv.detach_device_alias(op.uuid, alias, crate::libvirt::Affect::Live),
                    )
                    .await;
                if !no_device(&r) {
                    r?;
                }
            }
            op.define(without, in_flight).await?;
        }
        Err(e) => return Err(e),
    }
    op.deps.plugger.devices_detached(&[vif.id]).await;
    Ok(())
}

/// Hot-unplug a port: detach the device, unplug the host side.
pub(crate) async fn detach_interface(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
    port: PortId,
) -> Finished {
    let Some(vif) = record.network_info.get(&port).cloned() else {
        return Finished::err(
            from,
            Some(record),
            InstanceError::Invalid(format!("port {port} is not attached")),
        );
    };
    let mut without = record.clone();
    without.network_info.vifs.retain(|v| v.id != port);
    for (i, v) in without.network_info.vifs.iter_mut().enumerate() {
        v.index = i;
    }
    // Marked in flight (with the interface) before the device goes: an agent that dies
    // before the detach finished has recovery finish it.
    let in_flight = op.in_flight(
        "detach",
        InFlight::DetachInterface(InterfaceStep {
            vif: vif.raw_value(),
            index: vif.index,
        }),
    );
    let r = async {
        op.save(&record, Some(in_flight.clone())).await?;
        op.phase("detach");
        detach(
            op,
            &vif,
            from != InstanceState::Stopped,
            &without,
            Some(in_flight),
        )
        .await?;
        op.phase("unplug");
        let form = op.form(&vif);
        op.unplug_as(&record, &vif, form).await?;
        op.save(&without, None).await?;
        Ok::<_, InstanceError>(without)
    }
    .await;
    match r {
        Ok(without) => Finished::ok(from, Some(without)),
        Err(e) => Finished::err(from, Some(record), e),
    }
}

// ----------------------------------------------------------------------------------------
// Recovery

/// How long the recovery of an interrupted live migration waits for the destination's agent
/// to be known: hosts served by one process (`vireo::local`) start one after the other, and
/// the first one's recovery runs before the next is registered.
const RECOVERY_PEER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// An operation was in flight when the agent stopped and has no dedicated recovery: a live
/// migration the guest never left for is rolled back (network clean-up from here, the
/// destination told to remove what it prepared); anything else is reconciled — the state is
/// what libvirt says the domain is, and the in-flight marker is cleared.
pub(crate) async fn recover(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
    interrupted: Interrupted,
) -> Finished {
    op.phase("recover");
    if let Some(done) = recover_same_host(op, &record, &interrupted).await {
        return done;
    }
    let mut failure = None;
    let mut record = record;
    let operation = match &interrupted {
        Interrupted::Marked(marker) => Some(&marker.operation),
        Interrupted::Unreadable(_) => None,
    };
    match operation {
        // An attach is undone, a detach finished: either way the interface goes.
        Some(InFlight::AttachInterface(step) | InFlight::DetachInterface(step)) => {
            match take_interface_away(op, &record, from, step).await {
                Ok(without) => record = without,
                Err(e) => failure = Some(e),
            }
        }
        Some(InFlight::LiveMigrate(step)) => {
            let h = handover(&record, &record.flavor, true);
            // The destination's agent may be starting too: it is waited for, briefly.
            if let Err(e) = rollback_live_migration(
                op,
                &record,
                &step.migration,
                h,
                true,
                true,
                RECOVERY_PEER_WAIT,
            )
            .await
            {
                failure = Some(e);
            }
        }
        // Reconciled: the state is what libvirt says.
        Some(
            InFlight::Spawn
            | InFlight::PowerOn
            | InFlight::RebootHard
            | InFlight::RebootSoft
            | InFlight::Resize(_)
            | InFlight::FinishResize(_)
            | InFlight::RevertResize(_)
            | InFlight::FinishRevertResize(_),
        )
        | None => {}
    }
    let mut state = settle_state(op, from).await;
    if state == InstanceState::Error {
        // No domain: nothing of it is here any more.
        state = InstanceState::Gone;
    }
    if record.resize.as_ref().map(|r| r.role) == Some(ResizeRole::Source)
        && state == InstanceState::Stopped
    {
        // The stopped source of a handed-over resize waits for confirm or revert.
        state = InstanceState::ResizeSource;
    }
    let mut done = record.clone();
    done.state = state;
    if state != InstanceState::Gone {
        if let Err(e) = op.save(&done, None).await {
            failure.get_or_insert(e.to_string());
        }
    }
    match failure {
        None => Finished::ok(state, (state != InstanceState::Gone).then_some(done)),
        Some(f) => Finished::err(
            InstanceState::Error,
            Some(record),
            InstanceError::RollbackFailed {
                request: Request::Recover,
                rollback: f,
                cause: Box::new(InstanceError::Invalid(format!(
                    "interrupted {}",
                    interrupted.describe()
                ))),
            },
        ),
    }
}

/// An attach or detach the agent died in: the interface's device is detached and its host
/// side unplugged (each may or may not exist still); returns the record without it.
async fn take_interface_away(
    op: &mut OpCtx,
    record: &InstanceRecord,
    from: InstanceState,
    step: &InterfaceStep,
) -> Result<InstanceRecord, String> {
    let vif = Vif::from_value(step.index, &step.vif)
        .map_err(|e| format!("interrupted attach or detach without its interface: {e}"))?;
    let mut without = record.clone();
    without.network_info.vifs.retain(|v| v.id != vif.id);
    for (i, v) in without.network_info.vifs.iter_mut().enumerate() {
        v.index = i;
    }
    let mut with = without.clone();
    with.network_info.vifs.push(vif.clone());
    info!(instance = %op.uuid, port = %vif.id, "taking away an interface whose attach or detach was interrupted");
    let live = from != InstanceState::Stopped;
    let detached = detach(op, &vif, live, &without, None).await;
    let form = op.form(&vif);
    let unplugged = op.unplug_as(&with, &vif, form).await;
    detached
        .and(unplugged)
        .map(|()| without)
        .map_err(|e| e.to_string())
}

/// A same-host resize or revert the agent died in, after it took the guest down: boot again
/// from the definition libvirt has, devices plugged and the events awaited, running if the
/// guest ran. Once a resize redefined the guest, that is the resized guest (the resize
/// finishes: resize-target); before, the original one (as it was). A revert that redefined
/// the guest has the original one (the revert finishes); one that did not still has the
/// resize recorded and is done again by the actor (not here). None: not such an operation.
async fn recover_same_host(
    op: &mut OpCtx,
    record: &InstanceRecord,
    interrupted: &Interrupted,
) -> Option<Finished> {
    let Interrupted::Marked(marker) = interrupted else {
        return None;
    };
    let (resize, revert_was_running, migration) = match &marker.operation {
        InFlight::Resize(step) => (true, None, &step.migration),
        InFlight::RevertResize(step) => (false, step.was_running, &step.migration),
        InFlight::Spawn
        | InFlight::PowerOn
        | InFlight::RebootHard
        | InFlight::RebootSoft
        | InFlight::FinishResize(_)
        | InFlight::FinishRevertResize(_)
        | InFlight::LiveMigrate(_)
        | InFlight::AttachInterface(_)
        | InFlight::DetachInterface(_) => return None,
    };
    if !migration.same_host() {
        return None;
    }
    let target = record
        .resize
        .as_ref()
        .filter(|r| r.role == ResizeRole::Target);
    let (operation, run, state) = match target {
        Some(r) if resize => (
            Operation::FinishResize { same_host: true },
            r.was_running,
            InstanceState::ResizeTarget,
        ),
        // The revert's own recovery (RevertResize) runs for a record still resized.
        Some(_) => return None,
        None if resize => {
            let run = record.state == InstanceState::Running;
            (Operation::HardReboot, run, running_or_stopped(run))
        }
        None => {
            let run = revert_was_running.unwrap_or(true);
            (
                Operation::RevertResize {
                    source: migration.source_host.clone(),
                    dest: migration.dest_host.clone(),
                },
                run,
                running_or_stopped(run),
            )
        }
    };
    info!(instance = %op.uuid, interrupted = %interrupted.describe(), %state, "booting an interrupted same-host resize or revert again");
    let replug = matches!(operation, Operation::RevertResize { .. });
    let r = async {
        op.destroy_domain().await?;
        if replug {
            // As the revert does: every device plugged again for the original guest.
            op.unplug_all(record).await?;
        }
        boot_with_events(op, record, operation, run).await?;
        let mut done = record.clone();
        done.state = state;
        op.save(&done, None).await?;
        Ok::<_, InstanceError>(done)
    }
    .await;
    Some(match r {
        Ok(done) => Finished::ok(state, Some(done)),
        Err(e) => {
            op.cancel_waits().await;
            let _ = op.destroy_domain().await;
            Finished::err(
                InstanceState::Error,
                Some(record.clone()),
                InstanceError::RollbackFailed {
                    request: Request::Recover,
                    rollback: e.to_string(),
                    cause: Box::new(InstanceError::Invalid(format!(
                        "interrupted {}",
                        interrupted.describe()
                    ))),
                },
            )
        }
    })
}
