//! Connection loss and recovery against a private libvirtd (test driver over a unix socket):
//! killed and restarted, and frozen (SIGSTOP) until keepalive gives up. Nothing hangs.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{next_lifecycle, test_domain_xml, unique, wait_for, TestNode};
use vireo_actors::libvirt::{
    CloseReason, Keepalive, Libvirt, LibvirtConfig, LibvirtError, LibvirtEvent, LibvirtHandle,
    LifecycleEvent,
};
use vireo_tests::private_libvirtd::PrivateLibvirtd;

/// Generous bound on anything that must happen "soon"; nothing here should come near it.
const SOON: Duration = Duration::from_secs(30);

fn config(uri: String) -> LibvirtConfig {
    LibvirtConfig {
        reconnect_min_ms: 100,
        reconnect_max_ms: 400,
        // Far beyond keepalive: if a call ends, keepalive or the socket ended it, not this.
        call_timeout_ms: 120_000,
        ..LibvirtConfig::for_uri(uri)
    }
}

/// Starts `f` on a worker and returns once the closure is running, i.e. about to call
/// libvirt.
async fn in_flight<T: Send + 'static>(
    lv: &LibvirtHandle,
    f: impl FnOnce(&virt::connect::Connect) -> Result<T, virt::error::Error> + Send + 'static,
) -> tokio::task::JoinHandle<Result<T, LibvirtError>> {
    let entered = Arc::new(tokio::sync::Notify::new());
    let inside = entered.clone();
    let lv = lv.clone();
    let task = tokio::spawn(async move {
        lv.call("in flight", move |conn| {
            inside.notify_one();
            f(conn)
        })
        .await
    });
    tokio::time::timeout(SOON, entered.notified())
        .await
        .unwrap();
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_daemon_fails_calls_and_is_reconnected_with_callbacks() {
    let mut daemon = PrivateLibvirtd::start().unwrap();
    let node = TestNode::new();
    let lv = Libvirt::open(config(daemon.uri_for(&node.path)))
        .await
        .unwrap();
    let mut events = lv.events();
    let (name, uuid) = unique("kill");
    lv.define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();
    assert_eq!(
        next_lifecycle(&mut events, uuid).await,
        LifecycleEvent::Defined
    );

    // A call blocked in the (frozen) daemon when it dies fails with a typed error.
    daemon.freeze().unwrap();
    let call = in_flight(&lv, move |conn| {
        conn.lookup_domain_by_uuid(uuid).map(|_| ())
    })
    .await;
    daemon.kill().unwrap();
    let t0 = Instant::now();
    let err = tokio::time::timeout(SOON, call)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    eprintln!("in-flight call failed after {:?}: {err:?}", t0.elapsed());
    assert!(
        matches!(err, LibvirtError::ConnectionLost { .. }),
        "{err:?}"
    );

    let lost = wait_for(&mut events, SOON, |e| {
        matches!(e, LibvirtEvent::ConnectionLost { .. })
    })
    .await;
    assert!(
        matches!(
            lost,
            LibvirtEvent::ConnectionLost {
                reason: CloseReason::Eof | CloseReason::Error | CloseReason::Detected
            }
        ),
        "{lost:?}"
    );

    // While it is down every call fails at once.
    let t0 = Instant::now();
    let err = tokio::time::timeout(SOON, lv.info(uuid))
        .await
        .unwrap()
        .unwrap_err();
    eprintln!("call while down failed after {:?}: {err:?}", t0.elapsed());
    assert!(
        matches!(err, LibvirtError::ConnectionLost { source: None, .. }),
        "{err:?}"
    );
    assert!(!lv.is_connected());

    daemon.restart().unwrap();
    let t0 = Instant::now();
    let back = wait_for(&mut events, SOON, |e| {
        matches!(e, LibvirtEvent::Reconnected { .. })
    })
    .await;
    eprintln!("reconnected {:?} after restart: {back:?}", t0.elapsed());
    let LibvirtEvent::Reconnected { domains } = back else {
        unreachable!()
    };
    // The daemon re-read the node file: the domain defined before is gone (the test driver keeps
    // state in memory), which the resync list shows.
    assert!(domains.iter().all(|d| d.uuid != uuid), "{domains:?}");
    assert_eq!(lv.generation(), Some(2));

    // The callbacks are registered on the new connection.
    let (name2, uuid2) = unique("again");
    lv.define_xml(test_domain_xml(&name2, uuid2), true)
        .await
        .unwrap();
    assert_eq!(
        next_lifecycle(&mut events, uuid2).await,
        LifecycleEvent::Defined
    );
    lv.start(uuid2, false).await.unwrap();
    assert_eq!(
        next_lifecycle(&mut events, uuid2).await,
        LifecycleEvent::Started
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_daemon_is_dropped_by_keepalive_and_reconnected_when_thawed() {
    let mut daemon = PrivateLibvirtd::start().unwrap();
    let lv = Libvirt::open(config(daemon.uri())).await.unwrap();
    assert_eq!(
        lv.config().keepalive,
        Keepalive {
            interval_s: 2,
            count: 2
        }
    );
    // The daemon frees test:///default's state when its last client goes: this second client
    // (no keepalive, so it survives the freeze) keeps it, so the domain must be there after the
    // reconnect.
    let keeper = virt::connect::Connect::open(Some(&daemon.uri())).unwrap();
    let mut events = lv.events();
    let (name, uuid) = unique("freeze");
    lv.define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();
    assert_eq!(
        next_lifecycle(&mut events, uuid).await,
        LifecycleEvent::Defined
    );

    daemon.freeze().unwrap();
    let t0 = Instant::now();
    let err = tokio::time::timeout(SOON, lv.info(uuid))
        .await
        .expect("call hung")
        .unwrap_err();
    let took = t0.elapsed();
    eprintln!("call to frozen daemon failed after {took:?}: {err:?}");
    assert!(
        matches!(
            err,
            LibvirtError::ConnectionLost {
                source: Some(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.message().is_some_and(|m| m.contains("keepalive")),
        "{err:?}"
    );

    let lost = wait_for(&mut events, SOON, |e| {
        matches!(e, LibvirtEvent::ConnectionLost { .. })
    })
    .await;
    assert!(
        matches!(
            lost,
            LibvirtEvent::ConnectionLost {
                reason: CloseReason::Keepalive | CloseReason::Detected
            }
        ),
        "{lost:?}"
    );

    // Still frozen: calls fail at once, they do not queue behind the dead connection.
    for _ in 0..6 {
        let err = tokio::time::timeout(SOON, lv.is_active(uuid))
            .await
            .expect("call hung")
            .unwrap_err();
        assert!(
            matches!(err, LibvirtError::ConnectionLost { source: None, .. }),
            "{err:?}"
        );
    }

    daemon.thaw().unwrap();
    let t0 = Instant::now();
    let back = wait_for(&mut events, SOON, |e| {
        matches!(e, LibvirtEvent::Reconnected { .. })
    })
    .await;
    eprintln!("reconnected {:?} after thaw", t0.elapsed());
    let LibvirtEvent::Reconnected { domains } = back else {
        unreachable!()
    };
    assert!(
        domains.iter().any(|d| d.uuid == uuid && d.name == name),
        "{domains:?}"
    );
    assert!(lv.info(uuid).await.is_ok());
    assert_eq!(lv.generation(), Some(2));
    drop(keeper);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_while_frozen_is_reconnected_after_restart() {
    let mut daemon = PrivateLibvirtd::start().unwrap();
    let lv = Libvirt::open(config(daemon.uri())).await.unwrap();
    let mut events = lv.events();

    daemon.freeze().unwrap();
    wait_for(&mut events, SOON, |e| {
        matches!(e, LibvirtEvent::ConnectionLost { .. })
    })
    .await;
    // The supervisor now waits in virConnectOpen on the frozen daemon; callers do not.
    let err = tokio::time::timeout(SOON, lv.list_all())
        .await
        .expect("call hung")
        .unwrap_err();
    assert!(
        matches!(err, LibvirtError::ConnectionLost { source: None, .. }),
        "{err:?}"
    );

    daemon.kill().unwrap();
    let err = tokio::time::timeout(SOON, lv.list_all())
        .await
        .expect("call hung")
        .unwrap_err();
    assert!(err.is_connection_lost(), "{err:?}");
    daemon.restart().unwrap();
    let back = wait_for(&mut events, SOON, |e| {
        matches!(e, LibvirtEvent::Reconnected { .. })
    })
    .await;
    let LibvirtEvent::Reconnected { domains } = back else {
        unreachable!()
    };
    assert_eq!(
        domains.len(),
        1,
        "the restarted daemon's default state: {domains:?}"
    );
    assert_eq!(domains[0].name, "test");
    assert_eq!(lv.list_all().await.unwrap(), domains);
    assert!(lv.generation().is_some_and(|g| g >= 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_handle_while_the_daemon_is_frozen_does_not_hang() {
    let mut daemon = PrivateLibvirtd::start().unwrap();
    let lv = Libvirt::open(LibvirtConfig {
        join_timeout_ms: 300,
        ..config(daemon.uri())
    })
    .await
    .unwrap();
    let mut events = lv.events();
    daemon.freeze().unwrap();
    wait_for(&mut events, SOON, |e| {
        matches!(e, LibvirtEvent::ConnectionLost { .. })
    })
    .await;
    wait_for(&mut events, SOON, |e| {
        matches!(e, LibvirtEvent::Reconnecting { attempt: 1 })
    })
    .await;

    // The supervisor is (about to be) blocked in virConnectOpen on the frozen daemon: the drop
    // waits join_timeout for it, then gives up instead of hanging.
    let t0 = Instant::now();
    tokio::time::timeout(SOON, tokio::task::spawn_blocking(move || drop(lv)))
        .await
        .expect("drop hung")
        .unwrap();
    let took = t0.elapsed();
    eprintln!("drop returned after {took:?}");
    assert!(
        took >= Duration::from_millis(300),
        "the supervisor was not stuck: {took:?}"
    );
    daemon.thaw().unwrap();
}
