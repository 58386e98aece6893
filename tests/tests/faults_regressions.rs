//! Regression tests for the bugs the fault matrix found (docs/FAULTS.md, "Bugs found"): each
//! is the smallest scenario that failed before its fix.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod faults_support;

use common::*;
use vireo::compute::{ComputeDriver, ComputeOps};
use vireo_actors::instance::{DestroyArgs, InstanceError, Migration};
use vireo_actors::lifecycle::{InstanceState, Request};
use vireo_actors::network::{BindingStatus, NetworkApi, PortRequest};

/// A live migration whose rollback cannot reach the network service leaves `migrating_to`
/// and the destination's inactive binding on the ports. Destroy with deallocation must take
/// them off a user-supplied port (which is unbound, not deleted), or they outlive the
/// instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_removes_what_a_failed_migration_rollback_left_on_a_user_port() {
    let c = spec(&["h1", "h2"]).start().await;
    let h1 = c.host("h1");
    let user = c.user_port(NET_NATIVE).await;
    let id = uuid();
    h1.spawn_on(
        id,
        "vm-reg-lm",
        vec![on(NET_HYBRID), PortRequest::Port { port_id: user }],
    )
    .await;
    // The migration fails (the test driver cannot migrate); the service goes down when the
    // rollback clears migrating_to.
    h1.net
        .fail_with(NetCall::SetupNetworks, 1, NetFailure::Down);
    let e = h1.driver.live_migrate(id, lm("h2")).await.unwrap_err();
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
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Error
    );
    h1.net.set_down(false);
    let port = c.port(user).await;
    assert_eq!(port.migrating_to(), Some("h2"), "{port:?}");
    let bindings = c.network.show_bindings(user).await.unwrap();
    assert!(
        bindings
            .iter()
            .any(|b| b.host == "h2" && b.status == BindingStatus::Inactive),
        "{bindings:?}"
    );

    // The service is back; the instance goes.
    h1.driver
        .destroy(
            id,
            DestroyArgs {
                deallocate_network: true,
            },
        )
        .await
        .unwrap();
    let port = c.port(user).await;
    assert_eq!(port.migrating_to(), None, "{port:?}");
    assert_no_inactive_binding(&c, user).await;
    c.assert_clean(&[user]).await;
    c.delete_ports(&[user]).await;
}

/// The source of a resize keeps the OVS hybrid devices wired, so a cross-host revert waits
/// for that port's event at bind time. If the devices went meanwhile (removed outside vireo,
/// a host reboot), no event comes at bind time: the revert waited the whole plug timeout for
/// it and failed. It must wait for it once it plugged the devices again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revert_whose_kept_devices_went_waits_for_them_at_plug_time() {
    use std::time::Duration;
    use vireo_actors::instance::ResizeArgs;
    use vireo_actors::plug::{DomainForm, PlugContext, VifPlugger};
    use vireo_actors::predict::Timing;
    let c = spec(&["h1", "h2"])
        .timeout(Duration::from_secs(5))
        .start()
        .await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let id = uuid();
    h1.spawn_on(id, "vm-reg-rv", vec![on(NET_HYBRID), on(NET_NATIVE)])
        .await;
    let hybrid = ports_by_network(&c, &h1.driver.show(id).await.unwrap()).await[NET_HYBRID];
    h1.driver
        .resize(
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
        .unwrap();
    // The hybrid devices kept on h1 go.
    let vif = network_info(&*c.network, &[hybrid]).await.vifs.remove(0);
    let ctx = PlugContext {
        instance_uuid: id,
        instance_name: "vm-reg-rv".into(),
        form: DomainForm::LibvirtManaged,
    };
    h1.plugger.unplug(&ctx, &vif).await.unwrap();

    let report = h2.driver.revert_resize(id).await.unwrap();
    let _ = report;
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    let back = view.last_operation.unwrap();
    assert!(waited(&back, Timing::BindTime).is_empty(), "{back:#?}");
    assert!(
        waited(&back, Timing::PlugTime).contains(&hybrid),
        "{back:#?}"
    );
    assert!(back.waits.iter().all(|w| w.complete), "{back:#?}");
    assert!(h1.plugger.plugged().contains(&hybrid));
    c.destroy_and_assert_clean(&[id], &[]).await;
}

/// A same-host resize that fails to plug rolls back to the old definition and starts the
/// guest again: with the devices it needs. When the failed plug was one of devices that had
/// gone (removed outside vireo), the rollback started the guest without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_host_resize_rollback_starts_the_guest_with_its_devices() {
    use vireo_actors::instance::ResizeArgs;
    use vireo_actors::plug::{DomainForm, PlugContext, PlugStep, VifPlugger};
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let id = uuid();
    h1.spawn_on(id, "vm-reg-rs", vec![on(NET_HYBRID), on(NET_NATIVE)])
        .await;
    let hybrid = ports_by_network(&c, &h1.driver.show(id).await.unwrap()).await[NET_HYBRID];
    let vif = network_info(&*c.network, &[hybrid]).await.vifs.remove(0);
    let ctx = PlugContext {
        instance_uuid: id,
        instance_name: "vm-reg-rs".into(),
        form: DomainForm::LibvirtManaged,
    };
    h1.plugger.unplug(&ctx, &vif).await.unwrap();
    h1.plugger
        .faults()
        .fail_once(PlugStep::EnsureLinuxBridge, Some(hybrid));
    let e = h1
        .driver
        .resize(
            id,
            ResizeArgs::of(
                &Migration {
                    id: uuid(),
                    source_host: "h1".into(),
                    dest_host: "h1".into(),
                },
                flavor("m1.small", 2, 512),
            ),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, InstanceError::RolledBack { .. }),
        "{}",
        chain(&e)
    );
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.flavor.as_deref(), Some("m1.tiny"));
    assert!(
        h1.plugger.plugged().contains(&hybrid),
        "started without its devices"
    );
    c.port_eventually(hybrid, vireo_actors::network::PortStatus::Active)
        .await;
    c.destroy_and_assert_clean(&[id], &[]).await;
}

/// An instance is known to the network-event actor from its spawn's start, so an event that
/// arrives while the spawn runs is kept for the spawn's waits: the bind-time ones count it
/// (an agentless port reports when the spawn binds it, before any wait exists), a plug-time
/// one only counts what comes after it was registered (see the next test). The spawn made the
/// instance known only after it had read its ports: an event that came meanwhile was dropped
/// as one for an unknown instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_keeps_an_event_that_came_before_its_wait() {
    use std::sync::Arc;
    use vireo_actors::external::{EventName, EventStatus, ExternalEvent};
    let c = Arc::new(spec(&["h1"]).start().await);
    let h1 = c.host("h1");
    let id = uuid();
    let hold = h1.net.hold(NetCall::GetPort, 0);
    let task = {
        let c = c.clone();
        tokio::spawn(async move {
            c.host("h1")
                .driver
                .spawn(id, spawn_args("vm-reg-early", vec![on(NET_NATIVE)]))
                .await
        })
    };
    hold.reached("the spawn's first port read").await;
    let before = h1.driver.events().stats().await.unwrap();
    for p in c.network.list_instance_ports(id).await.unwrap() {
        c.sink.inject(ExternalEvent {
            name: EventName::NetworkVifPlugged,
            server_uuid: id,
            tag: Some(p.id.to_string()),
            status: EventStatus::Completed,
        });
    }
    let after = h1.driver.events().stats().await.unwrap();
    assert_eq!(
        (
            after.unknown_instance_dropped - before.unknown_instance_dropped,
            after.buffered - before.buffered
        ),
        (0, 1),
        "the early event was not kept: {after:?}"
    );
    hold.release();
    let r = task.await.unwrap();
    if let Err(e) = &r {
        panic!("{}", chain(e));
    }
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    c.destroy_and_assert_clean(&[id], &[]).await;
}

/// A stale duplicate — a `network-vif-plugged` of a port that arrives while an operation
/// runs but before it plugged anything (a late copy of an earlier plug's event, or Neutron
/// re-reporting the port after an update) — cannot be the event of the plug to come: a
/// plug-time wait counts only events that arrive after it was registered, which every flow
/// does before it plugs. It used to count every event since the operation began, so a hard
/// reboot returned on the stale copy while the port was still being wired again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_event_before_the_plug_does_not_release_the_plug_wait() {
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use vireo_actors::external::{EventName, EventStatus, ExternalEvent};
    use vireo_actors::predict::Timing;
    // The service reports a plug 300 ms after it saw it.
    let c = Arc::new(spec(&["h1"]).event_delay_ms(300).start().await);
    let h1 = c.host("h1");
    let id = uuid();
    h1.spawn_on(id, "vm-reg-stale", vec![on(NET_NATIVE)]).await;
    let native = ports(&h1.driver.show(id).await.unwrap())[0];
    let held = LibvirtHold::start(h1.driver.libvirt()).await;
    let task = {
        let c = c.clone();
        tokio::spawn(async move {
            c.host("h1")
                .driver
                .reboot(id, vireo_actors::instance::RebootKind::Hard)
                .await
        })
    };
    eventually(Duration::from_secs(10), "the reboot began", || async {
        h1.driver.show(id).await.ok()?.operation.map(|_| ())
    })
    .await;
    // Before the reboot unplugged or plugged anything.
    c.sink.inject(ExternalEvent {
        name: EventName::NetworkVifPlugged,
        server_uuid: id,
        tag: Some(native.to_string()),
        status: EventStatus::Completed,
    });
    let t0 = Instant::now();
    held.release().await;
    let r = task
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let t1 = Instant::now();
    assert_eq!(waited(&r, Timing::PlugTime), vec![native], "{r:#?}");
    // The reboot waited for the service's own report of its plug (the stale copy is logged
    // before t0).
    assert_eq!(
        c.sink.plugged(id, t0, t1),
        vec![native],
        "the reboot returned before the service reported its plug"
    );
    c.destroy_and_assert_clean(&[id], &[]).await;
}

/// A stale duplicate that arrives after the plug-time wait was registered — the window the
/// registration cannot close — while the port is not wired again: it releases the wait, but
/// the ports whose events released it are read back, and a port the service does not show
/// ACTIVE had a stale event: the wait goes on for the real one, and the report names the port.
/// It used to end the power-on with the port DOWN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_event_while_the_port_is_down_does_not_end_the_wait() {
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use vireo_actors::network::PortStatus;
    use vireo_actors::plug::VifPlugger;
    use vireo_actors::predict::Timing;
    let c = Arc::new(spec(&["h1"]).start().await);
    let h1 = c.host("h1");
    let (id, native, task) = power_on_with_the_agent_away(&c, "vm-reg-stale-down").await;
    // The port is read back and found DOWN, and still so a second later: a stale event.
    eventually(
        Duration::from_secs(10),
        "the stale event noticed",
        || async {
            if task.is_finished() {
                return Some(());
            }
            let v = h1.driver.show(id).await.ok()?;
            (v.operation?.phase == "wait again after a stale event").then_some(())
        },
    )
    .await;
    assert!(
        !task.is_finished(),
        "the power-on ended on the stale event with its port {:?}",
        c.network.port_status(native)
    );
    // The agent is back and wires the device: the real event.
    let t0 = Instant::now();
    let (n, w) = (c.network.clone(), h1.plugger.wiring());
    on_thread(&c.system, move || n.attach_host("h1", w))
        .await
        .unwrap();
    let r = task
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(c.sink.plugged(id, t0, Instant::now()), vec![native]);
    let plug = r
        .waits
        .iter()
        .find(|w| w.timing == Timing::PlugTime)
        .unwrap();
    assert_eq!(plug.stale, vec![native], "{r:#?}");
    assert!(plug.complete, "{r:#?}");
    assert_eq!(c.network.port_status(native), Some(PortStatus::Active));
    c.destroy_and_assert_clean(&[id], &[]).await;
}

/// Neutron can lose a port's status while the port works: on the real stack, ML2/OVN sent
/// `network-vif-plugged` twice on a cross-host revert while its status update gave up, and
/// the port stayed DOWN (docs/EVENT_MODEL.md section 7). The read-back keeps the wait open
/// for the confirmation window only, then trusts the events: the operation succeeds and its
/// report names the port `unconfirmed`. It used to hold the wait to its deadline and fail a
/// working operation with a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plug_event_whose_port_stays_down_is_trusted_after_the_window() {
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use vireo_actors::network::PortStatus;
    use vireo_actors::plug::VifPlugger;
    use vireo_actors::predict::Timing;
    let mut s = spec(&["h1"]);
    s.instances.confirm_window = Duration::from_secs(2);
    let c = Arc::new(s.start().await);
    let h1 = c.host("h1");
    // The service's status never follows: its host's agent stays away.
    let (id, native, task) = power_on_with_the_agent_away(&c, "vm-reg-unconfirmed").await;
    let t0 = Instant::now();
    let r = task.await.unwrap().unwrap_or_else(|e| {
        panic!(
            "the power-on failed on a status the service lost: {}",
            chain(&e)
        )
    });
    let took = t0.elapsed();
    let plug = r
        .waits
        .iter()
        .find(|w| w.timing == Timing::PlugTime)
        .unwrap();
    assert!(plug.complete, "{r:#?}");
    assert_eq!(plug.unconfirmed, vec![native], "{r:#?}");
    assert_eq!(plug.stale, vec![native], "{r:#?}");
    // The window, not the 30 s deadline.
    assert!(took < Duration::from_secs(10), "trusted after {took:?}");
    assert_eq!(c.network.port_status(native), Some(PortStatus::Down));
    let (n, w) = (c.network.clone(), h1.plugger.wiring());
    on_thread(&c.system, move || n.attach_host("h1", w))
        .await
        .unwrap();
    c.destroy_and_assert_clean(&[id], &[]).await;
}

/// An instance on h1's native network, powered off until its port is DOWN, then powered on
/// while h1's L2 agent is away (nobody wires the device, the port stays DOWN): once the
/// power-on waits for its events, a `network-vif-plugged` for the port is injected. Returns
/// the instance, its port and the power-on.
async fn power_on_with_the_agent_away(
    c: &std::sync::Arc<TestCloud>,
    name: &str,
) -> (
    uuid::Uuid,
    vireo_actors::vif::PortId,
    tokio::task::JoinHandle<Result<vireo_actors::instance::OpReport, InstanceError>>,
) {
    use std::time::Duration;
    use vireo_actors::external::{EventName, EventStatus, ExternalEvent};
    use vireo_actors::network::PortStatus;
    let h1 = c.host("h1");
    let id = uuid();
    h1.spawn_on(id, name, vec![on(NET_NATIVE)]).await;
    let native = ports(&h1.driver.show(id).await.unwrap())[0];
    h1.driver.power_off(id, None).await.unwrap();
    eventually(Duration::from_secs(10), "the port went DOWN", || async {
        (c.network.port_status(native) == Some(PortStatus::Down)).then_some(())
    })
    .await;
    assert!(c.network.detach_host("h1"));
    h1.net.take_calls();
    let task = {
        let c = c.clone();
        tokio::spawn(async move { c.host("h1").driver.power_on(id).await })
    };
    at_phase(&h1.driver, id, "wait for events").await;
    c.sink.inject(ExternalEvent {
        name: EventName::NetworkVifPlugged,
        server_uuid: id,
        tag: Some(native.to_string()),
        status: EventStatus::Completed,
    });
    (id, native, task)
}
