//! Shared by the agent tests and the agent benchmark: `FakeDriver`, an in-test fake of the
//! `ComputeDriver` trait (the real driver is not on this branch yet), and `TestAgent`, a real
//! agent server on 127.0.0.1:0 with the real NetworkEventActor.
//!
//! The fake keeps instances in memory and follows the lifecycle rules. Its spawn is honest
//! about events: it registers a real wait with the NetworkEventActor for every VIF's
//! `network-vif-plugged` (with the agent's wait policy), shows the awaited events in its
//! progress, and finishes only when they arrive (or rolls back when the wait fails).
//! Transition operations can be held (`hold(true)` until `hold(false)`; cooperative: they stop
//! with `ShuttingDown` when the driver is shut down) or made to hang (`set_stuck`, ignoring
//! shutdown), to test conflicts and shutdown with operations in flight.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use uuid::Uuid;
use vireo::agent::events::{InstanceDirectory, InstanceSet};
use vireo::agent::provisional::{
    Awaited, ComputeDriver, EventResult, Flavor, InstanceError, InstanceView, LiveMigrateArgs,
    Migration, OpReport, PowerState, Progress, RebootKind, SpawnArgs, VifView, WaitReport,
};
use vireo::agent::server::{serve, ServeError};
use vireo::agent::service::{AgentParts, AgentService, Settings};
use vireo::config::AgentConfig;
use vireo_actors::events::{EventConfig, EventsHandle, OpId, WaitPolicy};
use vireo_actors::external::{EventName, ExternalEvent};
use vireo_actors::lifecycle::{accepts, InstanceState, Request};
use vireo_actors::predict::ExpectedEvent;
use vireo_actors::vif::{PortId, Vif};

/// The API token every test agent uses.
pub const TOKEN: &str = "test-api-token-0123456789";
/// The events-only token of agents started with `events_token`.
pub const EVENTS_TOKEN: &str = "test-events-token-0123456789";

#[derive(Debug, Clone)]
struct FakeInstance {
    name: String,
    state: InstanceState,
    power: PowerState,
    vifs: Vec<VifView>,
    progress: Option<Progress>,
}

/// An in-test fake of the virt driver (see the module docs).
#[derive(Debug)]
pub struct FakeDriver {
    host: String,
    events: EventsHandle,
    policy: WaitPolicy,
    instances: Mutex<HashMap<Uuid, FakeInstance>>,
    held: tokio::sync::watch::Sender<bool>,
    stuck: AtomicBool,
    shut_down: AtomicBool,
    shutdown_notify: Notify,
    next_op: AtomicU64,
    pub calls: Mutex<Vec<String>>,
}

fn view(uuid: Uuid, i: &FakeInstance) -> InstanceView {
    InstanceView {
        uuid,
        name: i.name.clone(),
        state: i.state,
        power: i.power,
        vifs: i.vifs.clone(),
        operation: i.progress.clone(),
    }
}

impl FakeDriver {
    pub fn new(host: &str, events: EventsHandle, policy: WaitPolicy) -> Self {
        FakeDriver {
            host: host.to_owned(),
            events,
            policy,
            instances: Mutex::new(HashMap::new()),
            held: tokio::sync::watch::channel(false).0,
            stuck: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            shutdown_notify: Notify::new(),
            next_op: AtomicU64::new(1),
            calls: Mutex::new(Vec::new()),
        }
    }

    /// Put an instance in place without an operation (recovery at start, benchmarks).
    pub fn insert(&self, uuid: Uuid, state: InstanceState, vifs: usize) {
        let vifs = (0..vifs)
            .map(|n| VifView {
                port: PortId(Uuid::new_v4()),
                address: format!("fa:16:3e:00:00:{n:02x}"),
                vif_type: "ovs".into(),
                devname: None,
                plugged: true,
            })
            .collect();
        self.instances.lock().unwrap().insert(
            uuid,
            FakeInstance {
                name: format!("fake-{uuid}"),
                state,
                power: if state == InstanceState::Running {
                    PowerState::Running
                } else {
                    PowerState::Shutdown
                },
                vifs,
                progress: None,
            },
        );
    }

    /// Hold every transition operation before it takes effect, until `hold(false)`
    /// (cooperative with shutdown).
    pub fn hold(&self, held: bool) {
        self.held.send_replace(held);
    }

    /// Make transition operations hang forever, ignoring shutdown.
    pub fn set_stuck(&self, stuck: bool) {
        self.stuck.store(stuck, Ordering::SeqCst);
    }

    pub fn was_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    pub fn state_of(&self, uuid: Uuid) -> Option<InstanceState> {
        self.instances.lock().unwrap().get(&uuid).map(|i| i.state)
    }

    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn set_progress(&self, uuid: Uuid, p: Option<Progress>) {
        if let Some(i) = self.instances.lock().unwrap().get_mut(&uuid) {
            i.progress = p;
        }
    }

    async fn pause_point(&self) -> Result<(), InstanceError> {
        if self.stuck.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let mut rx = self.held.subscribe();
        let notified = self.shutdown_notify.notified();
        if self.shut_down.load(Ordering::SeqCst) {
            return Err(InstanceError::ShuttingDown);
        }
        tokio::select! {
            _ = rx.wait_for(|held| !held) => Ok(()),
            () = notified => Err(InstanceError::ShuttingDown),
        }
    }

    async fn transition(
        &self,
        uuid: Uuid,
        req: Request,
        to: InstanceState,
        power: PowerState,
    ) -> Result<OpReport, InstanceError> {
        self.record(format!("{req} {uuid}"));
        {
            let mut map = self.instances.lock().unwrap();
            let i = map.get_mut(&uuid).ok_or(InstanceError::NotFound(uuid))?;
            if i.progress.is_some() {
                return Err(InstanceError::Busy(uuid));
            }
            if !accepts(i.state, req) {
                return Err(InstanceError::IllegalState {
                    state: i.state,
                    request: req,
                });
            }
            i.progress = Some(Progress {
                request: req,
                step: req.as_str().to_owned(),
                steps_done: 0,
                waiting_for: Vec::new(),
            });
        }
        let r = self.pause_point().await;
        let mut map = self.instances.lock().unwrap();
        let i = map.get_mut(&uuid).ok_or(InstanceError::NotFound(uuid))?;
        i.progress = None;
        r?;
        i.state = to;
        i.power = power;
        Ok(OpReport {
            steps: vec![req.as_str().to_owned()],
            waits: Vec::new(),
        })
    }
}

#[async_trait]
impl ComputeDriver for FakeDriver {
    fn name(&self) -> &str {
        "fake"
    }

    fn host(&self) -> &str {
        &self.host
    }

    async fn spawn(&self, uuid: Uuid, args: SpawnArgs) -> Result<OpReport, InstanceError> {
        self.record(format!("spawn {uuid}"));
        let since = Instant::now();
        let awaited: Vec<Awaited> = args
            .network_info
            .vifs
            .iter()
            .map(|v| Awaited {
                name: EventName::NetworkVifPlugged,
                tag: v.id,
            })
            .collect();
        {
            let mut map = self.instances.lock().unwrap();
            if map
                .get(&uuid)
                .is_some_and(|i| i.state != InstanceState::Gone)
            {
                return Err(InstanceError::IllegalState {
                    state: InstanceState::Running,
                    request: Request::Spawn,
                });
            }
            map.insert(
                uuid,
                FakeInstance {
                    name: args.name.clone(),
                    state: InstanceState::Building,
                    power: PowerState::NoState,
                    vifs: args
                        .network_info
                        .vifs
                        .iter()
                        .map(|v| VifView {
                            port: v.id,
                            address: v.address.to_string(),
                            vif_type: v.vif_type.as_str().to_owned(),
                            devname: Some(v.tap_name()),
                            plugged: false,
                        })
                        .collect(),
                    progress: Some(Progress {
                        request: Request::Spawn,
                        step: "plug-vifs".into(),
                        steps_done: 1,
                        waiting_for: Vec::new(),
                    }),
                },
            );
        }
        // Register the wait before the "plug" (the trigger), as the real actor does.
        let expected: Vec<ExpectedEvent> = awaited
            .iter()
            .map(|a| ExpectedEvent::plugged(a.tag))
            .collect();
        let op = OpId(self.next_op.fetch_add(1, Ordering::Relaxed));
        let handle = self
            .events
            .expect(uuid, expected, since, self.policy, op)
            .await
            .map_err(|_| InstanceError::ShuttingDown)?;
        self.set_progress(
            uuid,
            Some(Progress {
                request: Request::Spawn,
                step: "wait-vif-plugged".into(),
                steps_done: 2,
                waiting_for: awaited.clone(),
            }),
        );
        let started = Instant::now();
        let result = handle.await;
        let mut map = self.instances.lock().unwrap();
        match result {
            Ok(outcome) => {
                let i = map.get_mut(&uuid).ok_or(InstanceError::NotFound(uuid))?;
                i.progress = None;
                i.state = InstanceState::Running;
                i.power = PowerState::Running;
                for v in &mut i.vifs {
                    v.plugged = true;
                }
                Ok(OpReport {
                    steps: vec![
                        "define".into(),
                        "plug-vifs".into(),
                        "wait-vif-plugged".into(),
                        "start".into(),
                    ],
                    waits: vec![WaitReport {
                        events: awaited,
                        outcome: if outcome.complete() {
                            "completed".into()
                        } else {
                            "incomplete".into()
                        },
                        waited_ms: started.elapsed().as_millis() as u64,
                    }],
                })
            }
            Err(e) => {
                // Roll back: nothing of the instance is left.
                map.remove(&uuid);
                Err(InstanceError::Failed(format!(
                    "waiting for network events: {e}"
                )))
            }
        }
    }

    async fn destroy(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.record(format!("destroy {uuid}"));
        self.instances.lock().unwrap().remove(&uuid);
        Ok(OpReport {
            steps: vec!["destroy".into(), "undefine".into()],
            waits: Vec::new(),
        })
    }

    async fn power_off(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.transition(
            uuid,
            Request::PowerOff,
            InstanceState::Stopped,
            PowerState::Shutdown,
        )
        .await
    }

    async fn power_on(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.transition(
            uuid,
            Request::PowerOn,
            InstanceState::Running,
            PowerState::Running,
        )
        .await
    }

    async fn reboot(&self, uuid: Uuid, kind: RebootKind) -> Result<OpReport, InstanceError> {
        let req = match kind {
            RebootKind::Soft => Request::RebootSoft,
            RebootKind::Hard => Request::RebootHard,
        };
        self.transition(uuid, req, InstanceState::Running, PowerState::Running)
            .await
    }

    async fn pause(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.transition(
            uuid,
            Request::Pause,
            InstanceState::Paused,
            PowerState::Paused,
        )
        .await
    }

    async fn unpause(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.transition(
            uuid,
            Request::Unpause,
            InstanceState::Running,
            PowerState::Running,
        )
        .await
    }

    async fn suspend(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.transition(
            uuid,
            Request::Suspend,
            InstanceState::Suspended,
            PowerState::Suspended,
        )
        .await
    }

    async fn resume(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.transition(
            uuid,
            Request::Resume,
            InstanceState::Running,
            PowerState::Running,
        )
        .await
    }

    async fn resize(
        &self,
        uuid: Uuid,
        migration: Migration,
        new_flavor: Flavor,
    ) -> Result<OpReport, InstanceError> {
        self.record(format!(
            "resize {uuid} to {} on {}",
            new_flavor.name, migration.dest_host
        ));
        self.transition(
            uuid,
            Request::ResizeOut,
            InstanceState::ResizeSource,
            PowerState::Shutdown,
        )
        .await
    }

    async fn confirm_resize(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.transition(
            uuid,
            Request::FinishRevertResize,
            InstanceState::Running,
            PowerState::Running,
        )
        .await
    }

    async fn revert_resize(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.transition(
            uuid,
            Request::FinishRevertResize,
            InstanceState::Running,
            PowerState::Running,
        )
        .await
    }

    async fn live_migrate(
        &self,
        uuid: Uuid,
        args: LiveMigrateArgs,
    ) -> Result<OpReport, InstanceError> {
        self.record(format!("live-migrate {uuid} to {}", args.dest_host));
        let r = self
            .transition(
                uuid,
                Request::LiveMigrate,
                InstanceState::Gone,
                PowerState::NoState,
            )
            .await?;
        self.instances.lock().unwrap().remove(&uuid);
        Ok(r)
    }

    async fn attach_interface(&self, uuid: Uuid, vif: Vif) -> Result<OpReport, InstanceError> {
        let state = self.state_of(uuid).ok_or(InstanceError::NotFound(uuid))?;
        let r = self
            .transition(uuid, Request::AttachInterface, state, PowerState::Running)
            .await?;
        if let Some(i) = self.instances.lock().unwrap().get_mut(&uuid) {
            i.vifs.push(VifView {
                port: vif.id,
                address: vif.address.to_string(),
                vif_type: vif.vif_type.as_str().to_owned(),
                devname: Some(vif.tap_name()),
                plugged: true,
            });
        }
        Ok(r)
    }

    async fn detach_interface(&self, uuid: Uuid, port: PortId) -> Result<OpReport, InstanceError> {
        {
            let map = self.instances.lock().unwrap();
            let i = map.get(&uuid).ok_or(InstanceError::NotFound(uuid))?;
            if !i.vifs.iter().any(|v| v.port == port) {
                return Err(InstanceError::Invalid(format!("no VIF for port {port}")));
            }
        }
        let state = self.state_of(uuid).ok_or(InstanceError::NotFound(uuid))?;
        let r = self
            .transition(uuid, Request::DetachInterface, state, PowerState::Running)
            .await?;
        if let Some(i) = self.instances.lock().unwrap().get_mut(&uuid) {
            i.vifs.retain(|v| v.port != port);
        }
        Ok(r)
    }

    async fn show(&self, uuid: Uuid) -> Result<InstanceView, InstanceError> {
        let map = self.instances.lock().unwrap();
        map.get(&uuid)
            .map(|i| view(uuid, i))
            .ok_or(InstanceError::NotFound(uuid))
    }

    async fn list(&self) -> Vec<InstanceView> {
        let map = self.instances.lock().unwrap();
        map.iter().map(|(u, i)| view(*u, i)).collect()
    }

    async fn external_events(&self, events: Vec<ExternalEvent>) -> Vec<EventResult> {
        events.iter().map(|_| EventResult { code: 200 }).collect()
    }

    async fn shutdown(&self, _deadline: Instant) {
        self.shut_down.store(true, Ordering::SeqCst);
        self.shutdown_notify.notify_waiters();
    }
}

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
    /// `[events]` lines.
    pub events: String,
    /// Wait for events at most this long in the fake's spawn.
    pub policy: WaitPolicy,
    /// Write an events token file and configure it.
    pub events_token: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            extra: String::new(),
            events: String::new(),
            policy: WaitPolicy {
                timeout: Duration::from_secs(30),
                fatal: true,
            },
            events_token: false,
        }
    }
}

/// A real agent on 127.0.0.1:0 with the real events actor and the fake driver. Must be
/// started inside an actix system (`#[actix_rt::test]`).
pub struct TestAgent {
    pub addr: SocketAddr,
    pub base: String,
    pub svc: Arc<AgentService>,
    pub driver: Arc<FakeDriver>,
    pub events: EventsHandle,
    pub directory: Arc<InstanceSet>,
    pub dir: tempfile::TempDir,
    pub images: PathBuf,
    pub instances_dir: PathBuf,
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
        let token = root.join("api-token");
        write_file(&token, &format!("{TOKEN}\n"), 0o600);
        let mut extra = opts.extra.clone();
        if opts.events_token {
            let ev = root.join("events-token");
            write_file(&ev, EVENTS_TOKEN, 0o600);
            extra.push_str(&format!("events_token_file = {:?}\n", ev.to_str().unwrap()));
        }
        let images = root.join("images");
        std::fs::create_dir_all(&images).unwrap();
        std::fs::write(images.join("vmlinuz"), b"kernel").unwrap();
        let cfg_text = format!(
            "host = \"test-host\"\napi_token_file = {:?}\n{extra}\n[instances]\nstate_dir = {:?}\nimage_dirs = [{:?}]\n[events]\n{}\n",
            token.to_str().unwrap(),
            root.join("state").to_str().unwrap(),
            images.to_str().unwrap(),
            opts.events,
        );
        let cfg = AgentConfig::parse(&cfg_text, &root.join("agent.toml")).unwrap();
        let settings = Settings::from_config(&cfg).unwrap();
        let instances_dir = settings.paths.instances_dir().to_owned();
        let events = EventsHandle::start(EventConfig::default());
        let driver = Arc::new(FakeDriver::new("test-host", events.clone(), opts.policy));
        let directory = Arc::new(InstanceSet::new(1024));
        let parts = AgentParts {
            driver: driver.clone(),
            events: events.clone(),
            directory: directory.clone() as Arc<dyn InstanceDirectory>,
            libvirt: None,
        };
        let svc = AgentService::new(parts, settings);
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
            events,
            directory,
            dir,
            images,
            instances_dir,
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

    /// Signal shutdown without waiting.
    pub fn signal_stop(&mut self) -> tokio::task::JoinHandle<Result<(), ServeError>> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.task.take().unwrap()
    }
}

/// An HTTP client with the API token set.
pub fn http() -> reqwest::Client {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("X-Auth-Token", TOKEN.parse().unwrap());
    reqwest::Client::builder()
        .default_headers(h)
        .build()
        .unwrap()
}

/// An HTTP client sending no token.
pub fn anonymous() -> reqwest::Client {
    reqwest::Client::new()
}

/// A network_info entry (OVS, hybrid plug) for `port`.
pub fn vif(port: Uuid, n: u8) -> Value {
    json!({
        "id": port.to_string(),
        "address": format!("fa:16:3e:00:01:{n:02x}"),
        "type": "ovs",
        "vnic_type": "normal",
        "details": {"ovs_hybrid_plug": true, "port_filter": true},
        "active": false,
        "network": {"id": "5f0b0f3e-6f7a-4c4e-9a55-2a6a3a0c1b2d", "bridge": "br-int",
                    "label": "private", "subnets": [], "meta": {"mtu": 1450}},
    })
}

/// A create request with `ports` VIFs.
pub fn create_body(uuid: Uuid, ports: &[Uuid]) -> Value {
    json!({
        "uuid": uuid,
        "name": "vm-test",
        "flavor": {"name": "m1.tiny", "vcpus": 1, "memory_mib": 128},
        "network_info": ports.iter().enumerate().map(|(n, p)| vif(*p, n as u8)).collect::<Vec<_>>(),
    })
}

/// One `network-vif-plugged` event body.
pub fn plugged(server: Uuid, port: Uuid, status: &str) -> Value {
    json!({"events": [{"name": "network-vif-plugged", "server_uuid": server,
                       "tag": port, "status": status}]})
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
        }
        assert!(Instant::now() < deadline, "instance {uuid} never matched");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
