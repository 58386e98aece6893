//! Recovery after the agent dies mid-operation. The agent's actor system is dropped with an
//! operation running (no rollback runs); libvirt's test driver keeps its state per
//! connection, so the domains are carried over the way a real libvirtd keeps them: dumped
//! (with their vireo `<metadata>`) into the node file of the restarted host's new
//! connection, in the state they were in. The network service and the host's devices (the
//! recording plugger) survive, as Neutron and the host's kernel do. The restarted agent
//! rebuilds its instance actors from libvirt and finishes or rolls back what was in flight.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod faults_support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use vireo::compute::{ComputeDriver, ComputeOps};
use vireo_actors::instance::{
    AdmissionError, BuildEntry, BuildJournal, DestroyArgs, InstanceError, InstanceReply, Migration,
    NetworkRequest, Operation, PeerHost, RebootKind, ResizeArgs,
};
use vireo_actors::lifecycle::InstanceState;
use vireo_actors::network::{NetworkApi, PortStatus, PortUpdate};
use vireo_actors::plug::testing::RecordingPlugger;
use vireo_actors::plug::VifPlugger;
use vireo_actors::vif::NetworkInfo;

/// A compute agent that accepts requests and never answers.
#[derive(Debug)]
struct HungPeer(String);

#[async_trait]
impl PeerHost for HungPeer {
    fn name(&self) -> &str {
        &self.0
    }

    fn migration_uri(&self) -> Option<String> {
        Some("test:///nonexistent.xml".into())
    }

    async fn request(
        &self,
        _instance: uuid::Uuid,
        _request: Operation,
    ) -> Result<InstanceReply, InstanceError> {
        futures::future::pending().await
    }
}

/// h2 exists for the network service (its L2 agent binds ports) but its compute agent hangs.
async fn hung_h2(c: &TestCloud) {
    let devices = RecordingPlugger::new();
    let (n, w) = (c.network.clone(), devices.wiring());
    on_thread(&c.system, move || n.attach_host("h2", w))
        .await
        .unwrap();
    c.peers.insert(Arc::new(HungPeer("h2".into())));
}

/// Kill the agent while `op` runs (it is at `phase`), bring it back on the same domains.
async fn crash_and_restart(
    c: TestCloud,
    op: tokio::task::JoinHandle<Result<vireo_actors::instance::OpReport, InstanceError>>,
    id: uuid::Uuid,
    phase: &str,
) -> TestCloud {
    at_phase(&c.host("h1").driver, id, phase).await;
    let domains = c.dump_domains().await;
    assert!(
        domains["h1"].contains("<vireo:operation"),
        "{}",
        domains["h1"]
    );
    op.abort();
    assert!(op.await.unwrap_err().is_cancelled());
    let remains = c.crash();
    TestCloud::restart(remains, domains).await
}

fn recovered(c: &TestCloud, id: uuid::Uuid) -> String {
    let report = c.host("h1").driver.recovery().clone();
    let found = report
        .instances
        .iter()
        .find(|i| i.uuid == id)
        .unwrap_or_else(|| panic!("{id} not recovered: {report:?}"));
    found.interrupted.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_interrupted_while_waiting_is_rolled_back_and_released() {
    let c = spec(&["h1"]).start().await;
    let id = uuid();
    // One port the build created (deleted on release), one the user brought whose event
    // never comes (unbound on release).
    let mut ni = c
        .network
        .allocate_for_instance(id, "h1", &[on(NET_HYBRID)])
        .await
        .unwrap();
    let created = ni.vifs[0].id;
    let (user, vif) = silent_port(&c, id, NET_NATIVE).await;
    ni.vifs.push(vif);
    ni.vifs[1].index = 1;
    let mut args = spawn_args("vm-crash-build", vec![]);
    args.network = NetworkRequest::Allocated(NetworkInfo { vifs: ni.vifs });
    let d = c.host("h1").driver.clone();
    let build = tokio::spawn(async move { d.spawn(id, args).await });
    let c = crash_and_restart(c, build, id, "wait for events").await;

    assert!(
        recovered(&c, id).starts_with("spawn/"),
        "{}",
        recovered(&c, id)
    );
    let h1 = c.host("h1");
    eventually(Duration::from_secs(5), "the build rolled back", || async {
        matches!(
            h1.driver.show(id).await,
            Err(InstanceError::Refused(AdmissionError::NotFound(_)))
        )
        .then_some(())
    })
    .await;
    assert!(
        c.network.port_status(created).is_none(),
        "created port kept"
    );
    c.assert_clean(&[user]).await;
    c.delete_ports(&[user]).await;
}

/// The build journal at start-up: a build that died before its domain existed has its ports
/// released on this host (the one it created deleted, the user's unbound), not the port a
/// rescheduled build of the same instance holds on another host; an entry whose domain
/// exists is only dropped (the domain is the record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_that_died_before_its_domain_has_its_ports_released_by_the_next_start() {
    let c = spec(&["h1", "h2"]).start().await;
    let (dead, alive) = (uuid(), uuid());
    let created = c
        .network
        .allocate_for_instance(dead, "h1", &[on(NET_HYBRID)])
        .await
        .unwrap()
        .vifs[0]
        .id;
    let user = c.user_port(NET_NATIVE).await;
    c.network
        .update_port(
            user,
            &PortUpdate {
                host_id: Some("h1".into()),
                device_id: Some(dead.to_string()),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
    let elsewhere = c
        .network
        .allocate_for_instance(dead, "h2", &[on(NET_HYBRID)])
        .await
        .unwrap()
        .vifs[0]
        .id;
    let h1 = c.host("h1").driver.clone();
    h1.spawn(alive, spawn_args("vm-journaled", vec![on(NET_NATIVE)]))
        .await
        .unwrap();
    let alive_port = h1.show(alive).await.unwrap().vifs[0].port;
    drop(h1);
    let journal = BuildJournal::open(c.journal_dir("h1")).unwrap();
    assert!(
        journal.pending().await.unwrap().is_empty(),
        "a finished build left its entry"
    );
    for (instance, user_ports) in [(dead, vec![user.0]), (alive, vec![])] {
        journal
            .begin(&BuildEntry {
                instance,
                host: "h1".into(),
                user_ports,
                allocated: true,
                build: None,
            })
            .await
            .unwrap();
    }

    let domains = c.dump_domains().await;
    let c = TestCloud::restart(c.crash(), domains).await;
    assert_eq!(c.host("h1").driver.recovery().released_builds, vec![dead]);
    assert!(journal.pending().await.unwrap().is_empty());
    assert!(
        c.network.port_status(created).is_none(),
        "created port kept"
    );
    let p = c.port(user).await;
    assert!(p.device_id.is_empty() && p.host_id.is_empty(), "{p:?}");
    let p = c.port(elsewhere).await;
    assert_eq!(
        (p.device_id, p.host_id),
        (dead.to_string(), "h2".to_owned())
    );
    let p = c.port(alive_port).await;
    assert_eq!(
        (p.device_id, p.host_id),
        (alive.to_string(), "h1".to_owned())
    );
    assert_eq!(
        c.host("h1").driver.show(alive).await.unwrap().state,
        InstanceState::Running
    );

    c.delete_ports(&[elsewhere]).await;
    c.destroy_and_assert_clean(&[alive], &[user]).await;
    c.delete_ports(&[user]).await;
}

/// The instances the build journal holds, sorted.
async fn pending(j: &BuildJournal) -> Vec<uuid::Uuid> {
    let mut ids: Vec<_> = j
        .pending()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.unwrap().instance)
        .collect();
    ids.sort();
    ids
}

/// A build whose rollback cannot release its networking (the service went down as it tried)
/// keeps its journal entry: a restart before anyone destroys the instance releases its ports,
/// and a destroy that releases them drops the entry. The entry used to go with the build, so
/// the ports of a build left in error were released only if the caller destroyed it before
/// the agent restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_whose_rollback_could_not_release_keeps_its_journal_entry() {
    use faults_support::{EventFault, EventRule, NetCall, NetFailure};
    let c = spec(&["h1"])
        .timeout(Duration::from_millis(300))
        .start()
        .await;
    let (kept, destroyed) = (uuid(), uuid());
    let user = c.user_port(NET_NATIVE).await;
    let journal = BuildJournal::open(c.journal_dir("h1")).unwrap();
    for (id, requests) in [
        (
            kept,
            vec![
                on(NET_HYBRID),
                vireo_actors::network::PortRequest::Port { port_id: user },
            ],
        ),
        (destroyed, vec![on(NET_HYBRID)]),
    ] {
        // Its events are lost (the build times out and rolls back); the service is down from
        // the release on.
        c.sink.set_event_fault(Some(EventRule {
            instance: id,
            fault: EventFault::Lost,
        }));
        let h1 = c.host("h1");
        h1.net.fail_with(NetCall::Deallocate, 0, NetFailure::Down);
        let e = h1
            .driver
            .spawn(id, spawn_args("vm-unreleased", requests))
            .await
            .unwrap_err();
        assert!(
            matches!(e, InstanceError::RollbackFailed { .. }),
            "{}",
            chain(&e)
        );
        h1.net.set_down(false);
        c.sink.set_event_fault(None);
        assert_eq!(
            h1.driver.show(id).await.unwrap().state,
            InstanceState::Error
        );
    }
    let mut both = vec![kept, destroyed];
    both.sort();
    assert_eq!(pending(&journal).await, both);
    // The caller destroys one: its ports released, its entry goes.
    c.host("h1")
        .driver
        .destroy(
            destroyed,
            DestroyArgs {
                deallocate_network: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(pending(&journal).await, vec![kept]);
    let created: Vec<_> = c
        .network
        .list_instance_ports(kept)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.id)
        .filter(|p| *p != user)
        .collect();
    assert_eq!(created.len(), 1);

    // The agent restarts before anyone destroyed the other.
    let domains = c.dump_domains().await;
    let c = TestCloud::restart(c.crash(), domains).await;
    assert_eq!(c.host("h1").driver.recovery().released_builds, vec![kept]);
    assert!(pending(&journal).await.is_empty());
    assert!(
        c.network.port_status(created[0]).is_none(),
        "created port kept"
    );
    let p = c.port(user).await;
    assert!(p.device_id.is_empty() && p.host_id.is_empty(), "{p:?}");
    c.assert_clean(&[user]).await;
    c.delete_ports(&[user]).await;
}

/// A build whose journal entry cannot be written allocates nothing: it fails at once (another
/// host may take it) rather than create ports a crash could leak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_that_cannot_be_journaled_allocates_nothing() {
    let c = spec(&["h1"]).start().await;
    let dir = c.journal_dir("h1");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, b"not a directory").unwrap();
    let id = uuid();
    let err = c
        .host("h1")
        .driver
        .spawn(id, spawn_args("vm-unjournaled", vec![on(NET_NATIVE)]))
        .await
        .unwrap_err();
    match &err {
        InstanceError::BuildFailed {
            reschedule: true,
            cause,
            ..
        } => assert!(
            matches!(**cause, InstanceError::Journal { step: "begin", .. }),
            "{}",
            chain(&err)
        ),
        other => panic!("{}", chain(other)),
    }
    assert!(c.network.list_instance_ports(id).await.unwrap().is_empty());
    std::fs::remove_file(&dir).unwrap();
    c.assert_clean(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_reboot_interrupted_while_waiting_is_finished() {
    let c = spec(&["h1"]).start().await;
    let id = uuid();
    let h1 = c.host("h1");
    h1.spawn_on(id, "vm-crash-reboot", vec![on(NET_HYBRID), on(NET_NATIVE)])
        .await;
    let native = ports_by_network(&c, &h1.driver.show(id).await.unwrap()).await[NET_NATIVE];
    // The native port's agent loses it: the reboot waits for its event forever.
    let away = PortUpdate {
        host_id: Some("elsewhere".into()),
        ..PortUpdate::default()
    };
    c.network.update_port(native, &away).await.unwrap();
    let d = h1.driver.clone();
    let reboot = tokio::spawn(async move { d.reboot(id, RebootKind::Hard).await });
    let c = crash_and_restart(c, reboot, id, "wait for events").await;
    assert!(
        recovered(&c, id).starts_with("reboot-hard/"),
        "{}",
        recovered(&c, id)
    );
    // The port is back on h1 in the meantime: the repeated reboot gets its event.
    let back = PortUpdate {
        host_id: Some("h1".into()),
        ..PortUpdate::default()
    };
    c.network.update_port(native, &back).await.unwrap();
    let h1 = c.host("h1");
    let view = eventually(Duration::from_secs(5), "the reboot finished", || async {
        let v = h1.driver.show(id).await.ok()?;
        (v.state == InstanceState::Running && v.operation.is_none() && v.last_operation.is_some())
            .then_some(v)
    })
    .await;
    let last = view.last_operation.unwrap();
    assert_eq!(last.request, "reboot-hard");
    assert!(last.waits.iter().all(|w| w.complete), "{last:#?}");
    assert_eq!(c.port(native).await.status, PortStatus::Active);
    // The metadata holds no operation any more.
    let xml = h1.driver.libvirt().xml_desc(id, false).await.unwrap();
    assert!(!xml.contains("<vireo:operation"), "{xml}");
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_migration_interrupted_before_the_guest_moved_is_rolled_back() {
    let c = spec(&["h1"]).start().await;
    hung_h2(&c).await;
    let id = uuid();
    let h1 = c.host("h1");
    h1.spawn_on(id, "vm-crash-lm", vec![on(NET_HYBRID), on(NET_NATIVE)])
        .await;
    let ports = ports(&h1.driver.show(id).await.unwrap());
    let d = h1.driver.clone();
    let lm = tokio::spawn(async move { d.live_migrate(id, lm("h2")).await });
    at_phase(&h1.driver, id, "pre-wire the destination").await;
    for p in &ports {
        assert_eq!(c.port(*p).await.migrating_to(), Some("h2"));
        assert_eq!(c.network.show_bindings(*p).await.unwrap().len(), 2);
    }
    let c = crash_and_restart(c, lm, id, "pre-wire the destination").await;
    assert!(
        recovered(&c, id).starts_with("live-migrate/"),
        "{}",
        recovered(&c, id)
    );
    let h1 = c.host("h1");
    eventually(
        Duration::from_secs(5),
        "the migration rolled back",
        || async {
            let v = h1.driver.show(id).await.ok()?;
            (v.operation.is_none() && v.last_operation.as_ref()?.request == "recover").then_some(())
        },
    )
    .await;
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    for p in &ports {
        let port = c.port(*p).await;
        assert_eq!(port.migrating_to(), None, "{port:?}");
        assert_eq!(port.host_id, "h1");
        let bindings = c.network.show_bindings(*p).await.unwrap();
        assert_eq!(bindings.len(), 1, "{bindings:?}");
    }
    c.destroy_everywhere(id).await;
    assert!(c.network.detach_host("h2"));
    c.assert_clean(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_interrupted_at_the_handover_waits_for_confirm_or_revert() {
    let c = spec(&["h1"]).start().await;
    hung_h2(&c).await;
    let id = uuid();
    let h1 = c.host("h1");
    h1.spawn_on(id, "vm-crash-resize", vec![on(NET_HYBRID), on(NET_NATIVE)])
        .await;
    let d = h1.driver.clone();
    let resize = tokio::spawn(async move {
        d.resize(
            id,
            ResizeArgs::of(
                &Migration {
                    id: uuid(),
                    source_host: "h1".into(),
                    dest_host: "h2".into(),
                },
                flavor("m1.small", 2, 512),
            ),
        )
        .await
    });
    let c = crash_and_restart(c, resize, id, "finish on destination").await;
    assert!(
        recovered(&c, id).starts_with("resize/"),
        "{}",
        recovered(&c, id)
    );
    let h1 = c.host("h1");
    eventually(Duration::from_secs(5), "resize-source", || async {
        let v = h1.driver.show(id).await.ok()?;
        (v.state == InstanceState::ResizeSource && v.operation.is_none()).then_some(())
    })
    .await;
    // The destination never finished: the instance is brought back here.
    h1.driver
        .complete(id, Operation::FinishRevertResize { caller: None })
        .await
        .unwrap();
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.flavor.as_deref(), Some("m1.tiny"));
    h1.driver
        .destroy(
            id,
            DestroyArgs {
                deallocate_network: true,
            },
        )
        .await
        .unwrap();
    assert!(c.network.detach_host("h2"));
    c.assert_clean(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_interrupted_on_both_hosts_is_reverted_to_the_source() {
    let c = spec(&["h1", "h2"]).start().await;
    let id = uuid();
    let h1 = c.host("h1");
    h1.spawn_on(id, "vm-crash-both", vec![on(NET_HYBRID), on(NET_NATIVE)])
        .await;
    let ports = ports(&h1.driver.show(id).await.unwrap());
    // h2's L2 agent is gone: its finish waits for events that never come.
    assert!(c.network.detach_host("h2"));
    let d = h1.driver.clone();
    let resize = tokio::spawn(async move {
        d.resize(
            id,
            ResizeArgs::of(
                &Migration {
                    id: uuid(),
                    source_host: "h1".into(),
                    dest_host: "h2".into(),
                },
                flavor("m1.small", 2, 512),
            ),
        )
        .await
    });
    at_phase(&c.host("h2").driver, id, "wait for events").await;
    at_phase(&c.host("h1").driver, id, "finish on destination").await;
    let domains = c.dump_domains().await;
    resize.abort();
    assert!(resize.await.unwrap_err().is_cancelled());
    // Both agents die; both come back (h2 with its L2 agent again).
    let c = TestCloud::restart(c.crash(), domains).await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    // h2 removes the half-finished copy and has h1 bring the instance back.
    let view = eventually(
        Duration::from_secs(5),
        "the instance back on h1",
        || async {
            let v = h1.driver.show(id).await.ok()?;
            (v.state == InstanceState::Running && v.operation.is_none()).then_some(v)
        },
    )
    .await;
    assert_eq!(view.flavor.as_deref(), Some("m1.tiny"));
    eventually(Duration::from_secs(5), "nothing on h2", || async {
        (matches!(
            h2.driver.show(id).await,
            Err(InstanceError::Refused(AdmissionError::NotFound(_)))
        ) && h2.driver.libvirt().list_all().await.ok()?.is_empty()
            && h2.plugger.plugged().is_empty())
        .then_some(())
    })
    .await;
    for p in &ports {
        let port = c.port(*p).await;
        assert_eq!(port.host_id, "h1", "{port:?}");
    }
    c.destroy_and_assert_clean(&[id], &[]).await;
}

/// `dump` (the domains of one host, as [`TestCloud::dump_domains`] writes them) with the
/// record of domain `id` naming `owner` instead of `from` (`None`: no owner at all, as
/// metadata written before vireo recorded it). Exactly one record changes.
fn with_owner(dump: &str, id: uuid::Uuid, from: &str, owner: Option<&str>) -> String {
    let mut out = String::new();
    let mut changed = 0;
    for chunk in dump.split_inclusive("</domain>") {
        if !chunk.contains(&format!("<uuid>{id}</uuid>")) {
            out.push_str(chunk);
            continue;
        }
        let mut chunk = chunk.to_owned();
        for q in ["\"", "&quot;"] {
            let field = format!("{q}host{q}:{q}{from}{q}");
            if !chunk.contains(&field) {
                continue;
            }
            chunk = match owner {
                Some(o) => chunk.replacen(&field, &format!("{q}host{q}:{q}{o}{q}"), 1),
                None if chunk.contains(&format!("{field},")) => {
                    chunk.replacen(&format!("{field},"), "", 1)
                }
                None => chunk.replacen(&format!(",{field}"), "", 1),
            };
            changed += 1;
        }
        out.push_str(&chunk);
    }
    assert_eq!(changed, 1, "the record of {id} names no {from}: {dump}");
    out
}

/// Another agent on the same libvirtd (a benchmark next to a test) owns a domain whose build
/// it is in the middle of: this host's recovery leaves it exactly as it is. Once the record
/// names this host, the same interrupted build is this host's to roll back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_another_host_owns_is_left_alone_by_recovery() {
    let c = spec(&["h1"]).start().await;
    let id = uuid();
    let (user, vif) = silent_port(&c, id, NET_NATIVE).await;
    let mut args = spawn_args("vm-crash-other", vec![]);
    args.network = NetworkRequest::Allocated(NetworkInfo { vifs: vec![vif] });
    let d = c.host("h1").driver.clone();
    let build = tokio::spawn(async move { d.spawn(id, args).await });
    at_phase(&c.host("h1").driver, id, "wait for events").await;
    let before = c.port(user).await;
    let mut domains = c.dump_domains().await;
    build.abort();
    assert!(build.await.unwrap_err().is_cancelled());
    let ours = domains["h1"].clone();
    domains.insert("h1".into(), with_owner(&ours, id, "h1", Some("h-bench")));
    let c = TestCloud::restart(c.crash(), domains).await;

    let h1 = c.host("h1");
    let report = h1.driver.recovery().clone();
    assert_eq!(report.other_hosts, vec![(id, "h-bench".to_owned())]);
    assert!(report.instances.iter().all(|i| i.uuid != id), "{report:?}");
    assert!(matches!(
        h1.driver.show(id).await,
        Err(InstanceError::Refused(AdmissionError::NotFound(_)))
    ));
    assert!(h1.driver.list().await.iter().all(|v| v.uuid != id));
    // A resync (what a libvirt reconnect runs) leaves it alone too.
    let again = h1.driver.host_handle().recover().await.unwrap();
    assert_eq!(again.other_hosts, vec![(id, "h-bench".to_owned())]);
    assert!(again.instances.is_empty(), "{again:?}");
    // Untouched: still defined, still paused mid-build, its operation still recorded, its
    // port as the build left it.
    let lv = h1.driver.libvirt();
    let domain = lv
        .list_all()
        .await
        .unwrap()
        .into_iter()
        .find(|d| d.uuid == id)
        .expect("the other host's domain is gone");
    assert_eq!(domain.state, vireo_actors::libvirt::DomainState::Paused);
    let xml = lv.xml_desc(id, false).await.unwrap();
    assert!(xml.contains("<vireo:operation"), "{xml}");
    assert!(xml.contains("h-bench"), "{xml}");
    let port = c.port(user).await;
    assert_eq!(port.device_id, id.to_string());
    assert_eq!(
        (&port.host_id, port.status, &port.profile),
        (&before.host_id, before.status, &before.profile)
    );

    // The same domain recorded as this host's: adopted and its build rolled back.
    let mut domains = c.dump_domains().await;
    let theirs = domains["h1"].clone();
    domains.insert("h1".into(), with_owner(&theirs, id, "h-bench", Some("h1")));
    let c = TestCloud::restart(c.crash(), domains).await;
    assert!(c.host("h1").driver.recovery().other_hosts.is_empty());
    assert!(
        recovered(&c, id).starts_with("spawn/"),
        "{}",
        recovered(&c, id)
    );
    let h1 = c.host("h1");
    eventually(Duration::from_secs(5), "the build rolled back", || async {
        matches!(
            h1.driver.show(id).await,
            Err(InstanceError::Refused(AdmissionError::NotFound(_)))
        )
        .then_some(())
    })
    .await;
    c.assert_clean(&[user]).await;
    c.delete_ports(&[user]).await;
}

/// A domain this host saved and one whose record names no host (metadata written before
/// vireo recorded the owner) are both adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domains_of_this_host_and_of_no_recorded_host_are_adopted() {
    let c = spec(&["h1"]).start().await;
    let (mine, old) = (uuid(), uuid());
    let h1 = c.host("h1");
    for (id, name) in [(mine, "vm-owned-mine"), (old, "vm-owned-none")] {
        h1.spawn_on(id, name, vec![on(NET_HYBRID)]).await;
    }
    let mut domains = c.dump_domains().await;
    let dump = domains["h1"].clone();
    assert!(dump.contains("h1"), "{dump}");
    domains.insert("h1".into(), with_owner(&dump, old, "h1", None));
    let c = TestCloud::restart(c.crash(), domains).await;

    let h1 = c.host("h1");
    let report = h1.driver.recovery().clone();
    assert!(report.other_hosts.is_empty(), "{report:?}");
    let mut adopted: Vec<_> = report.instances.iter().map(|i| i.uuid).collect();
    adopted.sort();
    let mut both = vec![mine, old];
    both.sort();
    assert_eq!(adopted, both);
    for id in [mine, old] {
        assert_eq!(
            h1.driver.show(id).await.unwrap().state,
            InstanceState::Running
        );
    }
    // The next save names this host.
    h1.driver.power_off(old, None).await.unwrap();
    let xml = h1.driver.libvirt().xml_desc(old, false).await.unwrap();
    with_owner(&xml, old, "h1", Some("h1"));
    for id in [mine, old] {
        c.destroy_everywhere(id).await;
    }
    c.assert_clean(&[]).await;
}

/// h2's agent as [`stalled_after_prepare`] stages it: it runs pre-live-migration for real,
/// then holds the source there (it never answers again): the destination is prepared, the
/// source has not migrated (the test driver cannot) nor rolled back.
fn prepared_then_silent(c: &TestCloud, prepared: Arc<tokio::sync::Notify>) -> Arc<StagedPeer> {
    StagedPeer::over(
        &c.peers,
        "h2",
        Box::new(move |real, instance, request| {
            let prepared = prepared.clone();
            Box::pin(async move {
                if matches!(request, Operation::PreLiveMigration { .. }) {
                    real.request(instance, request).await?;
                    prepared.notify_one();
                }
                futures::future::pending().await
            })
        }),
    )
}

/// The destination's agent dies while the guest migrates to it (libvirt moves the domain
/// without it) and starts again before the source hands the guest over. The restarted
/// destination finds a domain whose record names the source: it used to leave it alone, so
/// the source's post-live-migration got NotFound and the guest ran with nobody owning it.
/// It is adopted as the incoming guest instead, and the hand-over completes; asked again
/// after a second restart (the answer lost), it is done already.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_that_arrived_while_the_destination_was_down_is_handed_over() {
    let c = spec(&["h1", "h2"]).start().await;
    let Stalled {
        id,
        ports,
        migration,
        op,
        ..
    } = stalled_after_prepare(&c, "vm-crash-arrive").await;
    let h2 = c.host("h2");
    assert_eq!(
        h2.driver.show(id).await.unwrap().state,
        InstanceState::Incoming
    );
    // libvirt moved the domain (with the source's metadata, the migration in flight) to h2.
    let mut domains = c.dump_domains().await;
    let moved = move_domain(&mut domains, id);
    assert!(moved.contains("<vireo:operation"), "{moved}");
    op.abort();
    assert!(op.await.unwrap_err().is_cancelled());
    // This test plays the source's part by hand (the hand-over below, as a source whose
    // agent stayed up does): the source's live-migration journal entry goes, or its
    // restart would hand the guest over itself (the next test).
    std::fs::remove_file(c.migration_entry("h1", id)).unwrap();
    let c = TestCloud::restart(c.crash(), domains).await;
    let h2 = c.host("h2");

    let report = h2.driver.recovery().clone();
    let found = report.instances.iter().find(|i| i.uuid == id);
    assert_eq!(
        found.map(|i| (i.state, i.interrupted.clone())),
        Some((
            InstanceState::Incoming,
            Some("live-migrate/incoming from h1".to_owned())
        )),
        "{report:?}"
    );
    assert!(report.other_hosts.is_empty(), "{report:?}");
    // The guest runs on h2: libvirt made its taps (the test driver does not).
    h2.plugger.devices_attached(&ports).await;
    // The source hands the guest over.
    hand_over(&*h2.driver, id, &migration).await.unwrap();
    assert_eq!(
        h2.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    assert_eq!(
        owner_of(h2.driver.libvirt(), id).await.as_deref(),
        Some("h2")
    );
    for p in &ports {
        assert_eq!(c.port(*p).await.host_id, "h2");
    }
    // h2's agent dies once it saved the guest as its own, before the source heard back: the
    // restarted agent, asked again, says the hand-over is done (it used to refuse it as
    // illegal while running, and the source reported a failed migration of a guest that
    // ran on h2). Another migration's hand-over is still refused.
    let domains = c.dump_domains().await;
    let c = TestCloud::restart(c.crash(), domains).await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let again = hand_over(&*h2.driver, id, &migration)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let InstanceReply::Done { state, .. } = again;
    assert_eq!(state, InstanceState::Running);
    let other = Migration {
        id: uuid(),
        ..migration.clone()
    };
    let refused = hand_over(&*h2.driver, id, &other).await.unwrap_err();
    assert_eq!(refused.code(), "illegal-state", "{}", chain(&refused));
    assert_eq!(
        h2.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    // What the source's clean-up does after a hand-over (its agent was restarted too here).
    for p in &ports {
        remove_port_devices(&c, "h1", id, "vm-crash-arrive", *p).await;
        c.network.delete_binding(*p, "h1").await.unwrap();
    }
    let probe = vireo_actors::storage::migration_probe(migration.id);
    std::fs::remove_file(c.instances_dir("h1").join(probe)).unwrap();
    assert!(h1.driver.show(id).await.is_err());
    c.destroy_everywhere(id).await;
    c.assert_clean(&[]).await;
}

/// The source's agent is killed while libvirt migrates the guest, and stays down until the
/// guest has left: libvirt ran the peer-to-peer migration on without it and undefined the
/// domain here. The restarted source used to find no domain and nothing else: the
/// destination held the guest as incoming with nobody to hand it over, and the source's
/// devices, port bindings and probe stayed. The source journals the migration before it
/// starts; its restart recovers the migration from the entry — the destination takes the
/// guest over, the source cleans up — and drops the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_migration_whose_source_was_down_until_the_guest_left_is_handed_over() {
    let c = spec(&["h1", "h2"]).start().await;
    let Stalled {
        id,
        ports,
        migration,
        op,
        ..
    } = stalled_after_prepare(&c, "vm-crash-left").await;
    assert!(c.migration_entry("h1", id).exists());
    // libvirt moved the domain to h2 (with the source's metadata) and undefined it on h1;
    // the guest runs on h2, whose libvirt made its taps.
    let mut domains = c.dump_domains().await;
    move_domain(&mut domains, id);
    c.host("h2").plugger.devices_attached(&ports).await;
    op.abort();
    assert!(op.await.unwrap_err().is_cancelled());
    let c = TestCloud::restart(c.crash(), domains).await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));

    let report = h1.driver.recovery().clone();
    let found = report.instances.iter().find(|i| i.uuid == id);
    assert_eq!(
        found.map(|i| i.interrupted.clone()),
        Some(Some("live-migrate/prepare".to_owned())),
        "{report:?}"
    );
    eventually(Duration::from_secs(10), "the guest handed over", || async {
        (h2.driver.show(id).await.ok()?.state == InstanceState::Running
            && h1.driver.show(id).await.is_err())
        .then_some(())
    })
    .await;
    assert_eq!(
        owner_of(h2.driver.libvirt(), id).await.as_deref(),
        Some("h2")
    );
    for p in &ports {
        let port = c.port(*p).await;
        assert_eq!(port.host_id, "h2");
        assert_eq!(port.migrating_to(), None, "{port:?}");
        let bindings = c.network.show_bindings(*p).await.unwrap();
        assert_eq!(bindings.len(), 1, "{bindings:?}");
    }
    assert!(!c.migration_entry("h1", id).exists());
    let probe = vireo_actors::storage::migration_probe(migration.id);
    assert!(!c.instances_dir("h1").join(probe).exists());
    c.destroy_everywhere(id).await;
    c.assert_clean(&[]).await;
}

/// The guest arrived on the destination (libvirt switched it over) and a rollback is asked of
/// the destination anyway — by a source whose migrate call failed after the switch-over, or
/// by Nova after such a failure. The destination used to destroy the guest it ran, and the
/// source's domain was gone: the instance was lost on both hosts. It refuses now (the guest
/// runs: it arrived), keeps the guest as incoming, and the hand-over still takes it; the
/// source's restart, from its journal entry, finds the hand-over done and cleans up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_asked_of_a_destination_that_runs_the_guest_is_refused() {
    let c = spec(&["h1", "h2"]).start().await;
    let Stalled {
        id,
        ports,
        migration,
        op,
        handover,
    } = stalled_after_prepare(&c, "vm-arrived-rb").await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    // libvirt's job delivers the guest: running on h2, gone from h1.
    let to = h2.driver.libvirt();
    deliver_guest(h1.driver.libvirt(), to, id, |xml| xml).await;
    h2.plugger.devices_attached(&ports).await;

    let refused = h2
        .driver
        .complete(
            id,
            Operation::RollbackLiveMigrationAtDestination {
                handover: Box::new(handover),
                do_cleanup: true,
                destroy_disks: true,
                migration_id: Some(migration.id),
                caller: None,
            },
        )
        .await
        .unwrap_err();
    assert!(
        chain(&refused).contains("runs on h2 already"),
        "{}",
        chain(&refused)
    );
    assert!(
        to.is_active(id).await.unwrap(),
        "the guest still runs on h2"
    );
    assert_eq!(
        h2.driver.show(id).await.unwrap().state,
        InstanceState::Incoming
    );
    hand_over(&*h2.driver, id, &migration)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(
        h2.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    // The source (hung in its flow) restarts: its journal entry finds the hand-over done.
    let domains = c.dump_domains().await;
    op.abort();
    assert!(op.await.unwrap_err().is_cancelled());
    let c = TestCloud::restart(c.crash(), domains).await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    eventually(Duration::from_secs(10), "the source cleaned up", || async {
        h1.driver.show(id).await.is_err().then_some(())
    })
    .await;
    assert_eq!(
        h2.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    for p in &ports {
        assert_eq!(c.port(*p).await.host_id, "h2");
        assert_eq!(c.network.show_bindings(*p).await.unwrap().len(), 1);
    }
    c.destroy_everywhere(id).await;
    c.assert_clean(&[]).await;
}

/// A live migration h1 → h2 stalled once h2 is prepared (h2's agent never answers again).
struct Stalled {
    id: uuid::Uuid,
    ports: Vec<vireo_actors::vif::PortId>,
    migration: Migration,
    /// The migration's caller (it never returns).
    op: tokio::task::JoinHandle<Result<vireo_actors::instance::OpReport, InstanceError>>,
    /// The instance's handover, as h1 had it before the migration.
    handover: vireo_actors::instance::Handover,
}

/// Spawn `name` on h1 on two ports and start its live migration to h2 through
/// [`prepared_then_silent`]; returns once h2 is prepared (it holds the incoming instance).
async fn stalled_after_prepare(c: &TestCloud, name: &str) -> Stalled {
    let id = uuid();
    let h1 = c.host("h1");
    h1.spawn_on(id, name, vec![on(NET_HYBRID), on(NET_NATIVE)])
        .await;
    let view = h1.driver.show(id).await.unwrap();
    let prepared = Arc::new(tokio::sync::Notify::new());
    c.peers.insert(prepared_then_silent(c, prepared.clone()));
    let args = lm("h2");
    let migration = args.migration("h1");
    let d = h1.driver.clone();
    let op = tokio::spawn(async move { d.live_migrate(id, args).await });
    prepared.notified().await;
    Stalled {
        id,
        ports: ports(&view),
        migration,
        op,
        handover: view.handover.unwrap(),
    }
}

/// What libvirt's peer-to-peer job does to a dump of both hosts' domains: `id`'s domain
/// (with the source's metadata) moves from h1 to h2. Returns it.
fn move_domain(domains: &mut std::collections::BTreeMap<String, String>, id: uuid::Uuid) -> String {
    let moved = domain_of(&domains["h1"], id);
    let rest = domains["h1"].replace(&moved, "");
    domains.insert("h1".into(), rest);
    domains.get_mut("h2").unwrap().push_str(&moved);
    moved
}

/// The source's hand-over of a live-migrated guest to the destination `driver`.
async fn hand_over(
    driver: &dyn ComputeDriver,
    id: uuid::Uuid,
    migration: &Migration,
) -> Result<InstanceReply, InstanceError> {
    driver
        .complete(
            id,
            Operation::PostLiveMigrationAtDestination {
                migration: migration.clone(),
                caller: None,
            },
        )
        .await
}

/// The `<domain>` element of `id` in a [`TestCloud::dump_domains`] dump.
fn domain_of(dump: &str, id: uuid::Uuid) -> String {
    dump.split_inclusive("</domain>\n")
        .find(|chunk| chunk.contains(&format!("<uuid>{id}</uuid>")))
        .unwrap_or_else(|| panic!("{id} not in {dump}"))
        .to_owned()
}
