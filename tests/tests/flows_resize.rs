//! Resize and cold migration with confirm and revert, across hosts and on one host, on
//! libvirt's test driver with the embedded network service: which events each step waits
//! for (checked against what the service really sent), and a rollback for every failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use vireo::compute::ComputeDriver;
use vireo_actors::instance::{InstanceError, Migration, ResizeArgs};
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
    ResizeArgs {
        migration: migration(src, dst),
        new_flavor: flavor("m1.small", vcpus, 512),
    }
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
        assert_eq!(
            port.status,
            vireo_actors::network::PortStatus::Active,
            "{port:?}"
        );
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
        Err(InstanceError::NotFound(_))
    ));
    assert!(h1.plugger.plugged().is_empty());
    assert!(h1.driver.libvirt().list_all().await.unwrap().is_empty());

    c.destroy_everywhere(id).await;
    c.assert_clean(&[]).await;
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

    c.destroy_everywhere(id).await;
    c.assert_clean(&[]).await;
}
