//! Interface hot-plug: attach and detach a port; plug and unplug the host side of every
//! VIF (Nova's `plug_vifs` and `unplug_vifs`).
//!
//! Why one module: both change one device of a running or stopped guest, through libvirt's
//! device API where the driver can change the persistent definition and by redefining where
//! it cannot (libvirt's test driver); [`detach`] is shared with recovery, which takes away
//! an interface whose attach or detach was interrupted. Owns the
//! [`InFlight::AttachInterface`] and [`InFlight::DetachInterface`] markers, written before
//! anything of the interface changes.

use crate::lifecycle::{InstanceState, Request};
use crate::predict::EventOp;
use crate::vif::{NetworkInfo, PortId, Vif};

use crate::instance::in_flight::{InFlight, InterfaceStep};
use crate::instance::op::OpCtx;
use crate::instance::record::InstanceRecord;
use crate::instance::types::{InstanceError, InvalidOperation};
use tracing::warn;

use super::{expect_predicted, predicted, refresh_active, with_rollback, Finished};

/// Plug the host side of every VIF again (vireo's plug makes what is missing and keeps
/// what is there), for a caller that restarted and does not know what survived.
pub(crate) async fn plug_vifs(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
) -> Finished {
    op.phase("plug");
    match op.plug_all(&record).await {
        Ok(()) => Finished::ok(from, Some(record)),
        Err(e) => Finished::err(from, Some(record), e),
    }
}

/// Remove the host side of every VIF; the guest and its definition stay. Each VIF is tried
/// whatever the one before did; the first failure is the answer.
pub(crate) async fn unplug_vifs(
    op: &mut OpCtx,
    record: InstanceRecord,
    from: InstanceState,
) -> Finished {
    op.phase("unplug");
    match op.unplug_all(&record).await {
        Ok(()) => Finished::ok(from, Some(record)),
        Err(e) => Finished::err(from, Some(record), e),
    }
}

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
            InvalidOperation::AlreadyAttached { port: vif.id }.into(),
        );
    }
    let mut vif = vif;
    vif.index = record.network_info.vifs.len();
    let mut with = record.clone();
    with.network_info.vifs.push(vif.clone());
    // Set once the device exists (the rollback detaches it then): read by the rollback.
    let attached = std::cell::Cell::new(false);
    let in_flight = op.in_flight(
        "plug",
        InFlight::AttachInterface(InterfaceStep {
            vif: vif.raw_value(),
            index: vif.index,
        }),
    );
    let done = with_rollback(
        op,
        async |op| {
            let mut single = NetworkInfo {
                vifs: vec![vif.clone()],
            };
            refresh_active(op, &mut single).await?;
            let prediction = predicted(op, &EventOp::AttachInterface, &single.vifs)?;
            let live = from != InstanceState::Stopped;
            let (bind, plug) = expect_predicted(op, &prediction).await?;
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
                    attached.set(true);
                    op.define(&with, Some(in_flight.clone())).await?;
                }
                Err(e) => return Err(e),
            }
            attached.set(true);
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
        },
        async |op, e| {
            if attached.get() {
                let _ = detach(op, &vif, from != InstanceState::Stopped, &record, None).await;
            }
            let form = op.form(&vif);
            let _ = op.unplug_as(&with, &vif, form).await;
            // Nothing of the interface is left: neither is its in-flight mark.
            let _ = op.save(&record, None).await;
            // Always RolledBack: the rollback's own failures are not reported (as before).
            Finished::rolled_back(
                Request::AttachInterface,
                from,
                Some(record.clone()),
                e,
                Ok(()),
            )
        },
    )
    .await;
    match done {
        Ok(()) => Finished::ok(from, Some(with)),
        Err(rolled_back) => rolled_back,
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
pub(super) async fn detach(
    op: &mut OpCtx,
    vif: &Vif,
    live: bool,
    without: &InstanceRecord,
    in_flight: Option<vireo_xml::metadata::InFlightOperation>,
) -> Result<(), InstanceError> {
    let lv = op.deps.libvirt.clone();
    let alias = format!("{}{}", crate::instance::op::ALIAS_PREFIX, vif.id);
    let affect = if live {
        crate::libvirt::Affect::LiveAndConfig
    } else {
        crate::libvirt::Affect::Config
    };
    // Subscribed before the request, so that a device-removed event that comes at once is
    // not missed.
    let mut removed = live.then(|| lv.events());
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
                        lv.detach_device_alias(
                            op.uuid,
                            alias.clone(),
                            crate::libvirt::Affect::Live,
                        ),
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
    if let Some(events) = removed.as_mut() {
        released(op, &alias, events).await?;
    }
    op.deps.plugger.devices_detached(&[vif.id]).await;
    Ok(())
}

/// Wait until the running guest released the device `alias` that was just detached (see
/// [`crate::instance::DetachPolicy`]): done when the device is no longer in the live
/// definition or libvirt's device-removed event for it came; otherwise the guest is asked
/// again, at most `attempts` times in all, then [`InstanceError::DeviceNotReleased`].
async fn released(
    op: &mut OpCtx,
    alias: &str,
    events: &mut crate::libvirt::EventStream,
) -> Result<(), InstanceError> {
    let lv = op.deps.libvirt.clone();
    let policy = op.deps.config.device_detach;
    let started = tokio::time::Instant::now();
    for attempt in 1..=policy.attempts.max(1) {
        if attempt > 1 {
            warn!(instance = %op.uuid, alias, attempt,
                  "the guest has not released the device: asking again");
            let r = op
                .lv(
                    "detach device (again)",
                    lv.detach_device_alias(op.uuid, alias.to_owned(), crate::libvirt::Affect::Live),
                )
                .await;
            if no_device(&r) {
                return Ok(());
            }
            r?;
        }
        if !still_attached(op, alias).await? {
            return Ok(());
        }
        op.phase(&format!(
            "wait for the guest to release {alias} ({attempt}/{})",
            policy.attempts.max(1)
        ));
        let deadline = tokio::time::Instant::now() + policy.timeout;
        loop {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(crate::libvirt::LibvirtEvent::DeviceRemoved { uuid, alias: a }))
                    if uuid == op.uuid && a == alias =>
                {
                    return Ok(());
                }
                Ok(Some(_)) => continue,
                // The event stream ended (the connection is gone): read the definition.
                Ok(None) | Err(_) => break,
            }
        }
    }
    if !still_attached(op, alias).await? {
        return Ok(());
    }
    Err(InstanceError::DeviceNotReleased {
        alias: alias.to_owned(),
        attempts: policy.attempts.max(1),
        waited: started.elapsed(),
    })
}

/// True while the running guest's live definition still has the device `alias`.
async fn still_attached(op: &mut OpCtx, alias: &str) -> Result<bool, InstanceError> {
    let lv = op.deps.libvirt.clone();
    op.lv(
        "read live devices",
        lv.has_live_device(op.uuid, alias.to_owned()),
    )
    .await
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
            InvalidOperation::NotAttached { port }.into(),
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
    // No event waits and no rollback (a failed detach leaves the interface attached and the
    // marker for recovery to finish it): a plain match, not [`with_rollback`].
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
