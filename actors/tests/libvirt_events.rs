//! Domain lifecycle and device-removed events from libvirt's test driver reach the handle's
//! event stream, on private `test:///` connections.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::time::Duration;

use common::{next_lifecycle, test_domain_xml, unique, wait_for, TestNode};
use vireo_actors::libvirt::{Affect, LibvirtError, LibvirtEvent, LifecycleEvent};
use virt::sys;

fn detail_of(event: &LibvirtEvent) -> i32 {
    match event {
        LibvirtEvent::Lifecycle { detail, .. } => *detail,
        other => panic!("not a lifecycle event: {other:?}"),
    }
}

#[tokio::test]
async fn every_lifecycle_step_is_reported_in_order() {
    let node = TestNode::new();
    let lv = node.open().await;
    let mut events = lv.events();
    let (name, uuid) = unique("life");

    lv.define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();
    assert_eq!(
        next_lifecycle(&mut events, uuid).await,
        LifecycleEvent::Defined
    );
    lv.start(uuid, false).await.unwrap();
    assert_eq!(
        next_lifecycle(&mut events, uuid).await,
        LifecycleEvent::Started
    );
    lv.suspend(uuid).await.unwrap();
    assert_eq!(
        next_lifecycle(&mut events, uuid).await,
        LifecycleEvent::Suspended
    );
    lv.resume(uuid).await.unwrap();
    assert_eq!(
        next_lifecycle(&mut events, uuid).await,
        LifecycleEvent::Resumed
    );

    lv.destroy(uuid).await.unwrap();
    let stopped = wait_for(&mut events, Duration::from_secs(10), |e| {
        matches!(e, LibvirtEvent::Lifecycle { uuid: u, event: LifecycleEvent::Stopped, .. } if *u == uuid)
    })
    .await;
    assert_eq!(
        detail_of(&stopped),
        sys::VIR_DOMAIN_EVENT_STOPPED_DESTROYED as i32
    );

    lv.undefine(uuid).await.unwrap();
    assert_eq!(
        next_lifecycle(&mut events, uuid).await,
        LifecycleEvent::Undefined
    );
    assert_eq!(events.try_recv(), None);
}

#[tokio::test]
async fn a_shutdown_is_reported_as_stopped_with_the_shutdown_detail() {
    let node = TestNode::new();
    let lv = node.open().await;
    let (name, uuid) = unique("shut");
    lv.define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();
    lv.start(uuid, false).await.unwrap();
    let mut events = lv.events();
    lv.shutdown(uuid).await.unwrap();
    let stopped = wait_for(&mut events, Duration::from_secs(10), |e| {
        matches!(
            e,
            LibvirtEvent::Lifecycle {
                event: LifecycleEvent::Stopped,
                ..
            }
        )
    })
    .await;
    assert_eq!(
        stopped,
        LibvirtEvent::Lifecycle {
            uuid,
            event: LifecycleEvent::Stopped,
            detail: sys::VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN as i32,
        }
    );
}

#[tokio::test]
async fn detaching_by_alias_reports_device_removed() {
    let node = TestNode::new();
    let lv = node.open().await;
    let (name, uuid) = unique("dev");
    lv.define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();
    lv.start(uuid, false).await.unwrap();
    let mut events = lv.events();

    let nic = "<interface type='ethernet'><mac address='52:54:00:12:34:56'/>\
               <model type='virtio'/><alias name='ua-net1'/></interface>";
    lv.attach_device(uuid, nic, Affect::Live).await.unwrap();
    assert!(lv.xml_desc(uuid, false).await.unwrap().contains("ua-net1"));

    lv.detach_device_alias(uuid, "ua-net1", Affect::Live)
        .await
        .unwrap();
    let removed = wait_for(&mut events, Duration::from_secs(10), |e| {
        matches!(e, LibvirtEvent::DeviceRemoved { .. })
    })
    .await;
    assert_eq!(
        removed,
        LibvirtEvent::DeviceRemoved {
            uuid,
            alias: "ua-net1".into()
        }
    );
    assert!(!lv.xml_desc(uuid, false).await.unwrap().contains("ua-net1"));
    let err = lv
        .detach_device_alias(uuid, "ua-net1", Affect::Live)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LibvirtError::NoDevice {
                what: "detach_device_alias",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.code(), Some(sys::VIR_ERR_INTERNAL_ERROR));
}

#[tokio::test]
async fn every_subscriber_gets_every_event_from_its_subscription_on() {
    let node = TestNode::new();
    let lv = node.open().await;
    let mut early = lv.events();
    let (name, uuid) = unique("subs");
    lv.define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();
    assert_eq!(
        next_lifecycle(&mut early, uuid).await,
        LifecycleEvent::Defined
    );

    let mut late = lv.events();
    lv.start(uuid, false).await.unwrap();
    assert_eq!(
        next_lifecycle(&mut early, uuid).await,
        LifecycleEvent::Started
    );
    assert_eq!(
        next_lifecycle(&mut late, uuid).await,
        LifecycleEvent::Started
    );
}

#[tokio::test]
async fn two_connections_see_only_their_own_domains() {
    let (node_a, node_b) = (TestNode::new(), TestNode::new());
    let (lv_a, lv_b) = (node_a.open().await, node_b.open().await);
    let (mut events_a, mut events_b) = (lv_a.events(), lv_b.events());
    let (name_a, uuid_a) = unique("a");
    let (name_b, uuid_b) = unique("b");

    lv_a.define_xml(test_domain_xml(&name_a, uuid_a), true)
        .await
        .unwrap();
    lv_b.define_xml(test_domain_xml(&name_b, uuid_b), true)
        .await
        .unwrap();

    let first_a = wait_for(&mut events_a, Duration::from_secs(10), |_| true).await;
    let first_b = wait_for(&mut events_b, Duration::from_secs(10), |_| true).await;
    assert!(matches!(first_a, LibvirtEvent::Lifecycle { uuid, .. } if uuid == uuid_a));
    assert!(matches!(first_b, LibvirtEvent::Lifecycle { uuid, .. } if uuid == uuid_b));
    assert_eq!(lv_a.list_all().await.unwrap().len(), 1);
    assert_eq!(lv_b.list_all().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_stream_that_falls_behind_is_told_to_resync() {
    let node = TestNode::new();
    let lv = vireo_actors::libvirt::Libvirt::open(vireo_actors::libvirt::LibvirtConfig {
        event_capacity: 4,
        ..node.config()
    })
    .await
    .unwrap();
    let mut events = lv.events();
    let mut last = None;
    for _ in 0..6 {
        let (name, uuid) = unique("lag");
        lv.define_xml(test_domain_xml(&name, uuid), true)
            .await
            .unwrap();
        last = Some(uuid);
    }
    // Wait for the last event to be delivered to the channel, without reading it.
    let mut probe = lv.events();
    let (name, uuid) = unique("probe");
    lv.define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();
    assert_eq!(
        next_lifecycle(&mut probe, uuid).await,
        LifecycleEvent::Defined
    );

    // 7 events into 4 slots: the first read reports the 3 lost, then the newest 4 follow.
    assert_eq!(events.try_recv(), Some(LibvirtEvent::Lagged { missed: 3 }));
    let rest: Vec<_> = std::iter::from_fn(|| events.try_recv()).collect();
    assert_eq!(rest.len(), 4);
    assert!(matches!(rest[2], LibvirtEvent::Lifecycle { uuid: u, .. } if Some(u) == last));
    assert!(matches!(rest[3], LibvirtEvent::Lifecycle { uuid: u, .. } if u == uuid));
}
