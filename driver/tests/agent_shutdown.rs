//! Graceful shutdown with operations in flight, over the real `LibvirtDriver`: the server
//! stops accepting, the driver fails the event waits (the operation rolls back), and an
//! operation stuck in a libvirt call (a frozen private libvirtd) is aborted and recorded at the
//! deadline — all within `drain_timeout`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_common::*;
use serde_json::{json, Value};
use tokio::time::Instant;
use uuid::Uuid;
use vireo::agent::error::ApiError;
use vireo::agent::model::OpState;
use vireo::compute::ComputeDriver;
use vireo_actors::instance::Operation;
use vireo_tests::private_libvirtd::PrivateLibvirtd;

const WITHIN: Duration = Duration::from_secs(30);

async fn refused(agent: &TestAgent) -> bool {
    tokio::net::TcpStream::connect(agent.addr).await.is_err()
}

#[actix_rt::test]
async fn shutdown_fails_event_waits_and_the_create_rolls_back() {
    let mut agent = TestAgent::start_with(Options {
        extra: "drain_timeout = 20\n".into(),
        ..Options::default()
    })
    .await;
    let c = http();
    let uuid = Uuid::new_v4();
    let (op, tags) = create_waiting(&c, &agent, uuid, 1).await;
    let op: Uuid = op.parse().unwrap();

    let t0 = Instant::now();
    agent.stop().await.unwrap();
    // Far less than the 60 s event timeout and the 20 s bound: the wait failed at once and
    // the build was cleaned up.
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    let done = agent.svc.operations().get(op).unwrap();
    assert_eq!(done.state, OpState::Failed);
    let err = done.error.unwrap();
    assert_eq!(err.code, "build-failed", "{}", err.message);
    let domains = agent.driver.libvirt().list_all().await.unwrap();
    assert!(
        domains.iter().all(|d| d.uuid != uuid),
        "domain left: {domains:?}"
    );
    let port = tags[0].parse().unwrap();
    assert!(
        agent.driver.network().get_port(port).await.is_err(),
        "port released"
    );
    assert!(refused(&agent).await, "no longer accepting");
    assert_eq!(agent.svc.operations().running_count(), 0);
    assert!(
        agent.driver.event_stats().await.is_none(),
        "the events actor is stopped"
    );
}

#[actix_rt::test]
async fn an_operation_stuck_in_libvirt_is_aborted_at_the_deadline() {
    let mut daemon = PrivateLibvirtd::start().unwrap();
    let nodes = tempfile::tempdir().unwrap();
    let node = nodes.path().join("node.xml");
    std::fs::write(&node, "<node/>\n").unwrap();
    let mut agent = TestAgent::start_with(Options {
        extra: "drain_timeout = 1\n".into(),
        libvirt: format!("uri = {:?}\ncall_timeout = 120\n", daemon.uri_for(&node)),
        ..Options::default()
    })
    .await;
    let c = http();
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    agent.spawn_direct(a).await;
    agent.spawn_direct(b).await;

    // libvirtd stops answering: every libvirt call now blocks.
    daemon.freeze().unwrap();
    let mut ops = Vec::new();
    for u in [a, b] {
        let r: Value = c
            .post(agent.url(&format!("/v1/instances/{u}/action")))
            .json(&json!({"action": "pause"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ops.push(
            r["operation"]["id"]
                .as_str()
                .unwrap()
                .parse::<Uuid>()
                .unwrap(),
        );
    }
    assert_eq!(agent.svc.operations().running_count(), 2);

    let t0 = Instant::now();
    agent.stop().await.unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "waited for the deadline: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "bounded: {took:?}");
    for id in ops {
        let done = agent.svc.operations().get(id).unwrap();
        assert_eq!(done.state, OpState::Failed);
        assert_eq!(done.error.unwrap().code, "shutdown");
    }
    let m = agent.svc.metrics();
    assert_eq!(m.operations.get(&["pause", "failed"]), 2);
    assert_eq!(m.ops_in_flight.load(Ordering::Relaxed), 0);
    // The registry is closed: nothing new is admitted.
    assert!(matches!(
        agent.svc.action(a, Operation::PowerOn {}).await,
        Err(ApiError::ShuttingDown)
    ));
    assert!(refused(&agent).await);
    daemon.thaw().unwrap();
}

#[actix_rt::test]
async fn an_idle_agent_stops_at_once() {
    let mut agent = TestAgent::start().await;
    let r = http().get(agent.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let t0 = Instant::now();
    agent.stop().await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(agent.driver.event_stats().await.is_none());
    assert!(refused(&agent).await);
    let _ = WITHIN;
}
