//! The agent's instance API end to end over HTTP: a real server on 127.0.0.1:0, the real
//! NetworkEventActor, and the in-test `FakeDriver` (the real ComputeDriver is not on this
//! branch yet). Creates wait for real `network-vif-plugged` events posted to the agent's own
//! external-events endpoint.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;

use std::time::Duration;

use agent_common::*;
use serde_json::{json, Value};
use uuid::Uuid;
use vireo_actors::lifecycle::InstanceState;

const WITHIN: Duration = Duration::from_secs(10);

#[actix_rt::test]
async fn create_waits_for_plug_events_and_shows_progress() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let (uuid, p1, p2) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());

    let r = c
        .post(agent.url("/v1/instances"))
        .json(&create_body(uuid, &[p1, p2]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let loc = r.headers()["location"].to_str().unwrap().to_owned();
    let body: Value = r.json().await.unwrap();
    let op_id = body["operation"]["id"].as_str().unwrap().to_owned();
    assert_eq!(loc, format!("/v1/operations/{op_id}"));
    assert_eq!(body["operation"]["state"], "running");
    assert_eq!(body["operation"]["kind"], "create");
    assert_eq!(body["operation"]["instance"], uuid.to_string());

    // The show call reports the in-flight operation and the events it waits for.
    let shown = wait_instance(&c, &agent, uuid, WITHIN, |v| {
        v["operation"]["waiting_for"]
            .as_array()
            .is_some_and(|w| w.len() == 2)
    })
    .await;
    assert_eq!(shown["state"], "building");
    assert_eq!(shown["operation"]["id"], op_id);
    assert_eq!(shown["operation"]["kind"], "create");
    assert_eq!(shown["operation"]["step"], "wait-vif-plugged");
    let tags: Vec<&str> = shown["operation"]["waiting_for"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert_eq!(e["name"], "network-vif-plugged");
            e["tag"].as_str().unwrap()
        })
        .collect();
    assert_eq!(tags, [p1.to_string(), p2.to_string()]);
    assert_eq!(shown["vifs"].as_array().unwrap().len(), 2);
    assert_eq!(shown["vifs"][0]["plugged"], false);

    // One event is not enough.
    let r = c
        .post(agent.url("/v2.1/os-server-external-events"))
        .json(&plugged(uuid, p1, "completed"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let op: Value = c
        .get(agent.url(&format!("/v1/operations/{op_id}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(op["state"], "running");

    // The second one releases the wait.
    let r = c
        .post(agent.url("/os-server-external-events"))
        .json(&plugged(uuid, p2, "completed"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let op = wait_op(&c, &agent, &op_id, WITHIN).await;
    assert_eq!(op["state"], "succeeded", "{op}");
    assert_eq!(op["report"]["waits"][0]["outcome"], "completed");
    assert!(op["finished_ms"].as_u64().unwrap() >= op["started_ms"].as_u64().unwrap());

    let shown: Value = c
        .get(agent.url(&format!("/v1/instances/{uuid}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown["state"], "running");
    assert_eq!(shown["power_state"], "running");
    assert!(shown.get("operation").is_none(), "{shown}");
    assert_eq!(shown["vifs"][1]["plugged"], true);

    let list: Value = c
        .get(agent.url("/v1/instances"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["instances"].as_array().unwrap().len(), 1);
    assert_eq!(list["instances"][0]["uuid"], uuid.to_string());
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn a_failed_plug_event_fails_and_rolls_back_the_create() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let (uuid, p1) = (Uuid::new_v4(), Uuid::new_v4());
    let r: Value = c
        .post(agent.url("/v1/instances"))
        .json(&create_body(uuid, &[p1]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let op_id = r["operation"]["id"].as_str().unwrap().to_owned();
    wait_instance(&c, &agent, uuid, WITHIN, |v| {
        v["operation"]["waiting_for"][0]["tag"] == p1.to_string()
    })
    .await;
    let r = c
        .post(agent.url("/v2.1/os-server-external-events"))
        .json(&plugged(uuid, p1, "failed"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "accepted; the wait fails");
    let op = wait_op(&c, &agent, &op_id, WITHIN).await;
    assert_eq!(op["state"], "failed");
    assert_eq!(op["error"]["code"], "failed");
    assert!(
        op["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&p1.to_string()),
        "{op}"
    );
    // Rolled back: the instance is gone, and its later events are answered 404.
    let r = c
        .get(agent.url(&format!("/v1/instances/{uuid}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = c
        .post(agent.url("/v2.1/os-server-external-events"))
        .json(&plugged(uuid, p1, "completed"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn actions_run_in_the_background_and_enforce_the_lifecycle() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let uuid = Uuid::new_v4();
    agent.driver.insert(uuid, InstanceState::Running, 1);
    agent.directory_admit(uuid);

    let act = |a: Value| {
        let c = c.clone();
        let url = agent.url(&format!("/v1/instances/{uuid}/action"));
        async move { c.post(url).json(&a).send().await.unwrap() }
    };

    // Illegal in the current state: 409 at once, nothing started.
    let r = act(json!({"action": "unpause"})).await;
    assert_eq!(r.status(), 409);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "illegal-state");
    assert!(e["error"]["message"].as_str().unwrap().contains("running"));

    // A held pause is in flight: a second operation conflicts.
    agent.driver.hold(true);
    let r = act(json!({"action": "pause"})).await;
    assert_eq!(r.status(), 202);
    let pause: Value = r.json().await.unwrap();
    let pause_id = pause["operation"]["id"].as_str().unwrap().to_owned();
    let r = act(json!({"action": "power-off"})).await;
    assert_eq!(r.status(), 409);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "busy");
    assert!(e["error"]["message"].as_str().unwrap().contains(&pause_id));
    let r = c
        .delete(agent.url(&format!("/v1/instances/{uuid}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409, "delete conflicts too");
    let shown = wait_instance(&c, &agent, uuid, WITHIN, |v| {
        v["operation"]["kind"] == "pause"
    })
    .await;
    assert_eq!(shown["operation"]["id"], pause_id);
    assert_eq!(shown["state"], "running", "not paused yet");
    agent.driver.hold(false);
    let op = wait_op(&c, &agent, &pause_id, WITHIN).await;
    assert_eq!(op["state"], "succeeded");

    // A sequence of actions, each polled to its end.
    for (action, state, power) in [
        ("unpause", "running", "running"),
        ("suspend", "suspended", "suspended"),
        ("resume", "running", "running"),
        ("reboot-soft", "running", "running"),
        ("power-off", "stopped", "shutdown"),
        ("reboot-hard", "running", "running"),
    ] {
        let r = act(json!({ "action": action })).await;
        assert_eq!(r.status(), 202, "{action}");
        let op: Value = r.json().await.unwrap();
        assert_eq!(op["operation"]["kind"], action);
        let done = wait_op(&c, &agent, op["operation"]["id"].as_str().unwrap(), WITHIN).await;
        assert_eq!(done["state"], "succeeded", "{action}: {done}");
        let shown: Value = c
            .get(agent.url(&format!("/v1/instances/{uuid}")))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            (shown["state"].as_str(), shown["power_state"].as_str()),
            (Some(state), Some(power)),
            "{action}"
        );
    }

    // Interfaces.
    let port = Uuid::new_v4();
    let r = act(json!({"action": "attach-interface", "vif": vif(port, 9)})).await;
    assert_eq!(r.status(), 202);
    let op: Value = r.json().await.unwrap();
    wait_op(&c, &agent, op["operation"]["id"].as_str().unwrap(), WITHIN).await;
    let shown = wait_instance(&c, &agent, uuid, WITHIN, |v| {
        v["vifs"].as_array().unwrap().len() == 2
    })
    .await;
    assert_eq!(shown["vifs"][1]["port"], port.to_string());
    let r = act(json!({"action": "detach-interface", "port_id": port.to_string()})).await;
    let op: Value = r.json().await.unwrap();
    let done = wait_op(&c, &agent, op["operation"]["id"].as_str().unwrap(), WITHIN).await;
    assert_eq!(done["state"], "succeeded");

    // Resize, then live migration away: the instance leaves the host.
    let r = act(
        json!({"action": "resize", "flavor": {"name": "m1.small", "vcpus": 2, "memory_mib": 256}}),
    )
    .await;
    let op: Value = r.json().await.unwrap();
    wait_op(&c, &agent, op["operation"]["id"].as_str().unwrap(), WITHIN).await;
    assert_eq!(
        agent.driver.state_of(uuid),
        Some(InstanceState::ResizeSource)
    );
    let r = act(json!({"action": "confirm-resize"})).await;
    let op: Value = r.json().await.unwrap();
    wait_op(&c, &agent, op["operation"]["id"].as_str().unwrap(), WITHIN).await;
    let r = act(json!({"action": "live-migrate", "dest_host": "test-host"})).await;
    assert_eq!(r.status(), 400, "to itself");
    let r = act(json!({"action": "live-migrate", "dest_host": "other-host"})).await;
    let op: Value = r.json().await.unwrap();
    let done = wait_op(&c, &agent, op["operation"]["id"].as_str().unwrap(), WITHIN).await;
    assert_eq!(done["state"], "succeeded");
    let calls = agent.driver.calls.lock().unwrap().clone();
    assert!(
        calls
            .iter()
            .any(|c| c == &format!("resize {uuid} to m1.small on test-host")),
        "{calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| c == &format!("live-migrate {uuid} to other-host")),
        "{calls:?}"
    );
    // Events for an instance that migrated away: 422 (known, not on this host).
    let other = Uuid::new_v4();
    agent.driver.insert(other, InstanceState::Running, 0);
    agent.directory_admit(other);
    let r = c
        .post(agent.url("/v2.1/os-server-external-events"))
        .json(&json!({"events": [
            {"name": "network-changed", "server_uuid": uuid, "tag": port},
            {"name": "network-changed", "server_uuid": Uuid::new_v4()},
            {"name": "network-changed", "server_uuid": other},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 207);
    let answer: Value = r.json().await.unwrap();
    let codes: Vec<u64> = answer["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["code"].as_u64().unwrap())
        .collect();
    assert_eq!(codes, [422, 404, 200]);

    // The operations list holds them all, newest first.
    let ops: Value = c
        .get(agent.url(&format!("/v1/operations?instance={uuid}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let kinds: Vec<&str> = ops["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"live-migrate"));
    assert_eq!(kinds.last(), Some(&"pause"));
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn delete_removes_the_instance() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let uuid = Uuid::new_v4();
    agent.driver.insert(uuid, InstanceState::Stopped, 0);
    let r = c
        .delete(agent.url(&format!("/v1/instances/{uuid}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let op: Value = r.json().await.unwrap();
    assert_eq!(op["operation"]["kind"], "delete");
    let done = wait_op(&c, &agent, op["operation"]["id"].as_str().unwrap(), WITHIN).await;
    assert_eq!(done["state"], "succeeded");
    assert_eq!(done["report"]["steps"], json!(["destroy", "undefine"]));
    let r = c
        .get(agent.url(&format!("/v1/instances/{uuid}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn unknown_things_are_404_with_json_errors() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let nobody = Uuid::new_v4();
    for (method, path, body) in [
        ("GET", format!("/v1/instances/{nobody}"), None),
        ("DELETE", format!("/v1/instances/{nobody}"), None),
        (
            "POST",
            format!("/v1/instances/{nobody}/action"),
            Some(json!({"action": "pause"})),
        ),
        ("GET", format!("/v1/operations/{nobody}"), None),
        ("GET", "/v1/nothing".to_owned(), None),
    ] {
        let mut req = c.request(method.parse().unwrap(), agent.url(&path));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 404, "{method} {path}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], "not-found", "{method} {path}");
        assert!(!e["error"]["message"].as_str().unwrap().is_empty());
    }
    // Not a UUID: 400.
    let r = c
        .get(agent.url("/v1/instances/not-a-uuid"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // Nothing was started.
    assert_eq!(
        agent.svc.metrics().operations.get(&["pause", "rejected"]),
        1
    );
    assert!(agent.driver.calls.lock().unwrap().is_empty());
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn bad_bodies_are_refused_before_the_driver() {
    let mut agent = TestAgent::start_with(Options {
        extra: "max_body_bytes = 4096\n".into(),
        ..Options::default()
    })
    .await;
    let c = http();
    let uuid = Uuid::new_v4();
    let post = |body: Vec<u8>| {
        let c = c.clone();
        let url = agent.url("/v1/instances");
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
            (
                status,
                v["error"]["code"].as_str().unwrap_or("").to_owned(),
                v,
            )
        }
    };
    let outside = agent.dir.path().canonicalize().unwrap().join("api-token");
    let kernel = agent.images.join("vmlinuz");
    let cases: Vec<(Value, u16, &str)> = vec![
        (
            json!({"flavor": {"name": "m", "vcpus": "one", "memory_mib": 64}}),
            400,
            "bad-json",
        ),
        (
            json!({"flavor": {"name": "m", "vcpus": 1, "memory_mib": 64}, "colour": "red"}),
            400,
            "bad-json",
        ),
        (json!({"name": "x"}), 400, "bad-json"),
        (
            json!({"flavor": {"name": "m", "vcpus": 0, "memory_mib": 64}}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": {"name": "m", "vcpus": 1, "memory_mib": 64}, "network_info": {}}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": {"name": "m", "vcpus": 1, "memory_mib": 64},
                "network_info": [{"id": "nope", "address": "fa:16:3e:00:00:01", "type": "ovs"}]}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": {"name": "m", "vcpus": 1, "memory_mib": 64}, "image": {"kernel": outside}}),
            400,
            "invalid-path",
        ),
        (
            json!({"flavor": {"name": "m", "vcpus": 1, "memory_mib": 64},
                "image": {"kernel": agent.images.join("../api-token")}}),
            400,
            "invalid-path",
        ),
        (
            json!({"flavor": {"name": "m", "vcpus": 1, "memory_mib": 64}, "image": {"disk": "relative.img"}}),
            400,
            "invalid-path",
        ),
        (
            json!({"uuid": uuid, "flavor": {"name": "m", "vcpus": 1, "memory_mib": 64},
                "console_log": "/tmp/console.log"}),
            400,
            "invalid-path",
        ),
        (
            json!({"uuid": uuid, "flavor": {"name": "m", "vcpus": 1, "memory_mib": 64},
                "console_log": agent.instances_dir.join(uuid.to_string()).join("../x/c.log")}),
            400,
            "invalid-path",
        ),
        (
            json!({"flavor": {"name": "m", "vcpus": 1, "memory_mib": 64}, "image": {"initrd": kernel}}),
            400,
            "invalid",
        ),
    ];
    for (body, status, code) in cases {
        let (s, c, v) = post(body.to_string().into_bytes()).await;
        assert_eq!((s, c.as_str()), (status, code), "{body} -> {v}");
    }
    let (s, code, _) = post(b"{not json".to_vec()).await;
    assert_eq!((s, code.as_str()), (400, "bad-json"));
    let (s, code, v) = post(vec![b' '; 5000]).await;
    assert_eq!((s, code.as_str()), (413, "body-too-large"), "{v}");
    assert!(
        agent.driver.calls.lock().unwrap().is_empty(),
        "the driver saw nothing"
    );
    // Bodies that do not decode never reach the service; the other 9 are counted.
    assert_eq!(
        agent.svc.metrics().operations.get(&["create", "rejected"]),
        9
    );

    // A valid request with a kernel from the image dir and its own console log is accepted.
    let console = agent
        .instances_dir
        .join(uuid.to_string())
        .join("serial.log");
    let port = Uuid::new_v4();
    let (s, _, v) = post(
        json!({"uuid": uuid, "flavor": {"name": "m", "vcpus": 1, "memory_mib": 64},
               "image": {"kernel": kernel, "cmdline": "console=ttyS0"}, "console_log": console,
               "network_info": [vif(port, 1)]})
        .to_string()
        .into_bytes(),
    )
    .await;
    assert_eq!(s, 202, "{v}");
    // Creating it again while the first waits for its event conflicts.
    let (s, code, _) = post(
        json!({"uuid": uuid, "flavor": {"name": "m", "vcpus": 1, "memory_mib": 64}})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!((s, code.as_str()), (409, "busy"));
    let op = v["operation"]["id"].as_str().unwrap().to_owned();
    wait_instance(&c, &agent, uuid, WITHIN, |v| {
        v["operation"]["waiting_for"]
            .as_array()
            .is_some_and(|w| !w.is_empty())
    })
    .await;
    let r = c
        .post(agent.url("/v2.1/os-server-external-events"))
        .json(&plugged(uuid, port, "completed"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let done = wait_op(&c, &agent, &op, WITHIN).await;
    assert_eq!(done["state"], "succeeded");
    let (s, code, _) = post(
        json!({"uuid": uuid, "flavor": {"name": "m", "vcpus": 1, "memory_mib": 64}})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!((s, code.as_str()), (409, "exists"));
    // Action bodies too.
    let r = c
        .post(agent.url(&format!("/v1/instances/{uuid}/action")))
        .json(&json!({"action": "pause", "force": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = c
        .post(agent.url(&format!("/v1/instances/{uuid}/action")))
        .json(&json!({"action": "detach-interface", "port_id": "nope"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn the_api_needs_the_token() {
    let mut agent = TestAgent::start().await;
    let anon = anonymous();
    for path in ["/v1/instances", "/v1/operations", "/metrics"] {
        let r = anon.get(agent.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path}");
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], "unauthorized");
    }
    let r = anon
        .get(agent.url("/v1/instances"))
        .header("X-Auth-Token", "wrong-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = anon
        .post(agent.url("/v1/instances"))
        .header("X-Auth-Token", format!("{TOKEN}x"))
        .json(&create_body(Uuid::new_v4(), &[]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = anon
        .get(agent.url("/v1/instances"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "Authorization: Bearer works too");
    // The health check needs none.
    let r = anon.get(agent.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let h: Value = r.json().await.unwrap();
    assert_eq!(
        h,
        json!({"status": "ok", "host": "test-host", "driver": "fake"})
    );
    assert_eq!(agent.svc.metrics().auth_failures.get(&["api"]), 5);
    assert!(agent.driver.calls.lock().unwrap().is_empty());
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn metrics_report_operations_events_and_requests() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let (uuid, p1) = (Uuid::new_v4(), Uuid::new_v4());
    let r: Value = c
        .post(agent.url("/v1/instances"))
        .json(&create_body(uuid, &[p1]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // An early event for another port of the instance is buffered by the events actor.
    wait_instance(&c, &agent, uuid, WITHIN, |v| {
        v["operation"]["waiting_for"]
            .as_array()
            .is_some_and(|w| !w.is_empty())
    })
    .await;
    c.post(agent.url("/v2.1/os-server-external-events"))
        .json(&plugged(uuid, Uuid::new_v4(), "completed"))
        .send()
        .await
        .unwrap();
    c.post(agent.url("/v2.1/os-server-external-events"))
        .json(&plugged(uuid, p1, "completed"))
        .send()
        .await
        .unwrap();
    wait_op(&c, &agent, r["operation"]["id"].as_str().unwrap(), WITHIN).await;
    let r = c.get(agent.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = r.text().await.unwrap();
    for line in [
        "vireo_operations_total{kind=\"create\",result=\"succeeded\"} 1",
        "vireo_operation_duration_seconds_count{kind=\"create\",result=\"succeeded\"} 1",
        "vireo_operations_in_flight 0",
        "vireo_external_events_total{code=\"200\"} 2",
        "vireo_external_event_batches_total 2",
        "vireo_events_delivered_total 2",
        "vireo_events_early_total 1",
        "vireo_event_waits_total{result=\"completed\"} 1",
        "vireo_events_dropped_total{reason=\"unknown-instance\"} 0",
        "vireo_http_requests_total{route=\"/v1/instances\",status=\"202\"} 1",
        "vireo_http_requests_total{route=\"/v2.1/os-server-external-events\",status=\"200\"} 2",
        "vireo_instances 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(text.contains(
        "vireo_http_request_duration_seconds_bucket{route=\"/v1/instances/{uuid}\",le=\"+Inf\"}"
    ));
    agent.stop().await.unwrap();
}

trait AdmitExt {
    fn directory_admit(&self, uuid: Uuid);
}

impl AdmitExt for TestAgent {
    /// An instance put in the fake directly is known to the events endpoint too.
    fn directory_admit(&self, uuid: Uuid) {
        use vireo::agent::events::InstanceDirectory;
        self.directory.admitted(uuid);
    }
}
