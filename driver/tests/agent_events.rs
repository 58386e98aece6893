//! `POST /os-server-external-events` over HTTP, as Neutron's Nova notifier calls it: tokens,
//! Nova's per-event codes and 200/207/404 answers, body validation and size limit, and events
//! reaching the real NetworkEventActor of the real `LibvirtDriver` (a wait registered on it
//! is released or failed). Which instances are "here" comes from the driver.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;

use std::time::Duration;

use agent_common::*;
use serde_json::{json, Value};
use tokio::time::Instant;
use uuid::Uuid;
use vireo::compute::ComputeDriver;
use vireo_actors::events::{OpId, WaitError, WaitPolicy};
use vireo_actors::predict::ExpectedEvent;
use vireo_actors::vif::PortId;

const PATH: &str = "/v2.1/os-server-external-events";

/// What Neutron's notifier sends with `[nova] auth_type = none`.
fn neutron_request(
    c: &reqwest::Client,
    agent: &TestAgent,
    token: &str,
    body: &Value,
) -> reqwest::RequestBuilder {
    c.post(agent.url(PATH))
        .header("X-Auth-Token", token)
        .header("X-OpenStack-Nova-API-Version", "2.1")
        .header("Content-Type", "application/json")
        .header("Accept", "application/json")
        .body(body.to_string())
}

/// An instance on the agent's host (no ports).
async fn known(agent: &TestAgent) -> Uuid {
    let u = Uuid::new_v4();
    agent.spawn_direct(u).await;
    u
}

#[actix_rt::test]
async fn events_release_a_wait_registered_on_the_events_actor() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let server = known(&agent).await;
    let (p1, p2) = (PortId(Uuid::new_v4()), PortId(Uuid::new_v4()));
    let policy = WaitPolicy {
        timeout: Duration::from_secs(30),
        fatal: true,
    };
    let wait = agent
        .driver
        .events()
        .expect(
            server,
            vec![ExpectedEvent::plugged(p1), ExpectedEvent::plugged(p2)],
            Instant::now(),
            policy,
            OpId(7),
        )
        .await
        .unwrap();
    assert!(!wait.is_ready());
    // One POST carrying both events (Neutron batches per 2 s window), plus noise.
    let r = c
        .post(agent.url(PATH))
        .json(&json!({"events": [
            {"name": "network-changed", "server_uuid": server, "tag": p1.to_string()},
            {"name": "network-vif-plugged", "server_uuid": server, "tag": p1.to_string(), "status": "completed"},
            {"name": "network-vif-plugged", "server_uuid": server, "tag": p2.to_string()},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["events"].as_array().unwrap().len(), 3);
    for e in answer["events"].as_array().unwrap() {
        assert_eq!(
            (e["code"].as_u64(), e["status"].as_str()),
            (Some(200), Some("completed")),
            "{e}"
        );
    }
    let outcome = tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap()
        .unwrap();
    assert!(outcome.waited && outcome.complete());
    let stats = agent.driver.event_stats().await.unwrap();
    assert_eq!(stats.delivered, 3);
    assert_eq!(stats.matched, 2);
    assert_eq!(
        agent.svc.metrics().event_batches.get(&[]),
        1,
        "one POST = one batch"
    );
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn a_failed_event_fails_a_fatal_wait_naming_the_port() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let server = known(&agent).await;
    let p1 = PortId(Uuid::new_v4());
    let wait = agent
        .driver
        .events()
        .expect(
            server,
            vec![ExpectedEvent::plugged(p1)],
            Instant::now(),
            WaitPolicy::default(),
            OpId(1),
        )
        .await
        .unwrap();
    let r = c
        .post(agent.url(PATH))
        .json(&plugged(server, &p1.to_string(), "failed"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let err = tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(err, WaitError::Failed { port, .. } if port == p1),
        "{err:?}"
    );
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn nova_answers_per_event_and_207_or_404_overall() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let (a, b) = (known(&agent).await, known(&agent).await);
    let stranger = Uuid::new_v4();
    let port = Uuid::new_v4().to_string();

    // Some accepted, some not: 207, every event echoed with its code, failed ones "failed".
    let r = c
        .post(agent.url(PATH))
        .json(&json!({"events": [
            {"name": "network-vif-plugged", "server_uuid": a, "tag": port},
            {"name": "network-vif-plugged", "server_uuid": stranger, "tag": port},
            {"name": "network-vif-exploded", "server_uuid": b, "tag": port},
            {"name": "volume-extended", "server_uuid": b},
            {"name": "power-update", "server_uuid": b, "tag": "POWER_OFF"},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 207);
    let answer: Value = r.json().await.unwrap();
    let got: Vec<(u64, &str, &str)> = answer["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["code"].as_u64().unwrap(),
                e["status"].as_str().unwrap(),
                e["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (200, "completed", "network-vif-plugged"),
            (404, "failed", "network-vif-plugged"),
            (400, "failed", "network-vif-exploded"),
            (400, "failed", "volume-extended"),
            (200, "completed", "power-update"),
        ]
    );
    assert_eq!(
        answer["events"][1]["server_uuid"],
        stranger.to_string(),
        "echoed as sent"
    );
    assert!(answer["events"][3].get("tag").is_none());

    // None of the instances exists: 404 with a JSON error.
    let r = c
        .post(agent.url(PATH))
        .json(&plugged(stranger, &Uuid::new_v4().to_string(), "completed"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "not-found");
    assert_eq!(e["error"]["message"], "No instances found for any event");

    // The bare path works as well as /v2.1.
    let r = c
        .post(agent.url("/os-server-external-events"))
        .json(&plugged(a, &Uuid::new_v4().to_string(), "completed"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Only accepted events reach the actor (3 of the 7 above went there).
    let stats = agent.driver.event_stats().await.unwrap();
    assert_eq!(stats.delivered, 3, "{stats:?}");
    let m = agent.svc.metrics();
    assert_eq!(m.events_received.get(&["200"]), 3);
    assert_eq!(m.events_received.get(&["404"]), 2);
    assert_eq!(m.events_received.get(&["400"]), 2);
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn bad_bodies_are_400_or_413_and_reach_nothing() {
    let mut agent = TestAgent::start_with(Options {
        extra: "max_body_bytes = 2048\nmax_events_per_request = 5\n".into(),
        ..Options::default()
    })
    .await;
    let c = http();
    let a = known(&agent).await;
    let post = |body: Vec<u8>| {
        let c = c.clone();
        let url = agent.url(PATH);
        async move {
            let r = c
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let v: Value = r.json().await.unwrap();
            (status, v)
        }
    };
    let too_many: Vec<Value> = (0..6)
        .map(|_| json!({"name": "network-changed", "server_uuid": a}))
        .collect();
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"not json".to_vec(), 400, "bad-json"),
        (b"".to_vec(), 400, "bad-json"),
        (json!({"events": "x"}).to_string().into_bytes(), 400, "bad-json"),
        (json!({"events": [{"name": 1, "server_uuid": a}]}).to_string().into_bytes(), 400, "bad-json"),
        (json!({"events": [{"name": "network-changed", "server_uuid": a, "tag": 5}]}).to_string().into_bytes(), 400, "bad-json"),
        (json!({"events": [{"name": "network-changed"}]}).to_string().into_bytes(), 400, "bad-json"),
        (json!({"events": [{"name": "network-changed", "server_uuid": a, "x": 1}]}).to_string().into_bytes(), 400, "bad-json"),
        (json!({"events": [], "extra": true}).to_string().into_bytes(), 400, "bad-json"),
        (json!({"events": []}).to_string().into_bytes(), 400, "invalid"),
        (json!({"events": too_many}).to_string().into_bytes(), 400, "invalid"),
        (json!({"events": [{"name": "network-changed", "server_uuid": "12345"}]}).to_string().into_bytes(), 400, "invalid"),
        (json!({"events": [{"name": "network-changed", "server_uuid": a, "status": "done"}]}).to_string().into_bytes(), 400, "invalid"),
        (json!({"events": [{"name": "network-changed", "server_uuid": a, "tag": "t".repeat(256)}]}).to_string().into_bytes(), 400, "invalid"),
        (vec![b' '; 3000], 413, "body-too-large"),
    ];
    for (body, status, code) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        let (s, v) = post(body).await;
        assert_eq!(
            (s, v["error"]["code"].as_str().unwrap()),
            (status, code),
            "{shown} -> {v}"
        );
    }
    // A chunked body without Content-Length is capped while it is read.
    let status = chunked_post(&agent, 10, 512).await;
    assert_eq!(status, 413);
    assert_eq!(agent.driver.event_stats().await.unwrap().delivered, 0);
    assert_eq!(agent.svc.metrics().event_batches.get(&[]), 0);
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn events_need_a_token_and_notused_only_when_allowed() {
    let mut agent = TestAgent::start_with(Options {
        events_token: true,
        ..Options::default()
    })
    .await;
    let anon = anonymous();
    let a = known(&agent).await;
    let body = plugged(a, &Uuid::new_v4().to_string(), "completed");
    let r = anon.post(agent.url(PATH)).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 401, "no token");
    for wrong in [
        "notused",
        "wrong-token-000000000000",
        "",
        &TOKEN[..TOKEN.len() - 1],
    ] {
        let r = neutron_request(&anon, &agent, wrong, &body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{wrong:?}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], "unauthorized");
    }
    for good in [TOKEN, EVENTS_TOKEN] {
        let r = neutron_request(&anon, &agent, good, &body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let answer: Value = r.json().await.unwrap();
        assert_eq!(answer["events"][0]["code"], 200);
    }
    // The events token opens only the events endpoint.
    let r = anon
        .get(agent.url("/v1/instances"))
        .header("X-Auth-Token", EVENTS_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(agent.svc.metrics().auth_failures.get(&["events"]), 5);
    assert_eq!(
        agent.driver.event_stats().await.unwrap().delivered,
        2,
        "refused POSTs delivered nothing"
    );
    agent.stop().await.unwrap();

    // accept_noauth_events (loopback only): Neutron's `notused` is accepted on the events
    // endpoint, never on the API.
    let mut agent = TestAgent::start_with(Options {
        extra: "accept_noauth_events = true\n".into(),
        ..Options::default()
    })
    .await;
    let a = known(&agent).await;
    let r = neutron_request(
        &anon,
        &agent,
        "notused",
        &plugged(a, &Uuid::new_v4().to_string(), "completed"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let r = anon
        .get(agent.url("/v1/instances"))
        .header("X-Auth-Token", "notused")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = anon
        .post(agent.url(PATH))
        .json(&plugged(a, &Uuid::new_v4().to_string(), "completed"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "a token is still required");
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn a_configured_token_header_is_used() {
    let mut agent = TestAgent::start_with(Options {
        extra: "token_header = \"X-Vireo-Token\"\n".into(),
        ..Options::default()
    })
    .await;
    let anon = anonymous();
    let a = known(&agent).await;
    let body = plugged(a, &Uuid::new_v4().to_string(), "completed");
    let r = anon
        .post(agent.url(PATH))
        .header("X-Auth-Token", TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = anon
        .post(agent.url(PATH))
        .header("X-Vireo-Token", TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    agent.stop().await.unwrap();
}

/// POST `n` chunks of `size` spaces with `Transfer-Encoding: chunked`; returns the status.
async fn chunked_post(agent: &TestAgent, n: usize, size: usize) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(agent.addr).await.unwrap();
    let head = format!(
        "POST {PATH} HTTP/1.1\r\nHost: {}\r\nX-Auth-Token: {TOKEN}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        agent.addr
    );
    s.write_all(head.as_bytes()).await.unwrap();
    for _ in 0..n {
        let chunk = format!("{size:x}\r\n{}\r\n", " ".repeat(size));
        // The server may answer and close before every chunk is written.
        if s.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let _ = s.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer);
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}
