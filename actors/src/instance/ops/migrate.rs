//! Live migration: the source's flow and its rollback, and the destination's
//! pre-live-migration, post-live-migration and rollback-at-destination.
//!
//! Why one module: the rollback runs from the source whatever the storage (network first,
//! then the destination asked to remove what it prepared), and recovery reuses that same
//! rollback for a migration the agent died in; the `binding:profile` updates
//! (`migrating_to`) are only ever made here. Owns the [`InFlight::LiveMigrate`] marker, and
//! the source's live-migration journal entry (the same record, for a restart that finds no
//! domain: see [`crate::instance::journal`]); the destination writes none (it works from the
//! source's hand-over).

use std::collections::BTreeSet;

use tracing::{info, warn};

use crate::events::WaitPolicy;
use crate::lifecycle::{InstanceState, Request};
use crate::network::{MigrationHosts, NetworkError, NewBinding, PortStatus, MIGRATING_TO};
use crate::predict::{EventOp, Timing};

use crate::instance::admission::AdmissionError;
use crate::instance::in_flight::{InFlight, MigrationStep};
use crate::instance::journal::LiveMigrationEntry;
use crate::instance::op::OpCtx;
use crate::instance::operation::{cleanup_flags, CallerTask, LiveMigrateArgs, Operation};
use crate::instance::record::InstanceRecord;
use crate::instance::types::{
    Handover, IncomingDisks, InstanceError, InstanceReply, InvalidOperation, Migration, PowerState,
};
use crate::storage::{disk_targets, migration_probe, CacheMode, DiskRole};
use crate::vif::{NetworkInfo, Vif};
use crate::vif_config::DeviceConfig;
use vireo_xml::live::{rewrite, Edit, Selector};
use vireo_xml::metadata::InFlightOperation;

use super::{handover, predicted, record_from_handover, settle_state, with_rollback, Finished};

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
    let migration = args.migration(&op.deps.host);
    if migration.same_host() {
        return Finished::err(
            from,
            Some(record),
            InvalidOperation::MigrationToItself {
                host: migration.source_host,
            }
            .into(),
        );
    }
    if let Some(caller) = args.caller {
        return live_migrate_for_caller(op, record, from, migration, *caller).await;
    }
    let dest = migration.dest_host.clone();
    let h = handover(&record, &record.flavor, from == InstanceState::Running);
    let has_disks = !record.storage.disks.is_empty();
    let probe = migration_probe(migration.id);
    // What the destination prepared (its pre-live-migration's report): until it answered,
    // whether it shares the instances directory is unknown.
    let incoming: std::sync::Mutex<Option<IncomingDisks>> = std::sync::Mutex::new(None);
    // The migration call was made: when it fails, libvirt may still run the job, or have
    // moved the guest already.
    let called = std::sync::atomic::AtomicBool::new(false);
    let shared_path = |i: &std::sync::Mutex<Option<IncomingDisks>>| {
        i.lock()
            .map(|g| g.as_ref().is_some_and(|i| i.shared_instance_path))
            .unwrap_or(false)
    };
    let in_flight = op.in_flight(
        "prepare",
        InFlight::LiveMigrate(MigrationStep::of(migration.clone())),
    );
    let migrated = with_rollback(
        op,
        async |op| {
            op.save(&record, Some(in_flight.clone())).await?;
            let mut entry = journal_migration(op, &record, in_flight, None).await?;
            let storage = op.deps.storage.clone();
            op.store(
                "write the shared-directory probe",
                storage.write_probe(&probe),
            )
            .await?;
            let peer = op.deps.peers.get(&dest)?;
            let uri = peer.migration_uri().ok_or_else(|| {
                InstanceError::from(InvalidOperation::NoLiveMigrationTo { host: dest.clone() })
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
            let InstanceReply::Done { report, .. } = op
                .peer(
                    &dest,
                    "pre-live-migration",
                    Operation::PreLiveMigration {
                        migration: migration.clone(),
                        handover: Box::new(h.clone()),
                        caller: None,
                    },
                )
                .await?;
            let prepared = report.incoming.unwrap_or(IncomingDisks {
                // A destination that says nothing of disks prepared none.
                shared_instance_path: false,
                disks: Vec::new(),
            });
            if let Ok(mut i) = incoming.lock() {
                *i = Some(prepared.clone());
            }
            // What a recovery of this source needs to know of its disks, before they move.
            entry.copied_disks = Some(has_disks && !prepared.shared_instance_path);
            write_journal(op, &entry, "record the disk copy").await?;
            let block = if has_disks {
                Some(block_migration(op, &dest, &record, &prepared).await?)
            } else {
                None
            };
            op.phase("migrate");
            called.store(true, std::sync::atomic::Ordering::Relaxed);
            migrate_watched(op, uri, record.flavor.memory_mb, block).await?;
            Ok::<_, InstanceError>(())
        },
        async |op, cause| {
            let cause = if called.load(std::sync::atomic::Ordering::Relaxed) {
                let copied = has_disks && !shared_path(&incoming);
                match departed_despite_the_call(op, &record, &migration, from, copied, cause).await
                {
                    Ok(done) => return done,
                    Err(cause) => cause,
                }
            } else {
                cause
            };
            // Logged once the operation's waits are cancelled (before, in the copy this
            // replaced): the order of a log line only.
            warn!(instance = %op.uuid, error = %cause, "live migration failed; rolling back");
            // Not knowing whether the directory is shared (no answer), the destination is
            // asked to remove its disks: it looks for the probe first and keeps a directory
            // that is the source's.
            let (do_cleanup, destroy_disks) = cleanup_flags(!has_disks, shared_path(&incoming));
            let rollback = rollback_live_migration(
                op,
                &record,
                &migration,
                h.clone(),
                do_cleanup,
                destroy_disks,
                std::time::Duration::ZERO,
            )
            .await;
            op.deps.storage.remove_probe(&probe).await;
            let state = state_after_failed_migration(op, from).await;
            let _ = op.save(&record, None).await;
            end_journal(op).await;
            Finished::rolled_back(
                Request::LiveMigrate,
                state,
                Some(record.clone()),
                cause,
                rollback,
            )
        },
    )
    .await;
    match migrated {
        Ok(()) => {
            // The guest runs on the destination now: there is nothing to roll back to.
            let post = hand_over(op, &migration, std::time::Duration::ZERO).await;
            // The migration copied the disks unless the directory is shared: the
            // destination's are the guest's now.
            let copied = has_disks && !shared_path(&incoming);
            clean_up_departed(op, &record, copied, &probe).await;
            // A destination that did not take the guest over is asked again by the next
            // start's recovery: the entry is all that says so (the domain left).
            if post.is_ok() {
                end_journal(op).await;
            }
            match post {
                Ok(_) => Finished::ok(InstanceState::Gone, None),
                Err(e) => Finished::err(InstanceState::Gone, None, e),
            }
        }
        Err(rolled_back) => rolled_back,
    }
}

/// The migrate call failed, which is not a failed migration: the job may run on (a call that
/// timed out: its job was aborted) or have moved the guest before the call failed. Rolling
/// back then had the destination destroy the guest that had arrived. So the job is let end
/// and the domain decides: gone or shut off, the guest left — the destination takes it over
/// and this host cleans up (its disks when the migration `copied` them), which ends the
/// operation (`Ok`); still here, `Err(cause)`: the caller rolls back.
async fn departed_despite_the_call(
    op: &mut OpCtx,
    record: &InstanceRecord,
    migration: &Migration,
    from: InstanceState,
    copied: bool,
    cause: InstanceError,
) -> Result<Finished, InstanceError> {
    op.phase("the migration job after its call failed");
    let gone = match let_migration_end(op, from == InstanceState::Paused).await {
        Ok(PowerState::NoDomain) => true,
        Ok(PowerState::Shutoff) => false,
        _ => return Err(cause),
    };
    warn!(instance = %op.uuid, error = %cause, dest = %migration.dest_host,
        "the live migration's call failed, but the guest left: the destination takes it over");
    let zero = std::time::Duration::ZERO;
    Ok(
        match hand_over_departed(op, record, migration, gone, copied, zero).await {
            Ok(()) => Finished::ok(InstanceState::Gone, None),
            Err(rollback) => {
                let (state, kept) = if gone {
                    (InstanceState::Gone, None)
                } else {
                    (InstanceState::Error, Some(record.clone()))
                };
                let error = InstanceError::RollbackFailed {
                    request: Request::LiveMigrate,
                    rollback,
                    cause: Box::new(cause),
                };
                Finished::err(state, kept, error)
            }
        },
    )
}

/// How long the recovery of a live migration's source lets a migration job that outlived its
/// agent run on before it aborts it.
const RECOVER_JOB_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// How long the recovery of a live migration's source waits, with no job left, for a domain
/// paused for the switch-over or shut off by it to settle (resumed, or undefined by libvirt).
const RECOVER_SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The source of a live migration whose agent stopped while libvirt migrated the guest (a
/// kill, a crash): libvirt runs a peer-to-peer migration on to its end without its caller.
/// So the migration is let end first — a job running, or the domain paused (when it was not)
/// or shut off: libvirt pauses the source for the switch-over, stops its QEMU once the
/// destination runs the guest and then undefines it, and the job may show none in between —
/// polled, the job aborted after [`RECOVER_JOB_WAIT`]. Then: the guest running (or paused)
/// here, it never left — the migration is rolled back (the network from here, the
/// destination removes what it prepared). No domain, or a shut-off one: the guest left, or
/// is lost — the destination is asked to take it over; once it did, the source cleans up as
/// a finished migration does; if it cannot, nothing is rolled back (the destination may run
/// the guest) and the error says so. Rolling back whenever the record said a migration was
/// in flight — what recovery did before — had the destination destroy the guest that had
/// just arrived: the instance was lost on both hosts (the two-host scenario "live migrate
/// B>A, B (the source) killed"). Returns whether the guest left.
pub(crate) async fn recover_live_migration_source(
    op: &mut OpCtx,
    record: &InstanceRecord,
    migration: &Migration,
    was_paused: bool,
    peer_wait: std::time::Duration,
) -> Result<bool, String> {
    op.phase("recover: the migration job");
    let state = let_migration_end(op, was_paused).await;
    let gone = match state {
        Ok(PowerState::NoDomain) => true,
        Ok(PowerState::Shutoff) => false,
        Ok(_) => {
            let probe = migration_probe(migration.id);
            let h = handover(record, &record.flavor, true);
            let r = rollback_live_migration(op, record, migration, h, true, true, peer_wait).await;
            op.deps.storage.remove_probe(&probe).await;
            // Recovery clears the domain's marker whatever the rollback's outcome: the
            // entry goes with it.
            end_journal(op).await;
            return r.map(|()| false);
        }
        Err(e) => {
            return Err(format!(
                "the domain could not be read; the migration is left as it is: {}",
                crate::instance::actor::error_chain(&e)
            ))
        }
    };
    info!(instance = %op.uuid, dest = %migration.dest_host, domain_here = !gone,
        "the guest's QEMU ended here during the interrupted live migration: the destination \
         is asked to take the guest over");
    let copied = journaled_copied_disks(op).await;
    // The guest may run on the destination: a destination not known yet (hosts served by one
    // process start one after the other, and a loaded machine takes its time) is waited for
    // as long as an unreachable one, not just the rollback's `peer_wait` (a test that ran
    // beside others missed it that way).
    let wait = peer_wait.max(op.deps.config.migration.handover_retry);
    hand_over_departed(op, record, migration, gone, copied, wait)
        .await
        .map(|()| true)
}

/// Whether the interrupted migration copied the disks, as its journal entry recorded once
/// the destination answered; not knowing (no entry, or a version that wrote none), they are
/// kept.
async fn journaled_copied_disks(op: &mut OpCtx) -> bool {
    match op.deps.migrations.read(op.uuid).await {
        Ok(Some(entry)) => entry.copied_disks.unwrap_or(false),
        Ok(None) => false,
        Err(error) => {
            warn!(instance = %op.uuid, error = %crate::instance::actor::error_chain(&error), "live-migration journal entry unreadable: the source's disks are kept");
            false
        }
    }
}

/// Let a migration job libvirt runs on end (see [`recover_live_migration_source`]), and read
/// the domain's state after it: the job running, or the domain paused for the switch-over
/// (when it was not: `was_paused`) or shut off by it, is waited for — polled, the job aborted
/// after [`RECOVER_JOB_WAIT`].
async fn let_migration_end(op: &mut OpCtx, was_paused: bool) -> Result<PowerState, InstanceError> {
    let lv = op.deps.libvirt.clone();
    let start = tokio::time::Instant::now();
    let mut aborted = false;
    loop {
        // The job first: a state read after it cannot predate the job's end (seen here: the
        // domain read as running, then its job refused with "domain is not running").
        let progress = lv.job_progress(op.uuid).await;
        let state = op.power().await;
        let job = progress.as_ref().is_ok_and(|p| p.active);
        let settling = match state {
            Ok(PowerState::Paused) => !was_paused,
            Ok(PowerState::Shutoff) => true,
            // "domain is not running": it stopped between the two reads.
            Ok(PowerState::Running) => matches!(
                progress,
                Err(crate::libvirt::LibvirtError::OperationInvalid { .. })
            ),
            _ => false,
        };
        let waited = start.elapsed();
        let out_of_time = waited >= RECOVER_JOB_WAIT + RECOVER_SETTLE_WAIT;
        if job && !aborted && waited >= RECOVER_JOB_WAIT {
            warn!(instance = %op.uuid, "a live migration job outlived its call too long: aborting it");
            aborted = true;
            if let Err(e) = lv.abort_job(op.uuid).await {
                warn!(instance = %op.uuid, error = %e, "aborting the migration job failed");
            }
        } else if out_of_time || (!job && (!settling || waited >= RECOVER_SETTLE_WAIT)) {
            return state;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The guest left this host (`gone`: its domain too; otherwise the domain is shut off here)
/// while nobody followed the migration: the destination is asked to take it over; once it
/// did, this host cleans up as a finished migration does (its disks only when the migration
/// `copied` them) and the journal entry goes. If it
/// cannot, nothing is rolled back (the destination may run the guest) and the error says so:
/// a shut-off domain here is kept, and so is the entry (the next start asks again).
async fn hand_over_departed(
    op: &mut OpCtx,
    record: &InstanceRecord,
    migration: &Migration,
    gone: bool,
    copied: bool,
    peer_wait: std::time::Duration,
) -> Result<(), String> {
    let probe = migration_probe(migration.id);
    let post = hand_over(op, migration, peer_wait).await;
    if let Err(e) = &post {
        if !gone {
            return Err(format!(
                "the destination did not take the guest over; its shut-off domain here is \
                 kept: {}",
                crate::instance::actor::error_chain(e)
            ));
        }
    }
    clean_up_departed(op, record, copied, &probe).await;
    match post {
        Ok(_) => {
            end_journal(op).await;
            Ok(())
        }
        Err(e) => Err(format!(
            "the destination did not take the guest over: {}",
            crate::instance::actor::error_chain(&e)
        )),
    }
}

/// Journal the migration before anything of it is made: a source stopped until the guest
/// has left finds no domain at its next start, only this entry (see
/// [`crate::instance::journal`]). `copied_disks`: whether the migration copies the disks,
/// when that is known before it starts (Nova's: every disk is copied).
async fn journal_migration(
    op: &mut OpCtx,
    record: &InstanceRecord,
    in_flight: InFlightOperation,
    copied_disks: Option<bool>,
) -> Result<LiveMigrationEntry, InstanceError> {
    let metadata = record
        .metadata(&op.deps.host, Some(in_flight))
        .and_then(|m| m.to_xml().map_err(Into::into))
        .map_err(InstanceError::Record)?;
    let entry = LiveMigrationEntry {
        instance: op.uuid,
        name: record.name.clone(),
        metadata,
        copied_disks,
    };
    write_journal(op, &entry, "begin").await?;
    Ok(entry)
}

/// Write (or rewrite) the migration's journal entry, synced, as its `step`.
async fn write_journal(
    op: &mut OpCtx,
    entry: &LiveMigrationEntry,
    step: &'static str,
) -> Result<(), InstanceError> {
    op.deps
        .migrations
        .begin(entry)
        .await
        .map_err(|source| InstanceError::Journal { step, source })
}

/// Drop the migration's journal entry. A failure only leaves the entry behind: the next
/// start finds the domain without a migration in flight (and drops it), or hands over a
/// guest the destination already took (it says so) and cleans up again — the disks only as
/// the entry says the migration copied them.
async fn end_journal(op: &mut OpCtx) {
    if let Err(error) = op.deps.migrations.end(op.uuid).await {
        warn!(instance = %op.uuid, error = %crate::instance::actor::error_chain(&error), "live-migration journal entry not removed");
    }
}

/// The destination takes over the guest that runs there now (its post-live-migration).
/// Nothing can roll back any more, so a destination that cannot answer — its host is
/// restarting (hosts of one process; under Nova its compute manager asks the destination
/// itself); its recovery adopts the arrived guest — is asked again every
/// [`HANDOVER_RETRY_EVERY`] for up to the policy's `handover_retry`; one not known yet (hosts
/// served by one process start one after the other) is waited for up to `peer_wait`.
async fn hand_over(
    op: &mut OpCtx,
    migration: &Migration,
    peer_wait: std::time::Duration,
) -> Result<InstanceReply, InstanceError> {
    op.phase("destination takes over");
    let start = tokio::time::Instant::now();
    let until = start + op.deps.config.migration.handover_retry;
    loop {
        let post = op
            .peer(
                &migration.dest_host,
                "post-live-migration",
                Operation::PostLiveMigrationAtDestination {
                    migration: migration.clone(),
                    caller: None,
                },
            )
            .await;
        match post {
            Err(e) if unknown_host(&e) && start.elapsed() < peer_wait => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) if unreachable(&e) && tokio::time::Instant::now() < until => {
                warn!(instance = %op.uuid, host = %migration.dest_host, error = %crate::instance::actor::error_chain(&e), "the destination cannot take the guest over yet; asking again");
                op.phase("destination takes over: its agent is unreachable, asking again");
                tokio::time::sleep(HANDOVER_RETRY_EVERY).await;
            }
            post => return post,
        }
    }
}

/// How often an unreachable destination is asked again to take a guest over.
const HANDOVER_RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The other host could not answer: it was stopping or is gone (not: it refused or failed).
fn unreachable(e: &InstanceError) -> bool {
    match e {
        InstanceError::Peer { source, .. } => unreachable(source),
        e => e.code() == "unavailable",
    }
}

/// The other host is not known (yet) to this one.
fn unknown_host(e: &InstanceError) -> bool {
    match e {
        InstanceError::Peer { source, .. } => unknown_host(source),
        e => matches!(e, InstanceError::UnknownHost(_)),
    }
}

/// Where a guest whose live migration failed is left on the source: running or paused as
/// libvirt says, otherwise in error.
async fn state_after_failed_migration(op: &mut OpCtx, from: InstanceState) -> InstanceState {
    let state = settle_state(op, from).await;
    if matches!(state, InstanceState::Running | InstanceState::Paused) {
        state
    } else {
        InstanceState::Error
    }
}

/// The source after the guest left (best effort: the guest is the destination's now): its
/// devices, its port bindings here, its domain definition, its disks when the migration
/// copied them (`copied`), the migration's probe.
async fn clean_up_departed(op: &mut OpCtx, record: &InstanceRecord, copied: bool, probe: &str) {
    op.phase("clean up the source");
    let _ = op.unplug_all(record).await;
    let net = op.deps.network.clone();
    let host = op.deps.host.clone();
    for vif in &record.network_info.vifs {
        let _ = op
            .net("delete source binding", net.delete_binding(vif.id, &host))
            .await;
    }
    drop_departed(op, copied).await;
    op.deps.storage.remove_probe(probe).await;
}

/// The source after the guest left: the domain definition goes, and the disks when the
/// migration copied them (`copied`); the instance is forgotten by the event actor.
async fn drop_departed(op: &mut OpCtx, copied: bool) {
    let _ = op.undefine_domain().await;
    if copied {
        let storage = op.deps.storage.clone();
        let _ = op
            .store("remove the source's disks", storage.remove(op.uuid))
            .await;
    }
    op.deps.events.forget(op.uuid);
}

/// Migrate the guest to `uri` while reading the job's progress every `poll` (shown as the
/// operation's phase); past the completion timeout for a guest of `memory_mb` the job is
/// aborted, and the migration fails with [`InstanceError::MigrationAborted`] (the caller
/// rolls back). The migration call and the progress reads run on separate libvirt workers.
async fn migrate_watched(
    op: &mut OpCtx,
    uri: String,
    memory_mb: u64,
    block: Option<BlockMigration>,
) -> Result<(), InstanceError> {
    let policy = op.deps.config.migration.clone();
    let mut flags = virt::sys::VIR_MIGRATE_LIVE
        | virt::sys::VIR_MIGRATE_PERSIST_DEST
        | virt::sys::VIR_MIGRATE_UNDEFINE_SOURCE;
    if policy.auto_converge {
        flags |= virt::sys::VIR_MIGRATE_AUTO_CONVERGE;
    }
    let mut params = crate::libvirt::MigrateParameters {
        bandwidth: policy.bandwidth_mib,
        ..Default::default()
    };
    if let Some(b) = block {
        if !b.copy.is_empty() {
            flags |= virt::sys::VIR_MIGRATE_NON_SHARED_INC;
            params.migrate_disks = b.copy;
        }
        if b.proven_shared {
            flags |= virt::sys::VIR_MIGRATE_UNSAFE;
        }
        params.dest_xml = b.dest_xml;
    }
    let limit = policy.completion_timeout(memory_mb);
    let lv = op.deps.libvirt.clone();
    let uuid = op.uuid;
    let start = std::time::Instant::now();
    let mut aborted = false;
    let result = {
        let migrate = lv.migrate(uuid, uri, flags, params);
        tokio::pin!(migrate);
        let mut tick = tokio::time::interval(policy.poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                r = &mut migrate => break r,
                _ = tick.tick() => {
                    if let Ok(p) = lv.job_progress(uuid).await {
                        op.phase(&progress_phase(&p));
                    }
                    if let (false, Some(l)) = (aborted, limit) {
                        if start.elapsed() >= l {
                            warn!(instance = %uuid, limit = ?l, "live migration past its completion timeout: aborting");
                            aborted = true;
                            if let Err(e) = lv.abort_job(uuid).await {
                                warn!(instance = %uuid, error = %e, "aborting the migration job failed");
                            }
                        }
                    }
                }
            }
        }
    };
    op.step(
        "migrate".to_owned(),
        crate::instance::types::StepKind::Libvirt,
        start,
        result.is_err(),
    );
    if let (Err(crate::libvirt::LibvirtError::Timeout { .. }), false) = (&result, aborted) {
        // The call gave up; libvirt's job did not: it is aborted (the guest may have moved
        // already, which the caller finds out).
        warn!(instance = %uuid, "the migration call timed out: aborting its job");
        if let Err(e) = lv.abort_job(uuid).await {
            warn!(instance = %uuid, error = %e, "aborting the migration job failed");
        }
    }
    match result {
        Ok(()) => Ok(()),
        Err(source) if aborted => Err(InstanceError::MigrationAborted {
            after: start.elapsed(),
            limit: limit.unwrap_or_default(),
            source,
        }),
        Err(source) => Err(InstanceError::Libvirt {
            step: "migrate",
            source,
        }),
    }
}

/// How the disks move with the guest.
struct BlockMigration {
    /// The guest devices the migration copies (none on a shared instances directory).
    copy: Vec<String>,
    /// The domain as the destination defines it, when its disks are at other paths there.
    dest_xml: Option<String>,
    /// The disks stay where they are, on a directory the destination proved it sees (the
    /// probe) and without a host page cache (`cache='none'`): libvirt's own check, which
    /// knows shared storage only by file-system type (NFS, Ceph, GlusterFS, ...), is
    /// overruled (`VIR_MIGRATE_UNSAFE`). With any other cache mode libvirt decides.
    proven_shared: bool,
}

impl BlockMigration {
    /// Nothing copied, the domain as it is here.
    fn none() -> BlockMigration {
        BlockMigration {
            copy: Vec::new(),
            dest_xml: None,
            proven_shared: false,
        }
    }
}

/// `edits` (interfaces replaced) with each new interface at the guest address (PCI slot)
/// the one it replaces has in `xml`: the guest keeps its devices where they were, which
/// libvirt's check of the destination's domain against the running one requires.
fn keeping_guest_addresses(xml: &str, edits: Vec<Edit>) -> Result<Vec<Edit>, vireo_xml::XmlError> {
    let domain = vireo_xml::Domain::from_xml(xml)?;
    Ok(edits
        .into_iter()
        .map(|edit| match edit {
            Edit::ReplaceInterface(Selector::Mac(mac), mut iface) => {
                if iface.address.is_none() {
                    iface.address = domain.interface_by_mac(&mac).and_then(|old| old.address);
                }
                Edit::ReplaceInterface(Selector::Mac(mac), iface)
            }
            other => other,
        })
        .collect())
}

/// The interfaces of a live migration's destination XML that differ from this host's:
/// each VIF of `dest` (the ports as bound to the destination) whose device (`device`)
/// is not the one its binding here gives replaces that interface (found by MAC). VIFs
/// unknown here, and devices that are not interfaces on both sides, are left as they are.
fn dest_interface_edits(
    here: &NetworkInfo,
    dest: &NetworkInfo,
    device: impl Fn(&Vif) -> Result<DeviceConfig, InstanceError>,
) -> Result<Vec<Edit>, InstanceError> {
    let mut edits = Vec::new();
    for there in &dest.vifs {
        let Some(mine) = here.vifs.iter().find(|v| v.id == there.id) else {
            continue;
        };
        if let (DeviceConfig::Interface(a), DeviceConfig::Interface(b)) =
            (device(mine)?, device(there)?)
        {
            if a != b {
                edits.push(Edit::ReplaceInterface(Selector::Mac(mine.address), b));
            }
        }
    }
    Ok(edits)
}

/// The block part of a live migration from what the destination `prepared`: without a
/// shared directory every disk but the read-only config drive (the destination copied that
/// one already) is copied — the root disk's overlay only, the destination has the base —
/// and the destination's XML names the destination's files.
async fn block_migration(
    op: &mut OpCtx,
    dest: &str,
    record: &InstanceRecord,
    prepared: &IncomingDisks,
) -> Result<BlockMigration, InstanceError> {
    let here = &record.storage.disks;
    let there = &prepared.disks;
    if there.len() != here.len() || here.iter().zip(there).any(|(a, b)| a.role != b.role) {
        return Err(InvalidOperation::DisksNotPrepared {
            host: dest.to_owned(),
        }
        .into());
    }
    let targets = disk_targets(here);
    let copy = if prepared.shared_instance_path {
        Vec::new()
    } else {
        targets
            .iter()
            .zip(here)
            .filter(|(_, d)| d.role != DiskRole::ConfigDrive)
            .map(|(t, _)| t.clone())
            .collect()
    };
    let edits: Vec<Edit> = targets
        .iter()
        .zip(here.iter().zip(there))
        .filter(|(_, (a, b))| a.path != b.path)
        .map(|(t, (_, b))| Edit::SetDiskFile {
            target: t.clone(),
            file: b.path.display().to_string(),
        })
        .collect();
    let dest_xml = if edits.is_empty() {
        None
    } else {
        let lv = op.deps.libvirt.clone();
        let xml = op.lv("migratable xml", lv.migratable_xml(op.uuid)).await?;
        Some(rewrite(&xml, &edits).map_err(|source| InstanceError::DestinationXml { source })?)
    };
    let proven_shared = prepared.shared_instance_path
        && here
            .iter()
            .all(|d| d.role == DiskRole::ConfigDrive || d.cache == Some(CacheMode::None));
    Ok(BlockMigration {
        copy,
        dest_xml,
        proven_shared,
    })
}

/// The operation's phase while a migration job runs: how much is left.
fn progress_phase(p: &crate::libvirt::JobProgress) -> String {
    let mib = |b: Option<u64>| {
        b.map(|b| (b >> 20).to_string())
            .unwrap_or_else(|| "?".into())
    };
    let mut s = format!(
        "migrate: {} of {} MiB left (memory {} of {} MiB",
        mib(p.data_remaining),
        mib(p.data_total),
        mib(p.mem_remaining),
        mib(p.mem_total)
    );
    if p.disk_total.is_some_and(|t| t > 0) {
        s.push_str(&format!(
            ", disks {} of {} MiB",
            mib(p.disk_remaining),
            mib(p.disk_total)
        ));
    }
    s.push(')');
    s
}

/// Roll a failed live migration back from the source. The network part (clear
/// `migrating_to`, delete the destination's inactive bindings) runs here always — shared
/// storage or not — because the destination's clean-up may not run; then the destination
/// removes its devices and any incoming domain.
pub(super) async fn rollback_live_migration(
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
                Operation::RollbackLiveMigrationAtDestination {
                    handover: Box::new(h.clone()),
                    do_cleanup,
                    destroy_disks,
                    migration_id: Some(migration.id),
                    caller: None,
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
    let change = match dest {
        Some(_) => EventOp::UpdateBindingProfile,
        None => EventOp::ClearBindingProfile,
    };
    let prediction = predicted(op, &change, &changing)?;
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

/// A failed pre-live-migration: the instance goes, and with it what the event actor was
/// told to track of it (its buffer included).
fn incoming_failed(op: &OpCtx, e: InstanceError) -> Finished {
    op.deps.events.forget(op.uuid);
    Finished::err(InstanceState::Gone, None, e)
}

/// Destination: pre-wire the devices so the guest has its network the moment it arrives.
pub(crate) async fn pre_live_migration(
    op: &mut OpCtx,
    migration: Migration,
    h: Handover,
    caller: Option<Box<CallerTask>>,
) -> Finished {
    let mut record = match record_from_handover(op, &h) {
        Ok(r) => r,
        Err(e) => return Finished::err(InstanceState::Gone, None, e),
    };
    record.state = InstanceState::Incoming;
    op.deps.events.track(op.uuid);
    op.use_record(&record);
    // QEMU opens the serial log of the incoming domain here: its directory must exist (on a
    // shared instance directory it does already).
    if let Err(e) = record.prepare_console_log_dir(&op.deps.config.domain) {
        return incoming_failed(op, InstanceError::Record(e));
    }
    // The disks: where the source's probe is, or where the caller's probe showed the
    // directory shared, this host uses the source's directory (at the same path, Nova's
    // assumption) and its disks must be there; otherwise the migration will copy into disks
    // made here.
    let storage = op.deps.storage.clone();
    let shared = caller.as_ref().is_some_and(|c| c.shared_instance_path)
        || storage.sees_probe(&migration_probe(migration.id)).await;
    if shared && !record.storage.disks.is_empty() && !storage.holds_disks(op.uuid).await {
        let refused = InvalidOperation::SharedDisksMissing {
            host: op.deps.host.clone(),
        };
        return incoming_failed(op, refused.into());
    }
    let made_disks = !shared && !record.storage.disks.is_empty();
    if made_disks {
        if storage.holds_disks(op.uuid).await {
            let refused = InvalidOperation::DisksAlreadyHere {
                host: op.deps.host.clone(),
            };
            return incoming_failed(op, refused.into());
        }
        op.phase("prepare disks");
        let source_uri = caller.as_ref().and_then(|c| c.source_uri.clone());
        let image_token = caller.as_ref().and_then(|c| c.image_token.clone());
        let prepared = async {
            let source = &migration.source_host;
            let uri = match source_uri {
                Some(uri) => uri,
                None => op.deps.peers.get(source)?.migration_uri().ok_or_else(|| {
                    InstanceError::from(InvalidOperation::NoDiskCopyFrom {
                        host: source.clone(),
                    })
                })?,
            };
            op.store(
                "prepare disks",
                storage.prepare_incoming(
                    op.uuid,
                    &uri,
                    &record.storage.disks,
                    record.storage.image.as_ref(),
                    image_token,
                ),
            )
            .await
        }
        .await;
        match prepared {
            Ok(disks) => record.storage.disks = disks,
            Err(e) => return incoming_failed(op, e),
        }
        op.use_record(&record);
    }
    op.report.incoming = Some(IncomingDisks {
        shared_instance_path: shared,
        disks: record.storage.disks.clone(),
    });
    op.phase("plug");
    match op.plug_all(&record).await {
        Ok(()) => Finished::ok(InstanceState::Incoming, Some(record)),
        Err(e) => {
            let _ = op.unplug_all(&record).await;
            if made_disks {
                let _ = op.store("remove disks", storage.remove(op.uuid)).await;
            }
            incoming_failed(op, e)
        }
    }
}

/// Destination: the guest arrived; activate the bindings here and await the events.
pub(crate) async fn post_live_migration(
    op: &mut OpCtx,
    record: InstanceRecord,
    migration: Migration,
    caller: Option<Box<CallerTask>>,
) -> Finished {
    // Saved with the guest's state: a source that asks again (this host's answer was lost
    // with its agent) is told the hand-over is done (see the actor's admission).
    let mut record = record;
    record.arrived_by = Some(migration.id);
    if !record.storage.disks.is_empty() {
        // The disks as the arrived domain uses them (a guest adopted while it was still
        // arriving has the source's names for them until now).
        let lv = op.deps.libvirt.clone();
        let xml = match op
            .lv("read the arrived domain", lv.xml_desc(op.uuid, false))
            .await
        {
            Ok(xml) => xml,
            Err(e) => return Finished::err(InstanceState::Incoming, Some(record), e),
        };
        if let Err(e) = record.disks_from(&xml) {
            return Finished::err(
                InstanceState::Incoming,
                Some(record),
                InstanceError::Record(e),
            );
        }
    }
    let source = migration.source_host;
    if caller.is_some() {
        return post_live_migration_for_caller(op, record).await;
    }
    let done = with_rollback(
        op,
        async |op| {
            let prediction = predicted(
                op,
                &EventOp::PostLiveMigration {
                    source,
                    dest: op.deps.host.clone(),
                },
                &record.network_info.vifs,
            )?;
            // The activation causes the events, so a port whose binding here is active
            // already sends none: this host activated it before its agent restarted (the
            // source asks again), and its events went to the agent that died. The waits are
            // registered after the activation, counting from before it.
            op.phase("activate bindings");
            let activating = tokio::time::Instant::now();
            let net = op.deps.network.clone();
            let host = op.deps.host.clone();
            let mut active_already = BTreeSet::new();
            for vif in &record.network_info.vifs {
                match op
                    .net("activate binding", net.activate_binding(vif.id, &host))
                    .await
                {
                    Ok(_) => {}
                    Err(InstanceError::Network {
                        source: NetworkError::BindingAlreadyActive { .. },
                        ..
                    }) => {
                        active_already.insert(vif.id);
                    }
                    Err(e) => return Err(e),
                }
            }
            let pol = op.deps.config.wait;
            let mut waits = Vec::new();
            for timing in [Timing::BindTime, Timing::PlugTime] {
                let caused: Vec<_> = prediction
                    .events(timing)
                    .into_iter()
                    .filter(|e| !active_already.contains(&e.tag))
                    .collect();
                waits.push(op.expect_since(timing, caused, pol, activating).await?);
            }
            op.phase("wait for events");
            for wait in waits {
                op.wait(wait).await?;
            }
            let state = match op.power().await? {
                PowerState::Paused => InstanceState::Paused,
                _ => InstanceState::Running,
            };
            let mut done = record.clone();
            done.state = state;
            op.save(&done, None).await?;
            Ok::<_, InstanceError>(state)
        },
        async |op, e| {
            let state = settle_state(op, InstanceState::Error).await;
            let state = if state == InstanceState::Error || !state.has_domain() {
                InstanceState::Error
            } else {
                state
            };
            // Not taken over: a source that asks again runs the hand-over again.
            let mut record = record.clone();
            record.arrived_by = None;
            Finished::err(state, Some(record), e)
        },
    )
    .await;
    match done {
        Ok(state) => Finished::ok(state, Some(record)),
        Err(rolled_back) => rolled_back,
    }
}

/// Destination: the migration failed; remove the pre-wired devices and any incoming domain.
/// Works from the source's handover even when this host lost its own record.
pub(crate) async fn rollback_at_destination(
    op: &mut OpCtx,
    from: InstanceState,
    h: Handover,
    do_cleanup: bool,
    destroy_disks: bool,
    migration_id: Option<uuid::Uuid>,
) -> Finished {
    let record = match record_from_handover(op, &h) {
        Ok(r) => r,
        Err(e) => return Finished::err(InstanceState::Error, None, e),
    };
    op.use_record(&record);
    // The incoming domain definition is always removed (when it exists and is not the
    // running guest). `do_cleanup` (true only when the caller found the instances directory
    // not shared): the console log's directory pre-live-migration made goes, if it is still
    // empty (a flag that is wrong about sharing must never cost the source its log).
    // `destroy_disks`: the disks pre-live-migration made here go — unless this host sees
    // the migration's probe (the directory is the source's, whatever the caller thought),
    // or the caller did not name the migration (then it cannot be checked).
    let storage = op.deps.storage.clone();
    let remove_disks = match migration_id {
        Some(id) if destroy_disks => !storage.sees_probe(&migration_probe(id)).await,
        Some(_) => false,
        None => {
            if destroy_disks {
                warn!(instance = %op.uuid, "rollback without the migration's id: disks kept");
            }
            false
        }
    };
    // An incoming guest stays paused until the switch-over: one running here arrived (the
    // source's migrate call failed after it moved, say). Destroying it lost the guest on
    // both hosts; it stays, for the source's hand-over.
    let power = op.power().await;
    if let Err(e) = power {
        // Not knowing whether the guest runs here, nothing is destroyed.
        return Finished::err(from, Some(record), e);
    }
    if power.is_ok_and(|p| p == PowerState::Running) {
        warn!(instance = %op.uuid, "rollback of a live migration whose guest runs here: refused");
        // Held as the incoming guest (also when this host had lost its record).
        let state = if from == InstanceState::Absent {
            InstanceState::Incoming
        } else {
            from
        };
        return Finished::err(
            state,
            Some(record),
            InvalidOperation::GuestArrived {
                host: op.deps.host.clone(),
            }
            .into(),
        );
    }
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
    if remove_disks && errors.is_empty() {
        if let Err(e) = op.store("remove disks", storage.remove(op.uuid)).await {
            errors.push(e);
        }
    }
    if do_cleanup && errors.is_empty() {
        record.remove_empty_console_log_dir(&op.deps.config.domain);
    }
    op.deps.events.forget(op.uuid);
    if errors.is_empty() {
        Finished::ok(InstanceState::Gone, None)
    } else {
        Finished::err(InstanceState::Error, Some(record), errors.remove(0))
    }
}

/// Source side of a live migration Nova runs: Nova created the destination's bindings, had
/// the destination pre-wired (its pre-live-migration, with this host's disks copied into
/// its own at the same paths) and owns `migrating_to`; this host migrates the guest to
/// `caller.dest_uri` and cleans up after itself. A failure rolls back only this host's
/// part (the guest keeps running here); Nova rolls back the network and the destination.
async fn live_migrate_for_caller(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
    migration: Migration,
    caller: CallerTask,
) -> Finished {
    let has_disks = !record.storage.disks.is_empty();
    // On a shared instances directory (the caller's probe) the disks stay where they are:
    // none is copied, and the clean-up after the departure keeps them.
    let shared = caller.shared_instance_path;
    let copies = has_disks && !shared;
    let in_flight = op.in_flight(
        "migrate",
        InFlight::LiveMigrate(MigrationStep {
            migration: migration.clone(),
            by_caller: true,
        }),
    );
    // The migration call was made (see live_migrate).
    let called = std::sync::atomic::AtomicBool::new(false);
    let migrated = with_rollback(
        op,
        async |op| {
            op.save(&record, Some(in_flight.clone())).await?;
            // Journaled as vireo's own flow does: a source stopped until the guest has left
            // finds no domain at its next start, only this entry, and cleans up after it.
            // Whether the disks are copied (see below) is journaled with it.
            journal_migration(op, &record, in_flight, Some(copies)).await?;
            let uri = caller.dest_uri.clone().ok_or_else(|| {
                InstanceError::from(InvalidOperation::NoLiveMigrationTo {
                    host: migration.dest_host.clone(),
                })
            })?;
            // The destination made its disks at this host's paths (Nova's assumption of one
            // instances path on every host) and was refused if it saw them there already:
            // every disk is copied. On a shared directory it uses these very files.
            let prepared = IncomingDisks {
                shared_instance_path: shared,
                disks: record.storage.disks.clone(),
            };
            let mut block = if has_disks {
                Some(block_migration(op, &migration.dest_host, &record, &prepared).await?)
            } else {
                None
            };
            if let Some(dest) = &caller.dest_network_info {
                let dest = NetworkInfo::from_value(dest)
                    .map_err(InvalidOperation::DestinationNetworkInfo)?;
                let edits = dest_interface_edits(&record.network_info, &dest, |v| {
                    op.device(v, op.form(v))
                })?;
                if !edits.is_empty() {
                    let block = block.get_or_insert_with(BlockMigration::none);
                    let xml = match block.dest_xml.take() {
                        Some(xml) => xml,
                        None => {
                            let lv = op.deps.libvirt.clone();
                            op.lv("migratable xml", lv.migratable_xml(op.uuid)).await?
                        }
                    };
                    block.dest_xml = Some(
                        keeping_guest_addresses(&xml, edits)
                            .and_then(|edits| rewrite(&xml, &edits))
                            .map_err(|source| InstanceError::DestinationXml { source })?,
                    );
                }
            }
            op.phase("migrate");
            called.store(true, std::sync::atomic::Ordering::Relaxed);
            migrate_watched(op, uri, record.flavor.memory_mb, block).await?;
            Ok::<_, InstanceError>(())
        },
        async |op, cause| {
            if called.load(std::sync::atomic::Ordering::Relaxed) {
                // As in vireo's own flow: a failed call may have moved the guest. Then the
                // migration succeeded (Nova's post-live-migration takes the guest at the
                // destination) and this host cleans up; Nova's rollback would have had the
                // destination destroy it. A domain left shut off here is not taken for a
                // departure: nobody here can ask the destination (Nova rolls back as before).
                op.phase("the migration job after its call failed");
                let state = let_migration_end(op, from == InstanceState::Paused).await;
                if let Ok(PowerState::NoDomain) = state {
                    warn!(instance = %op.uuid, error = %cause,
                        "the live migration's call failed, but the guest left");
                    return departed_for_caller(op, &record, copies).await;
                }
            }
            warn!(instance = %op.uuid, error = %cause, "live migration failed; Nova rolls back the network and the destination");
            let state = state_after_failed_migration(op, from).await;
            let _ = op.save(&record, None).await;
            end_journal(op).await;
            Finished::rolled_back(Request::LiveMigrate, state, Some(record.clone()), cause, Ok(()))
        },
    )
    .await;
    match migrated {
        Ok(()) => {
            // The guest runs on the destination: this host's devices and disks go (libvirt
            // undefined the domain); Nova deletes the source's bindings.
            departed_for_caller(op, &record, copies).await
        }
        Err(rolled_back) => rolled_back,
    }
}

/// The source of a live migration Nova runs, after the guest left: this host's devices, its
/// domain definition and its disks (`copied`: the migration copied them) go, and the
/// journal entry (best effort: the guest is the destination's now). Nova deletes the
/// source's bindings.
async fn departed_for_caller(op: &mut OpCtx, record: &InstanceRecord, copied: bool) -> Finished {
    op.phase("clean up the source");
    let _ = op.unplug_all(record).await;
    drop_departed(op, copied).await;
    end_journal(op).await;
    Finished::ok(InstanceState::Gone, None)
}

/// Recovery of a live migration Nova ran from here, interrupted by an agent stop: the
/// migration job libvirt may still run is let end (see [`let_migration_end`]); a guest that
/// left is cleaned up after as a finished migration's source ([`departed_for_caller`]), one
/// that stayed keeps running here. No other host is asked anything: Nova's driver, which
/// waited for this agent to come back, reads the outcome and has Nova post or roll back
/// the migration (the destination's part included). Returns whether the guest left.
pub(crate) async fn recover_live_migration_for_caller(
    op: &mut OpCtx,
    record: &InstanceRecord,
    was_paused: bool,
) -> Result<bool, String> {
    op.phase("recover: the migration job");
    let state = let_migration_end(op, was_paused).await;
    let copied = journaled_copied_disks(op).await;
    match state {
        Ok(PowerState::NoDomain) => {
            info!(instance = %op.uuid, "the guest left during the interrupted live migration: cleaning up after it");
            departed_for_caller(op, record, copied).await;
            Ok(true)
        }
        Ok(_) => {
            end_journal(op).await;
            Ok(false)
        }
        Err(e) => Err(format!(
            "the domain could not be read; the migration is left as it is: {}",
            crate::instance::actor::error_chain(&e)
        )),
    }
}

/// Destination of a live migration Nova runs, after the guest arrived: Nova activated the
/// bindings here before it called, and the events of that activation went to the source's
/// nova-compute (the instance's host until now), so none is awaited here — as Nova's own
/// libvirt driver awaits none. The record takes the guest's state.
async fn post_live_migration_for_caller(op: &mut OpCtx, record: InstanceRecord) -> Finished {
    let state = match op.power().await {
        Ok(PowerState::Paused) => InstanceState::Paused,
        Ok(_) => InstanceState::Running,
        Err(e) => return Finished::err(InstanceState::Error, Some(record), e),
    };
    let mut done = record;
    done.state = state;
    match op.save(&done, None).await {
        Ok(()) => Finished::ok(state, Some(done)),
        Err(e) => Finished::err(InstanceState::Error, Some(done), e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plug::DomainForm;
    use crate::vif_config::{interface_for, InterfaceOptions};

    fn vif(port: &str, hybrid: bool) -> serde_json::Value {
        serde_json::json!({
            "id": port, "address": "fa:16:3e:00:00:01", "type": "ovs", "vnic_type": "normal",
            "details": {"ovs_hybrid_plug": hybrid, "port_filter": true},
            "devname": format!("tap{}", &port[..11]),
            "network": {"id": "be4c0000-0000-4000-8000-000000000001", "bridge": "br-int",
                        "subnets": [], "meta": {"mtu": 1450}},
        })
    }

    fn info(vifs: Vec<serde_json::Value>) -> NetworkInfo {
        NetworkInfo::from_value(&serde_json::Value::Array(vifs)).unwrap()
    }

    fn device(v: &Vif) -> Result<DeviceConfig, InstanceError> {
        interface_for(v, DomainForm::LibvirtManaged, &InterfaceOptions::default())
            .map_err(InstanceError::VifConfig)
    }

    const PORT: &str = "5c0b9f2e-1111-4222-8333-944455556666";
    const OTHER: &str = "5c0b9f2e-1111-4222-8333-944455557777";

    #[test]
    fn a_destination_bound_otherwise_gets_the_interface_its_binding_calls_for() {
        // Hybrid plug here, native OVS there: the interface on the qbr bridge becomes one on
        // br-int with an Open vSwitch virtual port, found by its MAC.
        let here = info(vec![vif(PORT, true)]);
        let edits = dest_interface_edits(&here, &info(vec![vif(PORT, false)]), device).unwrap();
        let [Edit::ReplaceInterface(Selector::Mac(mac), iface)] = edits.as_slice() else {
            panic!("{edits:?}");
        };
        assert_eq!(*mac, here.vifs[0].address);
        let xml = iface.to_xml().unwrap();
        assert!(
            xml.contains("openvswitch") && xml.contains("br-int"),
            "{xml}"
        );
        assert!(!xml.contains("qbr"), "{xml}");
        // The running domain's interface, at the PCI slot libvirt gave it.
        let slot = "<address type='pci' domain='0x0000' bus='0x00' slot='0x07' function='0x0'/>";
        let domain = format!(
            "<domain type='kvm'><name>x</name><memory unit='KiB'>131072</memory><vcpu>1</vcpu>\
             <os><type arch='x86_64'>hvm</type></os><devices>{}</devices></domain>",
            match device(&here.vifs[0]).unwrap() {
                DeviceConfig::Interface(i) => i
                    .to_xml()
                    .unwrap()
                    .replace("</interface>", &format!("{slot}</interface>")),
                DeviceConfig::Hostdev(_) => unreachable!(),
            }
        );
        let edits = keeping_guest_addresses(&domain, edits).unwrap();
        let moved = rewrite(&domain, &edits).unwrap();
        assert!(
            moved.contains("openvswitch") && !moved.contains("qbr"),
            "{moved}"
        );
        // The guest keeps the device where it was.
        let mac = &here.vifs[0].address;
        let before = vireo_xml::Domain::from_xml(&domain).unwrap();
        let after = vireo_xml::Domain::from_xml(&moved).unwrap();
        let old = before.interface_by_mac(mac).unwrap();
        assert!(old.address.is_some(), "{domain}");
        assert_eq!(
            after.interface_by_mac(mac).unwrap().address,
            old.address,
            "{moved}"
        );
    }

    #[test]
    fn a_destination_bound_alike_or_to_other_ports_changes_nothing() {
        let here = info(vec![vif(PORT, true)]);
        let same = dest_interface_edits(&here, &info(vec![vif(PORT, true)]), device).unwrap();
        assert!(same.is_empty(), "{same:?}");
        let unknown = dest_interface_edits(&here, &info(vec![vif(OTHER, false)]), device).unwrap();
        assert!(unknown.is_empty(), "{unknown:?}");
    }
}
