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

/// An event that arrives after a spawn began counts for the wait it registers later
/// (docs/EVENT_MODEL.md). The spawn made the instance known to the network-event actor only
/// after it had read its ports: a `network-vif-plugged` that came meanwhile (the port went
/// ACTIVE right after that read) was dropped as one for an unknown instance, and the build
/// timed out waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_keeps_an_event_that_came_before_its_wait() {
    use std::sync::Arc;
    use std::time::Duration;
    use vireo_actors::external::{EventName, EventStatus, ExternalEvent};
    let c = Arc::new(spec(&["h1"]).timeout(Duration::from_secs(2)).start().await);
    let h1 = c.host("h1");
    let id = uuid();
    // The service's own events are lost: only the early copies can satisfy the wait.
    c.sink.set_event_fault(Some(EventRule {
        instance: id,
        fault: EventFault::Lost,
    }));
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
    for p in c.network.list_instance_ports(id).await.unwrap() {
        c.sink.inject(ExternalEvent {
            name: EventName::NetworkVifPlugged,
            server_uuid: id,
            tag: Some(p.id.to_string()),
            status: EventStatus::Completed,
        });
    }
    hold.release();
    let r = task.await.unwrap();
    c.sink.set_event_fault(None);
    if let Err(e) = &r {
        panic!("{}", chain(e));
    }
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    c.destroy_and_assert_clean(&[id], &[]).await;
}
