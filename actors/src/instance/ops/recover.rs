//! Recovery of an operation interrupted by an agent stop, for the in-flight markers that
//! have no dedicated request (see the actor's recovery for the others).
//!
//! Why one module: recovery matches every [`InFlight`] variant exhaustively, so a new
//! variant cannot be forgotten here; it borrows the other families' rollbacks (a live
//! migration's, an interface's detach) rather than repeating them.

use tracing::info;

use crate::lifecycle::{InstanceState, Request};
use crate::predict::EventOp;
use crate::vif::Vif;

use crate::instance::in_flight::{InFlight, InterfaceStep, Interrupted};
use crate::instance::op::OpCtx;
use crate::instance::record::{InstanceRecord, ResizeRole};
use crate::instance::types::{InstanceError, InvalidOperation};

use super::interfaces::detach;
use super::migrate::{recover_live_migration_for_caller, recover_live_migration_source};
use super::resize::{finish_revert_resize, stop_interrupted_revert, undo_finish_for_caller};

use super::{boot_with_events, running_or_stopped, settle_state, with_rollback, Finished};

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
        Some(InFlight::FinishRevertResize(step)) if step.by_caller => {
            // Nova's driver asks for the finish again once the agent is back.
            if let Err(e) = stop_interrupted_revert(op).await {
                failure = Some(e);
            }
        }
        // vireo's own revert, interrupted on the source while it brought the guest back: the
        // guest that attempt started (paused for its events, or resumed already) is stopped
        // and the instance is brought back again from the top.
        Some(InFlight::FinishRevertResize(_))
            if from == InstanceState::ResizeSource
                && record.resize.as_ref().map(|r| r.role) == Some(ResizeRole::Source) =>
        {
            match stop_interrupted_revert(op).await {
                Ok(()) => return finish_revert_resize(op, record, None).await,
                Err(e) => failure = Some(e),
            }
        }
        Some(InFlight::FinishResize(step)) if step.by_caller => {
            if let Err(e) = undo_finish_for_caller(op, &record).await {
                failure = Some(e);
            }
        }
        Some(InFlight::LiveMigrate(step)) if step.by_caller => {
            if let Err(e) =
                recover_live_migration_for_caller(op, &record, from == InstanceState::Paused).await
            {
                failure = Some(e);
            }
        }
        Some(InFlight::LiveMigrate(step)) => {
            // The destination's agent may be starting too: it is waited for, briefly.
            if let Err(e) = recover_live_migration_source(
                op,
                &record,
                &step.migration,
                from == InstanceState::Paused,
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
                cause: Box::new(
                    InvalidOperation::Interrupted {
                        operation: interrupted.describe(),
                    }
                    .into(),
                ),
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
            EventOp::FinishResize { same_host: true },
            r.was_running,
            InstanceState::ResizeTarget,
        ),
        // The revert's own recovery (RevertResize) runs for a record still resized.
        Some(_) => return None,
        None if resize => {
            let run = record.state == InstanceState::Running;
            (EventOp::HardReboot, run, running_or_stopped(run))
        }
        None => {
            let run = revert_was_running.unwrap_or(true);
            (
                EventOp::RevertResize {
                    source: migration.source_host.clone(),
                    dest: migration.dest_host.clone(),
                },
                run,
                running_or_stopped(run),
            )
        }
    };
    info!(instance = %op.uuid, interrupted = %interrupted.describe(), %state, "booting an interrupted same-host resize or revert again");
    let replug = matches!(operation, EventOp::RevertResize { .. });
    let done = with_rollback(
        op,
        async |op| {
            op.destroy_domain().await?;
            if replug {
                // As the revert does: every device plugged again for the original guest.
                op.unplug_all(record).await?;
            }
            boot_with_events(op, record, operation, run).await?;
            let mut done = record.clone();
            done.state = state;
            op.save(&done, None).await?;
            Ok(done)
        },
        // The boot's failure is this recovery's rollback failure; its cause, the
        // interrupted operation.
        async |op, e| {
            let _ = op.destroy_domain().await;
            Finished::err(
                InstanceState::Error,
                Some(record.clone()),
                InstanceError::RollbackFailed {
                    request: Request::Recover,
                    rollback: e.to_string(),
                    cause: Box::new(
                        InvalidOperation::Interrupted {
                            operation: interrupted.describe(),
                        }
                        .into(),
                    ),
                },
            )
        },
    )
    .await;
    Some(match done {
        Ok(done) => Finished::ok(state, Some(done)),
        Err(rolled_back) => rolled_back,
    })
}
