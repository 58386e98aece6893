//! A cross-host resize that Nova's compute manager runs half by half (the vireo driver under
//! nova-compute): the source hands the instance to its caller, the destination finishes it
//! from that handover, and the port bindings move between the halves as Nova moves them —
//! before the driver is called. On libvirt's test driver with the embedded network service.
//!
//! Seed bug 3 under Nova: a revert's binding move back to a source whose hybrid devices stayed
//! wired makes the service send `network-vif-plugged` before the source's operation starts.
//! The events of the caller's task count (`events_since_ms`, or the events it hands over);
//! without them the wait times out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod faults_support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use vireo::compute::{ComputeDriver, ComputeOps};
use vireo_actors::external::{EventName, EventStatus, ExternalEvent};
use vireo_actors::instance::{
    AdmissionError, CallerTask, DestroyArgs, Handover, InstanceError, Migration, Operation,
    PowerState, ResizeArgs, SpawnArgs, SpawnStorage,
};
use vireo_actors::lifecycle::InstanceState;
use vireo_actors::network::{NetworkApi, PortUpdate};
use vireo_actors::plug::VifPlugger;
use vireo_actors::predict::Timing;
use vireo_actors::storage::{ImageFormat, ImageId, ImageRef};
use vireo_actors::vif::PortId;

/// A spawn with a root disk from a small raw image in the cloud's directory.
fn image_args(c: &TestCloud, name: &str) -> SpawnArgs {
    let image = c.dir.path().join("img.raw");
    std::fs::write(&image, vec![0xabu8; 1 << 20]).unwrap();
    let mut args = spawn_args(name, vec![on(NET_HYBRID)]);
    args.flavor.root_gb = 1;
    args.storage = SpawnStorage {
        image: Some(ImageRef {
            id: ImageId::new("img-1").unwrap(),
            source: image.display().to_string(),
            checksum: None,
            format: ImageFormat::Raw,
        }),
        ..SpawnStorage::default()
    };
    args
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// What Nova's `migrate_instance_finish` does: bind every port to `host`.
async fn nova_moves_bindings(c: &TestCloud, ports: &[PortId], host: &str) {
    for p in ports {
        let update = PortUpdate {
            host_id: Some(host.to_owned()),
            ..PortUpdate::default()
        };
        c.network.update_port(*p, &update).await.unwrap();
    }
}

/// Spawn on h1 with one port on each of the hybrid, native and Linux-bridge networks, then
/// run the source's half (`migrate_disk_and_power_off`) and the destination's
/// (`finish_migration`) as Nova does: the handover is the source's answer.
async fn resized_to_h2_by_nova(c: &TestCloud, name: &str) -> (uuid::Uuid, Migration, [PortId; 3]) {
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let id = uuid();
    h1.driver
        .spawn(
            id,
            spawn_args(name, vec![on(NET_HYBRID), on(NET_NATIVE), on(NET_LB)]),
        )
        .await
        .unwrap();
    let by = ports_by_network(c, &h1.driver.show(id).await.unwrap()).await;
    let ports = [by[NET_HYBRID], by[NET_NATIVE], by[NET_LB]];
    let migration = Migration {
        id: uuid(),
        source_host: "h1".into(),
        dest_host: "h2".into(),
    };
    let mut args = ResizeArgs::of(&migration, flavor("m1.small", 2, 512));
    args.caller_finishes = true;
    let handed = h1
        .driver
        .run(id, Operation::Resize(Box::new(args)))
        .await
        .unwrap();
    let handover: Handover = handed
        .handover
        .expect("the source answers with the handover");
    assert_eq!(handover.flavor.vcpus, 2);
    assert!(handover.power_on);
    // The source waits stopped, its hybrid devices wired; the destination was not asked.
    let src = h1.driver.show(id).await.unwrap();
    assert_eq!(src.state, InstanceState::ResizeSource);
    assert_eq!(src.power, PowerState::Shutoff);
    assert_eq!(h1.plugger.plugged(), set(ports));
    assert!(!h2.driver.knows(id).await);

    nova_moves_bindings(c, &ports, "h2").await;
    let finish = h2
        .driver
        .run(
            id,
            Operation::FinishResize {
                migration: migration.clone(),
                handover: Box::new(handover),
                caller: Some(Box::new(CallerTask {
                    events_since_ms: Some(now_ms()),
                    ..CallerTask::default()
                })),
            },
        )
        .await
        .unwrap();
    assert!(finish.waits.iter().all(|w| w.complete), "{finish:#?}");
    assert_eq!(set(waited(&finish, Timing::PlugTime)), set(ports));
    (id, migration, ports)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_nova_runs_is_finished_by_the_destination_and_confirmed_on_the_source() {
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let (id, _, ports) = resized_to_h2_by_nova(&c, "vm-nova-rc").await;
    // Nova's confirm asks only the source: the destination's instance is an ordinary one
    // already, which takes the next operation.
    let dst = h2.driver.show(id).await.unwrap();
    assert_eq!(dst.state, InstanceState::Running);
    assert_eq!(dst.flavor.as_deref(), Some("m1.small"));
    h2.driver
        .reboot(id, vireo_actors::instance::RebootKind::Hard)
        .await
        .unwrap();

    // Nova's confirm: answered once the old instance left h1, removed right after.
    h1.driver
        .run(id, Operation::ConfirmResizeSource { remove_after: true })
        .await
        .unwrap();
    assert!(matches!(
        h1.driver.show(id).await,
        Err(InstanceError::Refused(AdmissionError::NotFound(_)))
    ));
    assert!(!h1.driver.knows(id).await);
    // Asked again (while the removal runs, or after): not here, which Nova's driver takes
    // as confirmed.
    let again = h1
        .driver
        .run(id, Operation::ConfirmResizeSource { remove_after: true })
        .await
        .unwrap_err();
    assert!(
        matches!(again, InstanceError::Refused(AdmissionError::NotFound(_))),
        "{again:?}"
    );
    removed_from(&c, "h1", id).await;
    for p in ports {
        assert_eq!(c.port(p).await.host_id, "h2");
    }
    c.destroy_and_assert_clean(&[id], &[]).await;
}

/// Nothing of the instance is left on `host` — domain, devices, disks — once its removal
/// after the answer ended (5 s at most).
async fn removed_from(c: &TestCloud, host: &str, id: uuid::Uuid) {
    let h = c.host(host);
    let dir = c.instances_dir(host).join(id.to_string());
    eventually(
        Duration::from_secs(5),
        "the old instance removed",
        || async {
            let domains = h.driver.libvirt().list_all().await.unwrap();
            (h.plugger.plugged().is_empty() && domains.is_empty() && !dir.exists()).then_some(())
        },
    )
    .await;
}

/// The agent on the source stops after Nova's confirm was answered and before the old
/// instance was removed: its domain says the instance left, and the restarted agent removes
/// it without being asked (Nova asks nothing more of the source).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_source_recorded_as_gone_is_removed_by_the_restarted_agent() {
    let c = spec(&["h1", "h2"]).start().await;
    let (id, _, ports) = resized_to_h2_by_nova(&c, "vm-nova-rg").await;
    let mut domains = c.dump_domains().await;
    // What the confirm writes before it answers: the record, in state gone.
    let source = domains.get_mut("h1").unwrap();
    let recorded = r#""state":"resize-source""#;
    assert_eq!(source.matches(recorded).count(), 1, "{source}");
    *source = source.replace(recorded, r#""state":"gone""#);
    let remains = c.crash();
    let c = TestCloud::restart(remains, domains).await;
    let h1 = c.host("h1");
    let recovered = h1.driver.recovery().clone();
    assert!(
        recovered
            .instances
            .iter()
            .any(|i| i.uuid == id && i.state == InstanceState::Gone),
        "{recovered:?}"
    );
    assert!(!h1.driver.knows(id).await);
    removed_from(&c, "h1", id).await;
    assert_eq!(
        c.host("h2").driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    for p in &ports {
        assert_eq!(c.port(*p).await.host_id, "h2");
    }
    c.destroy_and_assert_clean(&[id], &[]).await;
}

/// Nova's revert: the destination's driver destroys its copy (`destroy`), the manager moves
/// the bindings back, and only then asks the source (`finish_revert_migration`).
async fn nova_reverts(c: &TestCloud, id: uuid::Uuid, ports: &[PortId]) -> u64 {
    c.host("h2")
        .driver
        .destroy(
            id,
            DestroyArgs {
                deallocate_network: false,
            },
        )
        .await
        .unwrap();
    let task_began = now_ms();
    let moved = std::time::Instant::now();
    nova_moves_bindings(c, ports, "h1").await;
    // The hybrid port's event (its qvo stayed wired on h1) reaches h1 before anything
    // there waits for it.
    eventually(Duration::from_secs(2), "the bind-time event", || async {
        let seen = c.sink.plugged(id, moved, std::time::Instant::now());
        seen.contains(&ports[0]).then_some(())
    })
    .await;
    task_began
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revert_nova_runs_counts_the_event_of_the_binding_move_that_came_before_it() {
    let c = spec(&["h1", "h2"])
        .timeout(Duration::from_secs(2))
        .start()
        .await;
    let h1 = c.host("h1");
    let (id, _, ports) = resized_to_h2_by_nova(&c, "vm-nova-rv").await;
    let task_began = nova_reverts(&c, id, &ports).await;

    let back = h1
        .driver
        .run(
            id,
            Operation::FinishRevertResize {
                caller: Some(Box::new(CallerTask {
                    events_since_ms: Some(task_began),
                    ..CallerTask::default()
                })),
            },
        )
        .await
        .unwrap();
    // Bind time: the hybrid port, whose event came before the operation; plug time: the
    // ports whose taps went with the stopped domain.
    assert_eq!(waited(&back, Timing::BindTime), vec![ports[0]]);
    assert_eq!(
        set(waited(&back, Timing::PlugTime)),
        set([ports[1], ports[2]])
    );
    assert!(back.waits.iter().all(|w| w.complete), "{back:#?}");
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.flavor.as_deref(), Some("m1.tiny"));
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revert_nova_runs_takes_the_events_nova_kept_for_it() {
    let c = spec(&["h1", "h2"])
        .timeout(Duration::from_secs(2))
        .start()
        .await;
    let h1 = c.host("h1");
    let (id, _, ports) = resized_to_h2_by_nova(&c, "vm-nova-kept").await;
    nova_reverts(&c, id, &ports).await;
    // The event as nova-compute's registry kept it (no time given).
    let kept = ExternalEvent {
        name: EventName::NetworkVifPlugged,
        server_uuid: id,
        tag: Some(ports[0].to_string()),
        status: EventStatus::Completed,
    };
    let back = h1
        .driver
        .run(
            id,
            Operation::FinishRevertResize {
                caller: Some(Box::new(CallerTask {
                    events: vec![kept],
                    ..CallerTask::default()
                })),
            },
        )
        .await
        .unwrap();
    assert_eq!(waited(&back, Timing::BindTime), vec![ports[0]]);
    assert!(back.waits.iter().all(|w| w.complete), "{back:#?}");
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revert_nova_runs_without_its_tasks_events_times_out_at_bind_time() {
    // The baseline the two tests above guard against: the event came, nothing counts it.
    let c = spec(&["h1", "h2"])
        .timeout(Duration::from_secs(1))
        .start()
        .await;
    let h1 = c.host("h1");
    let (id, _, ports) = resized_to_h2_by_nova(&c, "vm-nova-lost").await;
    nova_reverts(&c, id, &ports).await;
    let e = h1
        .driver
        .run(
            id,
            Operation::FinishRevertResize {
                caller: Some(Box::new(CallerTask::default())),
            },
        )
        .await
        .unwrap_err();
    let chain = chain(&e);
    assert!(chain.contains("timed out"), "{chain}");
    assert!(chain.contains(&ports[0].to_string()), "{chain}");
    c.destroy_everywhere(id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_nova_runs_is_refused_where_the_instances_directory_is_shared() {
    let c = spec(&["h1", "h2"]).shared_instances(true).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let id = uuid();
    h1.driver
        .spawn(id, image_args(&c, "vm-nova-shared"))
        .await
        .unwrap();
    let migration = Migration {
        id: uuid(),
        source_host: "h1".into(),
        dest_host: "h2".into(),
    };
    let mut args = ResizeArgs::of(&migration, flavor("m1.small", 2, 512));
    args.caller_finishes = true;
    let handover = h1
        .driver
        .run(id, Operation::Resize(Box::new(args)))
        .await
        .unwrap()
        .handover
        .unwrap();
    let e = h2
        .driver
        .run(
            id,
            Operation::FinishResize {
                migration,
                handover: Box::new(handover),
                caller: Some(Box::new(CallerTask::default())),
            },
        )
        .await
        .unwrap_err();
    assert!(
        chain(&e).contains("shares the instances directory"),
        "{}",
        chain(&e)
    );
    // Nothing was made there; the source still holds its disks.
    assert!(!h2.driver.knows(id).await);
    assert!(!c.disks_left("h1").is_empty());
    c.destroy_everywhere(id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nova_unplugs_and_plugs_the_vifs_of_an_instance_whose_guest_stays() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let id = uuid();
    h1.driver
        .spawn(
            id,
            spawn_args(
                "vm-nova-vifs",
                vec![on(NET_HYBRID), on(NET_NATIVE), on(NET_LB)],
            ),
        )
        .await
        .unwrap();
    let ports = set(common::ports(&h1.driver.show(id).await.unwrap()));
    assert_eq!(h1.plugger.plugged(), ports);

    h1.driver.run(id, Operation::UnplugVifs {}).await.unwrap();
    assert!(h1.plugger.plugged().is_empty());
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.power, PowerState::Running);

    // What nova-compute asks of every instance when it starts: idempotent.
    for _ in 0..2 {
        h1.driver.run(id, Operation::PlugVifs {}).await.unwrap();
        assert_eq!(h1.plugger.plugged(), ports);
    }
    // A stopped guest stays stopped.
    h1.driver.power_off(id, None).await.unwrap();
    h1.driver.run(id, Operation::PlugVifs {}).await.unwrap();
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Stopped
    );
    c.destroy_and_assert_clean(&[id], &[]).await;
}

fn lm_migration() -> Migration {
    Migration {
        id: uuid(),
        source_host: "h1".into(),
        dest_host: "h2".into(),
    }
}

/// Nova's `pre_live_migration` on the destination `host`.
async fn nova_pre_live_migration(
    host: &Host,
    id: uuid::Uuid,
    m: &Migration,
    handover: Handover,
) -> Result<vireo_actors::instance::OpReport, InstanceError> {
    nova_pre_live_migration_with(host, id, m, handover, CallerTask::default()).await
}

/// The same with the `caller` Nova's driver sends (e.g. `shared_instance_path`: its probe
/// found the instances directory shared).
async fn nova_pre_live_migration_with(
    host: &Host,
    id: uuid::Uuid,
    m: &Migration,
    handover: Handover,
    caller: CallerTask,
) -> Result<vireo_actors::instance::OpReport, InstanceError> {
    host.driver
        .run(
            id,
            Operation::PreLiveMigration {
                migration: m.clone(),
                handover: Box::new(handover),
                caller: Some(Box::new(caller)),
            },
        )
        .await
}

fn shared_path() -> CallerTask {
    CallerTask {
        shared_instance_path: true,
        ..CallerTask::default()
    }
}

/// Nova's `rollback_live_migration_at_destination` on `host`, with its clean-up flags for a
/// migration that found no shared storage (`do_cleanup`, `destroy_disks`).
async fn nova_rollback_at_destination(
    host: &Host,
    id: uuid::Uuid,
    m: &Migration,
    handover: Handover,
) -> Result<vireo_actors::instance::OpReport, InstanceError> {
    nova_rollback_at_destination_with(host, id, m, handover, true).await
}

/// The same with Nova's `destroy_disks` (false: its migrate data said shared block storage).
async fn nova_rollback_at_destination_with(
    host: &Host,
    id: uuid::Uuid,
    m: &Migration,
    handover: Handover,
    destroy_disks: bool,
) -> Result<vireo_actors::instance::OpReport, InstanceError> {
    host.driver
        .run(
            id,
            Operation::RollbackLiveMigrationAtDestination {
                handover: Box::new(handover),
                do_cleanup: true,
                destroy_disks,
                migration_id: Some(m.id),
                caller: Some(Box::new(CallerTask::default())),
            },
        )
        .await
}

fn lm_args(m: &Migration, dest_uri: &str) -> vireo_actors::instance::LiveMigrateArgs {
    let mut args = vireo_actors::instance::LiveMigrateArgs::of(m);
    args.caller = Some(Box::new(CallerTask {
        dest_uri: Some(dest_uri.to_owned()),
        ..CallerTask::default()
    }));
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_migration_nova_runs_that_fails_in_libvirt_rolls_back_only_this_hosts_part() {
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let id = uuid();
    h1.driver
        .spawn(
            id,
            spawn_args("vm-nova-lm", vec![on(NET_HYBRID), on(NET_NATIVE)]),
        )
        .await
        .unwrap();
    let view = h1.driver.show(id).await.unwrap();
    let ports = common::ports(&view);
    let handover = view.handover.expect("the source's handover");
    let m = lm_migration();
    // Nova's pre_live_migration on the destination: devices wired, the guest expected.
    nova_pre_live_migration(h2, id, &m, handover.clone())
        .await
        .unwrap();
    assert_eq!(
        h2.driver.show(id).await.unwrap().state,
        InstanceState::Incoming
    );
    assert_eq!(h2.plugger.plugged(), set(ports.iter().copied()));
    // The source's live_migration: libvirt's test driver cannot migrate, so it fails there.
    let e = h1
        .driver
        .run(
            id,
            Operation::LiveMigrate(Box::new(lm_args(&m, "test:///default"))),
        )
        .await
        .unwrap_err();
    assert!(chain(&e).contains("migrate"), "{}", chain(&e));
    // This host's part only: the guest runs on here with its devices; vireo wrote nothing to
    // the network (no migrating_to, no binding for h2: Nova's to make and remove).
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(
        (view.state, view.power),
        (InstanceState::Running, PowerState::Running)
    );
    assert_eq!(h1.plugger.plugged(), set(ports.iter().copied()));
    for p in &ports {
        let port = c.port(*p).await;
        assert_eq!(port.migrating_to(), None, "{port:?}");
        let bindings = c.network.show_bindings(*p).await.unwrap();
        assert_eq!(bindings.len(), 1, "{bindings:?}");
    }
    // Nova's rollback_live_migration_at_destination.
    nova_rollback_at_destination(h2, id, &m, handover)
        .await
        .unwrap();
    assert!(h2.plugger.plugged().is_empty());
    assert!(!h2.driver.knows(id).await);
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nova_never_costs_the_source_its_disks_on_a_shared_directory() {
    let c = spec(&["h1", "h2"]).shared_instances(true).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let id = uuid();
    h1.driver
        .spawn(id, image_args(&c, "vm-nova-lm-shared"))
        .await
        .unwrap();
    let handover = h1.driver.show(id).await.unwrap().handover.unwrap();
    let root = handover.storage.disks[0].path.clone();
    let m = lm_migration();
    // The destination sees the source's disks where it would make its own: refused before
    // anything is made (vireo under Nova copies the disks; a shared directory is refused).
    let e = nova_pre_live_migration(h2, id, &m, handover.clone())
        .await
        .unwrap_err();
    assert!(chain(&e).contains("already"), "{}", chain(&e));
    // Nova rolls back with destroy_disks (its flags say "not shared"): this host prepared
    // nothing, so nothing of the directory goes.
    nova_rollback_at_destination(h2, id, &m, handover)
        .await
        .unwrap();
    assert!(root.exists(), "the source's root disk went");
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_directory_nova_found_is_used_in_place_and_kept_through_a_rollback() {
    let c = spec(&["h1", "h2"]).shared_instances(true).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let id = uuid();
    h1.driver
        .spawn(id, image_args(&c, "vm-nova-lm-in-place"))
        .await
        .unwrap();
    let handover = h1.driver.show(id).await.unwrap().handover.unwrap();
    let disks = handover.storage.disks.clone();
    let inode = |p: &std::path::Path| std::os::unix::fs::MetadataExt::ino(&p.metadata().unwrap());
    let before: Vec<u64> = disks.iter().map(|d| inode(&d.path)).collect();
    let m = lm_migration();
    // Nova's probe said shared: the destination takes the source's disks as they are.
    nova_pre_live_migration_with(h2, id, &m, handover.clone(), shared_path())
        .await
        .unwrap();
    let incoming = h2.driver.show(id).await.unwrap();
    assert_eq!(incoming.state, InstanceState::Incoming);
    assert_eq!(
        incoming.disks, disks,
        "the destination's disks are the source's"
    );
    // The source migrates nothing of the disks; libvirt's test driver cannot migrate at
    // all: the source rolls back its part, the guest keeps running on its disks.
    let e = h1
        .driver
        .live_migrate(id, {
            let mut args = lm_args(&m, "test:///default");
            if let Some(caller) = args.caller.as_mut() {
                caller.shared_instance_path = true;
            }
            args
        })
        .await
        .unwrap_err();
    assert!(
        matches!(e, InstanceError::RolledBack { .. }),
        "{}",
        chain(&e)
    );
    // Nova's rollback at the destination keeps the disks (is_shared_block_storage).
    nova_rollback_at_destination_with(h2, id, &m, handover, false)
        .await
        .unwrap();
    assert!(!h2.driver.knows(id).await);
    let after: Vec<u64> = disks.iter().map(|d| inode(&d.path)).collect();
    assert_eq!(before, after, "the disks were replaced or removed");
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_directory_the_destination_does_not_share_is_refused_before_anything_is_made() {
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let id = uuid();
    h1.driver
        .spawn(id, image_args(&c, "vm-nova-lm-not-shared"))
        .await
        .unwrap();
    let handover = h1.driver.show(id).await.unwrap().handover.unwrap();
    let e = nova_pre_live_migration_with(h2, id, &lm_migration(), handover, shared_path())
        .await
        .unwrap_err();
    assert!(chain(&e).contains("are not on h2"), "{}", chain(&e));
    assert!(!h2.driver.knows(id).await);
    assert!(h2.plugger.plugged().is_empty());
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_destination_takes_over_a_guest_nova_moved_without_waiting_for_the_sources_events() {
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let id = uuid();
    h1.driver
        .spawn(id, spawn_args("vm-nova-post", vec![on(NET_HYBRID)]))
        .await
        .unwrap();
    let view = h1.driver.show(id).await.unwrap();
    let ports = common::ports(&view);
    let m = lm_migration();
    nova_pre_live_migration(h2, id, &m, view.handover.unwrap())
        .await
        .unwrap();
    // libvirt moves the guest (the test driver cannot: the domain is copied).
    let xml = h1.driver.libvirt().xml_desc(id, false).await.unwrap();
    h2.driver.libvirt().define_xml(xml, false).await.unwrap();
    h2.driver.libvirt().start(id, false).await.unwrap();
    h2.plugger.devices_attached(&ports).await;
    let report = h2
        .driver
        .run(
            id,
            Operation::PostLiveMigrationAtDestination {
                migration: m,
                caller: Some(Box::new(CallerTask::default())),
            },
        )
        .await
        .unwrap();
    // Nova activated the bindings before it called; their events went to the source's
    // nova-compute: none is awaited here, and nothing is written to the network.
    assert!(
        report.waits.iter().all(|w| w.expected.is_empty()),
        "{report:#?}"
    );
    assert_eq!(
        h2.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    assert_eq!(c.port(ports[0]).await.host_id, "h1");
    c.destroy_everywhere(id).await;
}
