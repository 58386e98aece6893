//! Agent-to-agent peering end to end: two real agents in one test process, each a real HTTP
//! server on its own loopback port over its own real `LibvirtDriver` (libvirt's test driver
//! on a private node file, the recording plugger), configured through the same TOML file and
//! start-up code as `vireo agent` — each with the other as a `[[peers]]` entry, so every
//! cross-host step goes over HTTP (`POST /v1/peer/instances/{uuid}`), never in-process.
//!
//! Both drivers share one embedded network service (cross-host bindings need one port
//! store). Its events play Neutron's Nova notifier: they are POSTed, over HTTP and in order,
//! to ONE agent's `/v2.1/os-server-external-events` — the endpoint each test chooses — so an
//! event for an instance on the other host reaches it only through the agent's forwarding.
//! The forwarding tests switch that delivery off and post events themselves.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use uuid::Uuid;
use vireo::agent::auth::Token;
use vireo::agent::peer::{HttpPeer, PeerLink};
use vireo::agent::server::{serve, ServeError};
use vireo::agent::service::AgentService;
use vireo::compute::{ComputeDriver, ComputeOps, LibvirtDriver, SharedNetwork};
use vireo::network::embedded::{EmbeddedConfig, EmbeddedNetwork, EmbeddedNetworkDef, Mechanism};
use vireo_actors::external::{EventSink, ExternalEvent};
use vireo_actors::instance::{
    AdmissionError, InstanceError, Migration, Operation, PeerHost, ResizeArgs,
};
use vireo_actors::lifecycle::Request;
use vireo_actors::network::{BindingStatus, NetworkApi, PortStatus};
use vireo_actors::plug::testing::RecordingPlugger;
use vireo_actors::plug::VifPlugger;
use vireo_actors::vif::PortId;
use vireo_xml::metadata::Flavor;

const NET_HYBRID: &str = "22222222-0000-4000-8000-000000000001";
const NET_NATIVE: &str = "22222222-0000-4000-8000-000000000002";
const NET_LB: &str = "22222222-0000-4000-8000-000000000003";
const EVENTS_TOKEN: &str = "peer-test-events-token-0123456789";
const WITHIN: Duration = Duration::from_secs(60);

fn token_of(host: &str) -> String {
    format!("peer-test-api-token-{host}-0123456789")
}

fn write_secret(path: &Path, body: &str) {
    std::fs::write(path, format!("{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn networks() -> Vec<EmbeddedNetworkDef> {
    let def = |id: &str, name: &str, mechanism, hybrid| EmbeddedNetworkDef {
        id: id.into(),
        name: name.into(),
        mtu: Some(1450),
        mechanism,
        ovs_hybrid_plug: hybrid,
        bridge_name: None,
        datapath_type: None,
        physical_network: None,
        vlan: None,
    };
    vec![
        def(NET_HYBRID, "ovs-hybrid", Mechanism::Openvswitch, true),
        def(NET_NATIVE, "ovs-native", Mechanism::Openvswitch, false),
        def(NET_LB, "linuxbridge", Mechanism::Linuxbridge, false),
    ]
}

/// The network service's sink: every event goes, in order, to one agent's events endpoint
/// over HTTP (what Neutron's notifier does with its one `[nova] endpoint`), or nowhere.
#[derive(Debug)]
struct NotifierSink {
    tx: mpsc::UnboundedSender<ExternalEvent>,
}

impl EventSink for NotifierSink {
    fn deliver(&self, event: ExternalEvent) {
        let _ = self.tx.send(event);
    }
}

/// POST what the sink receives to `url`, batching what is queued, in order.
async fn notifier(mut rx: mpsc::UnboundedReceiver<ExternalEvent>, url: String, token: String) {
    let c = client(&token);
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while let Ok(e) = rx.try_recv() {
            batch.push(e);
        }
        // 207 with per-event 404s (no instance here and on no peer) is a normal answer.
        let _ = c.post(&url).json(&json!({ "events": batch })).send().await;
    }
}

fn client(token: &str) -> reqwest::Client {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("X-Auth-Token", token.parse().unwrap());
    reqwest::Client::builder()
        .default_headers(h)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

/// Where a host's `[[peers]]` entry points.
#[derive(Debug, Clone)]
enum Target {
    /// Another host of the set-up (by index).
    Host(usize),
    /// A host named so whose agent is not listening (connection refused).
    Down(&'static str),
}

/// One agent.
struct Node {
    base: String,
    uri: String,
    token: String,
    driver: Arc<LibvirtDriver>,
    plugger: Arc<RecordingPlugger>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), ServeError>>>,
}

impl Node {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let r = self.http.get(self.url(path)).send().await.unwrap();
        let s = r.status().as_u16();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        let s = r.status().as_u16();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    async fn show(&self, uuid: Uuid) -> (u16, Value) {
        self.get(&format!("/v1/instances/{uuid}")).await
    }

    /// Start an operation and wait for it to end; returns the finished operation.
    async fn run(&self, path: &str, body: &Value) -> Value {
        let (s, v) = self.post(path, body).await;
        assert_eq!(s, 202, "{path}: {v}");
        self.wait_op(&v).await
    }

    /// Wait for the operation of a 202 answer to end.
    async fn wait_op(&self, accepted: &Value) -> Value {
        let id = accepted["operation"]["id"].as_str().unwrap().to_owned();
        let deadline = Instant::now() + WITHIN;
        loop {
            let (_, op) = self.get(&format!("/v1/operations/{id}")).await;
            if op["state"] != "running" {
                return op;
            }
            assert!(Instant::now() < deadline, "still running: {op}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Delete an instance (networking released) and wait.
    async fn delete(&self, uuid: Uuid) {
        let r = self
            .http
            .delete(self.url(&format!("/v1/instances/{uuid}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        let v: Value = r.json().await.unwrap();
        let op = self.wait_op(&v).await;
        assert_eq!(op["state"], "succeeded", "{op}");
    }

    async fn action(&self, uuid: Uuid, action: Value) -> Value {
        self.run(&format!("/v1/instances/{uuid}/action"), &action)
            .await
    }

    async fn metric(&self, series: &str) -> u64 {
        let text = self
            .http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0)
    }

    async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
    }
}

/// Two (or more) agents, their shared network service and its notifier.
struct Cloud {
    net: Arc<EmbeddedNetwork>,
    nodes: Vec<Node>,
}

impl Cloud {
    /// Hosts `names`, each with `[[peers]]` entries `links[i]`; the network's events go to
    /// host `endpoint` (None: nowhere — the test posts events itself).
    async fn start(names: &[&str], links: &[Vec<Target>], endpoint: Option<usize>) -> Cloud {
        let listeners: Vec<TcpListener> = names
            .iter()
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let bases: Vec<String> = listeners
            .iter()
            .map(|l| format!("http://{}", l.local_addr().unwrap()))
            .collect();
        let dirs: Vec<tempfile::TempDir> =
            names.iter().map(|_| tempfile::tempdir().unwrap()).collect();
        let roots: Vec<PathBuf> = dirs
            .iter()
            .map(|d| d.path().canonicalize().unwrap())
            .collect();
        let uris: Vec<String> = roots
            .iter()
            .map(|r| format!("test://{}", r.join("state/libvirt-test-node.xml").display()))
            .collect();

        let (tx, rx) = mpsc::unbounded_channel();
        let sink = Arc::new(NotifierSink { tx });
        let net = EmbeddedNetwork::new(
            EmbeddedConfig {
                networks: networks(),
                ..EmbeddedConfig::default()
            },
            sink,
        )
        .unwrap();

        let mut nodes = Vec::new();
        for (i, (dir, listener)) in dirs.into_iter().zip(listeners).enumerate() {
            let (name, root) = (names[i], &roots[i]);
            write_secret(&root.join("api-token"), &token_of(name));
            write_secret(&root.join("events-token"), EVENTS_TOKEN);
            std::fs::create_dir_all(root.join("images")).unwrap();
            let mut peers = String::new();
            for (j, t) in links[i].iter().enumerate() {
                let (pname, url, uri) = match t {
                    Target::Host(k) => (names[*k].to_owned(), bases[*k].clone(), uris[*k].clone()),
                    Target::Down(n) => {
                        // A port nothing listens on any more.
                        let l = TcpListener::bind("127.0.0.1:0").unwrap();
                        let url = format!("http://{}", l.local_addr().unwrap());
                        drop(l);
                        (
                            (*n).to_owned(),
                            url,
                            "qemu+tcp://192.0.2.1/system".to_owned(),
                        )
                    }
                };
                let tf = root.join(format!("peer-{j}-token"));
                write_secret(&tf, &token_of(&pname));
                peers.push_str(&format!(
                    "[[peers]]\nname = {pname:?}\nurl = {url:?}\ntoken_file = {:?}\nmigration_uri = {uri:?}\n",
                    tf.to_str().unwrap()
                ));
            }
            let text = format!(
                r#"host = "{name}"
api_token_file = {token:?}
events_token_file = {events:?}
drain_timeout = 10
[libvirt]
uri = "embedded"
[instances]
state_dir = {state:?}
image_dirs = [{images:?}]
power_off_timeout = 2
[events]
vif_plugging_timeout = 30
[network]
kind = "embedded"
{peers}"#,
                token = root.join("api-token").to_str().unwrap(),
                events = root.join("events-token").to_str().unwrap(),
                state = root.join("state").to_str().unwrap(),
                images = root.join("images").to_str().unwrap(),
            );
            let cfg_path = root.join("agent.toml");
            std::fs::write(&cfg_path, text).unwrap();
            // The agent's own start-up: config, token files (the peers' too), state
            // directory, the private test-driver node; the driver starts with the configured
            // peers as HTTP peers. Only the network service is the test's (shared).
            let (cfg, settings) = vireo::agent::prepare(&cfg_path).unwrap();
            assert_eq!(cfg.libvirt_uri(), uris[i]);
            let plugger = Arc::new(RecordingPlugger::new());
            let driver = Arc::new(
                LibvirtDriver::builder(cfg.driver_config())
                    .peers(vireo::agent::peer_directory(&settings).unwrap())
                    .network(SharedNetwork::Embedded(net.clone()))
                    .plugger(plugger.clone())
                    .build()
                    .await
                    .unwrap(),
            );
            let svc = AgentService::new(driver.clone() as Arc<dyn ComputeDriver>, settings);
            let (stop, stopped) = oneshot::channel::<()>();
            let task = actix_rt::spawn(serve(
                listener,
                async move {
                    let _ = stopped.await;
                },
                svc,
            ));
            nodes.push(Node {
                base: bases[i].clone(),
                uri: uris[i].clone(),
                token: token_of(name),
                driver,
                plugger,
                http: client(&token_of(name)),
                _dir: dir,
                stop: Some(stop),
                task: Some(task),
            });
        }
        match endpoint {
            Some(k) => {
                let url = nodes[k].url("/v2.1/os-server-external-events");
                actix_rt::spawn(notifier(rx, url, nodes[k].token.clone()));
            }
            // Kept open and never read: events are recorded by the sink only.
            None => std::mem::forget(rx),
        }
        Cloud { net, nodes }
    }

    /// h1 and h2, each the other's peer.
    async fn pair(endpoint: Option<usize>) -> Cloud {
        Cloud::start(
            &["h1", "h2"],
            &[vec![Target::Host(1)], vec![Target::Host(0)]],
            endpoint,
        )
        .await
    }

    async fn stop(mut self) {
        for n in &mut self.nodes {
            n.stop().await;
        }
    }

    async fn port(&self, p: PortId) -> vireo_actors::network::Port {
        self.net.get_port(p).await.unwrap()
    }

    /// Every port of `ports` is bound to `host` only (no other binding), has no
    /// `migrating_to` and becomes ACTIVE.
    async fn assert_bound_only(&self, ports: &[PortId], host: &str) {
        for p in ports {
            let deadline = Instant::now() + WITHIN;
            loop {
                let port = self.port(*p).await;
                assert_eq!(port.host_id, host, "{port:?}");
                assert_eq!(port.migrating_to(), None, "{port:?}");
                if port.status == PortStatus::Active {
                    break;
                }
                assert!(Instant::now() < deadline, "never active: {port:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let b = self.net.show_bindings(*p).await.unwrap();
            assert_eq!(b.len(), 1, "{b:?}");
            assert_eq!(b[0].host, host);
            assert_eq!(b[0].status, BindingStatus::Active);
        }
    }
}

fn flavor(name: &str, vcpus: u32, memory_mb: u64) -> Value {
    json!({"name": name, "vcpus": vcpus, "memory_mb": memory_mb})
}

/// Create an instance with a port on each network on `node` (through its API) and wait
/// until it runs; returns its ports (hybrid, native, linux bridge).
async fn create3(node: &Node, uuid: Uuid) -> Vec<PortId> {
    let op = node
        .run(
            "/v1/instances",
            &json!({
                "uuid": uuid,
                "name": format!("vm-{uuid}"),
                "flavor": flavor("m1.tiny", 1, 128),
                "ports": [{"network_id": NET_HYBRID}, {"network_id": NET_NATIVE},
                          {"network_id": NET_LB}],
            }),
        )
        .await;
    assert_eq!(op["state"], "succeeded", "{op}");
    let (_, v) = node.show(uuid).await;
    assert_eq!(v["state"], "running", "{v}");
    vifs(&v)
}

fn vifs(shown: &Value) -> Vec<PortId> {
    shown["vifs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["port"].as_str().unwrap().parse().unwrap())
        .collect()
}

/// The ports an operation report waited for at `timing`, and whether every wait completed.
fn waited(report: &Value, timing: &str) -> Vec<PortId> {
    report["waits"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["timing"] == timing)
        .flat_map(|w| w["expected"].as_array().unwrap().iter())
        .map(|e| e["tag"].as_str().unwrap().parse().unwrap())
        .collect()
}

fn all_complete(report: &Value) -> bool {
    report["waits"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["complete"] == true)
}

fn steps(report: &Value) -> Vec<String> {
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect()
}

fn sorted(mut v: Vec<PortId>) -> Vec<PortId> {
    v.sort();
    v
}

/// The `Remote` error somewhere in `e`'s chain: (host, code).
fn remote_in(e: &InstanceError) -> Option<(String, String)> {
    match e {
        InstanceError::Remote { host, code, .. } => Some((host.clone(), code.clone())),
        InstanceError::Peer { source, .. } => remote_in(source),
        InstanceError::RolledBack { cause, .. }
        | InstanceError::RollbackFailed { cause, .. }
        | InstanceError::BuildFailed { cause, .. } => remote_in(cause),
        _ => None,
    }
}

const FWD_ACCEPTED: &str = "vireo_events_forwarded_total{result=\"accepted\"}";
const FWD_REFUSED: &str = "vireo_events_forwarded_total{result=\"refused\"}";

fn peer_served(request: &str, result: &str) -> String {
    format!("vireo_peer_requests_total{{request=\"{request}\",result=\"{result}\"}}")
}

#[actix_rt::test]
async fn cross_host_resize_then_revert_over_the_peer_link() {
    // Neutron's events go to h2 only.
    let c = Cloud::pair(Some(1)).await;
    let (h1, h2) = (&c.nodes[0], &c.nodes[1]);
    let uuid = Uuid::new_v4();
    // Built on h1: h2 does not know the instance and forwards its plug events to h1.
    let ports = create3(h1, uuid).await;
    let (hy, na, lb) = (ports[0], ports[1], ports[2]);
    assert!(h2.metric(FWD_ACCEPTED).await >= 3);

    let op = h1
        .action(
            uuid,
            json!({"action": "resize", "flavor": flavor("m1.small", 2, 256), "dest_host": "h2"}),
        )
        .await;
    assert_eq!(op["state"], "succeeded", "{op}");
    assert!(
        steps(&op["report"]).contains(&"finish-resize on h2".to_owned()),
        "{op}"
    );
    let (_, src) = h1.show(uuid).await;
    assert_eq!(src["state"], "resize-source", "{src}");
    assert_eq!(src["power_state"], "shutoff");
    let (_, dst) = h2.show(uuid).await;
    assert_eq!(dst["state"], "resize-target", "{dst}");
    assert_eq!(dst["flavor"], "m1.small");
    // h2 built it over the peer link and waited for every port at plug time (the events
    // went to h2 itself).
    let finish = &dst["last_operation"];
    assert_eq!(finish["request"], "finish-resize");
    assert_eq!(sorted(waited(finish, "plug-time")), sorted(ports.clone()));
    assert!(all_complete(finish), "{finish}");
    assert_eq!(h2.plugger.plugged().len(), 3);
    c.assert_bound_only(&ports, "h2").await;
    assert_eq!(
        h2.metric(&peer_served("finish-resize", "succeeded")).await,
        1
    );

    // Revert on h2: it removes its copy, then asks h1 over HTTP to bring the instance back.
    // h1 waits for the events of the bindings it moves back — Neutron posts them to h2,
    // which forwards them.
    let before = h2.metric(FWD_ACCEPTED).await;
    let op = h2.action(uuid, json!({"action": "revert-resize"})).await;
    assert_eq!(op["state"], "succeeded", "{op}");
    assert!(
        steps(&op["report"]).contains(&"finish-revert-resize on h1".to_owned()),
        "{op}"
    );
    assert_eq!(h2.show(uuid).await.0, 404);
    assert!(h2.plugger.plugged().is_empty());
    assert!(h2.driver.libvirt().list_all().await.unwrap().is_empty());
    let (_, back) = h1.show(uuid).await;
    assert_eq!(back["state"], "running", "{back}");
    assert_eq!(back["flavor"], "m1.tiny");
    let report = &back["last_operation"];
    assert_eq!(report["request"], "finish-revert-resize");
    // The hybrid port's qvo stayed wired on h1: bind time; the taps went with the stopped
    // domain: plug time. Every wait completed with the forwarded events.
    assert_eq!(waited(report, "bind-time"), vec![hy]);
    assert_eq!(sorted(waited(report, "plug-time")), sorted(vec![na, lb]));
    assert!(all_complete(report), "{report}");
    assert!(h2.metric(FWD_ACCEPTED).await >= before + 3);
    assert_eq!(
        h1.metric(&peer_served("finish-revert-resize", "succeeded"))
            .await,
        1
    );
    c.assert_bound_only(&ports, "h1").await;

    h1.delete(uuid).await;
    assert!(
        c.net.ports().is_empty(),
        "the ports vireo created are deleted"
    );
    c.stop().await;
}

#[actix_rt::test]
async fn cross_host_resize_then_confirm_over_the_peer_link() {
    // Neutron's events go to h1 only: while h1's resize runs, h1 forwards the events of the
    // instance (it knows it too) so that h2's plug-time wait is satisfied.
    let c = Cloud::pair(Some(0)).await;
    let (h1, h2) = (&c.nodes[0], &c.nodes[1]);
    let uuid = Uuid::new_v4();
    let ports = create3(h1, uuid).await;
    assert_eq!(
        h1.metric(FWD_ACCEPTED).await,
        0,
        "h1 owns it: nothing forwarded"
    );

    let op = h1
        .action(
            uuid,
            json!({"action": "resize", "flavor": flavor("m1.small", 2, 256), "dest_host": "h2"}),
        )
        .await;
    assert_eq!(op["state"], "succeeded", "{op}");
    let (_, dst) = h2.show(uuid).await;
    assert_eq!(dst["state"], "resize-target", "{dst}");
    let finish = &dst["last_operation"];
    assert_eq!(sorted(waited(finish, "plug-time")), sorted(ports.clone()));
    assert!(all_complete(finish), "{finish}");
    assert!(h1.metric(FWD_ACCEPTED).await >= 3);

    let op = h2.action(uuid, json!({"action": "confirm-resize"})).await;
    assert_eq!(op["state"], "succeeded", "{op}");
    assert!(
        steps(&op["report"]).contains(&"confirm-resize-source on h1".to_owned()),
        "{op}"
    );
    // The source's copy is gone entirely; the resized instance runs on h2.
    assert_eq!(h1.show(uuid).await.0, 404);
    assert!(h1.plugger.plugged().is_empty());
    assert!(h1.driver.libvirt().list_all().await.unwrap().is_empty());
    let (_, v) = h2.show(uuid).await;
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(v["flavor"], "m1.small");
    assert_eq!(
        h1.metric(&peer_served("confirm-resize-source", "succeeded"))
            .await,
        1
    );
    c.assert_bound_only(&ports, "h2").await;

    h2.delete(uuid).await;
    assert!(c.net.ports().is_empty());
    c.stop().await;
}

#[actix_rt::test]
async fn failed_live_migration_is_rolled_back_over_the_peer_link() {
    // Neutron's events go to the destination, h2. Before the migration h2 does not know
    // the instance and forwards its events; once h2 pre-wired it (pre-live-migration), h2
    // knows it too and still forwards them until the source finishes the migration there.
    let c = Cloud::pair(Some(1)).await;
    let (h1, h2) = (&c.nodes[0], &c.nodes[1]);
    let uuid = Uuid::new_v4();
    let ports = create3(h1, uuid).await;

    let op = h1
        .action(uuid, json!({"action": "live-migrate", "dest_host": "h2"}))
        .await;
    // libvirt's test driver has no migration API: the migrate step fails.
    assert_eq!(op["state"], "failed", "{op}");
    assert_eq!(op["error"]["code"], "rolled-back", "{op}");
    assert!(
        op["error"]["message"].as_str().unwrap().contains("migrate"),
        "{op}"
    );
    let (_, v) = h1.show(uuid).await;
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(v["power_state"], "running");
    let report = &v["last_operation"];
    assert_eq!(report["request"], "live-migrate");
    let names = steps(report);
    for s in [
        "set migrating_to",
        "pre-live-migration on h2",
        "migrate",
        "clear migrating_to",
        "tear down destination bindings",
        "rollback-live-migration-at-destination on h2",
    ] {
        assert!(names.iter().any(|n| n == s), "{s} missing in {names:?}");
    }
    // Setting and clearing migrating_to rebinds each port: six events, each consumed by
    // its wait on h1 — forwarded by h2 before and after it pre-wired the instance.
    assert_eq!(waited(report, "bind-time").len(), 6, "{report}");
    assert!(all_complete(report), "{report}");
    // No migrating_to, no destination binding, nothing on the destination.
    c.assert_bound_only(&ports, "h1").await;
    assert_eq!(h1.plugger.plugged().len(), 3);
    assert!(h2.plugger.plugged().is_empty());
    assert!(h2.driver.libvirt().list_all().await.unwrap().is_empty());
    assert_eq!(h2.show(uuid).await.0, 404);
    for r in [
        "pre-live-migration",
        "rollback-live-migration-at-destination",
    ] {
        assert_eq!(h2.metric(&peer_served(r, "succeeded")).await, 1, "{r}");
    }

    h1.delete(uuid).await;
    assert!(c.net.ports().is_empty());
    c.stop().await;
}

#[actix_rt::test]
async fn a_peer_that_is_down_gives_a_typed_error_and_the_source_rolls_back() {
    // h1's peer h3 is configured, its agent is not listening (connection refused); h3's
    // L2 agent is up, so the network service binds ports there.
    let c = Cloud::start(&["h1"], &[vec![Target::Down("h3")]], Some(0)).await;
    let h1 = &c.nodes[0];
    let h3_devices = RecordingPlugger::new();
    c.net.attach_host("h3", h3_devices.wiring()).unwrap();
    let uuid = Uuid::new_v4();
    let ports = create3(h1, uuid).await;

    // Resize: the typed error, from the driver itself.
    let e = h1
        .driver
        .resize(
            uuid,
            ResizeArgs::of(
                &Migration {
                    id: Uuid::new_v4(),
                    source_host: "h1".into(),
                    dest_host: "h3".into(),
                },
                Flavor {
                    name: "m1.small".into(),
                    vcpus: 2,
                    memory_mb: 256,
                    root_gb: 0,
                    ephemeral_gb: 0,
                    swap_mb: 0,
                    extra_specs: Default::default(),
                },
            ),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            &e,
            InstanceError::RolledBack {
                request: Request::Resize,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        remote_in(&e),
        Some(("h3".to_owned(), "unavailable".to_owned())),
        "{e:?}"
    );
    let (_, v) = h1.show(uuid).await;
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(v["flavor"], "m1.tiny");
    assert_eq!(h1.plugger.plugged().len(), 3);
    c.assert_bound_only(&ports, "h1").await;

    // Live migration through the API: the source made h3's bindings and set migrating_to,
    // h3 cannot be reached: the source removes them itself and the guest stays.
    let op = h1
        .action(uuid, json!({"action": "live-migrate", "dest_host": "h3"}))
        .await;
    assert_eq!(op["state"], "failed", "{op}");
    assert_eq!(op["error"]["code"], "rolled-back", "{op}");
    let msg = op["error"]["message"].as_str().unwrap();
    assert!(msg.contains("host h3 answered unavailable"), "{msg}");
    let (_, v) = h1.show(uuid).await;
    assert_eq!(v["state"], "running", "{v}");
    let report = &v["last_operation"];
    assert!(steps(report).iter().any(|s| s == "set migrating_to"));
    assert!(steps(report).iter().any(|s| s == "clear migrating_to"));
    assert!(all_complete(report), "{report}");
    c.assert_bound_only(&ports, "h1").await;
    assert!(h3_devices.plugged().is_empty());
    // While the migration ran, h1 forwarded the instance's events to h3 too; they failed
    // there without harming the local answer.
    assert!(
        h1.metric("vireo_event_forward_failures_total{peer=\"h3\"}")
            .await
            > 0
    );

    h1.delete(uuid).await;
    assert!(c.net.ports().is_empty());
    c.stop().await;
}

/// Create an instance with one hybrid port on `node` through its API and wait until it
/// waits for that port's plug event; returns the 202 answer and the port.
async fn create_waiting(node: &Node, uuid: Uuid) -> (Value, String) {
    let (s, accepted) = node
        .post(
            "/v1/instances",
            &json!({"uuid": uuid, "flavor": flavor("m1.tiny", 1, 128),
                    "ports": [{"network_id": NET_HYBRID}]}),
        )
        .await;
    assert_eq!(s, 202, "{accepted}");
    let deadline = Instant::now() + WITHIN;
    loop {
        let (_, v) = node.show(uuid).await;
        if let Some(tag) = v["operation"]["waiting_for"][0]["tag"].as_str() {
            return (accepted, tag.to_owned());
        }
        assert!(Instant::now() < deadline, "never waited: {v}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const RECEIVED_200: &str = "vireo_external_events_total{code=\"200\"}";
const RECEIVED_404: &str = "vireo_external_events_total{code=\"404\"}";

#[actix_rt::test]
async fn events_posted_to_one_agent_reach_the_other_and_are_never_forwarded_twice() {
    // The network service's events go nowhere: the test is Neutron.
    let c = Cloud::pair(None).await;
    let (h1, h2) = (&c.nodes[0], &c.nodes[1]);

    // An instance on h2 waits for its plug event; the event is posted to h1.
    let on_h2 = Uuid::new_v4();
    let (accepted, port) = create_waiting(h2, on_h2).await;
    let (s, v) = h1
        .post(
            "/v2.1/os-server-external-events",
            &json!({"events": [{"name": "network-vif-plugged", "server_uuid": on_h2,
                                "tag": port, "status": "completed"}]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["events"][0]["code"], 200);
    assert_eq!(v["events"][0]["status"], "completed");
    let op = h2.wait_op(&accepted).await;
    assert_eq!(op["state"], "succeeded", "{op}");
    assert_eq!(waited(&op["report"], "plug-time").len(), 1);
    assert!(all_complete(&op["report"]), "{op}");
    assert_eq!(h1.metric(FWD_ACCEPTED).await, 1);
    assert_eq!(h1.metric(RECEIVED_200).await, 1, "answered 200 by h1");
    assert_eq!(h2.metric(RECEIVED_200).await, 1, "accepted by h2 once");

    // One POST to h2 for an instance on h1, one on h2 and one nowhere: one forwarded POST
    // to h1 with the two h2 does not own; Nova's 207 with the best code per event.
    let on_h1 = Uuid::new_v4();
    let op = h1
        .run(
            "/v1/instances",
            &json!({"uuid": on_h1, "flavor": flavor("m1.tiny", 1, 128)}),
        )
        .await;
    assert_eq!(op["state"], "succeeded", "{op}");
    let nowhere = Uuid::new_v4();
    let h1_404 = h1.metric(RECEIVED_404).await;
    let (s, v) = h2
        .post(
            "/v2.1/os-server-external-events",
            &json!({"events": [
                {"name": "network-changed", "server_uuid": on_h1, "tag": port},
                {"name": "network-changed", "server_uuid": on_h2, "tag": port},
                {"name": "network-changed", "server_uuid": nowhere},
            ]}),
        )
        .await;
    assert_eq!(s, 207, "{v}");
    let codes: Vec<u64> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["code"].as_u64().unwrap())
        .collect();
    assert_eq!(codes, [200, 200, 404]);
    assert_eq!(v["events"][2]["status"], "failed");
    assert_eq!(h2.metric(FWD_ACCEPTED).await, 1);
    assert_eq!(h2.metric(FWD_REFUSED).await, 1);
    assert_eq!(
        h1.metric(RECEIVED_404).await,
        h1_404 + 1,
        "one event h1 did not know"
    );

    // An event no host knows: h1 forwards it once; h2 receives it marked as forwarded and
    // does not send it back. Each agent counts it once.
    let (h1_404, h2_404) = (h1.metric(RECEIVED_404).await, h2.metric(RECEIVED_404).await);
    let (h1_ref, h2_ref) = (h1.metric(FWD_REFUSED).await, h2.metric(FWD_REFUSED).await);
    let unknown = json!({"events": [{"name": "network-vif-plugged",
                                     "server_uuid": Uuid::new_v4(), "tag": port}]});
    let (s, v) = h1.post("/v2.1/os-server-external-events", &unknown).await;
    assert_eq!(s, 207, "{v}");
    assert_eq!(v["events"][0]["code"], 404);
    assert_eq!(h1.metric(RECEIVED_404).await, h1_404 + 1);
    assert_eq!(h2.metric(RECEIVED_404).await, h2_404 + 1);
    assert_eq!(h1.metric(FWD_REFUSED).await, h1_ref + 1);
    assert_eq!(h2.metric(FWD_REFUSED).await, h2_ref, "h2 forwarded nothing");

    // A POST marked as forwarded is answered from the receiving host alone.
    let r = h2
        .http
        .post(h2.url("/v2.1/os-server-external-events"))
        .header("X-Vireo-Forwarded", "1")
        .json(&json!({"events": [{"name": "network-changed", "server_uuid": on_h1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 207, "on h1, but not forwarded again");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["events"][0]["code"], 404);
    assert_eq!(h1.metric(RECEIVED_404).await, h1_404 + 1, "h1 saw nothing");

    h1.delete(on_h1).await;
    h2.delete(on_h2).await;
    c.stop().await;
}

#[actix_rt::test]
async fn the_peer_endpoint_needs_the_api_token_and_takes_only_peer_requests() {
    let c = Cloud::pair(None).await;
    let (h1, h2) = (&c.nodes[0], &c.nodes[1]);
    let unknown = Uuid::new_v4();
    let path = h1.url(&format!("/v1/peer/instances/{unknown}"));
    let body = json!({"action": "confirm-resize-source"});
    let anon = reqwest::Client::new();

    let post = |req: reqwest::RequestBuilder| {
        let req = req.json(&body);
        async move {
            let r = req.send().await.unwrap();
            let s = r.status().as_u16();
            (s, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    assert_eq!(post(anon.post(&path)).await.0, 401, "no token");
    assert_eq!(
        post(anon.post(&path).header("X-Auth-Token", EVENTS_TOKEN))
            .await
            .0,
        401,
        "the events token is not an API token"
    );
    assert_eq!(
        post(anon.post(&path).header("X-Auth-Token", &h2.token))
            .await
            .0,
        401,
        "another host's token"
    );
    let (s, v) = post(anon.post(&path).bearer_auth(&h1.token)).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("not-found")),
        "{v}"
    );
    assert!(h1.metric("vireo_auth_failures_total{scope=\"api\"}").await >= 3);

    // Only the six peer requests, with exactly their arguments.
    for bad in [
        json!({"action": "spawn"}),
        json!({"action": "confirm-resize"}),
        json!({"action": "revert-resize"}),
        json!({"action": "confirm-resize-source", "force": true}),
        json!({"action": "pause"}),
        json!({"request": "confirm-resize-source"}),
    ] {
        let (s, v) = h1
            .post(&format!("/v1/peer/instances/{unknown}"), &bad)
            .await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (400, Some("bad-json")),
            "{bad}: {v}"
        );
    }
    let (s, v) = h1.post("/v1/peer/instances/nope", &body).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("invalid")),
        "{v}"
    );

    // What a peer request would build obeys the same rules as a create: a kernel outside
    // the image directories is refused and nothing is created.
    let f = json!({"name": "m1", "vcpus": 1, "memory_mb": 128, "root_gb": 0});
    let finish = json!({
        "action": "finish-resize",
        "migration": {"id": Uuid::new_v4(), "source_host": "h2", "dest_host": "h1"},
        "handover": {"name": "vm-x", "flavor": f, "old_flavor": f,
                     "boot": {"type": "kernel", "kernel": "/etc/passwd"},
                     "network_info": [], "power_on": true},
    });
    let (s, v) = h1
        .post(&format!("/v1/peer/instances/{unknown}"), &finish)
        .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("invalid-path")),
        "{v}"
    );
    assert_eq!(h1.show(unknown).await.0, 404);
    assert!(h1.driver.libvirt().list_all().await.unwrap().is_empty());
    assert_eq!(h1.metric(&peer_served("finish-resize", "refused")).await, 1);

    // The HTTP peer: typed errors for each answer.
    let link = |token: &str| PeerLink {
        name: "h1".into(),
        url: h1.base.clone(),
        token: Token::from_secret(token),
        migration_uri: None,
        timeout: Duration::from_secs(10),
    };
    let wrong = HttpPeer::new(&link("wrong-token-0123456789")).unwrap();
    let e = wrong
        .request(unknown, Operation::ConfirmResizeSource {})
        .await
        .unwrap_err();
    assert_eq!(
        remote_in(&e),
        Some(("h1".into(), "unauthorized".into())),
        "{e:?}"
    );
    let right = HttpPeer::new(&link(&h1.token)).unwrap();
    let e = right
        .request(unknown, Operation::ConfirmResizeSource {})
        .await
        .unwrap_err();
    assert!(
        matches!(e, InstanceError::Refused(AdmissionError::NotFound(u)) if u == unknown),
        "{e:?}"
    );
    let running = Uuid::new_v4();
    let op = h1
        .run(
            "/v1/instances",
            &json!({"uuid": running, "flavor": flavor("m1.tiny", 1, 128)}),
        )
        .await;
    assert_eq!(op["state"], "succeeded", "{op}");
    let e = right
        .request(running, Operation::ConfirmResizeSource {})
        .await
        .unwrap_err();
    assert_eq!(
        remote_in(&e),
        Some(("h1".into(), "illegal-state".into())),
        "{e:?}"
    );
    assert_eq!(e.code(), "illegal-state");
    let (_, v) = h1.show(running).await;
    assert_eq!(v["state"], "running", "{v}");

    // The driver's directory: this host in-process, the other over HTTP; a request that is
    // not a peer request never leaves.
    assert_eq!(h2.driver.peers().names(), ["h1", "h2"]);
    let via = h2.driver.peers().get("h1").unwrap();
    assert_eq!(via.migration_uri(), Some(h1.uri.clone()));
    let e = via.request(running, Operation::Pause {}).await.unwrap_err();
    assert!(matches!(e, InstanceError::Invalid(_)), "{e:?}");
    assert_eq!(h1.show(running).await.1["state"], "running");

    h1.delete(running).await;
    c.stop().await;
}

/// Post `network-vif-plugged` for every port `node`'s instance waits for now, once it
/// waits for `n` of them.
async fn release_waits(node: &Node, target: &Node, uuid: Uuid, n: usize) {
    let deadline = Instant::now() + WITHIN;
    let tags: Vec<String> = loop {
        let (_, v) = node.show(uuid).await;
        let tags: Vec<String> = v["operation"]["waiting_for"]
            .as_array()
            .map(|w| {
                w.iter()
                    .map(|e| e["tag"].as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        if tags.len() == n {
            break tags;
        }
        assert!(Instant::now() < deadline, "never waited for {n}: {v}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let events: Vec<Value> = tags
        .iter()
        .map(|t| json!({"name": "network-vif-plugged", "server_uuid": uuid, "tag": t}))
        .collect();
    let (s, v) = target
        .post(
            "/v2.1/os-server-external-events",
            &json!({ "events": events }),
        )
        .await;
    assert_eq!(s, 200, "{v}");
}

#[actix_rt::test]
async fn a_peer_request_in_flight_at_shutdown_is_rolled_back_and_answered() {
    // Events go nowhere: the test posts them. h2 will wait for a plug event no one sends.
    let mut c = Cloud::pair(None).await;
    let uuid = Uuid::new_v4();
    let (accepted, port) = create_waiting(&c.nodes[0], uuid).await;
    let (s, _) = c.nodes[0]
        .post(
            "/v2.1/os-server-external-events",
            &json!({"events": [{"name": "network-vif-plugged", "server_uuid": uuid,
                                "tag": port}]}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(c.nodes[0].wait_op(&accepted).await["state"], "succeeded");

    // h2 builds the resized copy and waits for its plug event.
    let (s, resize) = c.nodes[0]
        .post(
            &format!("/v1/instances/{uuid}/action"),
            &json!({"action": "resize", "flavor": flavor("m1.small", 2, 256),
                    "dest_host": "h2"}),
        )
        .await;
    assert_eq!(s, 202, "{resize}");
    let deadline = Instant::now() + WITHIN;
    loop {
        let (_, v) = c.nodes[1].show(uuid).await;
        if v["operation"]["waiting_for"]
            .as_array()
            .is_some_and(|w| w.len() == 1)
        {
            break;
        }
        assert!(Instant::now() < deadline, "h2 never waited: {v}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // h2 shuts down: its driver stops while the server drains, so the finish-resize fails
    // its wait, rolls back on h2, and h2 still answers h1 (not a dropped connection).
    c.nodes[1].stop().await;
    // h1 brings the instance back: its hybrid port's binding moves back (bind time).
    release_waits(&c.nodes[0], &c.nodes[0], uuid, 1).await;
    let op = c.nodes[0].wait_op(&resize).await;
    assert_eq!(op["state"], "failed", "{op}");
    assert_eq!(op["error"]["code"], "rolled-back", "{op}");
    let msg = op["error"]["message"].as_str().unwrap();
    assert!(msg.contains("host h2 answered"), "{msg}");
    assert!(!msg.contains("answered unavailable"), "{msg}");
    let (_, v) = c.nodes[0].show(uuid).await;
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(v["flavor"], "m1.tiny");
    assert!(c.nodes[1].plugger.plugged().is_empty());
    c.assert_bound_only(&[port.parse().unwrap()], "h1").await;

    c.nodes[0].delete(uuid).await;
    c.stop().await;
}
