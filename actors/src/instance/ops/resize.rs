//! Resize: the source's hand-over, the destination's finish, confirm and revert on both
//! sides, the same-host variants, and bringing an instance back after a failed or reverted
//! resize.
//!
//! Why one module: a resize is one operation spread over two hosts and up to three requests
//! (resize, then confirm or revert); the source's rollback of a failed resize is exactly the
//! revert's second half ([`bring_back`]), so both live here. Owns the [`InFlight::Resize`],
//! [`InFlight::FinishResize`], [`InFlight::RevertResize`] and
//! [`InFlight::FinishRevertResize`] markers.

use std::collections::BTreeSet;

use tracing::{info, warn};

use crate::lifecycle::{InstanceState, Request};
use crate::network::PortUpdate;
use crate::predict::{EventOp, ExpectedEvent, Timing};
use crate::vif::{NetworkInfo, PortId};

use crate::instance::admission::AdmissionError;
use crate::instance::in_flight::{InFlight, MigrationStep, RevertStep};
use crate::instance::op::OpCtx;
use crate::instance::operation::{CallerTask, Operation, ResizeArgs};
use crate::instance::record::{InstanceRecord, ResizeRecord, ResizeRole};
use crate::instance::types::{
    Handover, IncomingDisks, InstanceError, InstanceReply, InvalidOperation, Migration, PowerState,
};
use crate::storage::migration_probe;

use crate::instance::journal::BuildEntry;

use super::spawn::end_journal as end_build_journal;
use super::{
    boot_with_events, expect_predicted, handover, policy, predicted, record_from_handover,
    remove_domain, running_or_stopped, start_awaited, with_rollback, Finished,
};

/// Source side of a resize. Same host: the whole resize here. Otherwise: power off (devices
/// vireo created stay wired), hand the instance over to the destination, and wait there for
/// confirm or revert. If the destination fails, the instance comes back here.
pub(crate) async fn resize(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
    args: ResizeArgs,
) -> Finished {
    let migration = args.migration(&op.deps.host);
    let caller_finishes = args.caller_finishes;
    let new_flavor = args.new_flavor;
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
        old_disks: Vec::new(),
        shared_disks: false,
    });
    source.state = InstanceState::ResizeSource;
    let has_disks = !record.storage.disks.is_empty();
    let probe = migration_probe(migration.id);
    // Not [`with_rollback`]: this side registers no event waits (the destination does, and
    // ends them itself), and its rollback, [`bring_back`], ends its own.
    let r = async {
        let in_flight = op.in_flight(
            "power off",
            InFlight::Resize(MigrationStep::of(migration.clone())),
        );
        op.save(&record, Some(in_flight)).await?;
        op.phase("power off");
        op.shutdown_domain(op.deps.config.power_off_timeout).await?;
        let in_flight = op.in_flight(
            "handover",
            InFlight::Resize(MigrationStep::of(migration.clone())),
        );
        op.save(&source, Some(in_flight)).await?;
        if has_disks {
            // The destination looks for it: a shared instances directory is resized in
            // place there, not copied.
            let storage = op.deps.storage.clone();
            op.store(
                "write the shared-directory probe",
                storage.write_probe(&probe),
            )
            .await?;
        }
        let h = handover(&record, &new_flavor, was_running);
        if caller_finishes {
            // Nova's compute manager takes the handover to the destination's driver. The
            // probe stays for the destination to look for; confirm or revert removes it.
            op.report.handover = Some(h);
            return op.save(&source, None).await;
        }
        op.phase("finish on destination");
        let InstanceReply::Done { report, .. } = op
            .peer(
                &migration.dest_host,
                "finish-resize",
                Operation::FinishResize {
                    migration: migration.clone(),
                    handover: Box::new(h),
                    caller: None,
                },
            )
            .await?;
        let shared = report.incoming.is_some_and(|i| i.shared_instance_path);
        if let Some(r) = source.resize.as_mut() {
            r.shared_disks = shared && has_disks;
        }
        op.save(&source, None).await
    }
    .await;
    if has_disks && !(caller_finishes && r.is_ok()) {
        op.deps.storage.remove_probe(&probe).await;
    }
    match r {
        Ok(()) => Finished::ok(InstanceState::ResizeSource, Some(source)),
        Err(cause) => {
            warn!(instance = %op.uuid, error = %cause, "resize failed; bringing the instance back");
            // The destination removed its copy; bring the instance back here exactly as a
            // revert does (bindings back where they moved, devices, domain).
            let back = bring_back(op, source.clone(), false).await;
            let rollback = back.result.map_err(|e| e.to_string());
            Finished::rolled_back(Request::Resize, back.state, back.record, cause, rollback)
        }
    }
}

/// Destination side of a cross-host resize: define with the new flavor, register the
/// predicted waits, bind the ports here, plug, start paused, await, resume if it ran.
pub(crate) async fn finish_resize(
    op: &mut OpCtx,
    migration: Migration,
    h: Handover,
    caller: Option<Box<CallerTask>>,
) -> Finished {
    let mut record = match record_from_handover(op, &h) {
        Ok(r) => r,
        Err(e) => return Finished::err(InstanceState::Gone, None, e),
    };
    record.resize = Some(ResizeRecord {
        migration: migration.clone(),
        role: ResizeRole::Target,
        old_flavor: h.old_flavor.clone(),
        was_running: h.power_on,
        old_disks: Vec::new(),
        shared_disks: false,
    });
    record.state = InstanceState::ResizeTarget;
    // The source's probe here: the instances directory is the source's too, and the disks
    // are resized in place (the old ones kept for a revert) instead of copied.
    let shared = !record.storage.disks.is_empty()
        && op
            .deps
            .storage
            .sees_probe(&migration_probe(migration.id))
            .await;
    if let Some(r) = record.resize.as_mut() {
        r.shared_disks = shared;
    }
    if shared && caller.is_some() {
        // Nova's revert destroys the destination's disks unless its driver proves shared
        // storage, and its confirm removes nothing on the source: in-place disks would be
        // lost either way. Refused before anything is made.
        let refused = InvalidOperation::SharedResizeUnderNova {
            host: op.deps.host.clone(),
        };
        return Finished::err(InstanceState::Gone, None, refused.into());
    }
    // Disks already here otherwise: refused before anything is made, so that no rollback
    // removes them (a leftover, or a directory shared without a probe to show it).
    if !shared && !record.storage.disks.is_empty() && op.deps.storage.holds_disks(op.uuid).await {
        let refused = InvalidOperation::DisksAlreadyHere {
            host: op.deps.host.clone(),
        };
        return Finished::err(InstanceState::Gone, None, refused.into());
    }
    op.deps.events.track(op.uuid);
    op.use_record(&record);
    if let Some(task) = &caller {
        op.adopt_caller_task(task);
    }
    let source_uri = caller.as_ref().and_then(|c| c.source_uri.clone());
    let image_token = caller.as_ref().and_then(|c| c.image_token.clone());
    // With a caller (Nova) the resize ends here: its confirm only cleans the source, its
    // revert destroys this copy; without one this host keeps the resize until either.
    let caller_runs = caller.is_some();
    // The copy's token (see the build journal).
    let build = uuid::Uuid::new_v4();
    let done = with_rollback(
        op,
        // Not boot_with_events: the ports are bound here between registering the waits and
        // plugging (their bind-time events come from that move).
        async |op| {
            let prediction = predicted(
                op,
                &EventOp::FinishResize {
                    same_host: migration.same_host(),
                },
                &record.network_info.vifs,
            )?;
            // The disks come first: copied from the source (which keeps its own for a
            // revert) before the domain that names them is defined here.
            let mut record = record.clone();
            if shared {
                op.phase("resize disks in place");
                let storage = op.deps.storage.clone();
                record.storage.disks = op
                    .store(
                        "resize disks",
                        storage.resize(op.uuid, &record.storage.disks, record.flavor.root_gb),
                    )
                    .await?;
            } else if !record.storage.disks.is_empty() {
                if caller_runs {
                    // Journaled as a build (its token marks the copy): an agent stopped
                    // before the domain exists finds no marker, only this entry, and the
                    // next start removes the copy, so that Nova's driver can ask again.
                    let entry = BuildEntry {
                        instance: op.uuid,
                        host: op.deps.host.clone(),
                        user_ports: Vec::new(),
                        allocated: false,
                        build: Some(build),
                    };
                    op.deps.builds.begin(&entry).await.map_err(|source| {
                        InstanceError::Journal {
                            step: "begin",
                            source,
                        }
                    })?;
                }
                op.phase("copy disks");
                let source = &migration.source_host;
                let uri = match &source_uri {
                    Some(uri) => uri.clone(),
                    None => op.deps.peers.get(source)?.migration_uri().ok_or_else(|| {
                        InstanceError::from(InvalidOperation::NoDiskCopyFrom {
                            host: source.clone(),
                        })
                    })?,
                };
                let storage = op.deps.storage.clone();
                let disks = op
                    .store(
                        "copy disks",
                        storage.copy_from(
                            op.uuid,
                            &uri,
                            &record.storage.disks,
                            record.storage.image.as_ref(),
                            image_token.clone(),
                            record.flavor.root_gb,
                            caller_runs.then_some(build),
                        ),
                    )
                    .await?;
                record.storage.disks = disks;
            }
            op.report.incoming = Some(IncomingDisks {
                shared_instance_path: shared,
                disks: record.storage.disks.clone(),
            });
            op.phase("define");
            let in_flight = op.in_flight(
                "finish-resize",
                InFlight::FinishResize(MigrationStep {
                    migration: migration.clone(),
                    by_caller: caller_runs,
                }),
            );
            op.define(&record, Some(in_flight)).await?;
            let (bind, plug) = expect_predicted(op, &prediction).await?;
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
            if caller_runs {
                record.resize = None;
                record.state = running_or_stopped(h.power_on);
            }
            op.save(&record, None).await?;
            Ok(record)
        },
        async |op, e| give_up_copy(op, &record, e).await,
    )
    .await;
    if caller_runs {
        // Done or rolled back: either way nothing of the copy is left to journal.
        end_build_journal(op).await;
    }
    match done {
        Ok(record) if caller_runs => Finished::ok(record.state, Some(record)),
        Ok(record) => Finished::ok(InstanceState::ResizeTarget, Some(record)),
        Err(rolled_back) => rolled_back,
    }
}

/// A finish-resize Nova ran here, interrupted by an agent stop: this host's copy goes
/// (domain, devices, the disks the finish copied: under Nova it never runs on a directory
/// shared with the source), so that Nova's driver can ask for the finish again from the
/// start once the agent is back (the source keeps its own copy until Nova confirms).
pub(crate) async fn undo_finish_for_caller(
    op: &mut OpCtx,
    record: &InstanceRecord,
) -> Result<(), String> {
    op.phase("recover: remove the interrupted finish");
    info!(instance = %op.uuid, "removing what an interrupted finish-resize made here: Nova's driver asks for it again");
    let removed = remove_domain(op, record).await;
    op.deps.events.forget(op.uuid);
    removed.map_err(|e| e.to_string())
}

/// A revert interrupted on this host (the source) by an agent stop while it brought the
/// guest back: the guest is stopped again (a domain started paused, or already resumed), its
/// definition, devices and disks kept, so that the instance waits as the resize's source
/// (see the recovery) for the revert's finish to run again: Nova's driver asks for it once
/// the agent is back; vireo's own revert runs it from the recovery.
pub(crate) async fn stop_interrupted_revert(op: &mut OpCtx) -> Result<(), String> {
    op.phase("recover: stop the interrupted revert");
    info!(instance = %op.uuid, "stopping the guest of an interrupted finish-revert-resize: it runs again");
    op.destroy_domain().await.map_err(|e| e.to_string())
}

/// A failed finish-resize gives this host's copy up: the source takes the instance back.
async fn give_up_copy(op: &mut OpCtx, record: &InstanceRecord, e: InstanceError) -> Finished {
    // The source takes the instance back: this host gives it up whatever happens
    // here. What libvirt could not remove (its connection lost) stays with the
    // record, gone but kept, and the actor removes it once libvirt is back
    // (never adopted again as a resize target by the recovery after a reconnect).
    let mut removed = remove_domain(op, record).await;
    if removed.is_ok() && record.resize_shares_disks() {
        // The source's disks, resized in place: the kept ones go back.
        let storage = op.deps.storage.clone();
        let uuid = op.uuid;
        removed = op.store("restore disks", storage.restore_kept(uuid)).await;
    }
    op.deps.events.forget(op.uuid);
    match removed {
        Ok(()) => Finished::err(InstanceState::Gone, None, e),
        Err(left) => {
            warn!(instance = %op.uuid, error = %left, "finish-resize rollback left the domain behind; it goes once libvirt is back");
            Finished::err(InstanceState::Gone, Some(record.clone()), e)
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
            InvalidOperation::NoResize {
                request: Request::ConfirmResize,
            }
            .into(),
        );
    };
    // No event waits and nothing to roll back (a failure leaves the resize to confirm
    // again): a plain match, not [`with_rollback`].
    let r = async {
        if resize.migration.same_host() || resize.shared_disks {
            // The copy of the disks kept for a revert goes.
            let storage = op.deps.storage.clone();
            let uuid = op.uuid;
            op.store("drop the kept disks", storage.drop_kept(uuid))
                .await?;
        }
        if !resize.migration.same_host() {
            op.phase("clean up the source");
            match op
                .peer(
                    &resize.migration.source_host,
                    "confirm-resize-source",
                    Operation::ConfirmResizeSource {
                        remove_after: false,
                    },
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
///
/// `remove_after` (Nova's confirm): answer once the domain is off and its record says the
/// instance left, which is what a restarted agent reads; the instance actor then removes it
/// at once as the leftovers of an instance gone from this host (see [`super::super::actor`]),
/// before it takes another request. Measured: the removal of a hybrid plug's bridge and veth
/// pair alone takes the kernel 60-80 ms, which the libvirt driver spends at the migration
/// instead. Disks shared with the destination are never left to that removal (it would take
/// them): with them, and if the record cannot be written, everything is removed first.
pub(crate) async fn confirm_resize_source(
    op: &mut OpCtx,
    record: InstanceRecord,
    remove_after: bool,
) -> Finished {
    remove_probe(op, &record).await;
    if remove_after && !record.resize_shares_disks() {
        op.phase("leave");
        let mut left = record.clone();
        left.state = InstanceState::Gone;
        let off = async {
            op.destroy_domain().await?;
            op.save(&left, None).await
        }
        .await;
        match off {
            Ok(()) => return Finished::ok(InstanceState::Gone, Some(left)),
            Err(e) => {
                warn!(instance = %op.uuid, error = %e, "not recorded as gone: removing the old instance before the answer");
            }
        }
    }
    op.phase("remove the old instance");
    match remove_domain(op, &record).await {
        Ok(()) => {
            op.deps.events.forget(op.uuid);
            Finished::ok(InstanceState::Gone, None)
        }
        Err(e) => Finished::err(InstanceState::Error, Some(record), e),
    }
}

/// Where the resized instance runs: revert. Same host: all here. Otherwise remove the copy
/// here, then have the source bring the instance back.
pub(crate) async fn revert_resize(op: &mut OpCtx, record: InstanceRecord) -> Finished {
    let Some(resize) = record.resize.clone() else {
        return Finished::err(
            InstanceState::Error,
            Some(record),
            InvalidOperation::NoResize {
                request: Request::RevertResize,
            }
            .into(),
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
    if let Err(e) = remove_domain(op, &record).await {
        return Finished::err(InstanceState::Error, Some(record), e);
    }
    if resize.shared_disks {
        // The source's own files, resized in place: the kept ones go back before the
        // source starts on them.
        let storage = op.deps.storage.clone();
        let uuid = op.uuid;
        if let Err(e) = op.store("restore disks", storage.restore_kept(uuid)).await {
            return Finished::err(InstanceState::Error, Some(record), e);
        }
    }
    op.deps.events.forget(op.uuid);
    op.phase("bring back on the source");
    match op
        .peer(
            &resize.migration.source_host,
            "finish-revert-resize",
            Operation::FinishRevertResize { caller: None },
        )
        .await
    {
        Ok(_) => Finished::ok(InstanceState::Gone, None),
        Err(e) => Finished::err(InstanceState::Gone, None, e),
    }
}

/// The source of a reverted resize: bring the instance back. With a caller (Nova), which
/// moved the bindings back before it asked, the events of that move count.
pub(crate) async fn finish_revert_resize(
    op: &mut OpCtx,
    record: InstanceRecord,
    caller: Option<Box<CallerTask>>,
) -> Finished {
    remove_probe(op, &record).await;
    if let Some(task) = &caller {
        op.adopt_caller_task(task);
    }
    bring_back(op, record, caller.is_some()).await
}

/// The probe a source wrote for a destination that a caller finishes (see [`resize`]).
pub(crate) async fn remove_probe(op: &OpCtx, record: &InstanceRecord) {
    if let Some(r) = &record.resize {
        if !record.storage.disks.is_empty() {
            op.deps
                .storage
                .remove_probe(&migration_probe(r.migration.id))
                .await;
        }
    }
}

/// Bring an instance whose domain waits stopped on this host back to life after the
/// destination let go of it: expect the bind-time events, move the bindings back (only
/// those that moved), await; expect the plug-time events, plug, start paused, await, resume
/// if it ran. The waits are registered before their triggers, so an event Neutron sends at
/// bind time — before any plug — is never missed.
///
/// `moved_by_caller`: the caller moved every binding back before it asked (Nova's
/// `migrate_instance_finish`), so each port counts as moved although it is bound here now.
async fn bring_back(op: &mut OpCtx, record: InstanceRecord, moved_by_caller: bool) -> Finished {
    let Some(resize) = record.resize.clone() else {
        return Finished::err(
            InstanceState::Error,
            Some(record),
            InvalidOperation::NoResize {
                request: op.request,
            }
            .into(),
        );
    };
    let was_running = resize.was_running;
    let done = with_rollback(
        op,
        async |op| {
            let in_flight = op.in_flight(
                "finish-revert",
                InFlight::bring_back(op.request, resize.migration.clone(), moved_by_caller),
            );
            op.save(&record, Some(in_flight)).await?;
            op.deps.events.track(op.uuid);
            let prediction = predicted(
                op,
                &EventOp::RevertResize {
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
                if moved_by_caller || port.host_id != op.deps.host {
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
            // Both waits are registered before the bindings move back (a plug-time wait
            // counts from its registration): the service may report a port as soon as it is
            // bound here again.
            let pol = policy(op);
            let bind = op.expect(Timing::BindTime, bind_events, pol).await?;
            let plug = op.expect(Timing::PlugTime, plug_events, pol).await?;
            op.phase("bind ports back");
            bind_ports_here(op, &record.network_info).await?;
            // As a boot: the bind-time event (often kept already) and the plug-time ones
            // are awaited while the guest starts paused.
            start_awaited(op, &record, bind, plug, was_running).await?;
            let mut done = record.clone();
            done.resize = None;
            done.state = running_or_stopped(was_running);
            op.save(&done, None).await?;
            Ok::<_, InstanceError>(done)
        },
        async |op, e| {
            let _ = op.destroy_domain().await;
            Finished::err(InstanceState::Error, Some(record.clone()), e)
        },
    )
    .await;
    match done {
        Ok(done) => Finished::ok(done.state, Some(done)),
        Err(rolled_back) => rolled_back,
    }
}

async fn resize_same_host(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
    migration: Migration,
    new_flavor: vireo_xml::metadata::Flavor,
) -> Finished {
    // A disk does not shrink: refused before the guest is touched.
    let root = record
        .storage
        .disks
        .iter()
        .find(|d| d.role == crate::storage::DiskRole::Root);
    if let Some(r) = root {
        let wanted = new_flavor.root_gb.saturating_mul(1 << 30);
        if new_flavor.root_gb > 0 && wanted < r.virtual_size {
            let refused = InstanceError::Storage {
                step: "resize disks",
                source: crate::storage::StorageError::RootDiskShrink {
                    current: r.virtual_size,
                    root_gb: new_flavor.root_gb,
                },
            };
            return Finished::err(from, Some(record), refused);
        }
    }
    let was_running = from == InstanceState::Running;
    let mut target = record.clone();
    target.flavor = new_flavor;
    target.resize = Some(ResizeRecord {
        migration: migration.clone(),
        role: ResizeRole::Target,
        old_flavor: record.flavor.clone(),
        was_running,
        old_disks: record.storage.disks.clone(),
        shared_disks: false,
    });
    target.state = InstanceState::ResizeTarget;
    let done = with_rollback(
        op,
        async |op| {
            let in_flight = op.in_flight(
                "resize",
                InFlight::Resize(MigrationStep::of(migration.clone())),
            );
            op.save(&record, Some(in_flight.clone())).await?;
            op.phase("power off");
            op.shutdown_domain(op.deps.config.power_off_timeout).await?;
            // The disks: a copy kept for a revert, the root disk grown to the new flavor.
            let mut target = target.clone();
            if !record.storage.disks.is_empty() {
                op.phase("disks");
                let storage = op.deps.storage.clone();
                target.storage.disks = op
                    .store(
                        "resize disks",
                        storage.resize(op.uuid, &record.storage.disks, target.flavor.root_gb),
                    )
                    .await?;
            }
            op.phase("redefine");
            op.define(&target, Some(in_flight)).await?;
            boot_with_events(
                op,
                &target,
                EventOp::FinishResize { same_host: true },
                was_running,
            )
            .await?;
            op.save(&target, None).await?;
            Ok(target)
        },
        async |op, cause| {
            // Back to the old definition and disks, running again if it ran (with its
            // devices: a failed plug may have been of devices that had gone).
            let back = async {
                op.destroy_domain().await?;
                let storage = op.deps.storage.clone();
                let uuid = op.uuid;
                op.store("restore disks", storage.restore_kept(uuid))
                    .await?;
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
            let back = back.map_err(|e| e.to_string());
            Finished::rolled_back(Request::Resize, from, Some(record.clone()), cause, back)
        },
    )
    .await;
    match done {
        Ok(target) => Finished::ok(InstanceState::ResizeTarget, Some(target)),
        Err(rolled_back) => rolled_back,
    }
}

/// Same-host revert: the resized guest is destroyed and the original one booted in its place
/// with the devices that stayed wired through the resize (the same ports, the same binding):
/// a hard reboot into the old definition and disks. Only a device the new domain really
/// recreates (a libvirt-managed tap) reports again, and only that is awaited; unplugging and
/// re-plugging the rest would cost a wait for the L2 agent to notice the churn (about 2.5 s
/// with the OVS agent, measured in docs/NOVA.md's side-by-side) and buy nothing.
async fn revert_same_host(
    op: &mut OpCtx,
    record: InstanceRecord,
    resize: ResizeRecord,
) -> Finished {
    let mut back = record.clone();
    back.flavor = resize.old_flavor.clone();
    back.resize = None;
    if !resize.old_disks.is_empty() {
        back.storage.disks = resize.old_disks.clone();
    }
    let done = with_rollback(
        op,
        async |op| {
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
            op.phase("restore disks");
            let storage = op.deps.storage.clone();
            let uuid = op.uuid;
            op.store("restore disks", storage.restore_kept(uuid))
                .await?;
            op.phase("redefine");
            op.define(&back, Some(in_flight)).await?;
            boot_with_events(
                op,
                &back,
                EventOp::RevertResize {
                    source: resize.migration.source_host.clone(),
                    dest: resize.migration.dest_host.clone(),
                },
                resize.was_running,
            )
            .await?;
            let mut done = back.clone();
            done.state = running_or_stopped(resize.was_running);
            op.save(&done, None).await
        },
        async |op, e| {
            let _ = op.destroy_domain().await;
            Finished::err(InstanceState::Error, Some(back.clone()), e)
        },
    )
    .await;
    match done {
        Ok(()) => Finished::ok(running_or_stopped(resize.was_running), Some(back)),
        Err(rolled_back) => rolled_back,
    }
}
