//! Resize and cold migration with confirm and revert, across hosts and on one host, on
//! libvirt's test driver with the embedded network service: which events each step waits
//! for (checked against what the service really sent), and a rollback for every failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod faults_support;

use std::time::{Duration, Instant};

use common::*;
use vireo::compute::{ComputeDriver, ComputeOps};
use vireo_actors::instance::{AdmissionError, InstanceError, Migration, ResizeArgs};
use vireo_actors::lifecycle::InstanceState;
use vireo_actors::predict::Timing;
use vireo_actors::vif::PortId;

fn migration(src: &str, dst: &str) -> Migration {
    Migration {
        id: uuid(),
        source_host: src.into(),
        dest_host: dst.into(),
    }
}

fn resize_to(src: &str, dst: &str, vcpus: u32) -> ResizeArgs {
    ResizeArgs::of(&migration(src, dst), flavor("m1.small", vcpus, 512))
}

/// Spawn with one port on each of the hybrid, native and Linux-bridge networks.
async fn spawn3(c: &TestCloud, host: &str, name: &str) -> (uuid::Uuid, PortId, PortId, PortId) {
    let id = uuid();
    c.host(host)
        .driver
        .spawn(
            id,
            spawn_args(name, vec![on(NET_HYBRID), on(NET_NATIVE), on(NET_LB)]),
        )
        .await
        .unwrap();
    let view = c.host(host).driver.show(id).await.unwrap();
    let by = ports_by_network(c, &view).await;
    (id, by[NET_HYBRID], by[NET_NATIVE], by[NET_LB])
}

async fn assert_bound(c: &TestCloud, ports: &[PortId], host: &str) {
    for p in ports {
        let port = c.port(*p).await;
        assert_eq!(port.host_id, host, "{port:?}");
        // After a rollback that awaited no event the service may still be hearing of the
        // restarted guest's taps.
        c.port_eventually(*p, vireo_actors::network::PortStatus::Active)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_host_resize_then_confirm() {
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let (id, hy, na, lb) = spawn3(&c, "h1", "vm-rc").await;

    h1.driver
        .resize(id, resize_to("h1", "h2", 2))
        .await
        .unwrap();
    // The source keeps its stopped domain and the devices vireo created (hybrid).
    let src = h1.driver.show(id).await.unwrap();
    assert_eq!(src.state, InstanceState::ResizeSource);
    assert_eq!(src.power, vireo_actors::instance::PowerState::Shutoff);
    assert_eq!(h1.plugger.plugged(), set([hy, na, lb]));
    let dst = h2.driver.show(id).await.unwrap();
    assert_eq!(dst.state, InstanceState::ResizeTarget);
    assert_eq!(dst.flavor.as_deref(), Some("m1.small"));
    // Each side's domain names the host that saved it.
    assert_eq!(
        owner_of(h1.driver.libvirt(), id).await.as_deref(),
        Some("h1")
    );
    assert_eq!(
        owner_of(h2.driver.libvirt(), id).await.as_deref(),
        Some("h2")
    );
    assert_eq!(h2.plugger.plugged(), set([hy, na, lb]));
    assert_bound(&c, &[hy, na, lb], "h2").await;
    // Finish on another host: every agent-served port at plug time.
    let finish = dst.last_operation.unwrap();
    assert_eq!(set(waited(&finish, Timing::PlugTime)), set([hy, na, lb]));
    assert!(waited(&finish, Timing::BindTime).is_empty());
    assert!(finish.waits.iter().all(|w| w.complete), "{finish:#?}");

    h2.driver.confirm_resize(id).await.unwrap();
    assert_eq!(
        h2.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    // The source is gone entirely.
    assert!(matches!(
        h1.driver.show(id).await,
        Err(InstanceError::Refused(AdmissionError::NotFound(_)))
    ));
    assert!(h1.plugger.plugged().is_empty());
    assert!(h1.driver.libvirt().list_all().await.unwrap().is_empty());

    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_host_revert_waits_exactly_for_the_events_the_service_sends() {
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let (id, hy, na, lb) = spawn3(&c, "h1", "vm-rv").await;
    h1.driver
        .resize(id, resize_to("h1", "h2", 2))
        .await
        .unwrap();

    let before = c.stats().await;
    let t0 = Instant::now();
    h2.driver.revert_resize(id).await.unwrap();
    let t1 = Instant::now();
    let after = c.stats().await;

    // The copy on h2 is gone; the instance runs on h1 again with its old flavor.
    assert!(h2.plugger.plugged().is_empty());
    assert!(h2.driver.libvirt().list_all().await.unwrap().is_empty());
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.flavor.as_deref(), Some("m1.tiny"));
    assert_bound(&c, &[hy, na, lb], "h1").await;
    assert_eq!(
        owner_of(h1.driver.libvirt(), id).await.as_deref(),
        Some("h1")
    );

    // h1 brought it back: bind-time = [hybrid] (its qvo stayed wired on h1), plug-time =
    // [native, linux bridge] (their taps went with the stopped domain).
    let back = view.last_operation.unwrap();
    assert_eq!(back.request, "finish-revert-resize");
    assert_eq!(waited(&back, Timing::BindTime), vec![hy]);
    assert_eq!(set(waited(&back, Timing::PlugTime)), set([na, lb]));
    for w in &back.waits {
        assert!(w.complete, "{w:?}");
        assert!(w.took < Duration::from_secs(5), "wait took {:?}", w.took);
    }
    // What was waited for is exactly what the service sent during the revert.
    let sent = c.sink.plugged(id, t0, t1);
    assert_eq!(set(sent.clone()), set([hy, na, lb]), "sent {sent:?}");
    assert_eq!(sent.len(), 3, "one event per port: {sent:?}");
    assert_eq!(after.timeouts, before.timeouts);
    assert_eq!(after.completed - before.completed, 2, "{after:?}");
    assert_eq!(
        (after.matched + after.matched_from_buffer) - (before.matched + before.matched_from_buffer),
        3,
        "{after:?}"
    );

    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_host_resize_revert_and_confirm() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let (id, hy, na, lb) = spawn3(&c, "h1", "vm-same").await;

    let r = h1
        .driver
        .resize(id, resize_to("h1", "h1", 2))
        .await
        .unwrap();
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::ResizeTarget);
    assert_eq!(view.flavor.as_deref(), Some("m1.small"));
    // Same host, binding unchanged: only the libvirt-made taps come back (plug time); the
    // hybrid qvo stayed.
    assert_eq!(set(waited(&r, Timing::PlugTime)), set([na, lb]));
    assert!(waited(&r, Timing::BindTime).is_empty());
    assert_bound(&c, &[hy, na, lb], "h1").await;

    let before = c.stats().await;
    let t0 = Instant::now();
    let r = h1.driver.revert_resize(id).await.unwrap();
    let t1 = Instant::now();
    let after = c.stats().await;
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.flavor.as_deref(), Some("m1.tiny"));
    // Same-host revert keeps the devices wired, as the resize did: only the taps libvirt
    // recreates report (plug time); the hybrid qvo stayed, and nothing else was sent.
    assert!(waited(&r, Timing::BindTime).is_empty(), "{r:#?}");
    assert_eq!(set(waited(&r, Timing::PlugTime)), set([na, lb]));
    for w in &r.waits {
        assert!(w.complete, "{w:?}");
        assert!(w.took < Duration::from_secs(5), "{w:?}");
    }
    assert_eq!(set(c.sink.plugged(id, t0, t1)), set([na, lb]));
    assert_eq!(c.sink.plugged(id, t0, t1).len(), 2);
    assert!(
        h1.plugger.plugged().contains(&hy),
        "the hybrid devices stayed"
    );
    assert_eq!(after.timeouts, before.timeouts);
    assert_bound(&c, &[hy, na, lb], "h1").await;

    // Resize again and confirm: the resized instance stays.
    h1.driver
        .resize(id, resize_to("h1", "h1", 2))
        .await
        .unwrap();
    h1.driver.confirm_resize(id).await.unwrap();
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.flavor.as_deref(), Some("m1.small"));
    assert_eq!(h1.plugger.plugged(), set([hy, na, lb]));

    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_instance_resizes_and_reverts_stopped() {
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let id = uuid();
    let mut args = spawn_args("vm-stopped", vec![on(NET_HYBRID), on(NET_NATIVE)]);
    args.power_on = false;
    h1.driver.spawn(id, args).await.unwrap();
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Stopped
    );
    h1.driver
        .resize(id, resize_to("h1", "h2", 2))
        .await
        .unwrap();
    let dst = h2.driver.show(id).await.unwrap();
    assert_eq!(dst.state, InstanceState::ResizeTarget);
    assert_eq!(dst.power, vireo_actors::instance::PowerState::Shutoff);
    h2.driver.revert_resize(id).await.unwrap();
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Stopped);
    assert_eq!(view.power, vireo_actors::instance::PowerState::Shutoff);

    h1.driver
        .resize(id, resize_to("h1", "h2", 2))
        .await
        .unwrap();
    h2.driver.confirm_resize(id).await.unwrap();
    assert_eq!(
        h2.driver.show(id).await.unwrap().state,
        InstanceState::Stopped
    );
    c.destroy_and_assert_clean(&[id], &[]).await;
}

/// After a resize that failed on the destination: the instance runs on h1 as before, h2 holds
/// nothing.
async fn assert_back_on_h1(c: &TestCloud, id: uuid::Uuid, ports: &[PortId], e: &InstanceError) {
    assert!(
        matches!(
            e,
            InstanceError::RolledBack {
                request: vireo_actors::lifecycle::Request::Resize,
                ..
            }
        ),
        "{}",
        chain(e)
    );
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running, "{}", chain(e));
    assert_eq!(view.flavor.as_deref(), Some("m1.tiny"));
    assert_eq!(h1.plugger.plugged(), set(ports.iter().copied()));
    assert_bound(c, ports, "h1").await;
    assert!(h2.plugger.plugged().is_empty());
    assert!(h2.driver.libvirt().list_all().await.unwrap().is_empty());
    assert!(matches!(
        h2.driver.show(id).await,
        Err(InstanceError::Refused(AdmissionError::NotFound(_)))
    ));
    let back = view.last_operation.unwrap();
    assert!(back.waits.iter().all(|w| w.complete), "{back:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_failing_at_every_destination_plug_step_comes_back() {
    use vireo_actors::plug::{DomainForm, PlugKind};
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let (id, hy, na, lb) = spawn3(&c, "h1", "vm-plugfail").await;
    let cases = [
        (hy, PlugKind::OvsHybrid),
        (na, PlugKind::OvsNative),
        (lb, PlugKind::LinuxBridge),
    ];
    let mut tried = 0;
    for (port, kind) in cases {
        for step in kind.plug_steps(DomainForm::LibvirtManaged) {
            h2.plugger.faults().fail_once(*step, Some(port));
            let e = h1
                .driver
                .resize(id, resize_to("h1", "h2", 2))
                .await
                .unwrap_err();
            assert!(chain(&e).contains("plug"), "{}", chain(&e));
            assert_back_on_h1(&c, id, &[hy, na, lb], &e).await;
            tried += 1;
        }
    }
    assert_eq!(tried, 8);
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_failing_on_the_network_or_an_unknown_host_comes_back() {
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let (id, hy, na, lb) = spawn3(&c, "h1", "vm-netfail").await;

    // The destination cannot move the second port's binding: the first moved already and
    // comes back with the rest.
    h2.net.fail(NetCall::UpdatePort, 1);
    let e = h1
        .driver
        .resize(id, resize_to("h1", "h2", 2))
        .await
        .unwrap_err();
    assert!(chain(&e).contains("injected"), "{}", chain(&e));
    assert_back_on_h1(&c, id, &[hy, na, lb], &e).await;

    // The destination cannot read the ports at all.
    h2.net.fail(NetCall::GetPort, 0);
    let e = h1
        .driver
        .resize(id, resize_to("h1", "h2", 2))
        .await
        .unwrap_err();
    assert_back_on_h1(&c, id, &[hy, na, lb], &e).await;

    // A destination this host cannot reach: refused at admission (an agent is one host;
    // moves between hosts are Nova's), nothing started, nothing changed.
    let e = h1
        .driver
        .resize(id, resize_to("h1", "h9", 2))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, InstanceError::Refused(AdmissionError::CrossHost { host }) if host == "h9"),
        "{}",
        chain(&e)
    );
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.flavor.as_deref(), Some("m1.tiny"));
    assert_eq!(h1.plugger.plugged(), set([hy, na, lb]));
    assert_bound(&c, &[hy, na, lb], "h1").await;

    // libvirt refuses the definition on the destination (a different domain has the name).
    let squatter = uuid();
    h2.driver
        .libvirt()
        .define_xml(
            format!(
                "<domain type='test'><name>vm-netfail</name><uuid>{squatter}</uuid>\
                 <memory>65536</memory><vcpu>1</vcpu><os><type>hvm</type></os></domain>"
            ),
            false,
        )
        .await
        .unwrap();
    let e = h1
        .driver
        .resize(id, resize_to("h1", "h2", 2))
        .await
        .unwrap_err();
    assert!(chain(&e).contains("define"), "{}", chain(&e));
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    assert_eq!(
        h2.driver.libvirt().list_all().await.unwrap().len(),
        1,
        "only the squatter"
    );
    h2.driver.libvirt().undefine(squatter).await.unwrap();
    assert_back_on_h1(&c, id, &[hy, na, lb], &e).await;
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );

    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_to_a_host_whose_agent_is_down_times_out_and_comes_back() {
    let c = spec(&["h1", "h2"])
        .timeout(Duration::from_millis(300))
        .start()
        .await;
    let h1 = c.host("h1");
    let (id, hy, na, lb) = spawn3(&c, "h1", "vm-noagent").await;
    // h2's L2 agent is gone: its bindings fail, no event ever comes from there.
    assert!(c.network.detach_host("h2"));
    let e = h1
        .driver
        .resize(id, resize_to("h1", "h2", 2))
        .await
        .unwrap_err();
    assert!(chain(&e).contains("timed out"), "{}", chain(&e));
    assert_back_on_h1(&c, id, &[hy, na, lb], &e).await;
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_host_resize_to_an_invalid_flavor_is_rolled_back() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let (id, hy, na, lb) = spawn3(&c, "h1", "vm-badflavor").await;
    let mut args = resize_to("h1", "h1", 2);
    args.new_flavor.vcpus = 0;
    let e = h1.driver.resize(id, args).await.unwrap_err();
    assert!(
        matches!(e, InstanceError::RolledBack { .. }),
        "{}",
        chain(&e)
    );
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.flavor.as_deref(), Some("m1.tiny"));
    assert_eq!(view.power, vireo_actors::instance::PowerState::Running);
    // The guest runs again with its devices: every port is ACTIVE on h1.
    assert_bound(&c, &[hy, na, lb], "h1").await;
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_host_revert_failing_at_plug_leaves_error_then_power_on_recovers() {
    use vireo_actors::plug::PlugStep;
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let (id, hy, na, lb) = spawn3(&c, "h1", "vm-revertfail").await;
    h1.driver
        .resize(id, resize_to("h1", "h1", 2))
        .await
        .unwrap();
    // The revert keeps the devices wired; the hybrid port's went missing meanwhile, so the
    // revert plugs them again, and that plug fails.
    remove_port_devices(&c, "h1", id, "vm-revertfail", hy).await;
    h1.plugger
        .faults()
        .fail_once(PlugStep::OvsTransact, Some(hy));
    let e = h1.driver.revert_resize(id).await.unwrap_err();
    assert!(chain(&e).contains("plug"), "{}", chain(&e));
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Error);
    assert_eq!(view.power, vireo_actors::instance::PowerState::Shutoff);
    assert!(!h1.plugger.plugged().contains(&hy));
    let stats = c.stats().await;
    assert_eq!(stats.waits_now, 0, "{stats:?}");
    // From error, power on brings the reverted instance up.
    h1.driver.power_on(id).await.unwrap();
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.flavor.as_deref(), Some("m1.tiny"));
    assert_bound(&c, &[hy, na, lb], "h1").await;
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_host_revert_failing_on_the_source_network_leaves_error_and_cleans_up() {
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let (id, _hy, _na, _lb) = spawn3(&c, "h1", "vm-srcfail").await;
    h1.driver
        .resize(id, resize_to("h1", "h2", 2))
        .await
        .unwrap();
    // h1 cannot move the first binding back.
    h1.net.fail(NetCall::UpdatePort, 0);
    let e = h2.driver.revert_resize(id).await.unwrap_err();
    assert!(chain(&e).contains("injected"), "{}", chain(&e));
    // The copy on h2 was removed before the source was asked.
    assert!(h2.plugger.plugged().is_empty());
    assert!(h2.driver.libvirt().list_all().await.unwrap().is_empty());
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Error);
    assert_eq!(c.stats().await.waits_now, 0);
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_whose_source_cleanup_failed_completes_once_the_source_copy_is_destroyed() {
    use vireo_actors::instance::DestroyArgs;
    use vireo_actors::plug::PlugStep;
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let (id, hy, na, lb) = spawn3(&c, "h1", "vm-confirmfail").await;
    h1.driver
        .resize(id, resize_to("h1", "h2", 2))
        .await
        .unwrap();
    // The source cannot remove the hybrid port's devices.
    h1.plugger
        .faults()
        .fail_once(PlugStep::DeleteOvsPort, Some(hy));
    let e = h2.driver.confirm_resize(id).await.unwrap_err();
    assert!(chain(&e).contains("injected"), "{}", chain(&e));
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Error
    );
    // The resized instance is untouched and still waits for its confirm.
    let view = h2.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::ResizeTarget);
    assert_bound(&c, &[hy, na, lb], "h2").await;
    // The operator removes the source copy (its networking lives on h2: no deallocation).
    h1.driver.destroy(id, DestroyArgs::default()).await.unwrap();
    assert!(h1.plugger.plugged().is_empty());
    assert_bound(&c, &[hy, na, lb], "h2").await;
    h2.driver.confirm_resize(id).await.unwrap();
    let view = h2.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.flavor.as_deref(), Some("m1.small"));
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_host_revert_with_neutron_latency_waits_for_each_event_once() {
    // Neutron sends its events 0.3–1.6 s after their cause.
    let c = spec(&["h1", "h2"]).event_delay_ms(300).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let (id, hy, na, lb) = spawn3(&c, "h1", "vm-latency").await;
    h1.driver
        .resize(id, resize_to("h1", "h2", 2))
        .await
        .unwrap();
    let t0 = Instant::now();
    h2.driver.revert_resize(id).await.unwrap();
    let t1 = Instant::now();
    let back = h1.driver.show(id).await.unwrap().last_operation.unwrap();
    assert_eq!(waited(&back, Timing::BindTime), vec![hy]);
    assert_eq!(set(waited(&back, Timing::PlugTime)), set([na, lb]));
    for w in &back.waits {
        assert!(w.complete, "{w:?}");
        // Each wait lasted as long as the service took to send, not the 30 s timeout.
        assert!(w.took >= Duration::from_millis(250), "{w:?}");
        assert!(w.took < Duration::from_secs(5), "{w:?}");
    }
    assert_eq!(set(c.sink.plugged(id, t0, t1)), set([hy, na, lb]));
    assert_bound(&c, &[hy, na, lb], "h1").await;
    c.destroy_and_assert_clean(&[id], &[]).await;
}

/// A same-host resize keeps every PCI port on its device: vireo claims no other device and
/// never rewrites `binding:profile`, so nothing rebinds the ports and the service sends
/// nothing for them — and vireo waits for nothing (a wait for a rebind that never happens
/// would time out the resize). The same for the revert. (vireo plugs no remote-managed port:
/// its cells, none as well, are checked by the prediction table's tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_host_resize_and_revert_wait_for_no_pci_event() {
    use vireo_actors::vif::VnicType;
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let net = c.network.clone();
    let vf = sriov_port(net.as_ref(), VnicType::Direct, "0000:81:00.1").await;
    let pf = sriov_port(net.as_ref(), VnicType::DirectPhysical, "0000:82:00.0").await;
    let id = uuid();
    h1.driver
        .spawn(id, spawn_args("vm-pci", vec![on(NET_HYBRID), vf, pf]))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let all = ports(&h1.driver.show(id).await.unwrap());
    let (vf, pf) = (all[1], all[2]);
    for step in ["resize", "revert"] {
        let t0 = Instant::now();
        let r = if step == "resize" {
            h1.driver.resize(id, resize_to("h1", "h1", 2)).await
        } else {
            h1.driver.revert_resize(id).await
        }
        .unwrap_or_else(|e| panic!("{step}: {}", chain(&e)));
        let t1 = Instant::now();
        // No wait at all. The resize and the revert keep every device wired (nothing
        // reports: the hybrid qvo stays, the VF is re-assigned at once, which the polling
        // agent does not report); the PF is never waited for and never reported.
        assert!(waited(&r, Timing::BindTime).is_empty(), "{step}: {r:#?}");
        assert!(waited(&r, Timing::PlugTime).is_empty(), "{step}: {r:#?}");
        for w in &r.waits {
            assert!(w.complete, "{step}: {w:?}");
        }
        let sent = c.sink.plugged(id, t0, t1);
        assert!(sent.is_empty(), "{step}: the service sent events: {sent:?}");
    }
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    c.destroy_and_assert_clean(&[id], &[vf, pf]).await;
}
