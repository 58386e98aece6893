//! The embedded default: compute hosts on libvirt's test driver, in one process, sharing one
//! actor system, one network-event actor, one embedded network service and one directory of
//! hosts. `vireo demo` runs on it, and so do the `test:///` tier's tests.
//!
//! Each host has its own private `test:///<dir>/<host>.xml` connection (libvirt's test driver
//! keeps private state per such connection) and a plugger that makes nothing on the host — a
//! [`StaticPlugger`] by default: the test driver creates no devices, so the plugger keeps what
//! a host would wire and reports it to the embedded service, which follows Neutron's
//! port-status rules. Tests start the cloud with their own plugger type (the recording,
//! fault-injecting one of `vireo_actors::plug::testing`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use vireo_actors::events::{EventConfig, EventsHandle};
use vireo_actors::external::{EventSink, ExternalEvent};
use vireo_actors::instance::{InstanceConfig, Peers};
use vireo_actors::libvirt::LibvirtConfig;
use vireo_actors::plug::{StaticPlugger, VifPlugger};
use vireo_actors::runtime::ActorSystem;

use crate::compute::{
    DriverConfig, DriverError, LibvirtDriver, NetworkConfig, PluggingConfig, SharedNetwork,
};
use crate::network::embedded::{EmbeddedConfig, EmbeddedNetwork};
use crate::storage::StorageConfig;

/// How many events an [`EventLog`] keeps (the oldest are dropped first).
pub const EVENT_LOG_CAPACITY: usize = 4096;

/// The events the embedded service sent, with their time, forwarded to the network-event
/// actor: what "arrived", for the demo's timeline and for tests that compare what was waited
/// for with what was sent.
#[derive(Debug)]
pub struct EventLog {
    inner: Arc<dyn EventSink>,
    start: Instant,
    log: Mutex<std::collections::VecDeque<(Instant, ExternalEvent)>>,
}

impl EventLog {
    /// A log forwarding to `inner`.
    pub fn new(inner: Arc<dyn EventSink>) -> Self {
        EventLog {
            inner,
            start: Instant::now(),
            log: Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// Every event kept, with its time.
    pub fn events(&self) -> Vec<(Instant, ExternalEvent)> {
        self.log
            .lock()
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Events sent at or after `since`.
    pub fn since(&self, since: Instant) -> Vec<(Instant, ExternalEvent)> {
        self.events()
            .into_iter()
            .filter(|(t, _)| *t >= since)
            .collect()
    }

    /// When the log started.
    pub fn start(&self) -> Instant {
        self.start
    }
}

impl EventSink for EventLog {
    fn deliver(&self, event: ExternalEvent) {
        if let Ok(mut l) = self.log.lock() {
            if l.len() == EVENT_LOG_CAPACITY {
                l.pop_front();
            }
            l.push_back((Instant::now(), event.clone()));
        }
        self.inner.deliver(event);
    }
}

/// Hands every event to every host's network-event actor. Each host's actor keeps only the
/// events of the instances it knows, as if an API routed each event to the host of its
/// instance; a host that does not know the instance counts the event as for an unknown
/// instance. (Hosts must not share one actor: forgetting an instance on one host would cancel
/// the other's waits for it.)
#[derive(Debug, Default)]
pub struct FanOut {
    hosts: std::sync::RwLock<Vec<EventsHandle>>,
}

impl FanOut {
    /// Add a host's actor.
    pub fn add(&self, events: EventsHandle) {
        if let Ok(mut h) = self.hosts.write() {
            h.push(events);
        }
    }

    /// Every host's actor.
    pub fn handles(&self) -> Vec<EventsHandle> {
        self.hosts.read().map(|h| h.clone()).unwrap_or_default()
    }

    /// The counters of every host's actor, summed.
    pub async fn stats(&self) -> vireo_actors::events::EventStats {
        let mut sum = vireo_actors::events::EventStats::default();
        for h in self.handles() {
            if let Ok(s) = h.stats().await {
                sum += s;
            }
        }
        sum
    }
}

impl EventSink for FanOut {
    fn deliver(&self, event: ExternalEvent) {
        for h in self.handles() {
            h.deliver(event.clone());
        }
    }
}

/// What a local cloud is made of.
#[derive(Debug, Clone)]
pub struct LocalCloudConfig {
    /// Host names (the first is "this" host of the demo).
    pub hosts: Vec<String>,
    /// Where the private test-driver files go.
    pub dir: PathBuf,
    /// The embedded network service.
    pub network: EmbeddedConfig,
    /// Instance settings of every host.
    pub instances: InstanceConfig,
    /// The network-event actor's limits.
    pub events: EventConfig,
}

/// One host of a local cloud, with its plugger of type `P`.
#[derive(Debug)]
pub struct LocalHost<P = StaticPlugger> {
    /// Its name.
    pub name: String,
    /// Its driver.
    pub driver: Arc<LibvirtDriver>,
    /// Its plugger (what it "wired").
    pub plugger: Arc<P>,
    /// Its libvirt URI.
    pub uri: String,
    /// Its network-event actor.
    pub events: EventsHandle,
}

/// Compute hosts on libvirt's test driver in this process, each with a plugger of type `P`.
#[derive(Debug)]
pub struct LocalCloud<P = StaticPlugger> {
    /// The shared actor system.
    pub system: Arc<ActorSystem>,
    /// Every host's network-event actor, fed by the network service.
    pub events: Arc<FanOut>,
    /// The shared network service.
    pub network: Arc<EmbeddedNetwork>,
    /// What the network service sent.
    pub event_log: Arc<EventLog>,
    /// The directory of hosts.
    pub peers: Arc<Peers>,
    /// The hosts, in the configured order.
    pub hosts: Vec<LocalHost<P>>,
}

/// The `test:///` URI of a private test-driver file.
pub fn test_uri(file: &Path) -> String {
    format!("test://{}", file.display())
}

impl<P: VifPlugger + Default> LocalCloud<P> {
    /// Write each host's test-driver file and start the hosts, each with `P::default()`.
    pub async fn start(cfg: LocalCloudConfig) -> Result<Self, DriverError> {
        Self::start_with(cfg, |_| P::default()).await
    }
}

impl<P: VifPlugger> LocalCloud<P> {
    /// Write each host's test-driver file and start the hosts, each with the plugger
    /// `plugger(host name)` makes.
    pub async fn start_with(
        cfg: LocalCloudConfig,
        mut plugger: impl FnMut(&str) -> P,
    ) -> Result<Self, DriverError> {
        let system = Arc::new(ActorSystem::start().map_err(DriverError::Runtime)?);
        let events = Arc::new(FanOut::default());
        let event_log = Arc::new(EventLog::new(events.clone()));
        let sink: Arc<dyn EventSink> = event_log.clone();
        let net_cfg = cfg.network.clone();
        // The service's delivery task (when events are delayed) lives on the actor thread.
        let network =
            crate::compute::on_actor_thread(&system, move || EmbeddedNetwork::new(net_cfg, sink))
                .await?
                .map_err(|e| DriverError::Network(e.to_string()))?;
        let peers = Peers::new();
        std::fs::create_dir_all(&cfg.dir)
            .map_err(|e| DriverError::Network(format!("create {}: {e}", cfg.dir.display())))?;
        let mut hosts = Vec::with_capacity(cfg.hosts.len());
        for name in &cfg.hosts {
            let file = cfg.dir.join(format!("{name}.xml"));
            std::fs::write(&file, "<node/>\n")
                .map_err(|e| DriverError::Network(format!("write {}: {e}", file.display())))?;
            let uri = test_uri(&file);
            let plugger = Arc::new(plugger(name));
            let host_events = system.start_events(cfg.events);
            events.add(host_events.clone());
            let config = DriverConfig {
                host: name.clone(),
                libvirt: LibvirtConfig::for_uri(uri.clone()),
                instances: cfg.instances.clone(),
                events: cfg.events,
                plugging: PluggingConfig::Static,
                network: NetworkConfig::Embedded(cfg.network.clone()),
                migration_uri: Some(uri.clone()),
                // Each host its own state directory, as on separate machines.
                storage: StorageConfig::in_state_dir(&cfg.dir.join(name)),
            };
            let driver = LibvirtDriver::builder(config)
                .system(system.clone())
                .events(host_events.clone())
                .peers(peers.clone())
                .network(SharedNetwork::Embedded(network.clone()))
                .plugger(plugger.clone())
                .build()
                .await?;
            hosts.push(LocalHost {
                name: name.clone(),
                driver: Arc::new(driver),
                plugger,
                uri,
                events: host_events,
            });
        }
        Ok(LocalCloud {
            system,
            events,
            network,
            event_log,
            peers,
            hosts,
        })
    }

    /// A host by name.
    pub fn host(&self, name: &str) -> Option<&LocalHost<P>> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// Stop every host and its event actor.
    pub async fn shutdown(&self, timeout: std::time::Duration) {
        use crate::compute::ComputeDriver;
        for h in &self.hosts {
            h.driver.shutdown(timeout).await;
        }
        for e in self.events.handles() {
            let _ = e.shutdown().await;
        }
    }
}
