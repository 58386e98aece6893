//! External events accepted per second over HTTP, request latency, and the agent's idle
//! memory with 100 instances.
//!
//! Runs the real `vireo agent` binary (bench profile) as its own process with the embedded
//! network service and a token file, on libvirt's test driver — by default served by a private
//! libvirtd (`test+unix://`), so that, as with `qemu:///system` in production, the domains'
//! state lives in the daemon and the agent's RSS is the agent's own; with
//! `VIREO_BENCH_LIBVIRT=local` the agent's default in-process `test:///` node instead (the test
//! driver's domain state then counts in the agent's RSS). Then:
//! 1. creates 100 instances through the API (no ports) and reads the agent's `VmRSS` from
//!    `/proc/<pid>/status` once they are all running and the agent is idle;
//! 2. posts `network-vif-plugged` batches of 10 events (for those instances, so every event is
//!    accepted and handed to the NetworkEventActor) from `CLIENTS` tasks, each on its own
//!    keep-alive connection, for `SECS` seconds after a 1 s warm-up; prints events/s and the
//!    p50/p99/max request latency measured by the clients.
//!
//! Environment: `VIREO_BENCH_SECS` (default 10), `VIREO_BENCH_CLIENTS` (default 8),
//! `VIREO_BENCH_LIBVIRT` (`daemon`, default, or `local`). The
//! machine is shared with other builds: figures vary with its load.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uuid::Uuid;
use vireo_tests::private_libvirtd::PrivateLibvirtd;

const TOKEN: &str = "bench-token-0123456789abcdef";
const INSTANCES: usize = 100;
const BATCH: usize = 10;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn client() -> reqwest::Client {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("X-Auth-Token", TOKEN.parse().unwrap());
    reqwest::Client::builder()
        .default_headers(h)
        .pool_max_idle_per_host(1)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; a filter that does not name us means "skip".
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"agent_events".contains(a.as_str()))
    {
        return;
    }
    let secs = env_or("VIREO_BENCH_SECS", 10);
    let clients = env_or("VIREO_BENCH_CLIENTS", 8) as usize;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let token = root.join("token");
    std::fs::write(&token, TOKEN).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let local = std::env::var("VIREO_BENCH_LIBVIRT").is_ok_and(|v| v == "local");
    let daemon = (!local).then(|| PrivateLibvirtd::start().unwrap());
    let libvirt = match &daemon {
        Some(d) => {
            let node = root.join("node.xml");
            std::fs::write(&node, "<node/>\n").unwrap();
            format!("[libvirt]\nuri = {:?}\n", d.uri_for(&node))
        }
        None => "[libvirt]\nuri = \"embedded\"\n".to_owned(),
    };
    let cfg = root.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:{port}\"\napi_token_file = {:?}\n[instances]\nstate_dir = {:?}\n[logging]\nlevel = \"error\"\n{libvirt}",
            token.to_str().unwrap(),
            root.join("state").to_str().unwrap()
        ),
    )
    .unwrap();
    println!(
        "libvirt: {}",
        if local {
            "in-process test:/// node (domain state in the agent)"
        } else {
            "private libvirtd, test+unix:// (domain state in the daemon)"
        }
    );
    let mut agent = tokio::process::Command::new(env!("CARGO_BIN_EXE_vireo"))
        .args(["agent", "--config", cfg.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = agent.id().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let c = client();
    let up = Instant::now();
    while c.get(format!("{base}/healthz")).send().await.is_err() {
        assert!(
            up.elapsed() < Duration::from_secs(60),
            "agent did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss_start = rss_kib(pid);

    // 1. 100 instances, then idle memory.
    let mut ids = Vec::with_capacity(INSTANCES);
    let mut ops = Vec::with_capacity(INSTANCES);
    for n in 0..INSTANCES {
        let uuid = Uuid::new_v4();
        let r: Value = c
            .post(format!("{base}/v1/instances"))
            .json(&json!({"uuid": uuid, "name": format!("bench-{n}"),
                          "flavor": {"name": "m1.tiny", "vcpus": 1, "memory_mb": 64}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ops.push(r["operation"]["id"].as_str().unwrap().to_owned());
        ids.push(uuid);
    }
    for op in &ops {
        loop {
            let v: Value = c
                .get(format!("{base}/v1/operations/{op}"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            match v["state"].as_str() {
                Some("running") => tokio::time::sleep(Duration::from_millis(10)).await,
                Some("succeeded") => break,
                other => panic!("create failed: {other:?} {v}"),
            }
        }
    }
    let list: Value = c
        .get(format!("{base}/v1/instances"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["instances"].as_array().unwrap().len(), INSTANCES);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_idle = rss_kib(pid);
    println!(
        "idle RSS with {INSTANCES} instances: {:.1} MiB (at start, no instances: {:.1} MiB)",
        rss_idle as f64 / 1024.0,
        rss_start as f64 / 1024.0
    );

    // 2. Events over keep-alive connections.
    let ids = Arc::new(ids);
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    let url = format!("{base}/v2.1/os-server-external-events");
    let mut tasks = Vec::new();
    for t in 0..clients {
        let (ids, stop, measuring, accepted, url) = (
            ids.clone(),
            stop.clone(),
            measuring.clone(),
            accepted.clone(),
            url.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let c = client();
            let mut lat = Vec::with_capacity(100_000);
            let mut n = t;
            while !stop.load(Ordering::Relaxed) {
                let events: Vec<Value> = (0..BATCH)
                    .map(|i| {
                        n += 1;
                        json!({"name": "network-vif-plugged",
                               "server_uuid": ids[(n + i) % ids.len()],
                               "tag": Uuid::new_v4(), "status": "completed"})
                    })
                    .collect();
                let body = serde_json::to_vec(&json!({ "events": events })).unwrap();
                let t0 = Instant::now();
                let r = c
                    .post(&url)
                    .header("Content-Type", "application/json")
                    .header("X-OpenStack-Nova-API-Version", "2.1")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                let status = r.status();
                let _ = r.bytes().await.unwrap();
                let took = t0.elapsed();
                assert_eq!(status, 200);
                if measuring.load(Ordering::Relaxed) {
                    lat.push(took);
                    accepted.fetch_add(BATCH as u64, Ordering::Relaxed);
                }
            }
            lat
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    measuring.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut lat: Vec<Duration> = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    lat.sort();
    let events = accepted.load(Ordering::Relaxed);
    println!(
        "external events: {:.0} events/s ({} requests of {BATCH} in {:.1} s, {clients} keep-alive clients)",
        events as f64 / elapsed.as_secs_f64(),
        lat.len(),
        elapsed.as_secs_f64()
    );
    println!(
        "request latency: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        percentile(&lat, 0.50).as_secs_f64() * 1e3,
        percentile(&lat, 0.99).as_secs_f64() * 1e3,
        lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    let metrics = c
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for l in metrics.lines().filter(|l| {
        l.starts_with("vireo_events_delivered_total")
            || l.starts_with("vireo_external_events_total")
            || l.starts_with("vireo_events_dropped_total")
    }) {
        println!("  {l}");
    }
    println!("RSS after the run: {:.1} MiB", rss_kib(pid) as f64 / 1024.0);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(40), agent.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "agent exit: {status}");
}
