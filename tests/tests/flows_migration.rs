//! Live migration on libvirt's test driver with the embedded network service. The test
//! driver has no migration API, so every migration fails at the migrate step (or earlier,
//! where a test makes it): what is checked is the rollback — no `migrating_to` on any port,
//! no destination binding, nothing plugged on the destination, the guest running on the
//! source — for every shared-storage combination and every failure point before the guest
//! moves; and the destination's post-migration wait, driven directly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod faults_support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use vireo::compute::{ComputeDriver, ComputeOps};
use vireo_actors::instance::{
    AdmissionError, Handover, InstanceError, InstanceReply, Migration, Operation, PeerHost,
    PowerState,
};
use vireo_actors::lifecycle::{InstanceState, Request};
use vireo_actors::network::{BindingStatus, NetworkApi, PortStatus};
use vireo_actors::plug::testing::RecordingPlugger;
use vireo_actors::plug::{PlugStep, VifPlugger};
use vireo_actors::predict::Timing;
use vireo_actors::vif::PortId;

/// Hosts with their own instances directories, and hosts sharing one.
const SHARED: [bool; 2] = [false, true];

async fn spawn3(c: &TestCloud, name: &str) -> (uuid::Uuid, Vec<PortId>) {
    let id = uuid();
    let h1 = c.host("h1");
    h1.spawn_on(id, name, vec![on(NET_HYBRID), on(NET_NATIVE), on(NET_LB)])
        .await;
    let view = h1.driver.show(id).await.unwrap();
    (id, ports(&view))
}

/// The instance runs on h1 exactly as before the migration; no port has `migrating_to` or a
/// binding for `dest`; `dest` holds nothing of it.
async fn assert_rolled_back(c: &TestCloud, id: uuid::Uuid, ports: &[PortId], dest: &str) {
    let h1 = c.host("h1");
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.power, PowerState::Running);
    assert_eq!(h1.plugger.plugged(), set(ports.iter().copied()));
    for p in ports {
        let port = c.port(*p).await;
        assert_eq!(port.migrating_to(), None, "{port:?}");
        assert_eq!(port.host_id, "h1", "{port:?}");
        assert_eq!(port.status, PortStatus::Active, "{port:?}");
        let bindings = c.network.show_bindings(*p).await.unwrap();
        assert_eq!(bindings.len(), 1, "{bindings:?}");
        assert_eq!(bindings[0].host, "h1");
        assert_eq!(bindings[0].status, BindingStatus::Active);
    }
    if let Some(d) = c.hosts.iter().find(|h| h.name == dest) {
        assert!(d.plugger.plugged().is_empty(), "{dest} keeps devices");
        assert!(d.driver.libvirt().list_all().await.unwrap().is_empty());
        assert!(matches!(
            d.driver.show(id).await,
            Err(InstanceError::Refused(AdmissionError::NotFound(_)))
        ));
    }
    let last = view.last_operation.unwrap();
    assert_eq!(last.request, "live-migrate");
    assert!(last.waits.iter().all(|w| w.complete), "{last:#?}");
    assert_eq!(c.stats().await.waits_now, 0);
}

fn assert_rolled_back_err(e: &InstanceError) {
    assert!(
        matches!(
            e,
            InstanceError::RolledBack {
                request: Request::LiveMigrate,
                ..
            }
        ),
        "{}",
        chain(e)
    );
}

fn step_names(c: &vireo_actors::instance::OpReport) -> Vec<String> {
    c.steps.iter().map(|s| s.name.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_failing_at_migrate_rolls_back_with_and_without_a_shared_instances_directory() {
    for shared in SHARED {
        let c = spec(&["h1", "h2"]).shared_instances(shared).start().await;
        let h1 = c.host("h1");
        let (id, ports) = spawn3(&c, "vm-lm").await;
        let e = h1.driver.live_migrate(id, lm("h2")).await.unwrap_err();
        assert_rolled_back_err(&e);
        // The test driver has no migration API: the guest never left.
        assert!(chain(&e).contains("migrate"), "{}", chain(&e));
        assert_rolled_back(&c, id, &ports, "h2").await;
        let last = h1.driver.show(id).await.unwrap().last_operation.unwrap();
        let steps = step_names(&last);
        for s in [
            "create binding",
            "set migrating_to",
            "write the shared-directory probe",
            "pre-live-migration on h2",
            "migrate",
            "clear migrating_to",
            "tear down destination bindings",
            "rollback-live-migration-at-destination on h2",
        ] {
            assert!(steps.iter().any(|n| n == s), "{s} missing in {steps:?}");
        }
        let failed: Vec<_> = last.steps.iter().filter(|s| s.failed).collect();
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert_eq!(failed[0].name, "migrate");
        // The profile rebinds were consumed by their own waits, quickly.
        let consumed = waited(&last, Timing::BindTime);
        assert_eq!(consumed.len(), 6, "{last:#?}");
        assert!(last.took < Duration::from_secs(2), "{:?}", last.took);
        c.destroy_and_assert_clean(&[id], &[]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_without_migrating_to_rolls_back_too() {
    let mut s = spec(&["h1", "h2"]);
    s.instances.set_migrating_to = false;
    let c = s.start().await;
    let h1 = c.host("h1");
    let (id, ports) = spawn3(&c, "vm-lm-nomt").await;
    let before = c.sink.log().len();
    let e = h1.driver.live_migrate(id, lm("h2")).await.unwrap_err();
    assert_rolled_back_err(&e);
    assert_rolled_back(&c, id, &ports, "h2").await;
    // Inactive bindings send nothing and no profile changed: no event at all (the hybrid
    // device pre-wired on h2 is ignored, its binding there is not active).
    let sent: Vec<_> = c.sink.log()[before..]
        .iter()
        .filter(|s| s.event.name == vireo_actors::external::EventName::NetworkVifPlugged)
        .cloned()
        .collect();
    assert!(sent.is_empty(), "{sent:?}");
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_to_an_unknown_or_non_migrating_host_changes_nothing() {
    let c = spec(&["h1", "h2"]).start().await;
    let h1 = c.host("h1");
    let (id, ports) = spawn3(&c, "vm-lm-unknown").await;
    // A host this one cannot reach: refused at admission (an agent is one host; moves
    // between hosts are Nova's), nothing started.
    let e = h1.driver.live_migrate(id, lm("h9")).await.unwrap_err();
    assert!(
        matches!(&e, InstanceError::Refused(AdmissionError::CrossHost { host }) if host == "h9"),
        "{}",
        chain(&e)
    );
    assert!(chain(&e).contains("Nova"), "{}", chain(&e));
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.last_operation.unwrap().request, "spawn", "nothing ran");
    assert_eq!(h1.plugger.plugged(), set(ports.iter().copied()));
    for p in &ports {
        let port = c.port(*p).await;
        assert_eq!(
            (port.host_id.as_str(), port.migrating_to()),
            ("h1", None),
            "{port:?}"
        );
    }

    // Same host: refused before anything happens.
    let e = h1.driver.live_migrate(id, lm("h1")).await.unwrap_err();
    assert!(matches!(e, InstanceError::Invalid(_)), "{}", chain(&e));
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    c.destroy_and_assert_clean(&[id], &[]).await;
}

/// A compute host whose agent does not answer (its libvirt URI is unreachable too).
#[derive(Debug)]
struct DeadPeer(String);

#[async_trait]
impl PeerHost for DeadPeer {
    fn name(&self) -> &str {
        &self.0
    }

    fn migration_uri(&self) -> Option<String> {
        Some("qemu+tcp://192.0.2.1/system".into())
    }

    async fn request(
        &self,
        _instance: uuid::Uuid,
        _request: Operation,
    ) -> Result<InstanceReply, InstanceError> {
        Err(InstanceError::Unavailable)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_destination_is_cleaned_from_the_source_each_time() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    // h3's L2 agent is up (the service binds there), its compute agent is not.
    let h3_devices = RecordingPlugger::new();
    let (n, w) = (c.network.clone(), h3_devices.wiring());
    on_thread(&c.system, move || n.attach_host("h3", w))
        .await
        .unwrap();
    c.peers.insert(Arc::new(DeadPeer("h3".into())));
    let (id, ports) = spawn3(&c, "vm-lm-dead").await;
    // Twice: a rollback leaves the instance ready for the next attempt.
    for _ in 0..2 {
        let e = h1.driver.live_migrate(id, lm("h3")).await.unwrap_err();
        assert_rolled_back_err(&e);
        assert!(chain(&e).contains("pre-live-migration"), "{}", chain(&e));
        // Bindings for h3 and migrating_to had been made: the source removed them itself.
        assert_rolled_back(&c, id, &ports, "h3").await;
        let last = h1.driver.show(id).await.unwrap().last_operation.unwrap();
        let steps = step_names(&last);
        assert!(steps.iter().any(|s| s == "set migrating_to"), "{steps:?}");
        assert!(steps.iter().any(|s| s == "clear migrating_to"), "{steps:?}");
    }
    c.peers.remove("h3");
    assert!(c.network.detach_host("h3"));
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_while_prewiring_or_binding_rolls_back() {
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let (id, ports) = spawn3(&c, "vm-lm-pre").await;
    // The destination fails to plug the second port (after plugging the first).
    h2.plugger
        .faults()
        .fail_once(PlugStep::OvsTransact, Some(ports[1]));
    let e = h1.driver.live_migrate(id, lm("h2")).await.unwrap_err();
    assert_rolled_back_err(&e);
    assert!(chain(&e).contains("plug"), "{}", chain(&e));
    assert_rolled_back(&c, id, &ports, "h2").await;

    // The network refuses the second destination binding: the first is deleted again.
    h1.net.fail(NetCall::CreateBinding, 1);
    let e = h1.driver.live_migrate(id, lm("h2")).await.unwrap_err();
    assert_rolled_back_err(&e);
    assert!(chain(&e).contains("injected"), "{}", chain(&e));
    assert_rolled_back(&c, id, &ports, "h2").await;

    // Setting migrating_to fails.
    h1.net.fail(NetCall::SetupNetworks, 0);
    let e = h1.driver.live_migrate(id, lm("h2")).await.unwrap_err();
    assert_rolled_back_err(&e);
    assert_rolled_back(&c, id, &ports, "h2").await;

    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_whose_first_clear_fails_still_leaves_no_migrating_to() {
    // The destination is unreachable, so nothing on its side runs.
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let h3_devices = RecordingPlugger::new();
    let (n, w) = (c.network.clone(), h3_devices.wiring());
    on_thread(&c.system, move || n.attach_host("h3", w))
        .await
        .unwrap();
    c.peers.insert(Arc::new(DeadPeer("h3".into())));
    let (id, ports) = spawn3(&c, "vm-lm-clear").await;
    // 1st call sets migrating_to, 2nd (the rollback's clear) fails, 3rd (the teardown of
    // the destination bindings) removes migrating_to as well.
    h1.net.fail(NetCall::SetupNetworks, 1);
    let e = h1.driver.live_migrate(id, lm("h3")).await.unwrap_err();
    assert!(
        matches!(
            e,
            InstanceError::RollbackFailed {
                request: Request::LiveMigrate,
                ..
            }
        ),
        "{}",
        chain(&e)
    );
    for p in &ports {
        let port = c.port(*p).await;
        assert_eq!(port.migrating_to(), None, "{port:?}");
        assert_eq!(c.network.show_bindings(*p).await.unwrap().len(), 1);
    }
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Error);
    assert_eq!(view.power, PowerState::Running);
    // No wait of the failed clear is left behind.
    assert_eq!(c.stats().await.waits_now, 0);
    // From error, a hard reboot brings it back to running.
    h1.driver
        .reboot(id, vireo_actors::instance::RebootKind::Hard)
        .await
        .unwrap();
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    c.peers.remove("h3");
    assert!(c.network.detach_host("h3"));
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_waits_only_for_its_activation_events() {
    destination_post(false).await;
}

/// The events the destination's devices caused before its activation step (pre-wiring with
/// `migrating_to` set) are buffered, and never count: with the activation's own events lost,
/// the destination's wait times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_does_not_count_events_from_before_its_activation() {
    destination_post(true).await;
}

/// A destination pre-wired and its guest arrived, then its post-live-migration; with
/// `lose_activation`, the service's events from the activation on are lost.
async fn destination_post(lose_activation: bool) {
    use std::time::Instant;
    use vireo_actors::network::{MigrationHosts, NewBinding};
    let c = spec(&["h1", "h2"])
        .timeout(Duration::from_secs(2))
        .start()
        .await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let (id, ports) = spawn3(&c, "vm-lm-post").await;
    let migration = Migration {
        id: uuid(),
        source_host: "h1".into(),
        dest_host: "h2".into(),
    };
    // What the source does first: inactive bindings for h2, then migrating_to.
    for p in &ports {
        c.network
            .create_binding(
                *p,
                &NewBinding {
                    host: "h2".into(),
                    vnic_type: None,
                    profile: None,
                },
            )
            .await
            .unwrap();
    }
    c.network
        .setup_networks_on_host(id, "h1", false, Some(&MigrationHosts { dest: "h2".into() }))
        .await
        .unwrap();
    let handover = Handover {
        name: "vm-lm-post".into(),
        flavor: flavor("m1.tiny", 1, 256),
        old_flavor: flavor("m1.tiny", 1, 256),
        boot: vireo_actors::instance::BootSource::None,
        storage: Default::default(),
        network_info: network_info(&*c.network, &ports).await.to_value(),
        power_on: true,
    };
    h2.driver
        .complete(
            id,
            Operation::PreLiveMigration {
                migration: migration.clone(),
                handover: Box::new(handover),
                caller: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        h2.driver.show(id).await.unwrap().state,
        InstanceState::Incoming
    );
    assert_eq!(h2.plugger.plugged(), set(ports.iter().copied()));
    // libvirt moves the guest (the test driver cannot: the domain is copied, and h2's
    // plugger told that libvirt made its taps, as libvirt does for the incoming guest).
    let xml = h1.driver.libvirt().xml_desc(id, false).await.unwrap();
    h2.driver.libvirt().define_xml(xml, false).await.unwrap();
    h2.driver.libvirt().start(id, false).await.unwrap();
    h2.plugger.devices_attached(&ports).await;
    // The incoming domain names the source until the destination saves; a resync meanwhile
    // (a libvirt reconnect) keeps it with the destination's existing actor.
    assert_eq!(
        owner_of(h2.driver.libvirt(), id).await.as_deref(),
        Some("h1")
    );
    let resync = h2.driver.host_handle().recover().await.unwrap();
    assert!(resync.other_hosts.is_empty(), "{resync:?}");
    assert_eq!(
        h2.driver.show(id).await.unwrap().state,
        InstanceState::Incoming
    );
    // Devices on the destination with migrating_to set: the agent reports them, Neutron
    // sends vif-plugged — before the destination's wait exists.
    let t0 = Instant::now();
    let early = c
        .sink
        .plugged(id, std::time::Instant::now() - Duration::from_secs(60), t0);
    assert!(!early.is_empty(), "no destination-plug events");
    if lose_activation {
        c.sink.set_event_fault(Some(EventRule {
            instance: id,
            fault: EventFault::Lost,
        }));
    }
    let reply = h2
        .driver
        .complete(
            id,
            Operation::PostLiveMigrationAtDestination {
                migration: migration.clone(),
                caller: None,
            },
        )
        .await;
    let t1 = Instant::now();
    if lose_activation {
        c.sink.set_event_fault(None);
        let e = reply.unwrap_err();
        assert!(
            matches!(
                &e,
                InstanceError::EventWait {
                    source: vireo_actors::events::WaitError::TimedOut { .. },
                    ..
                }
            ),
            "{}",
            chain(&e)
        );
    } else {
        assert_handed_over(&c, reply.unwrap(), id, &ports, t0, t1).await;
    }
    // Clean up both sides: the source's copy (as its post-migration clean-up would), the
    // source's binding, then the instance. The handover's network_info was built from the
    // ports (preserve_on_delete): h2 unbinds them, the test deletes them.
    h1.driver
        .destroy(id, vireo_actors::instance::DestroyArgs::default())
        .await
        .unwrap();
    for p in &ports {
        c.network.delete_binding(*p, "h1").await.unwrap();
    }
    c.destroy_everywhere(id).await;
    c.assert_clean(&ports).await;
    c.delete_ports(&ports).await;
}

/// h2 took the guest over: it waited for the events of its activation (every port is
/// re-reported, its device being wired on h2 already) and saved, the ports are bound there.
async fn assert_handed_over(
    c: &TestCloud,
    reply: InstanceReply,
    id: uuid::Uuid,
    ports: &[PortId],
    t0: std::time::Instant,
    t1: std::time::Instant,
) {
    let InstanceReply::Done { state, report } = reply;
    assert_eq!(state, InstanceState::Running);
    assert_eq!(
        set(waited(&report, Timing::BindTime)),
        set(ports.iter().copied())
    );
    assert!(waited(&report, Timing::PlugTime).is_empty());
    assert!(report.waits.iter().all(|w| w.complete), "{report:#?}");
    assert_eq!(set(c.sink.plugged(id, t0, t1)), set(ports.iter().copied()));
    // The earlier events did not count: destination_does_not_count_events_from_before_its_activation.
    // The destination saved: it owns the domain now.
    assert_eq!(
        owner_of(c.host("h2").driver.libvirt(), id).await.as_deref(),
        Some("h2")
    );
    for p in ports {
        let port = c.port(*p).await;
        assert_eq!(port.host_id, "h2");
        assert_eq!(port.status, PortStatus::Active);
    }
}

/// The migrate call fails after libvirt moved the guest (a call that timed out while its job
/// switched over, an error from the last phase): the source used to roll back because the
/// call failed, and the destination destroyed the guest that had arrived — gone from both
/// hosts. Now the source lets the job end and reads its domain: gone, so the destination
/// takes the guest over and the source cleans up, as after a migration; the operation
/// succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_that_moved_although_the_migrate_call_failed_is_handed_over() {
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let (id, ports) = spawn3(&c, "vm-lm-moved").await;
    // h2's agent, once prepared, receives the guest the way libvirt's job delivers it (the
    // test driver has no migration), with its taps; the source's migrate call then fails
    // (its domain is not there any more).
    let (from, to) = (h1.driver.libvirt().clone(), h2.driver.libvirt().clone());
    let (plugger, moved) = (h2.plugger.clone(), ports.clone());
    c.peers.insert(StagedPeer::over(
        &c.peers,
        "h2",
        Box::new(move |real, instance, request| {
            let (from, to) = (from.clone(), to.clone());
            let (plugger, moved) = (plugger.clone(), moved.clone());
            Box::pin(async move {
                let moves = matches!(request, Operation::PreLiveMigration { .. });
                let reply = real.request(instance, request).await?;
                if moves {
                    deliver_guest(&from, &to, instance, |xml| xml).await;
                    plugger.devices_attached(&moved).await;
                }
                Ok(reply)
            })
        }),
    ));
    let report = h1
        .driver
        .live_migrate(id, lm("h2"))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let failed: Vec<_> = report.steps.iter().filter(|s| s.failed).collect();
    assert!(
        failed.iter().any(|s| s.name == "migrate"),
        "the call failed: {failed:?}"
    );
    assert!(
        !step_names(&report)
            .iter()
            .any(|n| n.starts_with("rollback-live-migration-at-destination")),
        "{report:#?}"
    );
    assert!(h1.driver.show(id).await.is_err(), "h1 holds nothing");
    assert!(
        !c.migration_entry("h1", id).exists(),
        "the journal entry is gone"
    );
    let on_h2 = h2.driver.show(id).await.unwrap();
    assert_eq!(on_h2.state, InstanceState::Running);
    assert_eq!(
        owner_of(h2.driver.libvirt(), id).await.as_deref(),
        Some("h2")
    );
    for p in &ports {
        let port = c.port(*p).await;
        assert_eq!(port.host_id, "h2", "{port:?}");
        assert_eq!(port.migrating_to(), None, "{port:?}");
        assert_eq!(c.network.show_bindings(*p).await.unwrap().len(), 1);
    }
    c.destroy_everywhere(id).await;
    c.assert_clean(&ports).await;
    c.delete_ports(&ports).await;
}
