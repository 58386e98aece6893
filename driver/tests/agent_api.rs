//! The agent's instance API end to end over HTTP: a real server on 127.0.0.1:0 over the real
//! `LibvirtDriver` on libvirt's test driver (private node file), the embedded network service
//! and the recording plugger. The test plays Neutron: the plug events come only from its POSTs
//! to the agent's external-events endpoint.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;

use std::time::Duration;

use agent_common::*;
use serde_json::{json, Value};
use uuid::Uuid;
use vireo::compute::ComputeDriver;
use vireo_actors::lifecycle::InstanceState;
use vireo_actors::network::PortUpdate;

const WITHIN: Duration = Duration::from_secs(30);

async fn get(c: &reqwest::Client, agent: &TestAgent, path: &str) -> (u16, Value) {
    let r = c.get(agent.url(path)).send().await.unwrap();
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

#[actix_rt::test]
async fn create_waits_for_the_plug_events_posted_to_the_agent() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let uuid = Uuid::new_v4();

    let r = c
        .post(agent.url("/v1/instances"))
        .json(&create_body(uuid, 2))
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

    // The show call reports the operation in flight and the events it waits for.
    let shown = wait_instance(&c, &agent, uuid, WITHIN, |v| {
        awaited_tags(v).len() == 2 && v["operation"]["phase"] == "wait for events"
    })
    .await;
    assert_eq!(shown["state"], "building");
    assert_eq!(shown["host"], HOST);
    assert_eq!(shown["operation"]["id"], op_id);
    assert_eq!(shown["operation"]["kind"], "create");
    assert_eq!(shown["operation"]["phase"], "wait for events");
    for e in shown["operation"]["waiting_for"].as_array().unwrap() {
        assert_eq!(e["name"], "network-vif-plugged");
    }
    let tags = awaited_tags(&shown);

    // One event is not enough.
    let (s, _) = post_events(&c, &agent, &plugged(uuid, &tags[0], "completed")).await;
    assert_eq!(s, 200);
    let deadline = tokio::time::Instant::now() + WITHIN;
    while agent.driver.event_stats().await.unwrap().matched < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the event never matched"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (_, op) = get(&c, &agent, &format!("/v1/operations/{op_id}")).await;
    assert_eq!(op["state"], "running", "still waiting for the second port");

    // The second one, on the bare path, releases the wait.
    let r = c
        .post(agent.url("/os-server-external-events"))
        .json(&plugged(uuid, &tags[1], "completed"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let op = wait_op(&c, &agent, &op_id, WITHIN).await;
    assert_eq!(op["state"], "succeeded", "{op}");
    assert_eq!(op["report"]["request"], "spawn");
    let wait = op["report"]["waits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["timing"] == "plug-time")
        .unwrap();
    assert_eq!(wait["complete"], true, "{op}");
    assert_eq!(wait["expected"].as_array().unwrap().len(), 2);
    assert!(op["finished_ms"].as_u64().unwrap() >= op["started_ms"].as_u64().unwrap());

    let (s, shown) = get(&c, &agent, &format!("/v1/instances/{uuid}")).await;
    assert_eq!(s, 200);
    assert_eq!(shown["state"], "running");
    assert_eq!(shown["power_state"], "running");
    assert_eq!(shown["flavor"], "m1.tiny");
    assert!(shown.get("operation").is_none(), "{shown}");
    assert_eq!(shown["last_operation"]["request"], "spawn");
    let vif_ports: Vec<&str> = shown["vifs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["port"].as_str().unwrap())
        .collect();
    assert_eq!(vif_ports, tags, "the awaited ports are the instance's VIFs");
    assert_eq!(shown["vifs"][0]["hybrid"], true);

    let (_, list) = get(&c, &agent, "/v1/instances").await;
    assert_eq!(list["instances"].as_array().unwrap().len(), 1);
    assert_eq!(list["instances"][0]["uuid"], uuid.to_string());
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn a_failed_plug_event_fails_the_create_and_it_is_cleaned_up() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let uuid = Uuid::new_v4();
    let (op_id, tags) = create_waiting(&c, &agent, uuid, 1).await;
    let (s, _) = post_events(&c, &agent, &plugged(uuid, &tags[0], "failed")).await;
    assert_eq!(s, 200, "accepted; the wait fails");
    let op = wait_op(&c, &agent, &op_id, WITHIN).await;
    assert_eq!(op["state"], "failed");
    assert_eq!(op["error"]["code"], "build-failed");
    let msg = op["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&tags[0]), "{msg}");
    // Cleaned up: the instance is gone, its port released, later events answered 404.
    let (s, _) = get(&c, &agent, &format!("/v1/instances/{uuid}")).await;
    assert_eq!(s, 404);
    let port = tags[0].parse().unwrap();
    assert!(
        agent.driver.network().get_port(port).await.is_err(),
        "port deleted"
    );
    let (s, e) = post_events(&c, &agent, &plugged(uuid, &tags[0], "completed")).await;
    assert_eq!(s, 207);
    assert_eq!(e["events"][0]["code"], 404);
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn actions_run_in_the_background_and_follow_the_lifecycle() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let uuid = Uuid::new_v4();
    agent.spawn_direct(uuid).await;

    let act = |a: Value| {
        let c = c.clone();
        let url = agent.url(&format!("/v1/instances/{uuid}/action"));
        async move {
            let r = c.post(url).json(&a).send().await.unwrap();
            let s = r.status().as_u16();
            (s, r.json::<Value>().await.unwrap())
        }
    };

    // Illegal in the current state: 409 at once, nothing started.
    let (s, e) = act(json!({"action": "unpause"})).await;
    assert_eq!(s, 409);
    assert_eq!(e["error"]["code"], "illegal-state");
    assert!(e["error"]["message"].as_str().unwrap().contains("running"));
    assert_eq!(
        agent.svc.metrics().operations.get(&["unpause", "rejected"]),
        1
    );

    for (action, state, power) in [
        (json!({"action": "pause"}), "paused", "paused"),
        (json!({"action": "unpause"}), "running", "running"),
        (json!({"action": "reboot-hard"}), "running", "running"),
        (
            json!({"action": "power-off", "timeout": 1}),
            "stopped",
            "shutoff",
        ),
        (json!({"action": "power-on"}), "running", "running"),
        (json!({"action": "suspend"}), "suspended", "suspended"),
        (json!({"action": "resume"}), "running", "running"),
        (
            json!({"action": "resize", "flavor": {"name": "m1.small", "vcpus": 2, "memory_mb": 256}}),
            "resize-target",
            "running",
        ),
        (json!({"action": "revert-resize"}), "running", "running"),
        (
            json!({"action": "resize", "flavor": {"name": "m1.small", "vcpus": 2, "memory_mb": 256}}),
            "resize-target",
            "running",
        ),
        (json!({"action": "confirm-resize"}), "running", "running"),
    ] {
        let name = action["action"].as_str().unwrap().to_owned();
        let (s, op) = act(action).await;
        assert_eq!(s, 202, "{name}: {op}");
        assert_eq!(op["operation"]["kind"], name);
        let done = wait_op(&c, &agent, op["operation"]["id"].as_str().unwrap(), WITHIN).await;
        assert_eq!(done["state"], "succeeded", "{name}: {done}");
        let (_, shown) = get(&c, &agent, &format!("/v1/instances/{uuid}")).await;
        assert_eq!(
            (shown["state"].as_str(), shown["power_state"].as_str()),
            (Some(state), Some(power)),
            "{name}: {shown}"
        );
    }
    let (_, shown) = get(&c, &agent, &format!("/v1/instances/{uuid}")).await;
    assert_eq!(shown["flavor"], "m1.small", "confirmed resize");

    // A move to another host: an agent is one host, moves between hosts are Nova's. Refused
    // at admission (400 `cross-host`, the message names Nova), nothing started, the instance
    // stays as it was.
    let (s, _) = act(json!({"action": "live-migrate", "dest_host": HOST})).await;
    assert_eq!(s, 400, "to itself");
    for action in [
        json!({"action": "live-migrate", "dest_host": "compute-2"}),
        json!({"action": "resize", "flavor": {"name": "m1.large", "vcpus": 4, "memory_mb": 512},
               "dest_host": "compute-2"}),
    ] {
        let (s, e) = act(action.clone()).await;
        assert_eq!(
            (s, e["error"]["code"].as_str()),
            (400, Some("cross-host")),
            "{action}: {e}"
        );
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("compute-2") && msg.contains("Nova") && msg.contains("vireo.VireoDriver"),
            "{msg}"
        );
    }
    let m = agent.svc.metrics();
    assert_eq!(
        m.operations.get(&["live-migrate", "rejected"]),
        2,
        "with the one to itself"
    );
    assert_eq!(m.operations.get(&["resize", "rejected"]), 1);
    let shown = agent.driver.show(uuid).await.unwrap();
    assert_eq!(shown.state, InstanceState::Running);
    assert_eq!(shown.flavor.as_deref(), Some("m1.small"));

    // The operations list holds them all, newest first.
    let (_, ops) = get(&c, &agent, &format!("/v1/operations?instance={uuid}")).await;
    let kinds: Vec<&str> = ops["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.len(), 11, "refused requests are not operations");
    assert_eq!(kinds.first(), Some(&"confirm-resize"));
    assert_eq!(kinds.last(), Some(&"pause"));
    let (s, _) = get(&c, &agent, "/v1/operations?bogus=1").await;
    assert_eq!(s, 400);
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn a_second_operation_conflicts_and_a_delete_preempts() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let uuid = Uuid::new_v4();
    let (create_op, _) = create_waiting(&c, &agent, uuid, 1).await;

    // Busy with the create: any other action conflicts, naming the running operation.
    let r = c
        .post(agent.url(&format!("/v1/instances/{uuid}/action")))
        .json(&json!({"action": "pause"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "busy");
    assert!(e["error"]["message"].as_str().unwrap().contains(&create_op));
    // Creating the same uuid again conflicts too.
    let r = c
        .post(agent.url("/v1/instances"))
        .json(&create_body(uuid, 0))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);

    // A delete is admitted next to it: the create's wait is cancelled, the instance goes.
    let r = c
        .delete(agent.url(&format!("/v1/instances/{uuid}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let del: Value = r.json().await.unwrap();
    let r = c
        .delete(agent.url(&format!("/v1/instances/{uuid}")))
        .send()
        .await
        .unwrap();
    // One delete at a time: while the first runs, a second conflicts. On the test driver the
    // first may already be done (the create's roll-back and the delete take milliseconds):
    // then the instance is gone and the second finds nothing.
    let del_id = del["operation"]["id"].as_str().unwrap();
    match r.status().as_u16() {
        409 => {}
        404 => {
            // Only because the first removed the instance (checked right below).
        }
        s => panic!("a second delete got {s}"),
    }
    let done = wait_op(&c, &agent, del_id, WITHIN).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let created = wait_op(&c, &agent, &create_op, WITHIN).await;
    assert_eq!(created["state"], "failed", "{created}");
    let (s, _) = get(&c, &agent, &format!("/v1/instances/{uuid}")).await;
    assert_eq!(s, 404);
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn interfaces_attach_and_detach() {
    let mut agent = TestAgent::start_with(Options {
        event_delay_ms: 0,
        ..Options::default()
    })
    .await;
    let c = http();
    let uuid = Uuid::new_v4();
    agent.spawn_direct(uuid).await;
    // A user port bound to this host, as Nova would hand it over.
    let net = agent.driver.network();
    let port = net.create_port(NET).await.unwrap();
    let port = net
        .update_port(
            port.id,
            &PortUpdate {
                host_id: Some(HOST.into()),
                device_id: Some(uuid.to_string()),
                device_owner: Some("compute:nova".into()),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
    let summary = net.get_network(NET).await.unwrap();
    let vif = vireo::network::vif_dict(&port, &summary, true, vireo::network::DEFAULT_OVS_BRIDGE);
    let r = c
        .post(agent.url(&format!("/v1/instances/{uuid}/action")))
        .json(&json!({"action": "attach-interface", "vif": vif}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let op: Value = r.json().await.unwrap();
    let done = wait_op(&c, &agent, op["operation"]["id"].as_str().unwrap(), WITHIN).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["report"]["request"], "attach-interface");
    let (_, shown) = get(&c, &agent, &format!("/v1/instances/{uuid}")).await;
    assert_eq!(shown["vifs"][0]["port"], port.id.to_string(), "{shown}");
    assert_eq!(shown["state"], "running");

    let r = c
        .post(agent.url(&format!("/v1/instances/{uuid}/action")))
        .json(&json!({"action": "detach-interface", "port_id": port.id.to_string()}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let op: Value = r.json().await.unwrap();
    let done = wait_op(&c, &agent, op["operation"]["id"].as_str().unwrap(), WITHIN).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let (_, shown) = get(&c, &agent, &format!("/v1/instances/{uuid}")).await;
    assert!(shown["vifs"].as_array().unwrap().is_empty(), "{shown}");

    // Detaching a port the instance does not have is refused before the driver.
    let r = c
        .post(agent.url(&format!("/v1/instances/{uuid}/action")))
        .json(&json!({"action": "detach-interface", "port_id": port.id.to_string()}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is not attached"),
        "{e}"
    );
    assert_eq!(
        agent
            .svc
            .metrics()
            .operations
            .get(&["detach-interface", "rejected"]),
        1
    );
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn delete_releases_the_networking_unless_asked_not_to() {
    let mut agent = TestAgent::start_with(Options {
        event_delay_ms: 0,
        ..Options::default()
    })
    .await;
    let c = http();
    let mut ports = Vec::new();
    for keep in [false, true] {
        let uuid = Uuid::new_v4();
        let r: Value = c
            .post(agent.url("/v1/instances"))
            .json(&create_body(uuid, 1))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let done = wait_op(&c, &agent, r["operation"]["id"].as_str().unwrap(), WITHIN).await;
        assert_eq!(done["state"], "succeeded", "{done}");
        let (_, shown) = get(&c, &agent, &format!("/v1/instances/{uuid}")).await;
        let port: vireo_actors::vif::PortId =
            shown["vifs"][0]["port"].as_str().unwrap().parse().unwrap();
        let q = if keep {
            "?deallocate_network=false"
        } else {
            ""
        };
        let r = c
            .delete(agent.url(&format!("/v1/instances/{uuid}{q}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        let op: Value = r.json().await.unwrap();
        assert_eq!(op["operation"]["kind"], "delete");
        let done = wait_op(&c, &agent, op["operation"]["id"].as_str().unwrap(), WITHIN).await;
        assert_eq!(done["state"], "succeeded");
        let (s, _) = get(&c, &agent, &format!("/v1/instances/{uuid}")).await;
        assert_eq!(s, 404);
        ports.push((port, keep, done));
    }
    let net = agent.driver.network();
    let (deleted, _, done) = &ports[0];
    assert!(net.get_port(*deleted).await.is_err(), "released");
    assert_eq!(
        done["report"]["released"]["deleted"][0],
        deleted.to_string()
    );
    let (kept, _, _) = &ports[1];
    assert!(net.get_port(*kept).await.is_ok(), "kept");
    let r = c
        .delete(agent.url(&format!(
            "/v1/instances/{}?deallocate_network=maybe",
            Uuid::new_v4()
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
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
    let (s, _) = get(&c, &agent, "/v1/instances/not-a-uuid").await;
    assert_eq!(s, 400);
    assert_eq!(
        agent.svc.metrics().operations.get(&["pause", "rejected"]),
        1
    );
    assert_eq!(
        agent.svc.metrics().operations.get(&["delete", "rejected"]),
        1
    );
    assert!(agent.driver.list().await.is_empty());
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
    let root = agent.dir.path().canonicalize().unwrap();
    let kernel = agent.images.join("vmlinuz");
    let fl = json!({"name": "m", "vcpus": 1, "memory_mb": 64});
    let cases: Vec<(Value, u16, &str)> = vec![
        (
            json!({"flavor": {"name": "m", "vcpus": "one", "memory_mb": 64}}),
            400,
            "bad-json",
        ),
        (json!({"flavor": fl, "colour": "red"}), 400, "bad-json"),
        (json!({"name": "x"}), 400, "bad-json"),
        (
            json!({"flavor": fl, "ports": [{"network_id": NET, "port_id": "x"}]}),
            400,
            "bad-json",
        ),
        (
            json!({"flavor": {"name": "m", "vcpus": 0, "memory_mb": 64}}),
            400,
            "invalid",
        ),
        (json!({"flavor": fl, "name": "a/b"}), 400, "invalid"),
        (json!({"flavor": fl, "network_info": {}}), 400, "invalid"),
        (
            json!({"flavor": fl, "network_info": [{"id": "nope", "address": "fa:16:3e:00:00:01", "type": "ovs"}]}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": fl, "network_info": [], "ports": []}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": fl, "ports": [{"port_id": "not-a-uuid"}]}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": fl, "image": {"kernel": root.join("api-token")}}),
            400,
            "invalid-path",
        ),
        (
            json!({"flavor": fl, "image": {"kernel": agent.images.join("../api-token")}}),
            400,
            "invalid-path",
        ),
        (
            json!({"flavor": fl, "image": {"id": "i", "source": "relative.img"}}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": fl, "image": {"id": "i", "source": agent.images}}),
            400,
            "invalid-path",
        ),
        (
            json!({"flavor": fl, "image": {"id": "i", "source": root.join("api-token")}}),
            400,
            "invalid-path",
        ),
        (
            json!({"flavor": fl, "image": {"id": "i", "source": format!("file://{}", root.join("api-token").display())}}),
            400,
            "invalid-path",
        ),
        (
            json!({"flavor": fl, "image": {"id": "i", "source": "ftp://host/img"}}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": fl, "image": {"initrd": kernel}}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": fl, "image": {"source": agent.images.join("disk.raw")}}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": fl, "image": {"id": "../etc", "source": agent.images.join("disk.raw")}}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": fl, "image": {"id": "i", "source": agent.images.join("disk.raw"), "disk_format": "vmdk"}}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": fl, "image": {"id": "i", "source": agent.images.join("disk.raw"), "checksum": "sha1:00"}}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": fl, "image": {"checksum": "md5:00000000000000000000000000000000"}}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": fl, "image": {"disk": agent.images.join("disk.raw")}}),
            400,
            "bad-json",
        ),
        (
            json!({"flavor": {"name": "m", "vcpus": 1, "memory_mb": 64, "root_gb": 1u64 << 20}}),
            400,
            "invalid",
        ),
        (
            json!({"flavor": fl, "config_drive": {"meta": (0..129).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>()}}),
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
        agent.driver.list().await.is_empty(),
        "the driver saw nothing"
    );
    // Bodies that do not decode never reach the service; the other 21 are counted.
    assert_eq!(
        agent.svc.metrics().operations.get(&["create", "rejected"]),
        21
    );

    // A kernel from the image directory is accepted and handed over resolved.
    let uuid = Uuid::new_v4();
    let link = agent.images.join("link-to-kernel");
    std::os::unix::fs::symlink(&kernel, &link).unwrap();
    let (s, _, v) = post(
        json!({"uuid": uuid, "flavor": fl, "power_on": false,
               "image": {"kernel": link, "cmdline": "console=ttyS0"}})
        .to_string()
        .into_bytes(),
    )
    .await;
    assert_eq!(s, 202, "{v}");
    let done = wait_op(&c, &agent, v["operation"]["id"].as_str().unwrap(), WITHIN).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let (_, shown) = get(&c, &agent, &format!("/v1/instances/{uuid}")).await;
    assert_eq!(shown["state"], "stopped", "power_on false");
    let xml = agent.driver.libvirt().xml_desc(uuid, true).await.unwrap();
    assert!(
        xml.contains(&format!("<kernel>{}</kernel>", kernel.display())),
        "{xml}"
    );
    // Now it exists.
    let (s, code, _) = post(json!({"uuid": uuid, "flavor": fl}).to_string().into_bytes()).await;
    assert_eq!((s, code.as_str()), (409, "exists"));
    // Action bodies are checked too.
    for (body, status) in [
        (json!({"action": "pause", "force": true}), 400),
        (
            json!({"action": "detach-interface", "port_id": "nope"}),
            400,
        ),
        (json!({"action": "power-off", "timeout": 100000}), 400),
        (json!({"action": "finish-revert-resize"}), 400),
        (
            json!({"action": "attach-interface", "vif": {"id": "x"}}),
            400,
        ),
    ] {
        let r = c
            .post(agent.url(&format!("/v1/instances/{uuid}/action")))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{body}");
    }
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn the_host_is_described_as_libvirt_and_its_filesystem_see_it() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let (status, host) = get(&c, &agent, "/v1/host").await;
    assert_eq!(status, 200, "{host}");
    // Read independently: a connection of our own to the same test-driver node, and statvfs.
    let uri = agent.driver.libvirt().config().uri.clone();
    let conn = virt::connect::Connect::open(Some(&uri)).unwrap();
    let node = conn.node_info().unwrap();
    assert_eq!(host["host"], HOST);
    assert_eq!(host["hypervisor_type"], conn.driver_type().unwrap());
    assert_eq!(
        host["hypervisor_version"],
        u64::from(conn.hyp_version().unwrap())
    );
    assert_eq!(host["vcpus"], node.cpus);
    assert_eq!(host["memory_mb"], node.memory / 1024);
    assert_eq!(host["cpu"]["model"], node.model.as_str());
    assert_eq!(host["cpu"]["sockets"], node.sockets);
    let instances = agent
        .dir
        .path()
        .canonicalize()
        .unwrap()
        .join("state/instances");
    assert_eq!(host["instances_path"], instances.to_str().unwrap());
    let fs = nix::sys::statvfs::statvfs(&instances).unwrap();
    let gib = |blocks: u64| blocks * fs.fragment_size() / (1 << 30);
    assert_eq!(host["disk_gb"], gib(fs.blocks()));
    let free = host["disk_free_gb"].as_u64().unwrap();
    let free_now = gib(fs.blocks_available());
    assert!(
        free.abs_diff(free_now) <= 1,
        "{free} GiB free, statvfs says {free_now}"
    );
    assert!(free <= host["disk_gb"].as_u64().unwrap());
    drop(conn);
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn a_shared_directory_probe_is_written_seen_and_removed_in_the_instances_directory() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let probe = Uuid::new_v4();
    let path = format!("/v1/storage/probes/{probe}");
    let file = agent
        .dir
        .path()
        .join(format!("state/instances/.vireo-probe-{probe}"));
    let (status, seen) = get(&c, &agent, &path).await;
    assert_eq!(
        (status, seen["seen"].as_bool()),
        (200, Some(false)),
        "{seen}"
    );
    let r = c.put(agent.url(&path)).send().await.unwrap();
    assert_eq!(r.status(), 201);
    assert!(file.is_file(), "{}", file.display());
    let (status, seen) = get(&c, &agent, &path).await;
    assert_eq!(
        (status, seen["seen"].as_bool()),
        (200, Some(true)),
        "{seen}"
    );
    // A second write of one probe is refused: the file was there already.
    let r = c.put(agent.url(&path)).send().await.unwrap();
    assert_eq!(r.status(), 500);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "storage", "{e}");
    for _ in 0..2 {
        let r = c.delete(agent.url(&path)).send().await.unwrap();
        assert_eq!(r.status(), 204);
        assert!(!file.exists());
    }
    let r = c
        .put(agent.url("/v1/storage/probes/../../etc"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = c
        .put(agent.url("/v1/storage/probes/not-a-uuid"))
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
    for path in ["/v1/instances", "/v1/operations", "/v1/host", "/metrics"] {
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
        .json(&create_body(Uuid::new_v4(), 0))
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
        json!({"status": "ok", "host": HOST, "driver": "libvirt"})
    );
    assert_eq!(agent.svc.metrics().auth_failures.get(&["api"]), 5);
    assert_eq!(agent.svc.metrics().auth_failures.get(&["metrics"]), 1);
    assert!(agent.driver.list().await.is_empty());
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn metrics_report_operations_events_and_requests() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let uuid = Uuid::new_v4();
    let (op, tags) = create_waiting(&c, &agent, uuid, 1).await;
    // An early event for another port of the instance: buffered by the events actor.
    let other = Uuid::new_v4().to_string();
    assert_eq!(
        post_events(&c, &agent, &plugged(uuid, &other, "completed"))
            .await
            .0,
        200
    );
    assert_eq!(
        post_events(&c, &agent, &plugged(uuid, &tags[0], "completed"))
            .await
            .0,
        200
    );
    wait_op(&c, &agent, &op, WITHIN).await;
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
        "vireo_libvirt_reconnects_total 0",
        "vireo_libvirt_connected 1",
        // The creation's one plug-time wait, in the event-wait latency histogram.
        "vireo_event_wait_duration_seconds_count{result=\"complete\",timing=\"plug-time\"} 1",
        "vireo_event_wait_duration_seconds_bucket{result=\"complete\",timing=\"plug-time\",le=\"300\"} 1",
        "vireo_build_info{version=\"0.1.0\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(text.contains(
        "vireo_http_request_duration_seconds_bucket{route=\"/v1/instances/{uuid}\",le=\"+Inf\"}"
    ));
    assert!(text
        .lines()
        .any(|l| l.starts_with("process_resident_memory_bytes ")));
    assert!(
        !text.contains("vireo_event_timeouts_total"),
        "one timeout counter"
    );
    agent.stop().await.unwrap();
}

/// Prometheus scrapes with its own token: `/metrics` takes it, nothing else does, and the
/// API token still works there.
#[actix_rt::test]
async fn a_metrics_token_opens_the_metrics_only() {
    const METRICS_TOKEN: &str = "metrics-token-0123456789abcdef";
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("metrics-token");
    write_file(&file, METRICS_TOKEN, 0o600);
    let mut agent = TestAgent::start_with(Options {
        extra: format!("metrics_token_file = {:?}\n", file.to_str().unwrap()),
        ..Options::default()
    })
    .await;
    let anon = anonymous();
    let get = |path: &str, token: &str| {
        anon.get(agent.url(path))
            .header("Authorization", format!("Bearer {token}"))
            .send()
    };
    assert_eq!(get("/metrics", METRICS_TOKEN).await.unwrap().status(), 200);
    assert_eq!(get("/metrics", TOKEN).await.unwrap().status(), 200);
    for path in ["/v1/instances", "/v1/host", "/v1/operations"] {
        assert_eq!(
            get(path, METRICS_TOKEN).await.unwrap().status(),
            401,
            "{path}"
        );
    }
    let r = anon
        .delete(agent.url(&format!("/v1/instances/{}", Uuid::new_v4())))
        .header("X-Auth-Token", METRICS_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "the metrics token deletes nothing");
    let r = anon
        .post(agent.url("/v2.1/os-server-external-events"))
        .header("X-Auth-Token", METRICS_TOKEN)
        .json(&plugged(
            Uuid::new_v4(),
            &Uuid::new_v4().to_string(),
            "completed",
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "nor posts events");
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn console_output_is_the_tail_of_the_serial_log() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let uuid = Uuid::new_v4();
    agent.spawn_direct(uuid).await;
    let console = |q: &str| format!("/v1/instances/{uuid}/console{q}");
    // Nothing written yet (the test driver runs no QEMU): empty, not an error.
    let (s, out) = get(&c, &agent, &console("")).await;
    assert_eq!(s, 200, "{out}");
    assert_eq!(out["output"], "");
    // What virtlogd writes for a guest: <instances>/<uuid>/console.log.
    let dir = agent
        .dir
        .path()
        .join("state/instances")
        .join(uuid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let mut log = "x".repeat(200 * 1024);
    log.push_str("login: \u{fffd}\n");
    std::fs::write(dir.join("console.log"), log.as_bytes()).unwrap();
    let (s, out) = get(&c, &agent, &console("")).await;
    assert_eq!(s, 200);
    let text = out["output"].as_str().unwrap();
    assert_eq!(
        text.len(),
        100 * 1024,
        "at most 100 KiB, the end of the log"
    );
    assert!(
        text.ends_with("login: \u{fffd}\n"),
        "{}",
        &text[text.len() - 20..]
    );
    let (_, out) = get(&c, &agent, &console("?bytes=10")).await;
    assert_eq!(out["output"], "ogin: \u{fffd}\n");
    let (s, out) = get(&c, &agent, &console("?bytes=-1")).await;
    assert_eq!(s, 400, "{out}");
    let (s, out) = get(
        &c,
        &agent,
        &format!("/v1/instances/{}/console", Uuid::new_v4()),
    )
    .await;
    assert_eq!(s, 404, "{out}");
    assert_eq!(out["error"]["code"], "not-found");
    agent.stop().await.unwrap();
}

#[actix_rt::test]
async fn the_lifecycle_feed_reports_the_guests_power_changes() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let (s, page) = get(&c, &agent, "/v1/lifecycle-events").await;
    assert_eq!(s, 200, "{page}");
    assert!(page["events"].as_array().unwrap().is_empty());
    let mut after = page["last"].as_u64().unwrap();
    // Everything after `after` for the instance until a read waits `wait` seconds in vain.
    async fn read(
        c: &reqwest::Client,
        agent: &TestAgent,
        uuid: Uuid,
        after: &mut u64,
    ) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let path = format!("/v1/lifecycle-events?after={after}&wait=1");
            let (s, page) = get(c, agent, &path).await;
            assert_eq!(s, 200, "{page}");
            assert_eq!(page["lost"], false);
            let events = page["events"].as_array().unwrap();
            if events.is_empty() {
                return seen;
            }
            for e in events {
                assert!(e["seq"].as_u64().unwrap() > *after);
                if e["instance"] == uuid.to_string() {
                    seen.push(e["transition"].as_str().unwrap().to_owned());
                }
            }
            *after = page["last"].as_u64().unwrap();
        }
    }
    let uuid = Uuid::new_v4();
    agent.spawn_direct(uuid).await;
    // The test driver cannot start a domain paused: vireo starts, pauses and resumes it.
    assert_eq!(
        read(&c, &agent, uuid, &mut after).await,
        ["started", "paused", "resumed"]
    );
    for (action, transition) in [
        ("pause", "paused"),
        ("unpause", "resumed"),
        ("power-off", "stopped"),
    ] {
        let r = c
            .post(agent.url(&format!("/v1/instances/{uuid}/action")))
            .json(&json!({ "action": action }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        let op: Value = r.json().await.unwrap();
        let done = wait_op(&c, &agent, op["operation"]["id"].as_str().unwrap(), WITHIN).await;
        assert_eq!(done["state"], "succeeded", "{done}");
        assert_eq!(
            read(&c, &agent, uuid, &mut after).await,
            [transition],
            "{action}"
        );
    }
    let (s, _) = get(&c, &agent, "/v1/lifecycle-events?after=x").await;
    assert_eq!(s, 400);
    agent.stop().await.unwrap();
}

/// `POST /v1/instances/{uuid}/half`: one host's half of a move Nova orchestrates (the Nova
/// driver's `host_half`). It takes the API token only, and only the six halves with exactly
/// their arguments; what a half would build obeys a create's rules.
#[actix_rt::test]
async fn a_host_half_needs_the_api_token_and_takes_only_host_halves() {
    let mut agent = TestAgent::start().await;
    let c = http();
    let anon = anonymous();
    let unknown = Uuid::new_v4();
    let path = agent.url(&format!("/v1/instances/{unknown}/half"));
    let body = json!({"action": "confirm-resize-source"});
    let post = |req: reqwest::RequestBuilder, body: Value| async move {
        let r = req.json(&body).send().await.unwrap();
        let s = r.status().as_u16();
        (s, r.json::<Value>().await.unwrap_or(Value::Null))
    };
    assert_eq!(
        post(anon.post(&path), body.clone()).await.0,
        401,
        "no token"
    );
    assert_eq!(
        post(
            anon.post(&path).header("X-Auth-Token", EVENTS_TOKEN),
            body.clone()
        )
        .await
        .0,
        401,
        "the events token is not an API token"
    );
    let (s, v) = post(c.post(&path), body.clone()).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("not-found")),
        "{v}"
    );

    // Only the six halves, with exactly their arguments.
    for bad in [
        json!({"action": "pause"}),
        json!({"action": "confirm-resize"}),
        json!({"action": "revert-resize"}),
        json!({"action": "resize", "flavor": {"name": "m1", "vcpus": 1, "memory_mb": 128},
               "dest_host": "compute-2"}),
        json!({"action": "confirm-resize-source", "force": true}),
        json!({"request": "confirm-resize-source"}),
    ] {
        let (s, v) = post(c.post(&path), bad.clone()).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (400, Some("bad-json")),
            "{bad}: {v}"
        );
    }
    let (s, v) = post(c.post(agent.url("/v1/instances/nope/half")), body.clone()).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("invalid")),
        "{v}"
    );
    // And the action endpoint takes no half.
    let (s, v) = post(
        c.post(agent.url(&format!("/v1/instances/{unknown}/action"))),
        body,
    )
    .await;
    assert_eq!(s, 400, "{v}");

    // What a half would build obeys the same rules as a create: a kernel outside the image
    // directories is refused and nothing is created.
    let f = json!({"name": "m1", "vcpus": 1, "memory_mb": 128, "root_gb": 0});
    let finish = json!({
        "action": "finish-resize",
        "migration": {"id": Uuid::new_v4(), "source_host": "compute-2", "dest_host": HOST},
        "handover": {"name": "vm-x", "flavor": f, "old_flavor": f,
                     "boot": {"type": "kernel", "kernel": "/etc/passwd"},
                     "network_info": [], "power_on": true},
    });
    let (s, v) = post(c.post(&path), finish).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("invalid-path")),
        "{v}"
    );
    assert!(agent.driver.libvirt().list_all().await.unwrap().is_empty());
    let m = agent.svc.metrics();
    assert_eq!(m.host_halves.get(&["finish-resize", "refused"]), 1);
    assert_eq!(m.host_halves.get(&["confirm-resize-source", "failed"]), 1);

    // A half on an instance in the wrong state is refused by it, and changes nothing.
    let running = Uuid::new_v4();
    agent.spawn_direct(running).await;
    let (s, v) = post(
        c.post(agent.url(&format!("/v1/instances/{running}/half"))),
        json!({"action": "confirm-resize-source"}),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("illegal-state")),
        "{v}"
    );
    assert_eq!(
        agent.driver.show(running).await.unwrap().state,
        InstanceState::Running
    );
    agent.stop().await.unwrap();
}
