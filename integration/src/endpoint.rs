//! Nova's external-events endpoint for the real Neutron: the vireo agent's own HTTP server
//! (`vireo::agent::server::serve` over an `AgentService`, with the events token Neutron's
//! notifier sends — `[nova] auth_type = admin_token`, as docs/AGENT.md configures Neutron, no
//! proxy) on `127.0.0.1:<VIREO_NOVA_PORT>`, in front of a [`Router`]
//! that hands each accepted batch to the drivers a test registered and records when it
//! arrived ([`ArrivalLog`]).
//!
//! One endpoint per test process (the port is the machine's): it runs on its own thread with
//! its own actix system for the whole run; tests register and unregister their drivers.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix_web::http::header::HeaderName;
use async_trait::async_trait;
use uuid::Uuid;
use vireo::agent::auth::{Auth, Token};
use vireo::agent::paths::PathPolicy;
use vireo::agent::server::serve;
use vireo::agent::service::{AgentService, Settings};
use vireo::compute::ComputeDriver;
use vireo_actors::events::{EventStats, EventsHandle};
use vireo_actors::external::{EventName, EventSink, EventStatus, ExternalEvent};
use vireo_actors::instance::{AdmissionError, InstanceError, InstanceView, Operation, Ticket};

use crate::HarnessError;

/// Where an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Neutron's Nova notifier, through the HTTP endpoint.
    Neutron,
    /// The embedded network service, in-process.
    Embedded,
}

/// One event as it reached vireo.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    /// When it was handed to the driver.
    pub at: Instant,
    /// Who sent it.
    pub source: Source,
    /// Event name.
    pub name: EventName,
    /// The instance.
    pub server: Uuid,
    /// The port, for network events.
    pub tag: Option<String>,
    /// Its status.
    pub status: EventStatus,
    /// The POST (or embedded hand-over) it came in, counted from 1.
    pub batch: u64,
}

/// Every event the endpoint (and recording sinks) handed to vireo, in order.
#[derive(Debug, Default)]
pub struct ArrivalLog {
    inner: Mutex<(u64, Vec<Arrival>)>,
}

impl ArrivalLog {
    fn lock(&self) -> MutexGuard<'_, (u64, Vec<Arrival>)> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record one batch.
    pub fn record(&self, source: Source, events: &[ExternalEvent]) {
        let at = Instant::now();
        let mut g = self.lock();
        g.0 += 1;
        let batch = g.0;
        for e in events {
            g.1.push(Arrival {
                at,
                source,
                name: e.name,
                server: e.server_uuid,
                tag: e.tag.clone(),
                status: e.status,
                batch,
            });
        }
    }

    /// Events for `server` that arrived at or after `since`.
    pub fn for_server(&self, server: Uuid, since: Instant) -> Vec<Arrival> {
        self.lock()
            .1
            .iter()
            .filter(|a| a.server == server && a.at >= since)
            .cloned()
            .collect()
    }

    /// Every event that arrived at or after `since`.
    pub fn since(&self, since: Instant) -> Vec<Arrival> {
        self.lock()
            .1
            .iter()
            .filter(|a| a.at >= since)
            .cloned()
            .collect()
    }

    /// Wait (polling, at most `within`) until an event `name` with `tag` for `server` arrived
    /// at or after `since`.
    pub async fn wait_for(
        &self,
        server: Uuid,
        name: EventName,
        tag: &str,
        since: Instant,
        within: Duration,
    ) -> Option<Arrival> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(a) = self
                .for_server(server, since)
                .into_iter()
                .find(|a| a.name == name && a.tag.as_deref() == Some(tag))
            {
                return Some(a);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// An [`EventSink`] that records and forwards (the embedded service's events).
#[derive(Debug)]
pub struct RecordingSink {
    log: Arc<ArrivalLog>,
    to: EventsHandle,
}

impl RecordingSink {
    /// Record into `log`, deliver to `to`.
    pub fn new(log: Arc<ArrivalLog>, to: EventsHandle) -> Self {
        RecordingSink { log, to }
    }
}

impl EventSink for RecordingSink {
    fn deliver(&self, event: ExternalEvent) {
        self.log
            .record(Source::Embedded, std::slice::from_ref(&event));
        self.to.deliver_batch(vec![event]);
    }
}

#[derive(Debug, Default)]
struct Targets {
    drivers: Vec<Arc<dyn ComputeDriver>>,
    events: Vec<EventsHandle>,
}

/// The driver the agent service sees: the drivers a test registered. `knows` asks each;
/// events go to every registered network-event actor (an actor drops events of instances
/// its host does not know); a call for an instance goes to the newest registered driver
/// that knows it (else the newest), `list` to the newest.
#[derive(Debug)]
pub struct Router {
    host: String,
    log: Arc<ArrivalLog>,
    targets: Mutex<Targets>,
}

impl Router {
    fn targets(&self) -> MutexGuard<'_, Targets> {
        self.targets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The registered driver that knows `uuid`, else the last one registered (a scenario
    /// that failed half-way may leave its driver registered: it must not take the calls).
    async fn pick(&self, uuid: Uuid) -> Result<Arc<dyn ComputeDriver>, InstanceError> {
        let drivers = self.targets().drivers.clone();
        for d in drivers.iter().rev() {
            if d.knows(uuid).await {
                return Ok(d.clone());
            }
        }
        drivers.last().cloned().ok_or(InstanceError::Unavailable)
    }

    fn last(&self) -> Result<Arc<dyn ComputeDriver>, InstanceError> {
        self.targets()
            .drivers
            .last()
            .cloned()
            .ok_or(InstanceError::Unavailable)
    }
}

#[async_trait]
impl ComputeDriver for Router {
    fn name(&self) -> &str {
        "libvirt"
    }
    fn host(&self) -> &str {
        &self.host
    }
    async fn submit(&self, uuid: Uuid, request: Operation) -> Result<Ticket, AdmissionError> {
        match self.pick(uuid).await {
            Ok(d) => d.submit(uuid, request).await,
            Err(_) => Err(AdmissionError::Unavailable),
        }
    }
    async fn show(&self, uuid: Uuid) -> Result<InstanceView, InstanceError> {
        self.pick(uuid).await?.show(uuid).await
    }
    async fn list(&self) -> Vec<InstanceView> {
        match self.last() {
            Ok(d) => d.list().await,
            Err(_) => Vec::new(),
        }
    }
    async fn knows(&self, uuid: Uuid) -> bool {
        let drivers = self.targets().drivers.clone();
        for d in drivers {
            if d.knows(uuid).await {
                return true;
            }
        }
        false
    }
    async fn evict_unused_images(
        &self,
    ) -> Result<Vec<vireo::storage::ImageId>, vireo::compute::DriverError> {
        let drivers = self.targets().drivers.clone();
        let mut removed = Vec::new();
        for d in drivers {
            removed.extend(d.evict_unused_images().await?);
        }
        Ok(removed)
    }
    fn domain_events(&self) -> Option<vireo_actors::libvirt::EventStream> {
        self.last().ok().and_then(|d| d.domain_events())
    }
    async fn console_output(
        &self,
        uuid: Uuid,
        max_bytes: u64,
    ) -> Result<String, vireo::compute::ConsoleError> {
        let driver = self
            .pick(uuid)
            .await
            .map_err(vireo::compute::ConsoleError::Instance)?;
        driver.console_output(uuid, max_bytes).await
    }
    async fn write_probe(&self, probe: Uuid) -> Result<(), vireo_actors::storage::StorageError> {
        match self.last() {
            Ok(d) => d.write_probe(probe).await,
            Err(_) => Err(vireo_actors::storage::StorageError::Io {
                action: "write the shared-directory probe",
                path: std::path::PathBuf::from("(no driver behind the endpoint)"),
                source: std::io::Error::from(std::io::ErrorKind::NotConnected),
            }),
        }
    }
    async fn sees_probe(&self, probe: Uuid) -> bool {
        match self.last() {
            Ok(d) => d.sees_probe(probe).await,
            Err(_) => false,
        }
    }
    async fn remove_probe(&self, probe: Uuid) {
        if let Ok(d) = self.last() {
            d.remove_probe(probe).await
        }
    }
    async fn host_resources(
        &self,
    ) -> Result<vireo::compute::HostResources, vireo::compute::HostError> {
        match self.last() {
            Ok(d) => d.host_resources().await,
            Err(_) => Err(vireo::compute::HostError::TaskLost(
                "no driver behind the endpoint",
            )),
        }
    }
    fn external_events(&self, events: Vec<ExternalEvent>) {
        self.log.record(Source::Neutron, &events);
        let targets = self.targets().events.clone();
        for t in targets {
            t.deliver_batch(events.clone());
        }
    }
    async fn event_stats(&self) -> Option<EventStats> {
        None
    }
    fn libvirt_generation(&self) -> Option<u64> {
        None
    }
    async fn shutdown(&self, _timeout: Duration) {}
}

/// The endpoint's agent API token.
#[derive(Debug, Clone)]
pub struct EndpointOptions {
    /// The API token.
    pub api_secret: String,
}

impl EndpointOptions {
    /// A random API token.
    pub fn alone() -> Self {
        EndpointOptions {
            api_secret: Uuid::new_v4().simple().to_string(),
        }
    }
}

/// The running endpoint. Dropping it stops the server and joins its thread.
#[derive(Debug)]
pub struct EventsEndpoint {
    addr: SocketAddr,
    api_secret: String,
    router: Arc<Router>,
    log: Arc<ArrivalLog>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

/// How long [`EventsEndpoint::start`] retries a port someone else holds.
pub const BIND_PATIENCE: Duration = Duration::from_secs(60);

impl EventsEndpoint {
    /// Serve `/v2.1/os-server-external-events` on `127.0.0.1:port`, taking the token in
    /// `events_token_file` (and the API token) on it. When the port is taken (another test
    /// process's listener), retries for [`BIND_PATIENCE`], then fails.
    pub fn start(
        port: u16,
        host: &str,
        events_token_file: &std::path::Path,
        opts: EndpointOptions,
    ) -> Result<EventsEndpoint, HarnessError> {
        let events = Token::load("events_token_file", events_token_file)
            .map_err(|e| HarnessError::Setup(crate::chain(&e)))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + BIND_PATIENCE;
        let listener = loop {
            match TcpListener::bind(addr) {
                Ok(l) => break l,
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(source) => {
                    return Err(HarnessError::Io {
                        what: format!(
                            "listen on {addr} for Neutron's Nova notifier (nothing else may \
                             listen there while these tests run)"
                        ),
                        source,
                    })
                }
            }
        };
        let dir = tempfile::tempdir().map_err(|source| HarnessError::Io {
            what: "temporary directory".into(),
            source,
        })?;
        let paths = PathPolicy::new(dir.path(), &[]).map_err(|source| HarnessError::Io {
            what: "agent path policy".into(),
            source,
        })?;
        let api = Token::from_secret(&opts.api_secret);
        let settings = Settings {
            host: host.to_owned(),
            auth: Auth::new(
                HeaderName::from_static("x-auth-token"),
                api,
                Some(events),
                false,
            ),
            paths,
            max_body_bytes: 1 << 20,
            finished_operations: 16,
            drain_timeout: Duration::from_secs(5),
            http_workers: 1,
            half_timeout: Duration::from_secs(600),
        };
        let log = Arc::new(ArrivalLog::default());
        let router = Arc::new(Router {
            host: host.to_owned(),
            log: log.clone(),
            targets: Mutex::default(),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let r = router.clone();
        let thread = std::thread::Builder::new()
            .name("vireo-it-events".into())
            .spawn(move || {
                let system = actix_rt::System::new();
                system.block_on(async move {
                    let svc = AgentService::new(r, settings);
                    let _ = ready_tx.send(Ok(()));
                    let shutdown = async {
                        let _ = stopped.await;
                    };
                    if let Err(e) = serve(listener, shutdown, svc).await {
                        tracing::error!(error = %e, "events endpoint failed");
                    }
                });
            })
            .map_err(|source| HarnessError::Io {
                what: "start the events endpoint thread".into(),
                source,
            })?;
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            _ => return Err(HarnessError::Setup("events endpoint did not start".into())),
        }
        Ok(EventsEndpoint {
            addr,
            api_secret: opts.api_secret,
            router,
            log,
            stop: Some(stop),
            thread: Some(thread),
            _dir: dir,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its base URL (`http://127.0.0.1:<port>`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its API token.
    pub fn api_secret(&self) -> &str {
        &self.api_secret
    }

    /// The arrivals.
    pub fn log(&self) -> &Arc<ArrivalLog> {
        &self.log
    }

    /// Route events to `driver`'s host (`knows`) and to `events`.
    pub fn register(&self, driver: Arc<dyn ComputeDriver>, events: EventsHandle) {
        let mut t = self.router.targets();
        t.drivers.push(driver);
        t.events.push(events);
    }

    /// Forget every registered driver.
    pub fn clear(&self) {
        *self.router.targets() = Targets::default();
    }
}

impl Drop for EventsEndpoint {
    fn drop(&mut self) {
        self.clear();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            // The server drains within its shutdown timeout (5 s).
            let deadline = Instant::now() + Duration::from_secs(10);
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(name: EventName, server: Uuid, tag: &str) -> ExternalEvent {
        ExternalEvent {
            name,
            server_uuid: server,
            tag: Some(tag.into()),
            status: EventStatus::Completed,
        }
    }

    #[test]
    fn log_keeps_batches_in_order_and_filters() {
        let log = ArrivalLog::default();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let t0 = Instant::now();
        log.record(
            Source::Neutron,
            &[ev(EventName::NetworkVifPlugged, a, "p1")],
        );
        log.record(
            Source::Neutron,
            &[
                ev(EventName::NetworkVifUnplugged, b, "p2"),
                ev(EventName::NetworkVifPlugged, a, "p3"),
            ],
        );
        let for_a = log.for_server(a, t0);
        assert_eq!(for_a.len(), 2);
        assert_eq!((for_a[0].batch, for_a[1].batch), (1, 2));
        assert_eq!(log.since(t0).len(), 3);
        assert!(log
            .since(Instant::now() + Duration::from_secs(1))
            .is_empty());
    }
}
