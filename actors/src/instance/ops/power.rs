//! Power: power off and on, soft and hard reboot, pause/unpause, suspend/resume.
//!
//! Why one module: each of these starts or stops the guest on this host with its devices
//! staying plugged, and each ends in a state read back from libvirt (or the state it
//! started in) — no binding moves, no other host. Starting goes through
//! [`super::boot_with_events`] so the events each wait for are the model's. Owns the
//! [`InFlight::PowerOn`], [`InFlight::RebootHard`] and [`InFlight::RebootSoft`] markers
//! (recovery runs an interrupted start again as a hard reboot).

use tracing::info;

use crate::lifecycle::InstanceState;
use crate::predict::EventOp;

use crate::instance::in_flight::InFlight;
use crate::instance::op::OpCtx;
use crate::instance::record::InstanceRecord;
use crate::instance::types::InstanceError;

use super::{boot_with_events, settle_state, with_rollback, Finished};

/// Graceful shutdown, then hard. Devices stay plugged.
pub(crate) async fn power_off(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
    timeout: Option<std::time::Duration>,
) -> Finished {
    op.phase("shutdown");
    let timeout = timeout.unwrap_or(op.deps.config.power_off_timeout);
    // No event waits: nothing to cancel, and no rollback (the state is read back), so not
    // [`with_rollback`].
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

/// Start a stopped (or errored) instance.
pub(crate) async fn power_on(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
) -> Finished {
    let done = with_rollback(
        op,
        async |op| {
            let in_flight = op.in_flight("start", InFlight::PowerOn);
            op.save(&record, Some(in_flight)).await?;
            boot_with_events(op, &record, EventOp::PowerOn, true).await?;
            let mut done = record.clone();
            done.state = InstanceState::Running;
            op.save(&done, None).await
        },
        async |op, cause| {
            let _ = op.destroy_domain().await;
            let _ = op.save(&record, None).await;
            let state = if from == InstanceState::Error {
                InstanceState::Error
            } else {
                InstanceState::Stopped
            };
            // Always rolled back: what the rollback could not do is left for the next start.
            Finished::rolled_back(op.request, state, Some(record.clone()), cause, Ok(()))
        },
    )
    .await;
    match done {
        Ok(()) => Finished::ok(InstanceState::Running, Some(record)),
        Err(rolled_back) => rolled_back,
    }
}

/// Destroy and recreate the domain; wait only for the events the model predicts.
pub(crate) async fn reboot_hard(op: &mut OpCtx, record: InstanceRecord) -> Finished {
    reboot(op, record, None).await
}

/// Nova's soft reboot: the guest is asked to shut down (ACPI) and given
/// `soft_reboot_timeout` to do so, then booted again with its devices (the domain is
/// recreated: the waits of a hard reboot). A guest that ignores the request, or a driver that
/// cannot make it, is rebooted hard after that time, and the report says so (a step
/// "soft reboot: ..., rebooted hard"). `virDomainReboot` is not used: it returns as soon as
/// the request is sent, and a guest that ignores ACPI would never be noticed.
pub(crate) async fn reboot_soft(op: &mut OpCtx, record: InstanceRecord) -> Finished {
    let timeout = op.deps.config.soft_reboot_timeout;
    reboot(op, record, Some(timeout)).await
}

/// A reboot: with `graceful`, the guest first gets that long to shut down itself; then the
/// domain is destroyed (when still running) and booted again with the hard reboot's waits.
async fn reboot(
    op: &mut OpCtx,
    record: InstanceRecord,
    graceful: Option<std::time::Duration>,
) -> Finished {
    let done = with_rollback(
        op,
        async |op| {
            let in_flight = op.in_flight("reboot", InFlight::reboot(op.request));
            op.save(&record, Some(in_flight)).await?;
            if let Some(timeout) = graceful {
                op.phase("shutdown");
                let start = std::time::Instant::now();
                if !op.shut_down_gracefully(timeout).await? {
                    info!(instance = %op.uuid, ?timeout, "guest did not shut down for a soft reboot; rebooting hard");
                    op.step(
                        format!(
                            "soft reboot: the guest did not shut down in {} s, rebooted hard",
                            timeout.as_secs_f64()
                        ),
                        crate::instance::types::StepKind::Libvirt,
                        start,
                        false,
                    );
                }
            }
            op.phase("destroy");
            op.destroy_domain().await?;
            boot_with_events(op, &record, EventOp::HardReboot, true).await?;
            let mut done = record.clone();
            done.state = InstanceState::Running;
            op.save(&done, None).await
        },
        async |op, cause| {
            // The guest was down already; leave it down, devices plugged, recoverable by
            // another reboot or power on.
            let _ = op.destroy_domain().await;
            let _ = op.save(&record, None).await;
            Finished::err(InstanceState::Error, Some(record.clone()), cause)
        },
    )
    .await;
    match done {
        Ok(()) => Finished::ok(InstanceState::Running, Some(record)),
        Err(rolled_back) => rolled_back,
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
    let done = with_rollback(
        op,
        async |op| {
            boot_with_events(op, &record, EventOp::PowerOn, true).await?;
            let mut done = record.clone();
            done.state = InstanceState::Running;
            op.save(&done, None).await
        },
        async |op, cause| {
            let state = settle_state(op, InstanceState::Error).await;
            let state = match state {
                InstanceState::Running | InstanceState::Paused => {
                    let _ = op.destroy_domain().await;
                    InstanceState::Error
                }
                s => s,
            };
            Finished::err(state, Some(record.clone()), cause)
        },
    )
    .await;
    match done {
        Ok(()) => Finished::ok(InstanceState::Running, Some(record)),
        Err(rolled_back) => rolled_back,
    }
}
