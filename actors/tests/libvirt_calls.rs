//! The call path: the in-flight cap, deadlines, failure isolation, and the typed domain
//! operations, on private `test:///` connections.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::Duration;

use common::{test_domain_xml, unique, TestNode};
use vireo_actors::libvirt::{
    Affect, DomainState, Libvirt, LibvirtConfig, LibvirtError, Metadata, PausedStart, MAX_WORKERS,
};

/// Runs `calls` calls at once through a handle with `workers` workers; every call waits on a
/// barrier of `workers` parties, so calls can only finish if `workers` of them run together.
/// Returns the most that were ever inside a closure at once.
async fn peak_concurrency(workers: usize, calls: usize) -> usize {
    let node = TestNode::new();
    let lv = Libvirt::open(LibvirtConfig {
        workers,
        ..node.config()
    })
    .await
    .unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(workers));

    let all = (0..calls).map(|_| {
        let (inside, peak, barrier) = (inside.clone(), peak.clone(), barrier.clone());
        lv.call("hostname", move |conn| {
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            barrier.wait();
            let hostname = conn.hostname();
            inside.fetch_sub(1, Ordering::SeqCst);
            hostname
        })
    });
    let results = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(all))
        .await
        .expect("calls deadlocked: fewer than `workers` ran at once");
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(lv.peak_in_flight(), peak.load(Ordering::SeqCst));
    assert_eq!(lv.in_flight(), 0);
    peak.load(Ordering::SeqCst)
}

#[tokio::test]
async fn never_more_than_four_calls_in_flight() {
    assert_eq!(MAX_WORKERS, 4);
    assert_eq!(peak_concurrency(4, 24).await, 4);
}

#[tokio::test]
async fn the_cap_follows_the_worker_count() {
    assert_eq!(peak_concurrency(2, 10).await, 2);
    assert_eq!(peak_concurrency(1, 3).await, 1);
}

#[tokio::test]
async fn a_late_call_times_out_but_keeps_its_slot() {
    let node = TestNode::new();
    let lv = Libvirt::open(LibvirtConfig {
        workers: 1,
        ..node.config()
    })
    .await
    .unwrap();
    let (release, blocked) = mpsc::channel::<()>();
    let finished = Arc::new(AtomicBool::new(false));
    let queued_ran = Arc::new(AtomicBool::new(false));

    let entered = Arc::new(tokio::sync::Notify::new());
    let (inside, done) = (entered.clone(), finished.clone());
    let slow = lv.call_with_timeout("slow", Duration::from_secs(30), move |conn| {
        inside.notify_one();
        let _ = blocked.recv();
        done.store(true, Ordering::SeqCst);
        conn.hostname()
    });
    tokio::pin!(slow);
    tokio::select! {
        _ = entered.notified() => {}
        early = &mut slow => panic!("the call ended before it was released: {early:?}"),
    }
    // The worker is inside the call. With the clock paused, the deadline passes as soon as the
    // runtime idles.
    tokio::time::pause();
    let err = slow.await.unwrap_err();
    assert!(
        matches!(err, LibvirtError::Timeout { what: "slow", after } if after == Duration::from_secs(30)),
        "{err:?}"
    );
    assert_eq!(
        lv.in_flight(),
        1,
        "the worker still runs the timed-out call"
    );

    // The only worker is busy: the next call waits in the queue and times out too.
    let ran = queued_ran.clone();
    let err = lv
        .call_with_timeout("queued", Duration::from_secs(5), move |conn| {
            ran.store(true, Ordering::SeqCst);
            conn.hostname()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, LibvirtError::Timeout { what: "queued", .. }),
        "{err:?}"
    );

    tokio::time::resume();
    release.send(()).unwrap();
    assert!(lv.call("after", |conn| conn.hostname()).await.is_ok());
    assert!(finished.load(Ordering::SeqCst));
    assert!(
        !queued_ran.load(Ordering::SeqCst),
        "a call whose caller gave up while queued is skipped"
    );
    assert_eq!(lv.in_flight(), 0);
}

#[tokio::test]
async fn a_panicking_call_fails_alone() {
    let node = TestNode::new();
    let lv = Libvirt::open(LibvirtConfig {
        workers: 1,
        ..node.config()
    })
    .await
    .unwrap();
    let err = lv
        .call("boom", |_conn| -> Result<(), virt::error::Error> {
            panic!("closure panicked on purpose")
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, LibvirtError::Panicked { what: "boom" }),
        "{err:?}"
    );
    assert!(lv.call("after", |conn| conn.hostname()).await.is_ok());
    assert_eq!(lv.in_flight(), 0);
}

#[tokio::test]
async fn opening_fails_cleanly() {
    let err = Libvirt::open(LibvirtConfig {
        workers: 9,
        ..LibvirtConfig::for_uri("test:///default")
    })
    .await
    .unwrap_err();
    assert!(matches!(err, LibvirtError::InvalidConfig { .. }), "{err:?}");

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.xml");
    let err = Libvirt::open(LibvirtConfig::for_uri(format!(
        "test://{}",
        missing.display()
    )))
    .await
    .unwrap_err();
    assert!(matches!(err, LibvirtError::Connect { .. }), "{err:?}");
    assert!(err.code().is_some());
}

#[tokio::test]
async fn typed_operations_drive_a_domain_through_its_life() {
    let node = TestNode::new();
    let lv = node.open().await;
    assert!(lv.is_connected());
    assert_eq!(lv.generation(), Some(1));
    let (name, uuid) = unique("ops");

    let id = lv
        .define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();
    assert_eq!((id.uuid, id.name.as_str()), (uuid, name.as_str()));
    let listed = lv.list_all().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].uuid, uuid);
    assert_eq!(listed[0].name, name);
    assert!(!listed[0].active);
    assert_eq!(listed[0].state, DomainState::Shutoff);

    lv.start(uuid, false).await.unwrap();
    let info = lv.info(uuid).await.unwrap();
    assert_eq!(info.state, DomainState::Running);
    assert_eq!((info.max_mem_kib, info.vcpus), (65536, 1));
    assert!(lv.is_active(uuid).await.unwrap());

    lv.suspend(uuid).await.unwrap();
    assert_eq!(lv.info(uuid).await.unwrap().state, DomainState::Paused);
    assert!(lv.is_active(uuid).await.unwrap());
    lv.resume(uuid).await.unwrap();
    assert_eq!(lv.info(uuid).await.unwrap().state, DomainState::Running);
    lv.reboot(uuid).await.unwrap();
    lv.reset(uuid).await.unwrap();
    assert_eq!(lv.info(uuid).await.unwrap().state, DomainState::Running);

    let ns = "https://vireo.invalid/instance/1";
    assert_eq!(lv.get_metadata(uuid, ns, Affect::Live).await.unwrap(), None);
    let metadata = Metadata {
        xml: "<instance><flavor>m1.tiny</flavor></instance>".into(),
        key: "vireo".into(),
        uri: ns.into(),
    };
    lv.set_metadata(uuid, metadata, Affect::LiveAndConfig)
        .await
        .unwrap();
    let live = lv
        .get_metadata(uuid, ns, Affect::Live)
        .await
        .unwrap()
        .unwrap();
    assert!(live.contains("<flavor>m1.tiny</flavor>"), "{live}");
    let config = lv
        .get_metadata(uuid, ns, Affect::Config)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(live, config);
    assert!(lv.xml_desc(uuid, true).await.unwrap().contains(ns));
    lv.remove_metadata(uuid, ns, Affect::LiveAndConfig)
        .await
        .unwrap();
    assert_eq!(
        lv.get_metadata(uuid, ns, Affect::Config).await.unwrap(),
        None
    );

    let live_xml = lv.xml_desc(uuid, false).await.unwrap();
    assert!(live_xml.contains("id='1'"), "{live_xml}");
    assert!(!lv.xml_desc(uuid, true).await.unwrap().contains("id='1'"));

    lv.shutdown(uuid).await.unwrap();
    assert_eq!(lv.info(uuid).await.unwrap().state, DomainState::Shutoff);
    lv.start(uuid, false).await.unwrap();
    lv.destroy(uuid).await.unwrap();
    assert!(!lv.is_active(uuid).await.unwrap());
    lv.undefine(uuid).await.unwrap();
    assert!(lv.list_all().await.unwrap().is_empty());
}

#[tokio::test]
async fn transient_domains_vanish_when_destroyed() {
    let node = TestNode::new();
    let lv = node.open().await;
    let (name, uuid) = unique("transient");
    let id = lv.create_xml(test_domain_xml(&name, uuid)).await.unwrap();
    assert_eq!(id.uuid, uuid);
    assert!(lv.is_active(uuid).await.unwrap());
    lv.destroy(uuid).await.unwrap();
    assert!(matches!(
        lv.info(uuid).await.unwrap_err(),
        LibvirtError::NoDomain { .. }
    ));
}

/// The operations that make several libvirt calls in one worker call: a paused start on a
/// driver without `START_PAUSED`, a destroy only of what runs, metadata written where the
/// domain is defined.
#[tokio::test]
async fn composite_operations_do_what_their_calls_did() {
    let node = TestNode::new();
    let lv = node.open().await;
    let (a, b) = (unique("composite-a"), unique("composite-b"));
    for (name, uuid) in [&a, &b] {
        lv.define_xml(test_domain_xml(name, *uuid), true)
            .await
            .unwrap();
    }
    let ns = "https://vireo.invalid/instance/1";
    let meta = |flavor: &str| Metadata {
        xml: format!("<instance><flavor>{flavor}</flavor></instance>"),
        key: "vireo".into(),
        uri: ns.into(),
    };

    // Shut off: the definition only (a live write would be refused).
    lv.save_metadata(a.1, meta("m1.tiny")).await.unwrap();
    let config = lv.get_metadata(a.1, ns, Affect::Config).await.unwrap();
    assert!(config.unwrap().contains("m1.tiny"));
    assert!(!lv.destroy_if_running(a.1).await.unwrap(), "nothing ran");

    // The test driver refuses START_PAUSED: started and suspended, for both domains.
    for (_, uuid) in [&a, &b] {
        assert_eq!(
            lv.start_paused(*uuid).await.unwrap(),
            PausedStart::StartedThenSuspended
        );
        assert_eq!(lv.info(*uuid).await.unwrap().state, DomainState::Paused);
    }
    // A missing domain is still an error, not a start.
    let (_, missing) = unique("composite-missing");
    assert!(matches!(
        lv.start_paused(missing).await.unwrap_err(),
        LibvirtError::NoDomain { .. }
    ));

    // Running (paused): live and persistent metadata both change.
    lv.save_metadata(a.1, meta("m1.small")).await.unwrap();
    for affect in [Affect::Live, Affect::Config] {
        let m = lv.get_metadata(a.1, ns, affect).await.unwrap().unwrap();
        assert!(m.contains("m1.small"), "{affect:?}: {m}");
    }

    assert!(lv.destroy_if_running(a.1).await.unwrap());
    assert_eq!(lv.info(a.1).await.unwrap().state, DomainState::Shutoff);
    assert!(!lv.destroy_if_running(a.1).await.unwrap());
    assert!(!lv.destroy_if_running(missing).await.unwrap(), "no domain");
    assert!(lv.destroy_if_running(b.1).await.unwrap());
}
