//! The API a compute agent loads: [`ComputeDriver`], and [`load_driver`] to pick a
//! hypervisor layer by name.
//!
//! The one driver is `libvirt` ([`LibvirtDriver`]): every call becomes a request to the
//! instance's actor on this host (one operation at a time per instance, instances in
//! parallel). Operations return when they are done — completed, or failed and rolled back —
//! with a report of what they did and how long each part took.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;
use tracing::info;
use uuid::Uuid;
use vireo_actors::events::{EventConfig, EventStats, EventsHandle};
use vireo_actors::external::ExternalEvent;
use vireo_actors::host::{HostHandle, RecoveryReport};
use vireo_actors::instance::{
    AdmissionError, BuildJournal, DestroyArgs, HostDeps, InstanceConfig, InstanceError,
    InstanceReply, InstanceView, JournalError, LiveMigrateArgs, LiveMigrationJournal, OpReport,
    Operation, Peers, RebootKind, ResizeArgs, SpawnArgs, Ticket,
};
use vireo_actors::libvirt::{Libvirt, LibvirtConfig, LibvirtError, LibvirtHandle};
use vireo_actors::network::NetworkApi;
use vireo_actors::plug::{StaticPlugger, VifPlugger};
use vireo_actors::runtime::{ActorSystem, RuntimeError};
use vireo_actors::vif::{PortId, Vif};

use crate::network::embedded::{EmbeddedConfig, EmbeddedNetwork};
use crate::network::neutron::{NeutronClient, NeutronConfig};
use crate::network::nova_owned::{NovaOwnedPorts, PortsOwner};
use crate::plug::{HostPlugger, PlugConfig};
use crate::storage::{HostStorage, ImageId, StorageConfig};
use vireo_actors::storage::{migration_probe, InstanceStorage, StorageError};

/// The hypervisor layer of one compute host.
///
/// Every operation names its instance by uuid and is one [`Operation`], handed over
/// with [`ComputeDriver::submit`]: the instance's actor admits it at once (a [`Ticket`] that
/// carries its completion) or refuses it (an [`AdmissionError`]: busy, illegal in this state,
/// not found, unavailable) — the only admission check there is. Operations on one instance run
/// one at a time (a second one while the first runs is refused as busy, except destroy, which
/// cancels the running one's event waits and runs next); operations on different instances
/// run concurrently. A failed operation has rolled back what it did; the error says so
/// ([`InstanceError::RolledBack`], [`InstanceError::BuildFailed`], ...). [`ComputeOps`] has
/// the submit-and-wait form of each operation.
#[async_trait]
pub trait ComputeDriver: Send + Sync + std::fmt::Debug {
    /// The driver's name (`libvirt`).
    fn name(&self) -> &str;

    /// This host's name, as the network service knows it.
    fn host(&self) -> &str;

    /// Submit an operation: admitted (the ticket; the operation runs to its end or its
    /// rollback whether or not the ticket is waited for) or refused (nothing runs).
    async fn submit(&self, uuid: Uuid, request: Operation) -> Result<Ticket, AdmissionError>;

    /// One instance: state, power, VIFs, the operation in progress and the events it waits
    /// for.
    async fn show(&self, uuid: Uuid) -> Result<InstanceView, InstanceError>;

    /// Every instance on this host.
    async fn list(&self) -> Vec<InstanceView>;

    /// Is the instance on this host (for the external events API's 404)?
    async fn knows(&self, uuid: Uuid) -> bool;

    /// Remove the cached base images no instance on this host uses and none used for the
    /// configured age (`remove_unused_base_after`); returns the images removed.
    async fn evict_unused_images(&self) -> Result<Vec<ImageId>, DriverError>;

    /// What this host offers instances: hypervisor, CPUs, memory and the instances
    /// directory's filesystem (what a compute agent's resource tracker reports).
    async fn host_resources(&self) -> Result<HostResources, HostError>;

    /// A caller's shared-directory check before a live migration (Nova's: the
    /// destination's host writes a probe file, the source's looks for it, the destination's
    /// removes it): write the probe `probe` names in this host's instances directory.
    async fn write_probe(&self, probe: Uuid) -> Result<(), StorageError>;

    /// Does this host's instances directory hold the probe `probe` names (the directory of
    /// the host that wrote it)?
    async fn sees_probe(&self, probe: Uuid) -> bool;

    /// Remove the probe `probe` names (gone already is fine).
    async fn remove_probe(&self, probe: Uuid);

    /// A subscription to the hypervisor's domain events (lifecycle changes, connection
    /// losses); None: this driver has none.
    fn domain_events(&self) -> Option<vireo_actors::libvirt::EventStream>;

    /// The last `max_bytes` of the instance's serial console log (lossy UTF-8; empty when
    /// the guest has written nothing yet).
    async fn console_output(&self, uuid: Uuid, max_bytes: u64) -> Result<String, ConsoleError>;

    /// Hand over external events (one POST's worth, in order). Never blocks.
    fn external_events(&self, events: Vec<ExternalEvent>);

    /// The network-event actor's counters.
    async fn event_stats(&self) -> Option<EventStats>;

    /// libvirt reconnects so far.
    fn libvirt_generation(&self) -> Option<u64>;

    /// Stop: running operations' waits fail (they roll back), actors stop; at most
    /// `timeout`.
    async fn shutdown(&self, timeout: Duration);
}

/// Each operation submitted and waited for: what the tests, the demo and the benchmarks
/// call. Defined once, for every [`ComputeDriver`].
#[async_trait]
pub trait ComputeOps: ComputeDriver {
    /// Submit `request` and wait for its end.
    async fn complete(
        &self,
        uuid: Uuid,
        request: Operation,
    ) -> Result<InstanceReply, InstanceError> {
        self.submit(uuid, request).await?.finished().await
    }

    /// Submit `request` and wait for its report.
    async fn run(&self, uuid: Uuid, request: Operation) -> Result<OpReport, InstanceError> {
        match self.complete(uuid, request).await? {
            InstanceReply::Done { report, .. } => Ok(report),
        }
    }

    /// Build and start an instance. On any failure everything it created here is removed
    /// and its networking released (ports vireo created deleted, user ports unbound) before
    /// [`InstanceError::BuildFailed`] says whether the build may be rescheduled.
    async fn spawn(&self, uuid: Uuid, args: SpawnArgs) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::Spawn(Box::new(args))).await
    }

    /// Destroy the domain, unplug its VIFs, undefine it; with `deallocate_network`, release
    /// its networking. Idempotent.
    async fn destroy(&self, uuid: Uuid, args: DestroyArgs) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::Destroy(args)).await
    }

    /// Graceful shutdown within `timeout` (None: the configured default), then hard.
    async fn power_off(
        &self,
        uuid: Uuid,
        timeout: Option<Duration>,
    ) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::PowerOff { timeout }).await
    }

    /// Start a stopped instance, waiting for the network events the model predicts.
    async fn power_on(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::PowerOn {}).await
    }

    /// Reboot (soft falls back to hard; hard waits only for the predicted events).
    async fn reboot(&self, uuid: Uuid, kind: RebootKind) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::reboot(kind)).await
    }

    /// Pause the vCPUs.
    async fn pause(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::Pause {}).await
    }

    /// Resume the vCPUs.
    async fn unpause(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::Unpause {}).await
    }

    /// Save the guest to disk.
    async fn suspend(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::Suspend {}).await
    }

    /// Restore a suspended guest.
    async fn resume(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::Resume {}).await
    }

    /// Resize (or cold-migrate) from this host; the destination finishes it and it waits
    /// there for confirm or revert. Same host: all of it here.
    async fn resize(&self, uuid: Uuid, args: ResizeArgs) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::Resize(Box::new(args))).await
    }

    /// On the host the resized instance runs on: confirm (the source cleans up).
    async fn confirm_resize(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::ConfirmResize {}).await
    }

    /// On the host the resized instance runs on: revert (the instance goes back to the
    /// source, waiting for exactly the events that will come — bind-time ones included).
    async fn revert_resize(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::RevertResize {}).await
    }

    /// Live-migrate from this host. On failure the migration is rolled back from here:
    /// `migrating_to` cleared and destination bindings deleted whatever the storage, then
    /// the destination removes what it prepared.
    async fn live_migrate(
        &self,
        uuid: Uuid,
        args: LiveMigrateArgs,
    ) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::LiveMigrate(Box::new(args))).await
    }

    /// Hot-plug an interface (its port bound to this host).
    async fn attach_interface(&self, uuid: Uuid, vif: Vif) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::AttachInterface { vif: Box::new(vif) })
            .await
    }

    /// Hot-unplug an interface.
    async fn detach_interface(&self, uuid: Uuid, port: PortId) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::DetachInterface { port_id: port })
            .await
    }

    /// Remove a failed build's remains and release its networking so it can be rescheduled.
    async fn cleanup_for_reschedule(&self, uuid: Uuid) -> Result<OpReport, InstanceError> {
        self.run(uuid, Operation::CleanupForReschedule {}).await
    }
}

impl<D: ComputeDriver + ?Sized> ComputeOps for D {}

/// Why a driver could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// No driver has that name.
    #[error("unknown driver {0:?} (known: libvirt)")]
    UnknownDriver(String),
    /// The actor thread could not start.
    #[error("start the actor system")]
    Runtime(#[source] RuntimeError),
    /// libvirt could not be opened.
    #[error("open libvirt")]
    Libvirt(#[source] LibvirtError),
    /// The host plugger could not start.
    #[error("start VIF plugging")]
    Plugging(#[source] crate::plug::StartError),
    /// The network service could not be set up.
    #[error("set up the network service: {0}")]
    Network(String),
    /// The instance storage (its image cache directory) could not be set up.
    #[error("set up instance storage")]
    Storage(#[source] crate::storage::CacheError),
    /// A journal's directory (builds, live migrations) could not be set up.
    #[error("set up a journal")]
    Journal(#[source] JournalError),
    /// Rebuilding the instances from libvirt failed.
    #[error("recover instances from libvirt")]
    Recovery(#[source] InstanceError),
    /// A background task of the driver ended without an answer.
    #[error("{0}: the task was lost")]
    TaskLost(&'static str),
    /// The actor system stopped while the driver was being built.
    #[error("the actor system stopped during start-up")]
    StartUp,
}

/// What a host offers instances, read from libvirt and the instances directory's filesystem
/// (`GET /v1/host`; the Nova driver's `get_available_resource` and `update_provider_tree`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostResources {
    /// This host's name (as ports are bound to it).
    pub host: String,
    /// libvirt's hypervisor type (`QEMU`, `TEST`).
    pub hypervisor_type: String,
    /// The hypervisor version (major * 1,000,000 + minor * 1,000 + release).
    pub hypervisor_version: u64,
    /// The host name libvirt reports.
    pub hypervisor_hostname: String,
    /// CPU model, frequency (MHz) and topology.
    pub cpu: HostCpu,
    /// Logical CPUs.
    pub vcpus: u32,
    /// Memory, MiB.
    pub memory_mb: u64,
    /// Size of the filesystem holding the instances directory, GiB (rounded down).
    pub disk_gb: u64,
    /// Space on it an unprivileged user can still use, GiB (rounded down).
    pub disk_free_gb: u64,
    /// The instances directory.
    pub instances_path: std::path::PathBuf,
}

/// A host's CPU as libvirt describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostCpu {
    /// Model (`x86_64`, ...).
    pub model: String,
    /// MHz.
    pub mhz: u32,
    /// NUMA nodes.
    pub nodes: u32,
    /// Sockets per node.
    pub sockets: u32,
    /// Cores per socket.
    pub cores: u32,
    /// Threads per core.
    pub threads: u32,
}

/// Why the host's resources could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// libvirt did not describe the host.
    #[error("read the host from libvirt")]
    Libvirt(#[source] LibvirtError),
    /// The instances directory's filesystem could not be read.
    #[error("read the filesystem of {}", path.display())]
    Filesystem {
        /// The instances directory.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: nix::Error,
    },
    /// The blocking task ended without an answer.
    #[error("{0}: the task was lost")]
    TaskLost(&'static str),
}

/// Why an instance's console output could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// The instance is not on this host (or could not be asked).
    #[error("look up the instance")]
    Instance(#[source] InstanceError),
    /// This host writes no serial console logs (no `console_dir`).
    #[error("this host writes no serial console logs")]
    NoConsoleLog,
    /// The log could not be read.
    #[error("read {}", path.display())]
    Read {
        /// The console log.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The blocking task ended without an answer.
    #[error("{0}: the task was lost")]
    TaskLost(&'static str),
}

/// The last `max_bytes` of the file at `path` as text (a missing file: nothing yet).
fn read_tail(path: &std::path::Path, max_bytes: u64) -> Result<String, ConsoleError> {
    use std::io::{Read, Seek, SeekFrom};
    let read = |source| ConsoleError::Read {
        path: path.to_owned(),
        source,
    };
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(read(e)),
    };
    let len = file.metadata().map_err(read)?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(max_bytes)))
        .map_err(read)?;
    let mut bytes = Vec::new();
    file.take(max_bytes).read_to_end(&mut bytes).map_err(read)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

const GIB: u64 = 1 << 30;

/// `statvfs` of `path`: (size, space available to unprivileged users), bytes.
fn filesystem_size(path: &std::path::Path) -> Result<(u64, u64), HostError> {
    let fs = nix::sys::statvfs::statvfs(path).map_err(|source| HostError::Filesystem {
        path: path.to_owned(),
        source,
    })?;
    let unit = fs.fragment_size();
    Ok((
        fs.blocks().saturating_mul(unit),
        fs.blocks_available().saturating_mul(unit),
    ))
}

/// How VIFs are plugged.
#[derive(Debug, Clone)]
pub enum PluggingConfig {
    /// On this host's kernel and Open vSwitch.
    Host(PlugConfig),
    /// Nothing made on the host ([`StaticPlugger`]): the `test:///` tier, where libvirt's test
    /// driver creates no devices. Chosen from the libvirt URI, not written in a config file.
    Static,
}

/// Which network service.
#[derive(Debug, Clone)]
pub enum NetworkConfig {
    /// The in-process service (the default when no Neutron is configured).
    Embedded(EmbeddedConfig),
    /// A Neutron endpoint (boxed: it is the larger configuration by far).
    Neutron(Box<NeutronConfig>),
}

/// Everything [`load_driver`] needs.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// This host's name.
    pub host: String,
    /// The libvirt connection.
    pub libvirt: LibvirtConfig,
    /// Instance settings (timeouts, forms, domain type).
    pub instances: InstanceConfig,
    /// The network-event actor's limits.
    pub events: EventConfig,
    /// VIF plugging.
    pub plugging: PluggingConfig,
    /// The network service.
    pub network: NetworkConfig,
    /// The URI other hosts live-migrate to (None: this host takes no live migrations).
    pub migration_uri: Option<String>,
    /// Where instance disks and the image cache live.
    pub storage: StorageConfig,
}

/// Load the driver called `name`.
pub async fn load_driver(
    name: &str,
    config: &DriverConfig,
) -> Result<Box<dyn ComputeDriver>, DriverError> {
    match name {
        "libvirt" => Ok(Box::new(
            LibvirtDriver::builder(config.clone()).build().await?,
        )),
        other => Err(DriverError::UnknownDriver(other.to_owned())),
    }
}

/// A network service several hosts of one process share (the embedded one, or any).
#[derive(Debug, Clone)]
pub enum SharedNetwork {
    /// The embedded service: each host attaches its wiring to it.
    Embedded(Arc<EmbeddedNetwork>),
    /// Any other implementation.
    Api(Arc<dyn NetworkApi>),
}

/// Assembles a [`LibvirtDriver`], optionally sharing parts with other hosts of the same
/// process (the demo's two hosts; tests).
#[derive(Debug)]
pub struct DriverBuilder {
    config: DriverConfig,
    system: Option<Arc<ActorSystem>>,
    events: Option<EventsHandle>,
    peers: Option<Arc<Peers>>,
    network: Option<SharedNetwork>,
    plugger: Option<Arc<dyn VifPlugger>>,
}

impl DriverBuilder {
    /// Share an actor system.
    pub fn system(mut self, system: Arc<ActorSystem>) -> Self {
        self.system = Some(system);
        self
    }

    /// Share a network-event actor.
    pub fn events(mut self, events: EventsHandle) -> Self {
        self.events = Some(events);
        self
    }

    /// Share the directory of hosts.
    pub fn peers(mut self, peers: Arc<Peers>) -> Self {
        self.peers = Some(peers);
        self
    }

    /// Share a network service.
    pub fn network(mut self, network: SharedNetwork) -> Self {
        self.network = Some(network);
        self
    }

    /// Use this plugger.
    pub fn plugger(mut self, plugger: Arc<dyn VifPlugger>) -> Self {
        self.plugger = Some(plugger);
        self
    }

    /// Start everything, recover the instances libvirt has, and return the driver.
    pub async fn build(self) -> Result<LibvirtDriver, DriverError> {
        let DriverBuilder {
            config,
            system,
            events,
            peers,
            network,
            plugger,
        } = self;
        let (system, owns_system) = match system {
            Some(s) => (s, false),
            None => (
                Arc::new(ActorSystem::start().map_err(DriverError::Runtime)?),
                true,
            ),
        };
        let (events, owns_events) = match events {
            Some(e) => (e, false),
            None => (system.start_events(config.events), true),
        };
        let plugger: Arc<dyn VifPlugger> = match (plugger, &config.plugging) {
            (Some(p), _) => p,
            (None, PluggingConfig::Static) => Arc::new(StaticPlugger::new()),
            (None, PluggingConfig::Host(cfg)) => {
                // The plugger's watcher tasks live on the actor thread, as long as the driver.
                let cfg = cfg.clone();
                let p = on_actor_thread(&system, move || HostPlugger::start(cfg))
                    .await?
                    .map_err(DriverError::Plugging)?;
                Arc::new(p)
            }
        };
        let network: Arc<dyn NetworkApi> = match (network, &config.network) {
            (Some(SharedNetwork::Api(n)), _) => n,
            (Some(SharedNetwork::Embedded(n)), _) => {
                attach(&system, &n, &config.host, &plugger).await?;
                n
            }
            (None, NetworkConfig::Embedded(cfg)) => {
                let n = EmbeddedNetwork::new(cfg.clone(), Arc::new(events.clone()))
                    .map_err(|e| DriverError::Network(e.to_string()))?;
                attach(&system, &n, &config.host, &plugger).await?;
                n
            }
            (None, NetworkConfig::Neutron(cfg)) => {
                let neutron: Arc<dyn NetworkApi> = Arc::new(
                    NeutronClient::new((**cfg).clone())
                        .map_err(|e| DriverError::Network(e.to_string()))?,
                );
                match cfg.ports_owner {
                    PortsOwner::Vireo => neutron,
                    PortsOwner::Nova => Arc::new(NovaOwnedPorts::new(neutron)),
                }
            }
        };
        let libvirt = Libvirt::open(config.libvirt.clone())
            .await
            .map_err(DriverError::Libvirt)?;
        let peers = peers.unwrap_or_else(Peers::new);
        let storage =
            Arc::new(HostStorage::new(config.storage.clone()).map_err(DriverError::Storage)?);
        let builds = Arc::new(
            BuildJournal::open(&config.storage.journal_dir).map_err(DriverError::Journal)?,
        );
        let migrations = Arc::new(
            LiveMigrationJournal::open(&config.storage.migration_journal_dir)
                .map_err(DriverError::Journal)?,
        );
        let deps = Arc::new(HostDeps {
            host: config.host.clone(),
            libvirt: libvirt.clone(),
            events: events.clone(),
            plugger: plugger.clone(),
            network: network.clone(),
            storage: storage.clone(),
            builds,
            migrations,
            peers: peers.clone(),
            config: config.instances.clone(),
        });
        let host = system.start_host(deps, config.migration_uri.clone());
        peers.insert(Arc::new(host.clone()));
        let recovery = host.recover().await.map_err(DriverError::Recovery)?;
        info!(host = %config.host, recovered = recovery.instances.len(), "driver ready");
        Ok(LibvirtDriver {
            name: "libvirt".to_owned(),
            host,
            events,
            libvirt,
            network,
            plugger,
            storage,
            peers,
            recovery,
            system,
            owns_system,
            owns_events,
            domain: config.instances.domain.clone(),
        })
    }
}

/// Run `f` on the actor thread (where background tasks it spawns live on).
pub(crate) async fn on_actor_thread<T: Send + 'static>(
    system: &ActorSystem,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, DriverError> {
    let (tx, rx) = oneshot::channel();
    system.arbiter().spawn(async move {
        let _ = tx.send(f());
    });
    rx.await.map_err(|_| DriverError::StartUp)
}

async fn attach(
    system: &ActorSystem,
    network: &Arc<EmbeddedNetwork>,
    host: &str,
    plugger: &Arc<dyn VifPlugger>,
) -> Result<(), DriverError> {
    let (n, h, w) = (network.clone(), host.to_owned(), plugger.wiring());
    on_actor_thread(system, move || n.attach_host(&h, w))
        .await?
        .map_err(|e| DriverError::Network(e.to_string()))
}

/// The libvirt driver.
#[derive(Debug)]
pub struct LibvirtDriver {
    name: String,
    host: HostHandle,
    events: EventsHandle,
    libvirt: LibvirtHandle,
    network: Arc<dyn NetworkApi>,
    plugger: Arc<dyn VifPlugger>,
    storage: Arc<HostStorage>,
    peers: Arc<Peers>,
    recovery: RecoveryReport,
    system: Arc<ActorSystem>,
    owns_system: bool,
    owns_events: bool,
    /// The settings every domain is defined with (where console logs are).
    domain: vireo_actors::instance::DomainSettings,
}

impl LibvirtDriver {
    /// Assemble a driver from its configuration.
    pub fn builder(config: DriverConfig) -> DriverBuilder {
        DriverBuilder {
            config,
            system: None,
            events: None,
            peers: None,
            network: None,
            plugger: None,
        }
    }

    /// The host actor.
    pub fn host_handle(&self) -> &HostHandle {
        &self.host
    }

    /// The network-event actor.
    pub fn events(&self) -> &EventsHandle {
        &self.events
    }

    /// The libvirt connection.
    pub fn libvirt(&self) -> &LibvirtHandle {
        &self.libvirt
    }

    /// The network service.
    pub fn network(&self) -> &Arc<dyn NetworkApi> {
        &self.network
    }

    /// The plugger.
    pub fn plugger(&self) -> &Arc<dyn VifPlugger> {
        &self.plugger
    }

    /// The directory of hosts.
    pub fn peers(&self) -> &Arc<Peers> {
        &self.peers
    }

    /// What recovery found at start-up.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// The actor system.
    pub fn system(&self) -> &Arc<ActorSystem> {
        &self.system
    }
}

#[async_trait]
impl ComputeDriver for LibvirtDriver {
    fn name(&self) -> &str {
        &self.name
    }

    fn host(&self) -> &str {
        vireo_actors::instance::PeerHost::name(&self.host)
    }

    async fn submit(&self, uuid: Uuid, request: Operation) -> Result<Ticket, AdmissionError> {
        self.host.submit(uuid, request).await
    }

    async fn show(&self, uuid: Uuid) -> Result<InstanceView, InstanceError> {
        self.host.show(uuid).await
    }

    async fn list(&self) -> Vec<InstanceView> {
        self.host.list().await
    }

    async fn knows(&self, uuid: Uuid) -> bool {
        self.host.knows(uuid).await
    }

    async fn write_probe(&self, probe: Uuid) -> Result<(), StorageError> {
        self.storage.write_probe(&migration_probe(probe)).await
    }

    async fn sees_probe(&self, probe: Uuid) -> bool {
        self.storage.sees_probe(&migration_probe(probe)).await
    }

    async fn remove_probe(&self, probe: Uuid) {
        self.storage.remove_probe(&migration_probe(probe)).await
    }

    async fn evict_unused_images(&self) -> Result<Vec<ImageId>, DriverError> {
        // An image in use is one an instance's disk here names (a resize's kept copy names
        // the same image as its instance), or the backing file of any root disk in the
        // instances directory (on a shared one, other hosts' instances on this host's base).
        // A base just fetched for a build whose disks are not recorded yet was used (touched)
        // moments ago: younger than any eviction age.
        let mut in_use: std::collections::BTreeSet<ImageId> = self
            .list()
            .await
            .iter()
            .flat_map(|v| v.disks.iter().filter_map(|d| d.image.clone()))
            .collect();
        let storage = self.storage.clone();
        let on_disk = tokio::task::spawn_blocking(move || storage.bases_in_use())
            .await
            .map_err(|_| DriverError::TaskLost("scan the instances directory"))?;
        in_use.extend(on_disk);
        let cache = self.storage.cache().clone();
        let removed = tokio::task::spawn_blocking(move || cache.evict(&in_use))
            .await
            .map_err(|_| DriverError::TaskLost("evict unused images"))?
            .map_err(DriverError::Storage)?;
        if !removed.is_empty() {
            info!(host = %self.host(), removed = ?removed, "unused base images removed");
        }
        Ok(removed)
    }

    fn domain_events(&self) -> Option<vireo_actors::libvirt::EventStream> {
        Some(self.libvirt.events())
    }

    async fn console_output(&self, uuid: Uuid, max_bytes: u64) -> Result<String, ConsoleError> {
        self.host.show(uuid).await.map_err(ConsoleError::Instance)?;
        let path = self
            .domain
            .console_log(uuid)
            .ok_or(ConsoleError::NoConsoleLog)?;
        tokio::task::spawn_blocking(move || read_tail(std::path::Path::new(&path), max_bytes))
            .await
            .map_err(|_| ConsoleError::TaskLost("read the console log"))?
    }

    async fn host_resources(&self) -> Result<HostResources, HostError> {
        let node = self
            .libvirt
            .node_facts()
            .await
            .map_err(HostError::Libvirt)?;
        let path = self.storage.instances_dir().to_owned();
        let at = path.clone();
        let (size, free) = tokio::task::spawn_blocking(move || filesystem_size(&at))
            .await
            .map_err(|_| HostError::TaskLost("read the instances filesystem"))??;
        let [nodes, sockets, cores, threads] = node.topology;
        Ok(HostResources {
            host: self.host().to_owned(),
            hypervisor_type: node.hypervisor_type,
            hypervisor_version: node.hypervisor_version,
            hypervisor_hostname: node.hostname,
            cpu: HostCpu {
                model: node.cpu_model,
                mhz: node.cpu_mhz,
                nodes,
                sockets,
                cores,
                threads,
            },
            vcpus: node.cpus,
            memory_mb: node.memory_kib / 1024,
            disk_gb: size / GIB,
            disk_free_gb: free / GIB,
            instances_path: path,
        })
    }

    fn external_events(&self, events: Vec<ExternalEvent>) {
        self.events.deliver_batch(events);
    }

    async fn event_stats(&self) -> Option<EventStats> {
        self.events.stats().await.ok()
    }

    fn libvirt_generation(&self) -> Option<u64> {
        self.libvirt.generation()
    }

    async fn shutdown(&self, timeout: Duration) {
        let work = async {
            self.host.shutdown().await;
            if self.owns_events {
                let _ = self.events.shutdown().await;
            }
        };
        if tokio::time::timeout(timeout, work).await.is_err() {
            tracing::warn!(?timeout, "driver shutdown did not finish in time");
        }
        let _ = self.owns_system;
    }
}
