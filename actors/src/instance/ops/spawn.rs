//! Spawn and destroy: what makes an instance exist on this host and what removes it.
//!
//! Why one module: the build's rollback *is* a destroy (domain, devices, definition, then
//! the networking released), and the reschedule clean-up is a destroy that releases the
//! networking; keeping them together keeps the order of those steps in one place. The
//! only in-flight marker here is [`InFlight::Spawn`], written with the first definition
//! (recovery rolls an interrupted build back); destroy writes none (it is idempotent and
//! simply runs again).

use tracing::warn;
use uuid::Uuid;

use crate::lifecycle::{InstanceState, Request};
use crate::network::{BindingStatus, NetworkError, PortRequest, PortUpdate, MIGRATING_TO};
use crate::predict::EventOp;
use crate::vif::NetworkInfo;

use crate::instance::in_flight::InFlight;
use crate::instance::journal::BuildEntry;
use crate::instance::op::OpCtx;
use crate::instance::record::StorageRecord;
use crate::instance::record::{InstanceRecord, ResizeRole};
use crate::instance::types::{
    DestroyArgs, InstanceError, NetworkRequest, Released, SpawnArgs, SpawnStorage,
};
use crate::storage::{config_drive_files, DiskPlan, StorageError};

use super::{
    boot_predicted, predicted, refresh_active, running_or_stopped, with_rollback, Finished,
};

/// Build the instance: network (allocate or take the caller's), define, register the
/// predicted waits, plug, start paused, await, resume. Any failure: destroy, unplug,
/// undefine, release the networking, then report a build failure that may be rescheduled.
pub(crate) async fn spawn(op: &mut OpCtx, args: SpawnArgs) -> Finished {
    let SpawnArgs {
        name,
        flavor,
        boot,
        storage,
        network,
        power_on,
    } = args;
    op.phase("network");
    // Known to the network-event actor from the start: an event that comes from here on
    // (a port going ACTIVE while its status is read below) is kept for the waits
    // registered later, not dropped as one for an unknown instance.
    op.deps.events.track(op.uuid);
    let host = op.deps.host.clone();
    // Every build is journaled before its first port (or, given its networking, before its
    // first disk) exists, until it ends: an agent that dies in between releases the ports
    // it allocated and removes the disks it made at its next start (see journal.rs).
    let build = Uuid::new_v4();
    let entry = BuildEntry {
        instance: op.uuid,
        host: host.clone(),
        user_ports: match &network {
            NetworkRequest::Allocate(requests) => requests
                .iter()
                .filter_map(|r| match r {
                    PortRequest::Port { port_id } => Some(port_id.0),
                    PortRequest::Network { .. } => None,
                })
                .collect(),
            NetworkRequest::Allocated(_) => Vec::new(),
        },
        allocated: matches!(network, NetworkRequest::Allocate(_)),
        build: Some(build),
    };
    let allocated = entry.allocated;
    if let Err(source) = op.deps.builds.begin(&entry).await {
        let cause = InstanceError::Journal {
            step: "begin",
            source,
        };
        return failed_before_allocation(op, cause);
    }
    let network_info = match network {
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
                    end_journal(op).await;
                    return failed_before_allocation(op, cause);
                }
            }
        }
        NetworkRequest::Allocated(ni) => ni,
    };
    let SpawnStorage {
        image,
        image_token,
        config_drive,
    } = storage;
    let record = InstanceRecord {
        uuid: op.uuid,
        name,
        flavor,
        boot,
        storage: StorageRecord {
            image,
            config_drive,
            disks: Vec::new(),
        },
        network_info,
        state: InstanceState::Building,
        resize: None,
        arrived_by: None,
    };
    op.use_record(&record);
    let mut unreleased = false;
    let done = with_rollback(
        op,
        async |op| {
            // The caller's network_info may be older than the ports: a port that is ACTIVE on
            // this host already has no transition left to report. Read after the operation
            // began, so an event that makes it ACTIVE from here on is kept for the wait.
            let mut network_info = record.network_info.clone();
            refresh_active(op, &mut network_info).await?;
            let mut record = record.clone();
            record.network_info = network_info.clone();
            let state = spawn_steps(op, &mut record, build, image_token.clone(), power_on).await?;
            Ok((state, record))
        },
        // The record as it was before the refresh: the ports the build was given.
        async |op, cause| {
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
            if let Err(e) = remove_disks(op).await {
                leftovers.push(format!("remove disks: {e}"));
            }
            let released = release_network(op, &record.network_info).await;
            // What another host would refuse the same way is not rescheduled.
            let reschedule = !matches!(
                cause,
                InstanceError::Invalid(_)
                    | InstanceError::Predict(_)
                    | InstanceError::VifConfig(_)
                    | InstanceError::Record(_)
                    | InstanceError::Storage {
                        source: StorageError::ImageTooLarge { .. }
                            | StorageError::ImageBacking { .. }
                            | StorageError::ConfigDrive(_),
                        ..
                    }
            );
            let (released, release_err) = match released {
                Ok(r) => (r, None),
                Err(e) => (Released::default(), Some(e)),
            };
            op.report.released = Some(released.clone());
            op.deps.events.forget(op.uuid);
            if let Some(e) = release_err {
                leftovers.push(format!("release networking: {e}"));
                // The entry of a build that allocated its ports stays: a restart before
                // the caller destroys the instance releases them (or finds the domain, whose
                // recovery does). A caller that brought the ports releases them itself.
                unreleased = allocated;
            }
            if leftovers.is_empty() {
                // Everything removed: a build failure (maybe rescheduled), not RolledBack.
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
                    Some(record.clone()),
                    InstanceError::RollbackFailed {
                        request: Request::Spawn,
                        rollback: leftovers.join("; "),
                        cause: Box::new(cause),
                    },
                )
            }
        },
    )
    .await;
    // The domain holds the record now, or the rollback released everything — or it could
    // not release the networking, and the entry stays until a destroy does (or a restart).
    if !unreleased {
        end_journal(op).await;
    }
    match done {
        Ok((state, record)) => Finished::ok(state, Some(record)),
        Err(rolled_back) => rolled_back,
    }
}

/// A build that failed with nothing of it left (no port, no disk, no domain): another host
/// may try.
fn failed_before_allocation(op: &mut OpCtx, cause: InstanceError) -> Finished {
    op.deps.events.forget(op.uuid);
    Finished::err(
        InstanceState::Gone,
        None,
        InstanceError::BuildFailed {
            reschedule: true,
            released: Released::default(),
            cause: Box::new(cause),
        },
    )
}

/// Drop the build's journal entry. A failure only leaves the entry behind: the next
/// recovery finds the domain (and drops it) or releases what is left, which is nothing.
pub(crate) async fn end_journal(op: &mut OpCtx) {
    if let Err(error) = op.deps.builds.end(op.uuid).await {
        warn!(instance = %op.uuid, error = %crate::instance::actor::error_chain(&error), "build journal entry not removed");
    }
}

/// Make the disks, define (in flight: spawn), then boot as every start does. The prediction
/// comes first: a VIF the model refuses fails the build before anything exists. The disks
/// are made before the first definition, which names them; the rollback removes them.
async fn spawn_steps(
    op: &mut OpCtx,
    record: &mut InstanceRecord,
    build: Uuid,
    image_token: Option<String>,
    power_on: bool,
) -> Result<InstanceState, InstanceError> {
    let prediction = predicted(op, &EventOp::Spawn, &record.network_info.vifs)?;
    op.phase("disks");
    let mut plan = DiskPlan::new(record.uuid, &record.flavor, record.storage.image.clone());
    plan.image_token = image_token;
    plan.build = Some(build);
    if let Some(drive) = &record.storage.config_drive {
        let files = config_drive_files(record.uuid, &record.name, drive, &record.network_info)
            .map_err(|e| InstanceError::Storage {
                step: "config drive",
                source: e.into(),
            })?;
        plan.config_drive = Some(files);
    }
    if !plan.is_empty() {
        let storage = op.deps.storage.clone();
        record.storage.disks = op.store("create disks", storage.create(&plan)).await?;
    }
    op.phase("define");
    let in_flight = op.in_flight("define", InFlight::Spawn);
    op.define(record, Some(in_flight)).await?;
    boot_predicted(op, record, &prediction, power_on).await?;
    let state = running_or_stopped(power_on);
    record.state = state;
    op.save(record, None).await?;
    Ok(state)
}

/// Remove the instance's disks and directory on this host.
async fn remove_disks(op: &mut OpCtx) -> Result<(), InstanceError> {
    let storage = op.deps.storage.clone();
    let uuid = op.uuid;
    op.store("remove disks", storage.remove(uuid)).await
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

/// Destroy the domain, unplug every VIF, undefine; optionally release networking (and, for
/// an instance in error — `failed_build`, perhaps a build whose rollback could not release
/// it — drop its build journal entry once released). Idempotent: whatever is already gone is
/// skipped.
pub(crate) async fn destroy(
    op: &mut OpCtx,
    record: Option<InstanceRecord>,
    args: DestroyArgs,
    failed_build: bool,
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
    // The disks go with the definition: nothing is left that could start them.
    if errors.is_empty() {
        if let Err(e) = remove_disks(op).await {
            errors.push(e);
        }
    }
    // A resize's source deleted before confirm or revert: the probe it wrote goes too.
    if let Some(r) = record.as_ref().filter(|r| {
        r.resize
            .as_ref()
            .is_some_and(|z| z.role == ResizeRole::Source)
    }) {
        super::resize::remove_probe(op, r).await;
    }
    if args.deallocate_network {
        if let Some(r) = &record {
            let released = match clear_migration_leftovers(op, &r.network_info).await {
                Ok(()) => release_network(op, &r.network_info).await,
                // Unbinding now would hide what is left: keep the ports for a retry.
                Err(e) => Err(e),
            };
            match released {
                Ok(released) => {
                    op.report.released = Some(released);
                    // A build whose rollback could not release its networking kept its
                    // journal entry (see spawn): released now.
                    if failed_build {
                        end_journal(op).await;
                    }
                }
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
