//! The built `vireo` binary: `vireo agent` refusing bad configs and token files (exit 2, one
//! line naming the key), and the client commands (`vireo instance ...`, `vireo events send`)
//! against a real agent on 127.0.0.1:0.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use agent_common::*;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use uuid::Uuid;
use vireo::compute::ComputeDriver;
use vireo_actors::lifecycle::InstanceState;

const BIN: &str = env!("CARGO_BIN_EXE_vireo");

async fn vireo(args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("VIREO_URL")
        .env_remove("VIREO_TOKEN_FILE")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).await.unwrap();
    }
    drop(input);
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("vireo did not finish")
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// SIGTERM the agent process and wait (at most 40 s) for it to exit; its output.
async fn sigterm_and_wait(child: tokio::process::Child) -> Output {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    tokio::time::timeout(Duration::from_secs(40), child.wait_with_output())
        .await
        .expect("the agent did not stop")
        .unwrap()
}

/// A config file plus its token file in `dir`, on the embedded default's libvirt unless
/// `body` has its own `[libvirt]`.
fn config(dir: &Path, body: &str, token_mode: u32) -> PathBuf {
    let libvirt = if body.contains("[libvirt]") {
        ""
    } else {
        "[libvirt]\nuri = \"embedded\"\n"
    };
    config_with(dir, &format!("{body}\n{libvirt}"), token_mode)
}

/// A config file plus its token file in `dir`: `body` and the state directory, nothing else.
fn config_with(dir: &Path, body: &str, token_mode: u32) -> PathBuf {
    let token = dir.join("api-token");
    write_file(&token, TOKEN, token_mode);
    let state = dir.join("state");
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "api_token_file = {:?}\nlisten = \"127.0.0.1:0\"\n{body}\n[instances]\nstate_dir = {:?}\n",
            token.to_str().unwrap(),
            state.to_str().unwrap()
        ),
    )
    .unwrap();
    cfg
}

#[actix_rt::test]
async fn agent_refuses_bad_configs_with_exit_2_naming_the_key() {
    let d = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, &str)> = vec![
        ("bogus_key = 1", "`bogus_key`"),
        (
            "[events]\nvif_plugging_timeout = \"soon\"",
            "`events.vif_plugging_timeout`",
        ),
        ("[network]\nkind = \"neutron\"", "`network.neutron`"),
        ("[libvirt]\nworkers = 0", "`libvirt.workers`"),
        ("[logging]\nlevel = \"chatty\"", "`logging.level`"),
    ];
    for (body, key) in cases {
        let cfg = config(d.path(), body, 0o600);
        let out = vireo(&["agent", "--config", cfg.to_str().unwrap()], None).await;
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{body}: {err}");
        assert!(err.contains(key), "{body}: {err}");
        assert!(err.starts_with("vireo agent: config "), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
    let out = vireo(&["agent", "--config", "/nonexistent/agent.toml"], None).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("/nonexistent/agent.toml"));
    let out = vireo(&["agent"], None).await;
    assert_eq!(out.status.code(), Some(2), "--config is required");
}

#[actix_rt::test]
async fn agent_refuses_a_group_or_world_readable_token_file() {
    let d = tempfile::tempdir().unwrap();
    for mode in [0o644, 0o640, 0o604] {
        let cfg = config(d.path(), "", mode);
        let out = vireo(&["agent", "--config", cfg.to_str().unwrap()], None).await;
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{mode:o}: {err}");
        assert!(err.contains("api_token_file"), "{err}");
        assert!(err.contains("chmod 600"), "{err}");
        assert!(!err.contains(TOKEN), "the token is never printed");
    }
    // The events token file is checked the same way.
    let ev = d.path().join("events-token");
    write_file(&ev, EVENTS_TOKEN, 0o644);
    let cfg = config(
        d.path(),
        &format!("events_token_file = {:?}", ev.to_str().unwrap()),
        0o600,
    );
    let out = vireo(&["agent", "--config", cfg.to_str().unwrap()], None).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("events_token_file"));
    // A good config passes every check before the driver is loaded.
    let cfg = config(d.path(), "", 0o600);
    let (cfg, settings) = vireo::agent::prepare(&cfg).unwrap();
    assert_eq!(settings.max_body_bytes, 1 << 20);
    assert!(
        cfg.default_test_node().exists(),
        "private test-driver node created"
    );
    assert!(settings.paths.instances_dir().is_dir());
}

#[actix_rt::test]
async fn client_commands_against_a_running_agent() {
    let mut agent = TestAgent::start().await;
    let token = agent.dir.path().join("api-token");
    let url = agent.base.clone();
    let common = [
        "--url",
        url.as_str(),
        "--token-file",
        token.to_str().unwrap(),
    ];
    let with = |a: &[&str]| args(a, &common);
    let run = |args: Vec<String>, stdin: Option<String>| async move {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        vireo(&refs, stdin.as_deref()).await
    };

    // Empty list.
    let out = run(with(&["instance", "list"]), None).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "UUID  NAME  STATE  POWER  VIFS  OPERATION\n"
    );

    // Create with --wait: progress on stderr while it waits for its event.
    let uuid = Uuid::new_v4();
    let body = create_body(uuid, 1).to_string();
    let create = tokio::spawn(run(
        with(&["instance", "create", "--file", "-", "--wait"]),
        Some(body),
    ));
    let c = http();
    let shown = wait_instance(&c, &agent, uuid, Duration::from_secs(30), |v| {
        awaited_tags(v).len() == 1 && v["operation"]["phase"] == "wait for events"
    })
    .await;
    let port = awaited_tags(&shown)[0].clone();
    // Let the client poll at least once while it waits.
    tokio::time::sleep(super_poll()).await;
    let sent = run(
        with(&[
            "events",
            "send",
            "--server",
            &uuid.to_string(),
            "--tag",
            &port.to_string(),
        ]),
        None,
    )
    .await;
    assert_eq!(sent.status.code(), Some(0), "{}", text(&sent.stderr));
    let sent_out = text(&sent.stdout);
    assert!(sent_out.starts_with("HTTP 200\nEVENT"), "{sent_out}");
    assert!(
        sent_out.contains(&format!(
            "network-vif-plugged  {uuid}  {port}  completed  200"
        )),
        "{sent_out}"
    );
    let out = create.await.unwrap();
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{so}{se}");
    assert!(
        se.contains(&format!("waiting for network-vif-plugged {port}")),
        "{se}"
    );
    assert!(se.contains("phase wait for events"), "{se}");
    // Plain lines (stderr is a pipe): elapsed time first, the wait's time left (60 s here).
    let waiting = se
        .lines()
        .find(|l| l.contains("waiting for network-vif-plugged"))
        .unwrap();
    assert!(waiting.starts_with("[+"), "{waiting}");
    assert!(waiting.ends_with(" s left)"), "{waiting}");
    assert!(!se.contains('\r'), "no redraws on a pipe: {se:?}");
    assert!(
        so.contains(&format!("(create of {uuid}): succeeded")),
        "{so}"
    );
    assert!(
        so.contains("started 20") && so.contains("Z\nfinished 20"),
        "{so}"
    );
    assert!(so.contains("steps: ") && so.contains(" → "), "{so}");

    // Show as text and JSON.
    let out = run(with(&["instance", "show", &uuid.to_string()]), None).await;
    let so = text(&out.stdout);
    assert!(so.contains("state:        running"), "{so}");
    assert!(so.contains(&port.to_string()), "{so}");
    let out = run(
        with(&["instance", "show", &uuid.to_string(), "--json"]),
        None,
    )
    .await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["uuid"], uuid.to_string());
    assert_eq!(v["power_state"], "running");

    // An action, waited for, then one that is illegal (exit 1, the agent's code shown).
    let out = run(
        with(&["instance", "action", &uuid.to_string(), "pause", "--wait"]),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("(pause of"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        agent.driver.show(uuid).await.unwrap().state,
        InstanceState::Paused
    );
    let out = run(
        with(&["instance", "action", &uuid.to_string(), "pause"]),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("HTTP 409 illegal-state"),
        "{}",
        text(&out.stderr)
    );
    let out = run(
        with(&["instance", "action", &uuid.to_string(), "explode"]),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "invalid input");

    // List as a table.
    let out = run(with(&["instance", "list"]), None).await;
    let so = text(&out.stdout);
    assert!(
        so.lines()
            .nth(1)
            .unwrap()
            .starts_with(&format!("{uuid}  vm-{uuid}  paused  paused  1     -")),
        "{so}"
    );

    // Unknown instance: exit 1 with the 404.
    let out = run(
        with(&["instance", "show", &Uuid::new_v4().to_string()]),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("HTTP 404 not-found"));

    // Delete --wait, then the operation by id as JSON.
    let out = run(
        with(&["instance", "delete", &uuid.to_string(), "--wait", "--json"]),
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let op: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(op["state"], "succeeded");
    let out = run(
        with(&["instance", "operation", op["id"].as_str().unwrap()]),
        None,
    )
    .await;
    assert!(
        text(&out.stdout).contains("(delete of"),
        "{}",
        text(&out.stdout)
    );

    // Events for an unknown instance: exit 1, the 207 and the event's 404 shown.
    let out = run(
        with(&["events", "send", "--file", "-"]),
        Some(json!([{"name": "network-changed", "server_uuid": Uuid::new_v4()}]).to_string()),
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let shown = text(&out.stdout);
    assert!(shown.starts_with("HTTP 207"), "{shown}");
    assert!(shown.contains("failed") && shown.contains("404"), "{shown}");

    // A wrong token: 401, exit 1; a world-readable token file: refused locally, exit 2.
    let wrong = agent.dir.path().join("wrong-token");
    write_file(&wrong, "not-the-right-token-000", 0o600);
    let out = run(
        vec![
            "instance".into(),
            "list".into(),
            "--url".into(),
            url.clone(),
            "--token-file".into(),
            wrong.to_str().unwrap().into(),
        ],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("HTTP 401 unauthorized"));
    write_file(&wrong, "not-the-right-token-000", 0o644);
    let out = run(
        vec![
            "instance".into(),
            "list".into(),
            "--url".into(),
            url.clone(),
            "--token-file".into(),
            wrong.to_str().unwrap().into(),
        ],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    agent.stop().await.unwrap();
}

/// An agent whose config names no libvirt URI drives this machine's `qemu:///system` (the
/// libvirtd the test job's host set-up starts), never the test driver. Its host name is its
/// own, so the domains other hosts' agents saved on that libvirtd are left alone.
#[actix_rt::test]
async fn an_agent_without_a_libvirt_uri_drives_qemu_system() {
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let host = format!("vireo-default-uri-{}", Uuid::new_v4().simple());
    let cfg = config_with(
        d.path(),
        &format!("host = {host:?}\nlisten = \"127.0.0.1:{port}\"\n"),
        0o600,
    );
    let text_cfg = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("listen = \"127.0.0.1:0\"\n", "");
    assert!(!text_cfg.contains("[libvirt]"), "{text_cfg}");
    std::fs::write(&cfg, text_cfg).unwrap();
    let child = Command::new(BIN)
        .args(["agent", "--config", cfg.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let c = http();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let host_info: Value = loop {
        if let Ok(r) = c.get(format!("{base}/v1/host")).send().await {
            assert_eq!(r.status(), 200);
            break r.json().await.unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(host_info["hypervisor_type"], "QEMU", "{host_info}");
    assert!(
        !d.path().join("state/libvirt-test-node.xml").exists(),
        "no test-driver node"
    );
    let out = sigterm_and_wait(child).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[actix_rt::test]
async fn the_agent_binary_serves_and_stops_on_sigterm() {
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(d.path(), "", 0o600);
    let text_cfg = std::fs::read_to_string(&cfg).unwrap().replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    );
    std::fs::write(&cfg, format!("{text_cfg}[logging]\njson = true\n")).unwrap();
    // systemd's notification socket (Type=notify): the agent says when it is ready and when
    // it stops.
    let notify_path = d.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let next_notification = |want: &str| -> Vec<String> {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = notify
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("no {want} notification ({e}): {seen:?}"));
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            let done = msg.lines().any(|l| l == want);
            seen.push(msg);
            if done {
                return seen;
            }
        }
    };
    let child = Command::new(BIN)
        .args(["agent", "--config", cfg.to_str().unwrap()])
        .env("NOTIFY_SOCKET", &notify_path)
        .env_remove("JOURNAL_STREAM")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let c = http();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = c.get(format!("{base}/healthz")).send().await {
            let h: Value = r.json().await.unwrap();
            assert_eq!(h["status"], "ok");
            assert_eq!(h["driver"], "libvirt");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before_ready = next_notification("READY=1");
    assert!(
        before_ready[0].contains("STATUS=loading the driver"),
        "{before_ready:?}"
    );
    assert!(
        before_ready
            .last()
            .unwrap()
            .contains(&format!("STATUS=serving on 127.0.0.1:{port}")),
        "{before_ready:?}"
    );
    // The real driver on the embedded default's private test-driver node: create an instance.
    let uuid = Uuid::new_v4();
    let r = c
        .post(format!("{base}/v1/instances"))
        .json(&json!({"uuid": uuid, "flavor": {"name": "m1.tiny", "vcpus": 1, "memory_mb": 64}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let op: Value = r.json().await.unwrap();
    let id = op["operation"]["id"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let op: Value = c
            .get(format!("{base}/v1/operations/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if op["state"] != "running" {
            assert_eq!(op["state"], "succeeded", "{op}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(d.path().join("state/libvirt-test-node.xml").exists());

    let out = sigterm_and_wait(child).await;
    next_notification("STOPPING=1");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    // Structured JSON logs, the instance uuid on the operation's lines, no token anywhere.
    let lines: Vec<Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(lines
        .iter()
        .any(|l| l["fields"]["message"] == "agent listening"));
    assert!(lines
        .iter()
        .any(|l| l["fields"]["message"] == "SIGTERM received"));
    let op_lines: Vec<&Value> = lines
        .iter()
        .filter(|l| l["span"]["name"] == "operation")
        .collect();
    assert!(!op_lines.is_empty(), "{err}");
    for l in op_lines {
        assert_eq!(l["span"]["instance"], uuid.to_string(), "{l}");
    }
    assert!(!err.contains(TOKEN));
}

fn super_poll() -> Duration {
    vireo::cli::instance::POLL_EVERY * 2
}

fn args(a: &[&str], common: &[&str]) -> Vec<String> {
    a.iter().chain(common).map(|s| s.to_string()).collect()
}
