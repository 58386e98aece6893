//! One compute host of a test: a real [`LibvirtDriver`] assembled the way `load_driver`
//! does, with the parts a test needs to see kept at hand — the host plugger (its wiring
//! watcher and fault seam), the embedded network service when there is one, the
//! network-event actor — and registered with the events endpoint.

use std::sync::Arc;
use std::time::Duration;

use vireo::compute::{
    ComputeDriver, DriverConfig, LibvirtDriver, NetworkConfig, PluggingConfig, SharedNetwork,
};
use vireo::network::embedded::{EmbeddedConfig, EmbeddedNetwork};
use vireo::network::neutron::{NeutronClient, NeutronConfig};
use vireo::plug::{DatapathType, HostPlugger, PlugConfig};
use vireo_actors::events::{EventConfig, EventsHandle, WaitPolicy};
use vireo_actors::external::EventSink;
use vireo_actors::instance::{DomainSettings, InstanceConfig, Peers};
use vireo_actors::libvirt::LibvirtConfig;
use vireo_actors::network::NetworkApi;
use vireo_actors::plug::testing::RecordingPlugger;
use vireo_actors::plug::{DomainForm, VifPlugger};
use vireo_actors::runtime::ActorSystem;
use vireo_xml::domain::DomainType;

use crate::endpoint::{ArrivalLog, EventsEndpoint, RecordingSink};
use crate::split::SplitNetwork;
use crate::HarnessError;

/// The network service of a host.
#[derive(Debug, Clone)]
pub enum NetChoice {
    /// The real Neutron (events through the endpoint).
    Neutron,
    /// The embedded service only.
    Embedded(EmbeddedConfig),
    /// Neutron, plus the embedded service for its own networks ([`SplitNetwork`]).
    Split(EmbeddedConfig),
}

/// How VIFs are plugged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plugging {
    /// This machine's kernel and Open vSwitch.
    Host,
    /// Recorded only (a `test:///` host).
    Recording,
}

/// What a host is made of.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// The host's name (as the network service knows it).
    pub name: String,
    /// libvirt URI.
    pub uri: String,
    /// Plugging.
    pub plugging: Plugging,
    /// Network service.
    pub network: NetChoice,
    /// Domain type.
    pub domain_type: DomainType,
    /// OVS native form.
    pub ovs_native_form: DomainForm,
    /// The OVS bridge of a binding that names none (`[network.neutron] ovs_bridge`).
    pub ovs_bridge: String,
    /// `vif_plugging_timeout` (fatal).
    pub wait_timeout: Duration,
    /// Serial console logs (`<dir>/<uuid>/console.log`).
    pub console_dir: Option<String>,
    /// Graceful power-off time.
    pub power_off_timeout: Duration,
    /// A soft reboot's wait for the guest to shut down (the diskless guests have no OS and
    /// ignore ACPI: they are rebooted hard after it).
    pub soft_reboot_timeout: Duration,
    /// Where other hosts migrate to.
    pub migration_uri: Option<String>,
    /// How live migrations from this host are run and watched.
    pub migration: vireo_actors::instance::MigrationPolicy,
    /// How a device detached from a running guest is waited for (the booted guest releases
    /// it in a second or two; a diskless guest, with no OS, never does).
    pub device_detach: vireo_actors::instance::DetachPolicy,
    /// The state directory (instance disks in `instances/`, the image cache in `_base/`).
    /// Default: one of its own under the system's temporary directory, per process and host.
    pub state_dir: std::path::PathBuf,
}

impl HostOptions {
    /// `qemu:///system` on this machine's devices with the real Neutron.
    pub fn system(name: &str) -> HostOptions {
        HostOptions {
            name: name.to_owned(),
            uri: "qemu:///system".into(),
            plugging: Plugging::Host,
            network: NetChoice::Neutron,
            domain_type: DomainType::Qemu,
            ovs_native_form: DomainForm::LibvirtManaged,
            ovs_bridge: vireo::network::DEFAULT_OVS_BRIDGE.into(),
            wait_timeout: Duration::from_secs(60),
            console_dir: None,
            power_off_timeout: Duration::from_secs(2),
            soft_reboot_timeout: Duration::from_secs(2),
            migration_uri: None,
            migration: vireo_actors::instance::MigrationPolicy::default(),
            device_detach: vireo_actors::instance::DetachPolicy {
                timeout: Duration::from_secs(20),
                attempts: 3,
            },
            state_dir: std::env::temp_dir().join(format!("vireo-it-{}-{name}", std::process::id())),
        }
    }
}

/// What hosts of one test share.
#[derive(Debug, Clone)]
pub struct Shared {
    /// Where event arrivals are recorded.
    pub log: Arc<ArrivalLog>,
    /// Neutron's URL.
    pub neutron_url: String,
    /// The directory of hosts.
    pub peers: Arc<Peers>,
}

/// A running host.
#[derive(Debug)]
pub struct Host {
    /// Its name.
    pub name: String,
    /// The OVS bridge of its bindings that name none.
    pub ovs_bridge: String,
    /// The driver.
    pub driver: Arc<LibvirtDriver>,
    /// Its network-event actor.
    pub events: EventsHandle,
    /// The host plugger (Plugging::Host).
    pub plugger: Option<Arc<HostPlugger>>,
    /// The recording plugger (Plugging::Recording).
    pub recording: Option<Arc<RecordingPlugger>>,
    /// The embedded service, when it has one.
    pub embedded: Option<Arc<EmbeddedNetwork>>,
    /// The network service the driver uses.
    pub network: Arc<dyn NetworkApi>,
    /// Its state directory (instance disks, image cache).
    pub state_dir: std::path::PathBuf,
    system: Arc<ActorSystem>,
}

async fn on_thread<T: Send + 'static>(
    system: &ActorSystem,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, HarnessError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    system.arbiter().spawn(async move {
        let _ = tx.send(f());
    });
    rx.await
        .map_err(|_| HarnessError::Setup("actor thread gone".into()))
}

/// The plugging configuration of this machine (userspace OVS datapath).
pub fn plug_config() -> PlugConfig {
    PlugConfig {
        datapath_type: DatapathType::Netdev,
        ..PlugConfig::default()
    }
}

impl Host {
    /// Start a host and register it with `endpoint` (when given).
    pub async fn start(
        opts: HostOptions,
        shared: &Shared,
        endpoint: Option<&EventsEndpoint>,
    ) -> Result<Host, HarnessError> {
        let system =
            Arc::new(ActorSystem::start().map_err(|e| HarnessError::Setup(e.to_string()))?);
        let events = system.start_events(EventConfig::default());
        let (plugger, recording, dyn_plugger): (_, _, Arc<dyn VifPlugger>) = match opts.plugging {
            Plugging::Host => {
                let p = on_thread(&system, || HostPlugger::start(plug_config()))
                    .await?
                    .map_err(|e| HarnessError::Setup(format!("host plugger: {e}")))?;
                let p = Arc::new(p);
                (Some(p.clone()), None, p)
            }
            Plugging::Recording => {
                let p = Arc::new(RecordingPlugger::new());
                (None, Some(p.clone()), p)
            }
        };
        let neutron_config = || {
            let mut c = NeutronConfig::new(shared.neutron_url.clone());
            c.ovs_bridge = opts.ovs_bridge.clone();
            c
        };
        let neutron = || -> Result<Arc<dyn NetworkApi>, HarnessError> {
            Ok(Arc::new(NeutronClient::new(neutron_config()).map_err(
                |e| HarnessError::Setup(format!("neutron client: {e}")),
            )?))
        };
        let embedded = match &opts.network {
            NetChoice::Neutron => None,
            NetChoice::Embedded(cfg) | NetChoice::Split(cfg) => {
                let sink: Arc<dyn EventSink> =
                    Arc::new(RecordingSink::new(shared.log.clone(), events.clone()));
                let n = EmbeddedNetwork::new(cfg.clone(), sink)
                    .map_err(|e| HarnessError::Setup(format!("embedded network: {e}")))?;
                let (n2, host, w) = (n.clone(), opts.name.clone(), dyn_plugger.wiring());
                on_thread(&system, move || n2.attach_host(&host, w))
                    .await?
                    .map_err(|e| HarnessError::Setup(format!("attach host: {e}")))?;
                Some(n)
            }
        };
        let network: Arc<dyn NetworkApi> = match (&opts.network, &embedded) {
            (NetChoice::Embedded(_), Some(e)) => e.clone(),
            (NetChoice::Split(cfg), Some(e)) => Arc::new(SplitNetwork::new(
                neutron()?,
                e.clone(),
                cfg.networks.iter().map(|n| n.id.clone()),
            )),
            _ => neutron()?,
        };
        let config = DriverConfig {
            storage: vireo::storage::StorageConfig::in_state_dir(&opts.state_dir),
            host: opts.name.clone(),
            libvirt: LibvirtConfig::for_uri(opts.uri.clone()),
            instances: InstanceConfig {
                domain: DomainSettings {
                    domain_type: opts.domain_type,
                    machine: None,
                    console_dir: opts.console_dir.clone(),
                },
                ovs_native_form: opts.ovs_native_form,
                wait: WaitPolicy {
                    timeout: opts.wait_timeout,
                    fatal: true,
                },
                power_off_timeout: opts.power_off_timeout,
                soft_reboot_timeout: opts.soft_reboot_timeout,
                migration: opts.migration.clone(),
                device_detach: opts.device_detach,
                ..InstanceConfig::default()
            },
            events: EventConfig::default(),
            plugging: match opts.plugging {
                Plugging::Host => PluggingConfig::Host(plug_config()),
                Plugging::Recording => PluggingConfig::Static,
            },
            network: match &opts.network {
                NetChoice::Embedded(cfg) => NetworkConfig::Embedded(cfg.clone()),
                _ => NetworkConfig::Neutron(Box::new(neutron_config())),
            },
            migration_uri: opts.migration_uri.clone(),
        };
        let driver = LibvirtDriver::builder(config)
            .system(system.clone())
            .events(events.clone())
            .peers(shared.peers.clone())
            .plugger(dyn_plugger)
            .network(SharedNetwork::Api(network.clone()))
            .build()
            .await
            .map_err(|e| {
                HarnessError::Setup(format!("driver for {}: {}", opts.name, crate::chain(&e)))
            })?;
        let driver = Arc::new(driver);
        if let Some(ep) = endpoint {
            ep.register(driver.clone(), events.clone());
        }
        Ok(Host {
            state_dir: opts.state_dir,
            ovs_bridge: opts.ovs_bridge,
            name: opts.name,
            driver,
            events,
            plugger,
            recording,
            embedded,
            network,
            system,
        })
    }

    /// The driver as the API.
    pub fn api(&self) -> &dyn ComputeDriver {
        &*self.driver
    }

    /// Stop the driver and its actors.
    pub async fn stop(self) {
        self.driver.shutdown(Duration::from_secs(10)).await;
        let _ = self.events.shutdown().await;
        if let Some(e) = &self.embedded {
            e.detach_host(&self.name);
        }
        self.peers_forget();
        drop(self.driver);
        drop(self.plugger);
        let system = self.system;
        // Joining the actor thread blocks: not on an async worker.
        let _ = tokio::task::spawn_blocking(move || drop(system)).await;
    }

    fn peers_forget(&self) {
        self.driver.peers().remove(&self.name);
    }
}
