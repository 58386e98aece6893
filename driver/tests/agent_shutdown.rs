//! Graceful shutdown with operations in flight: the server stops accepting, event waits are
//! failed (the operation rolls back), the driver is told to stop, and whatever still runs at
//! the deadline is aborted and recorded — all within `shutdown_timeout`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;

use std::time::Duration;

use agent_common::*;
use serde_json::{json, Value};
use tokio::time::Instant;
use uuid::Uuid;
use vireo::agent::error::ApiError;
use vireo::agent::events::InstanceDirectory;
use vireo::agent::model::{OpKind, OpState};
use vireo_actors::lifecycle::InstanceState;

const WITHIN: Duration = Duration::from_secs(10);

async fn refused(agent: &TestAgent) -> bool {
    tokio::net::TcpStream::connect(agent.addr).await.is_err()
}

#[actix_rt::test]
async fn shutdown_fails_event_waits_and_the_create_rolls_back() {
    let mut agent = TestAgent::start_with(Options {
        extra: "shutdown_timeout = 20\n".into(),
        ..Options::default()
    })
    .await;
    let c = http();
    let (uuid, port) = (Uuid::new_v4(), Uuid::new_v4());
    let r: Value = c
        .post(agent.url("/v1/instances"))
        .json(&create_body(uuid, &[port]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let op: Uuid = r["operation"]["id"].as_str().unwrap().parse().unwrap();
    wait_instance(&c, &agent, uuid, WITHIN, |v| {
        v["operation"]["waiting_for"]
            .as_array()
            .is_some_and(|w| !w.is_empty())
    })
    .await;

    let t0 = Instant::now();
    agent.stop().await.unwrap();
    // Far less than the 300 s event timeout and the 20 s shutdown bound: the wait was failed
    // at once and the spawn rolled back.
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    let done = agent.svc.operations().get(op).unwrap();
    assert_eq!(done.state, OpState::Failed);
    let err = done.error.unwrap();
    assert_eq!(err.code, "failed");
    assert!(err.message.contains("shut down"), "{}", err.message);
    assert!(agent.driver.was_shut_down());
    assert_eq!(agent.driver.state_of(uuid), None, "rolled back");
    assert!(!agent.directory.knows(&uuid));
    assert!(refused(&agent).await, "no longer accepting");
    assert_eq!(agent.svc.operations().running_count(), 0);
}

#[actix_rt::test]
async fn the_driver_is_told_to_finish_its_operations() {
    let mut agent = TestAgent::start_with(Options {
        extra: "shutdown_timeout = 20\n".into(),
        ..Options::default()
    })
    .await;
    let c = http();
    let uuid = Uuid::new_v4();
    agent.driver.insert(uuid, InstanceState::Running, 0);
    agent.driver.hold(true);
    let r: Value = c
        .post(agent.url(&format!("/v1/instances/{uuid}/action")))
        .json(&json!({"action": "reboot-hard"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let op: Uuid = r["operation"]["id"].as_str().unwrap().parse().unwrap();
    wait_instance(&c, &agent, uuid, WITHIN, |v| {
        v["operation"]["kind"] == "reboot-hard"
    })
    .await;

    let t0 = Instant::now();
    agent.stop().await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(20));
    let done = agent.svc.operations().get(op).unwrap();
    assert_eq!(done.state, OpState::Failed);
    assert_eq!(done.error.unwrap().code, "shutting-down");
    assert_eq!(agent.driver.state_of(uuid), Some(InstanceState::Running));
    assert!(refused(&agent).await);
}

#[actix_rt::test]
async fn a_stuck_operation_is_aborted_at_the_deadline() {
    let mut agent = TestAgent::start_with(Options {
        extra: "shutdown_timeout = 1\n".into(),
        ..Options::default()
    })
    .await;
    let c = http();
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    agent.driver.insert(a, InstanceState::Running, 0);
    agent.driver.insert(b, InstanceState::Running, 0);
    agent.driver.set_stuck(true);
    let mut ops = Vec::new();
    for u in [a, b] {
        let r: Value = c
            .post(agent.url(&format!("/v1/instances/{u}/action")))
            .json(&json!({"action": "power-off"}))
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
    wait_instance(&c, &agent, b, WITHIN, |v| {
        v["operation"]["kind"] == "power-off"
    })
    .await;

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
    assert_eq!(m.operations.get(&["power-off", "failed"]), 2);
    assert_eq!(
        m.ops_in_flight.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert!(agent.driver.was_shut_down());
    // The registry is closed: nothing new is admitted.
    assert!(matches!(
        agent.svc.operations().admit(a, OpKind::PowerOn),
        Err(ApiError::ShuttingDown)
    ));
    assert!(refused(&agent).await);
}

#[actix_rt::test]
async fn an_idle_agent_stops_at_once() {
    let mut agent = TestAgent::start().await;
    let r = http().get(agent.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let t0 = Instant::now();
    agent.stop().await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(agent.driver.was_shut_down());
    assert!(
        agent.events.stats().await.is_err(),
        "the events actor is stopped"
    );
    assert!(refused(&agent).await);
}
