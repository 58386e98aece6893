//! A build that fails on this host leaves nothing behind and releases its networking before
//! it reports that the build may be rescheduled — whichever step failed (plugging of every
//! VIF kind, libvirt, the event wait, the network service) and for ports vireo created
//! (deleted) and user-supplied ones (unbound: no host, no device id/owner, no PCI keys).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod faults_support;

use std::time::{Duration, Instant};

use common::*;
use vireo::compute::{ComputeDriver, ComputeOps};
use vireo_actors::instance::{AdmissionError, InstanceError, NetworkRequest, Released};
use vireo_actors::lifecycle::InstanceState;
use vireo_actors::network::{NetworkApi, PortRequest, PortStatus, PortUpdate, PCI_PROFILE_KEYS};
use vireo_actors::plug::testing::{CallOutcome, PlugOp};
use vireo_actors::plug::{DomainForm, PlugKind};
use vireo_actors::vif::{PortId, VnicType};

/// Give a user port the binding profile a PCI claim writes before a build.
async fn claim_pci(c: &TestCloud, port: PortId, vnic: VnicType, pci: &str) {
    let mut profile = serde_json::Map::new();
    profile.insert("pci_slot".into(), pci.into());
    profile.insert("pci_vendor_info".into(), "8086:154c".into());
    profile.insert("physical_network".into(), "physnet1".into());
    c.network
        .update_port(
            port,
            &PortUpdate {
                vnic_type: Some(vnic),
                profile: Some(profile),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
}

fn build_failed(e: &InstanceError) -> (bool, &Released) {
    match e {
        InstanceError::BuildFailed {
            reschedule,
            released,
            ..
        } => (*reschedule, released),
        other => panic!("not a build failure: {}", chain(other)),
    }
}

/// Nothing of instance `id` is on `host`; `user` ports are unbound, every other port of
/// the instance is gone.
async fn assert_released(c: &TestCloud, host: &str, id: uuid::Uuid, user: &[PortId]) {
    let h = c.host(host);
    assert!(h.driver.libvirt().list_all().await.unwrap().is_empty());
    assert!(h.plugger.plugged().is_empty(), "{:?}", h.plugger.plugged());
    assert!(matches!(
        h.driver.show(id).await,
        Err(InstanceError::Refused(AdmissionError::NotFound(_)))
    ));
    for p in c.network.ports() {
        assert!(user.contains(&p.id), "port {} left: {p:?}", p.id);
        assert!(p.host_id.is_empty(), "{p:?}");
        assert!(p.device_id.is_empty(), "{p:?}");
        assert!(p.device_owner.is_empty(), "{p:?}");
        for k in PCI_PROFILE_KEYS {
            assert!(!p.profile.contains_key(k), "{k} kept: {p:?}");
        }
    }
    // Every port plugged for the instance was unplugged afterwards.
    let calls = h.plugger.calls();
    for (i, call) in calls.iter().enumerate() {
        if call.instance_uuid == id && call.op == PlugOp::Plug && call.outcome == CallOutcome::Done
        {
            assert!(
                calls[i..].iter().any(|later| later.port == call.port
                    && later.op == PlugOp::Unplug
                    && later.outcome == CallOutcome::Done),
                "{:?} never unplugged",
                call.port
            );
        }
    }
    assert_eq!(c.stats().await.waits_now, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_failing_at_every_plug_step_of_every_kind_is_released() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let native = c.user_port(NET_NATIVE).await;
    let vf = c.user_port(NET_SRIOV).await;
    let macvtap = c.user_port(NET_SRIOV).await;
    let pf = c.user_port(NET_SRIOV).await;
    let user = [native, vf, macvtap, pf];
    let mut builds = 0;
    for kind in [
        PlugKind::OvsHybrid,
        PlugKind::OvsNative,
        PlugKind::LinuxBridge,
        PlugKind::SriovVf,
        PlugKind::SriovMacvtap,
        PlugKind::SriovPf,
    ] {
        for step in kind.plug_steps(DomainForm::LibvirtManaged) {
            claim_pci(&c, vf, VnicType::Direct, "0000:81:00.1").await;
            claim_pci(&c, macvtap, VnicType::Macvtap, "0000:81:00.2").await;
            claim_pci(&c, pf, VnicType::DirectPhysical, "0000:82:00.0").await;
            let id = uuid();
            // Arm the fault for the port of `kind` once the ports exist: plug runs in
            // network_info order, so the ports before it get plugged first.
            let port = match kind {
                PlugKind::OvsNative => Some(native),
                PlugKind::SriovVf => Some(vf),
                PlugKind::SriovMacvtap => Some(macvtap),
                PlugKind::SriovPf => Some(pf),
                _ => None, // hybrid and Linux bridge ports are created by the build
            };
            h1.plugger.faults().clear();
            h1.plugger
                .faults()
                .inject(vireo_actors::plug::testing::InjectedFault {
                    step: *step,
                    port,
                    mode: vireo_actors::plug::testing::FaultMode::Once,
                });
            let requests = vec![
                on(NET_HYBRID),
                PortRequest::Port { port_id: native },
                PortRequest::Port { port_id: vf },
                PortRequest::Port { port_id: macvtap },
                PortRequest::Port { port_id: pf },
                on(NET_LB),
            ];
            let e = h1
                .driver
                .spawn(id, spawn_args(&format!("vm-plug-{builds}"), requests))
                .await
                .unwrap_err();
            let (reschedule, released) = build_failed(&e);
            assert!(reschedule, "{}", chain(&e));
            assert!(chain(&e).contains("injected"), "{}", chain(&e));
            assert_eq!(released.deleted.len(), 2, "{released:?}");
            assert_eq!(set(released.unbound.clone()), set(user), "{released:?}");
            assert_released(&c, "h1", id, &user).await;
            builds += 1;
        }
    }
    assert_eq!(builds, 13);
    c.assert_clean(&user).await;
    c.delete_ports(&user).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_refused_by_libvirt_or_with_a_bad_flavor_is_released() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let user = c.user_port(NET_LB).await;

    // libvirt refuses the definition: another domain has the name. Another host may try.
    let squatter = uuid();
    h1.driver
        .libvirt()
        .define_xml(
            format!(
                "<domain type='test'><name>vm-taken</name><uuid>{squatter}</uuid>\
                 <memory>65536</memory><vcpu>1</vcpu><os><type>hvm</type></os></domain>"
            ),
            false,
        )
        .await
        .unwrap();
    let id = uuid();
    let e = h1
        .driver
        .spawn(
            id,
            spawn_args(
                "vm-taken",
                vec![on(NET_HYBRID), PortRequest::Port { port_id: user }],
            ),
        )
        .await
        .unwrap_err();
    let (reschedule, released) = build_failed(&e);
    assert!(reschedule, "{}", chain(&e));
    assert!(chain(&e).contains("define"), "{}", chain(&e));
    assert_eq!(released.unbound, vec![user]);
    let domains = h1.driver.libvirt().list_all().await.unwrap();
    assert_eq!(domains.len(), 1);
    assert_eq!(domains[0].uuid, squatter, "the other domain is left alone");
    h1.driver.libvirt().undefine(squatter).await.unwrap();
    assert_released(&c, "h1", id, &[user]).await;

    // A flavor no host can build: not reschedulable, released all the same.
    let id = uuid();
    let mut args = spawn_args(
        "vm-badflavor",
        vec![on(NET_NATIVE), PortRequest::Port { port_id: user }],
    );
    args.flavor.memory_mb = 0;
    let e = h1.driver.spawn(id, args).await.unwrap_err();
    let (reschedule, released) = build_failed(&e);
    assert!(!reschedule, "{}", chain(&e));
    assert_eq!(released.deleted.len(), 1);
    assert_released(&c, "h1", id, &[user]).await;

    c.assert_clean(&[user]).await;
    c.delete_ports(&[user]).await;
}

async fn silent_request(c: &TestCloud, id: uuid::Uuid) -> (PortId, NetworkRequest) {
    let (p, vif) = silent_port(c, id, NET_NATIVE).await;
    (
        p,
        NetworkRequest::Allocated(vireo_actors::vif::NetworkInfo { vifs: vec![vif] }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_whose_event_never_comes_times_out_and_is_released() {
    let c = spec(&["h1"])
        .timeout(Duration::from_millis(200))
        .start()
        .await;
    let h1 = c.host("h1");
    let id = uuid();
    let (p, network) = silent_request(&c, id).await;
    let mut args = spawn_args("vm-timeout", vec![]);
    args.network = network;
    let t0 = Instant::now();
    let e = h1.driver.spawn(id, args).await.unwrap_err();
    let took = t0.elapsed();
    let (reschedule, released) = build_failed(&e);
    assert!(reschedule);
    assert!(chain(&e).contains("timed out"), "{}", chain(&e));
    assert!(chain(&e).contains(&p.to_string()), "{}", chain(&e));
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(released.unbound, vec![p]);
    assert_released(&c, "h1", id, &[p]).await;
    assert_eq!(c.stats().await.timeouts, 1);
    c.assert_clean(&[p]).await;
    c.delete_ports(&[p]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_whose_port_fails_is_released() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1").driver.clone();
    let id = uuid();
    let (p, network) = silent_request(&c, id).await;
    let mut args = spawn_args("vm-failed", vec![]);
    args.network = network;
    let build = tokio::spawn(async move { h1.spawn(id, args).await });
    let view = at_phase(&c.host("h1").driver, id, "wait for events").await;
    assert_eq!(view.state, InstanceState::Building);
    assert_eq!(view.operation.unwrap().waiting_for.len(), 1);
    // The agent cannot wire it: ERROR, `network-vif-plugged` `failed`.
    c.network.set_port_error(p).unwrap();
    let e = build.await.unwrap().unwrap_err();
    let (reschedule, _) = build_failed(&e);
    assert!(reschedule);
    assert!(chain(&e).contains("status failed"), "{}", chain(&e));
    assert_released(&c, "h1", id, &[p]).await;
    c.assert_clean(&[p]).await;
    c.delete_ports(&[p]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_fatal_wait_proceeds_without_the_event() {
    let mut s = spec(&["h1"]).timeout(Duration::from_millis(200));
    s.instances.wait.fatal = false;
    let c = s.start().await;
    let h1 = c.host("h1");
    let id = uuid();
    let (p, network) = silent_request(&c, id).await;
    let mut args = spawn_args("vm-nonfatal", vec![]);
    args.network = network;
    let report = h1.driver.spawn(id, args).await.unwrap();
    let wait = report
        .waits
        .iter()
        .find(|w| !w.expected.is_empty())
        .unwrap();
    assert!(!wait.complete);
    assert_eq!(wait.missing, vec![p]);
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    c.destroy_and_assert_clean(&[id], &[p]).await;
    c.delete_ports(&[p]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_failing_at_allocation_leaves_no_port() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let user = c.user_port(NET_NATIVE).await;
    let bogus = "11111111-0000-4000-8000-0000000000ff";

    // The second network does not exist: the port created for the first is deleted, the
    // user port unbound again.
    for requests in [
        vec![on(NET_HYBRID), on(bogus)],
        vec![PortRequest::Port { port_id: user }, on(NET_LB), on(bogus)],
    ] {
        let id = uuid();
        let e = h1
            .driver
            .spawn(id, spawn_args("vm-alloc", requests))
            .await
            .unwrap_err();
        let (reschedule, _) = build_failed(&e);
        assert!(reschedule);
        assert!(chain(&e).contains("not found"), "{}", chain(&e));
        assert_released(&c, "h1", id, &[user]).await;
    }

    // SR-IOV on a network without a physical network: the binding fails.
    let direct = c.user_port(NET_NATIVE).await;
    claim_pci(&c, direct, VnicType::Direct, "0000:81:00.3").await;
    let id = uuid();
    let e = h1
        .driver
        .spawn(
            id,
            spawn_args(
                "vm-nobind",
                vec![on(NET_HYBRID), PortRequest::Port { port_id: direct }],
            ),
        )
        .await
        .unwrap_err();
    build_failed(&e);
    assert!(chain(&e).contains("binding"), "{}", chain(&e));
    assert_released(&c, "h1", id, &[user, direct]).await;

    // The service fails outright.
    h1.net.fail(NetCall::Allocate, 0);
    let id = uuid();
    let e = h1
        .driver
        .spawn(id, spawn_args("vm-503", vec![on(NET_HYBRID)]))
        .await
        .unwrap_err();
    assert!(build_failed(&e).0);
    assert_released(&c, "h1", id, &[user, direct]).await;

    c.assert_clean(&[user, direct]).await;
    c.delete_ports(&[user, direct]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_of_another_instance_is_left_to_it() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let other = uuid();
    h1.spawn_on(other, "vm-owner", vec![on(NET_NATIVE)]).await;
    let taken = ports(&h1.driver.show(other).await.unwrap())[0];
    let id = uuid();
    let e = h1
        .driver
        .spawn(
            id,
            spawn_args(
                "vm-thief",
                vec![on(NET_HYBRID), PortRequest::Port { port_id: taken }],
            ),
        )
        .await
        .unwrap_err();
    build_failed(&e);
    assert!(chain(&e).contains("in use"), "{}", chain(&e));
    let port = c.port(taken).await;
    assert_eq!(port.device_id, other.to_string());
    assert_eq!(port.host_id, "h1");
    assert_eq!(port.status, PortStatus::Active);
    assert_eq!(
        h1.driver.show(other).await.unwrap().state,
        InstanceState::Running
    );
    c.destroy_and_assert_clean(&[other], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_whose_release_fails_is_released_by_cleanup_for_reschedule() {
    use vireo_actors::plug::PlugStep;
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let user = c.user_port(NET_NATIVE).await;
    let id = uuid();
    h1.plugger
        .faults()
        .fail_once(PlugStep::OvsTransact, Some(user));
    h1.net.fail(NetCall::Deallocate, 0);
    let e = h1
        .driver
        .spawn(
            id,
            spawn_args(
                "vm-release",
                vec![on(NET_HYBRID), PortRequest::Port { port_id: user }],
            ),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, InstanceError::RollbackFailed { .. }),
        "{}",
        chain(&e)
    );
    // Host side cleaned; the networking is still held.
    assert!(h1.plugger.plugged().is_empty());
    assert!(h1.driver.libvirt().list_all().await.unwrap().is_empty());
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Error
    );
    assert_eq!(c.port(user).await.host_id, "h1");
    h1.driver.cleanup_for_reschedule(id).await.unwrap();
    assert_released(&c, "h1", id, &[user]).await;
    c.assert_clean(&[user]).await;
    c.delete_ports(&[user]).await;
}
