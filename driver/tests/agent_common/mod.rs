//! Shared by the agent tests and the agent benchmark: `TestAgent`, a real agent server on
//! 127.0.0.1:0 over the real `LibvirtDriver` — libvirt's test driver on a private node file,
//! the embedded network service, the recording plugger (the `test:///` tier) — configured
//! through the same TOML file and code path as `vireo agent`.
//!
//! The embedded service reports `network-vif-plugged` itself once a port is wired, after
//! `[network.embedded] event_delay_ms`. The tests that play Neutron set that delay far beyond
//! the test's length, so the only events that arrive are the ones they POST to the agent's
//! external-events endpoint.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;
use uuid::Uuid;
use vireo::agent::server::{serve, ServeError};
use vireo::agent::service::{AgentService, Settings};
use vireo::compute::{ComputeDriver, ComputeOps, LibvirtDriver};
use vireo::config::AgentConfig;
use vireo_actors::instance::{BootSource, NetworkRequest, SpawnArgs};
use vireo_actors::vif::NetworkInfo;
use vireo_xml::metadata::Flavor;

/// The API token every test agent uses.
pub const TOKEN: &str = "test-api-token-0123456789";
/// The events-only token of agents started with `events_token`.
pub const EVENTS_TOKEN: &str = "test-events-token-0123456789";
/// The embedded service's network (OVS, hybrid plug).
pub const NET: &str = "11111111-0000-4000-8000-0000000000a1";
/// The test agent's host name.
pub const HOST: &str = "test-host";
/// An event delay no test waits out: only POSTed events arrive.
pub const NEVER_MS: u64 = 3_600_000;

/// Write `body` to `path` with `mode`.
pub fn write_file(path: &Path, body: &str, mode: u32) {
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Options of a test agent.
#[derive(Debug, Clone)]
pub struct Options {
    /// Extra top-level config lines.
    pub extra: String,
    /// Extra `[libvirt]` lines.
    pub libvirt: String,
    /// The embedded service's event delay (ms); [`NEVER_MS`]: the test posts the events.
    pub event_delay_ms: u64,
    /// Write an events token file and configure it.
    pub events_token: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            extra: String::new(),
            libvirt: "uri = \"embedded\"\n".into(),
            event_delay_ms: NEVER_MS,
            events_token: false,
        }
    }
}

/// The config file text of a test agent rooted at `root`.
pub fn config_text(root: &Path, opts: &Options) -> String {
    let mut extra = opts.extra.clone();
    if opts.events_token {
        let ev = root.join("events-token");
        write_file(&ev, EVENTS_TOKEN, 0o600);
        extra.push_str(&format!("events_token_file = {:?}\n", ev.to_str().unwrap()));
    }
    format!(
        r#"host = "{HOST}"
api_token_file = {token:?}
{extra}
[libvirt]
{libvirt}
[instances]
state_dir = {state:?}
image_dirs = [{images:?}]
power_off_timeout = 2
[events]
vif_plugging_timeout = 60
[network]
kind = "embedded"
[network.embedded]
event_delay_ms = {delay}
[[network.embedded.networks]]
id = "{NET}"
name = "private"
mechanism = "openvswitch"
ovs_hybrid_plug = true
mtu = 1450
"#,
        token = root.join("api-token").to_str().unwrap(),
        libvirt = opts.libvirt,
        state = root.join("state").to_str().unwrap(),
        images = root.join("images").to_str().unwrap(),
        delay = opts.event_delay_ms,
    )
}

/// A real agent on 127.0.0.1:0 (see the module docs). Must be started inside an actix
/// system (`#[actix_rt::test]`).
pub struct TestAgent {
    pub addr: SocketAddr,
    pub base: String,
    pub svc: Arc<AgentService>,
    pub driver: Arc<LibvirtDriver>,
    pub cfg: AgentConfig,
    pub dir: tempfile::TempDir,
    pub images: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), ServeError>>>,
}

impl TestAgent {
    pub async fn start() -> TestAgent {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(opts: Options) -> TestAgent {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        write_file(&root.join("api-token"), &format!("{TOKEN}\n"), 0o600);
        let images = root.join("images");
        std::fs::create_dir_all(&images).unwrap();
        std::fs::write(images.join("vmlinuz"), b"kernel").unwrap();
        std::fs::write(images.join("disk.raw"), b"disk").unwrap();
        let cfg_path = root.join("agent.toml");
        std::fs::write(&cfg_path, config_text(&root, &opts)).unwrap();
        // The same preparation as `vireo agent`: config, token files, state directory, the
        // private test-driver node.
        let (cfg, settings): (AgentConfig, Settings) = vireo::agent::prepare(&cfg_path).unwrap();
        let driver = Arc::new(
            LibvirtDriver::builder(cfg.driver_config())
                .build()
                .await
                .unwrap(),
        );
        let svc = AgentService::new(driver.clone() as Arc<dyn ComputeDriver>, settings);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = actix_rt::spawn(serve(
            listener,
            async move {
                let _ = rx.await;
            },
            svc.clone(),
        ));
        TestAgent {
            addr,
            base: format!("http://{addr}"),
            svc,
            driver,
            cfg,
            dir,
            images,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Signal shutdown (like SIGTERM) and wait for `serve` to return.
    pub async fn stop(&mut self) -> Result<(), ServeError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(t) => t.await.unwrap(),
            None => Ok(()),
        }
    }

    /// An instance with no ports, spawned through the driver (not the API).
    pub async fn spawn_direct(&self, uuid: Uuid) {
        self.driver
            .spawn(
                uuid,
                SpawnArgs {
                    name: format!("direct-{uuid}"),
                    flavor: Flavor {
                        name: "m1.tiny".into(),
                        vcpus: 1,
                        memory_mb: 64,
                        root_gb: 0,
                        ephemeral_gb: 0,
                        swap_mb: 0,
                        extra_specs: Default::default(),
                    },
                    boot: BootSource::None,
                    storage: Default::default(),
                    network: NetworkRequest::Allocated(NetworkInfo::default()),
                    power_on: true,
                },
            )
            .await
            .unwrap();
    }
}

/// An HTTP client with the API token set.
pub fn http() -> reqwest::Client {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("X-Auth-Token", TOKEN.parse().unwrap());
    reqwest::Client::builder()
        .default_headers(h)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// An HTTP client sending no token.
pub fn anonymous() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A create request with `ports` new ports on [`NET`].
pub fn create_body(uuid: Uuid, ports: usize) -> Value {
    json!({
        "uuid": uuid,
        "name": format!("vm-{uuid}"),
        "flavor": {"name": "m1.tiny", "vcpus": 1, "memory_mb": 128},
        "ports": (0..ports).map(|_| json!({"network_id": NET})).collect::<Vec<_>>(),
    })
}

/// One `network-vif-plugged` event body.
pub fn plugged(server: Uuid, port: &str, status: &str) -> Value {
    json!({"events": [{"name": "network-vif-plugged", "server_uuid": server,
                       "tag": port, "status": status}]})
}

/// Every awaited event's tag of a shown instance.
pub fn awaited_tags(shown: &Value) -> Vec<String> {
    shown["operation"]["waiting_for"]
        .as_array()
        .map(|w| {
            w.iter()
                .map(|e| e["tag"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Poll `GET /v1/operations/{id}` until it leaves `running` (bounded by `within`).
pub async fn wait_op(c: &reqwest::Client, agent: &TestAgent, id: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let op: Value = c
            .get(agent.url(&format!("/v1/operations/{id}")))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if op["state"] != "running" {
            return op;
        }
        assert!(
            Instant::now() < deadline,
            "operation {id} still running: {op}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Poll `GET /v1/instances/{uuid}` until `pred` holds (bounded by `within`).
pub async fn wait_instance(
    c: &reqwest::Client,
    agent: &TestAgent,
    uuid: Uuid,
    within: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    let mut last = Value::Null;
    loop {
        let r = c
            .get(agent.url(&format!("/v1/instances/{uuid}")))
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            let v: Value = r.json().await.unwrap();
            if pred(&v) {
                return v;
            }
            last = v;
        }
        assert!(
            Instant::now() < deadline,
            "instance {uuid} never matched: {last}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Post `body` to the agent's external-events endpoint with the API token.
pub async fn post_events(c: &reqwest::Client, agent: &TestAgent, body: &Value) -> (u16, Value) {
    let r = c
        .post(agent.url("/v2.1/os-server-external-events"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Create an instance with `ports` ports through the API and wait until it awaits its plug
/// events; returns the operation id and the awaited ports.
pub async fn create_waiting(
    c: &reqwest::Client,
    agent: &TestAgent,
    uuid: Uuid,
    ports: usize,
) -> (String, Vec<String>) {
    let r = c
        .post(agent.url("/v1/instances"))
        .json(&create_body(uuid, ports))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let v: Value = r.json().await.unwrap();
    let op = v["operation"]["id"].as_str().unwrap().to_owned();
    let shown = wait_instance(c, agent, uuid, Duration::from_secs(30), |v| {
        awaited_tags(v).len() == ports && v["operation"]["phase"] == "wait for events"
    })
    .await;
    (op, awaited_tags(&shown))
}
