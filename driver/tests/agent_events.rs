//! `POST /os-server-external-events` over HTTP, as Neutron's Nova notifier calls it: tokens,
//! Nova's per-event codes and 200/207 answers, Nova's faults, microversions and request ids,
//! body validation and size limit, and events
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
async fn nova_answers_per_event_and_207_when_any_failed() {
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
            {"name": "accelerator-request-bound", "server_uuid": b},
            {"name": "volume-extended", "server_uuid": b},
            {"name": "power-update", "server_uuid": b, "tag": "POWER_OFF"},
        ]}))
        .header("OpenStack-API-Version", "compute 2.82")
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
            (400, "failed", "accelerator-request-bound"),
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

    // None of the instances exists: still 207 with the per-event answers (Nova since bug
    // 1855752; a 404 made Neutron's notifier lose them).
    let r = c
        .post(agent.url(PATH))
        .json(&plugged(stranger, &Uuid::new_v4().to_string(), "completed"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 207);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["events"][0]["code"], 404);
    assert_eq!(e["events"][0]["status"], "failed");

    // The bare path and an endpoint with the project id (an old-style catalog) work as well
    // as /v2.1.
    for path in [
        "/os-server-external-events",
        "/v2.1/1d2b9ce5f0a94a1fa1b1c7c5e7d0a3b4/os-server-external-events",
    ] {
        let r = c
            .post(agent.url(path))
            .json(&plugged(a, &Uuid::new_v4().to_string(), "completed"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }

    // Only accepted events reach the actor (4 of the 8 above went there).
    let stats = agent.driver.event_stats().await.unwrap();
    assert_eq!(stats.delivered, 4, "{stats:?}");
    let m = agent.svc.metrics();
    assert_eq!(m.events_received.get(&["200"]), 4);
    assert_eq!(m.events_received.get(&["404"]), 2);
    assert_eq!(m.events_received.get(&["400"]), 2);
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn bad_bodies_are_400_or_413_and_reach_nothing() {
    let mut agent = TestAgent::start_with(Options {
        extra: "max_body_bytes = 2048\n".into(),
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
    // Nova's faults: `{"badRequest": {"code": 400, "message"}}`, `overLimit` for 413.
    let cases: Vec<(Vec<u8>, u16, &str, &str)> = vec![
        (b"not json".to_vec(), 400, "badRequest", "Invalid input"),
        (b"".to_vec(), 400, "badRequest", "Invalid input"),
        (json!({"events": "x"}).to_string().into_bytes(), 400, "badRequest", "Invalid input"),
        (json!({"events": [{"name": 1, "server_uuid": a}]}).to_string().into_bytes(), 400, "badRequest", "Invalid input"),
        (json!({"events": [{"name": "network-changed", "server_uuid": a, "tag": 5}]}).to_string().into_bytes(), 400, "badRequest", "Invalid input"),
        (json!({"events": [{"name": "network-changed"}]}).to_string().into_bytes(), 400, "badRequest", "server_uuid"),
        (json!({"events": [{"name": "network-changed", "server_uuid": a, "x": 1}]}).to_string().into_bytes(), 400, "badRequest", "unknown field"),
        (json!({"events": [], "extra": true}).to_string().into_bytes(), 400, "badRequest", "unknown field"),
        (json!({"events": []}).to_string().into_bytes(), 400, "badRequest", "at least one event"),
        (json!({"events": [{"name": "network-changed", "server_uuid": "12345"}]}).to_string().into_bytes(), 400, "badRequest", "is not a UUID"),
        (json!({"events": [{"name": "network-changed", "server_uuid": a, "status": "done"}]}).to_string().into_bytes(), 400, "badRequest", "status"),
        (json!({"events": [{"name": "network-changed", "server_uuid": a, "tag": "t".repeat(256)}]}).to_string().into_bytes(), 400, "badRequest", "255"),
        (json!({"events": [{"name": "network-vif-exploded", "server_uuid": a}]}).to_string().into_bytes(), 400, "badRequest", "network-vif-exploded"),
        // Asked for 2.1 (no header): power-update is not in that version's schema.
        (json!({"events": [{"name": "power-update", "server_uuid": a, "tag": "POWER_ON"}]}).to_string().into_bytes(), 400, "badRequest", "power-update"),
        (vec![b' '; 3000], 413, "overLimit", "larger than 2048"),
    ];
    for (body, status, fault, says) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        let (s, v) = post(body).await;
        assert_eq!(s, status, "{shown} -> {v}");
        assert_eq!(v[fault]["code"], status, "{shown} -> {v}");
        let message = v[fault]["message"].as_str().unwrap();
        assert!(message.contains(says), "{shown} -> {message}");
    }
    // No count limit (Nova has none, and Neutron drops a refused batch whole): 20 events in
    // a body under the size limit.
    let twenty: Vec<Value> = (0..20)
        .map(|_| json!({"name": "network-changed", "server_uuid": a}))
        .collect();
    let (s, v) = post(json!({"events": twenty}).to_string().into_bytes()).await;
    assert_eq!((s, v["events"].as_array().unwrap().len()), (200, 20));
    // A chunked body without Content-Length is capped while it is read.
    let status = chunked_post(&agent, 10, 512).await;
    assert_eq!(status, 413);
    assert_eq!(
        agent.driver.event_stats().await.unwrap().delivered,
        20,
        "only the valid batch"
    );
    assert_eq!(agent.svc.metrics().event_batches.get(&[]), 1);
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn answers_name_their_microversion_and_request_id() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let a = known(&agent).await;
    let body = plugged(a, &Uuid::new_v4().to_string(), "completed");
    let versions = |r: &reqwest::Response| {
        let h = r.headers();
        let get = |n: &str| h.get(n).map(|v| v.to_str().unwrap().to_owned());
        let vary: Vec<String> = h
            .get_all("vary")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        (
            get("openstack-api-version"),
            get("x-openstack-nova-api-version"),
            vary,
        )
    };
    // Neutron's notifier: the legacy header at 2.1.
    let r = neutron_request(&c, &agent, TOKEN, &body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (std, legacy, vary) = versions(&r);
    assert_eq!(
        (std.as_deref(), legacy.as_deref()),
        (Some("compute 2.1"), Some("2.1"))
    );
    assert!(
        vary.iter().any(|v| v == "OpenStack-API-Version"),
        "{vary:?}"
    );
    assert!(vary.iter().any(|v| v == "X-OpenStack-Nova-API-Version"));
    // Request ids: `req-<uuid>`, a new one per request, under both of Nova's names.
    let id = |r: &reqwest::Response| {
        r.headers()
            .get("x-openstack-request-id")
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned()
    };
    let first = id(&r);
    assert!(
        Uuid::parse_str(first.strip_prefix("req-").unwrap()).is_ok(),
        "{first}"
    );
    assert_eq!(r.headers()["x-compute-request-id"], first.as_str());
    let r = c
        .post(agent.url(PATH))
        .header("X-OpenStack-Request-ID", format!("req-{}", Uuid::new_v4()))
        .header("OpenStack-API-Version", "compute latest")
        .json(&json!({"events": [
            {"name": "volume-reimaged", "server_uuid": a, "tag": "vol"},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_ne!(id(&r), first);
    let (std, legacy, _) = versions(&r);
    assert_eq!(
        (std.as_deref(), legacy.as_deref()),
        (Some("compute 2.93"), Some("2.93"))
    );
    // The agent's own API carries request ids too.
    let r = c.get(agent.url("/v1/instances")).send().await.unwrap();
    assert!(id(&r).starts_with("req-"));

    // A version that is not X.Y: 400; outside 2.1..=2.93: 406; both as Nova's faults.
    for (header, status, fault) in [
        ("compute two", 400, "badRequest"),
        ("compute 2.0", 406, "computeFault"),
        ("compute 2.94", 406, "computeFault"),
        ("compute 3.1", 406, "computeFault"),
    ] {
        let r = c
            .post(agent.url(PATH))
            .header("OpenStack-API-Version", header)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{header}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v[fault]["code"], status, "{header}: {v}");
    }
    let m = "Version 2.94 is not supported by the API. Minimum is 2.1 and maximum is 2.93.";
    let r = c
        .post(agent.url(PATH))
        .header("X-OpenStack-Nova-API-Version", "2.94")
        .json(&body)
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["computeFault"]["message"], m);
    // A fault after the version was read names it.
    let r = c
        .post(agent.url(PATH))
        .header("X-OpenStack-Nova-API-Version", "2.51")
        .json(&json!({"events": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(versions(&r).1.as_deref(), Some("2.51"));
    assert_eq!(
        agent.driver.event_stats().await.unwrap().delivered,
        2,
        "refused requests delivered nothing"
    );
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
        assert_eq!(e["unauthorized"]["code"], 401);
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
