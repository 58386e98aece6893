//! What an instance actor works with: the host's libvirt connection, the network-event actor,
//! the VIF plugger, the network service, the other hosts, and the host-wide settings.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use crate::events::{EventsHandle, WaitPolicy};
use crate::libvirt::LibvirtHandle;
use crate::network::NetworkApi;
use crate::plug::{DomainForm, VifPlugger};
use crate::predict::{DeviceForm, Wiring};
use crate::storage::InstanceStorage;

use super::journal::{BuildJournal, LiveMigrationJournal};
use super::operation::Operation;
use super::record::DomainSettings;
use super::types::{InstanceError, InstanceReply};

/// Another compute host, as the flows that cross hosts (resize, revert, live migration) see
/// it when this process runs both: the demo's second host and the tests' (a `HostHandle`, or
/// a test's stand-in). A vireo agent is one host and its directory holds only itself: moves
/// between hosts are Nova's to orchestrate, each host's half asked of that host's agent
/// (`caller_finishes`, `caller`), and a request that needs another host here is refused at
/// admission ([`super::AdmissionError::CrossHost`]).
#[async_trait]
pub trait PeerHost: Send + Sync + fmt::Debug + 'static {
    /// The host name (as the network service knows it).
    fn name(&self) -> &str;

    /// The libvirt URI a source host migrates to (None: this host takes no live migrations).
    fn migration_uri(&self) -> Option<String>;

    /// Ask the host's actor for `instance` to run `request`.
    async fn request(
        &self,
        instance: Uuid,
        request: Operation,
    ) -> Result<InstanceReply, InstanceError>;
}

/// The hosts this host can reach by name. This host registers itself too (same-host
/// resize uses it).
#[derive(Debug, Default)]
pub struct Peers {
    hosts: RwLock<BTreeMap<String, Arc<dyn PeerHost>>>,
}

impl Peers {
    /// An empty directory.
    pub fn new() -> Arc<Self> {
        Arc::new(Peers::default())
    }

    /// Add or replace a host.
    pub fn insert(&self, peer: Arc<dyn PeerHost>) {
        if let Ok(mut hosts) = self.hosts.write() {
            hosts.insert(peer.name().to_owned(), peer);
        }
    }

    /// Remove a host.
    pub fn remove(&self, name: &str) {
        if let Ok(mut hosts) = self.hosts.write() {
            hosts.remove(name);
        }
    }

    /// Look a host up.
    pub fn get(&self, name: &str) -> Result<Arc<dyn PeerHost>, InstanceError> {
        self.hosts
            .read()
            .ok()
            .and_then(|h| h.get(name).cloned())
            .ok_or_else(|| InstanceError::UnknownHost(name.to_owned()))
    }
}

/// Host-wide settings of the instance actors.
#[derive(Debug, Clone)]
pub struct InstanceConfig {
    /// Domain type, machine, console directory.
    pub domain: DomainSettings,
    /// Which device form OVS native ports use (Linux bridge ports are always libvirt-managed,
    /// hybrid always pre-created by vireo).
    pub ovs_native_form: DomainForm,
    /// `vif_plugging_timeout` and `vif_plugging_is_fatal`.
    pub wait: WaitPolicy,
    /// How long an operation waits to consume the events its own `binding:profile` update
    /// causes (non-fatal; see docs/EVENT_MODEL.md section 6).
    pub profile_wait: Duration,
    /// How long a wait released by `network-vif-plugged` reads its ports back for ACTIVE
    /// before it trusts the events (docs/EVENT_MODEL.md section 7); zero: no read-back.
    pub confirm_window: Duration,
    /// How long a graceful power off may take before the domain is destroyed.
    pub power_off_timeout: Duration,
    /// How often a graceful power off polls the domain state.
    pub power_off_poll: Duration,
    /// How long a soft reboot waits for the guest to shut down before it reboots hard
    /// (Nova's `[libvirt] wait_soft_reboot_seconds`).
    pub soft_reboot_timeout: Duration,
    /// How long a libvirt "stopped" event waits before the power state is reconciled (a
    /// STOPPED followed quickly by STARTED is a reboot, not a stop).
    pub lifecycle_debounce: Duration,
    /// Set `binding:profile.migrating_to` on the source ports during a live migration (as
    /// Nova does; mechanism drivers such as OVN use it to pre-program the destination).
    pub set_migrating_to: bool,
    /// How a live migration is run and watched.
    pub migration: MigrationPolicy,
    /// How a device detached from a running guest is waited for.
    pub device_detach: DetachPolicy,
}

/// How a device detached from a running guest is waited for (Nova's `[libvirt]
/// device_detach_timeout` and `device_detach_attempts`): the guest releases the device
/// asynchronously and libvirt says so with a device-removed event. Each attempt asks the guest
/// to release it and waits `timeout` for the event; after `attempts` the detach fails and the
/// host side stays plugged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetachPolicy {
    /// How long one attempt waits for the device-removed event.
    pub timeout: Duration,
    /// How many times the guest is asked.
    pub attempts: u32,
}

impl Default for DetachPolicy {
    fn default() -> Self {
        DetachPolicy {
            timeout: Duration::from_secs(20),
            attempts: 8,
        }
    }
}

/// How a live migration is run and watched.
#[derive(Debug, Clone, PartialEq)]
pub struct MigrationPolicy {
    /// Time allowed per GiB of data the migration moves (guest memory, at least 2 GiB, as
    /// Nova counts it) before the job is aborted and the migration rolled back (Nova's
    /// `live_migration_completion_timeout`, 800 s); None: no limit.
    pub completion_timeout_per_gib: Option<Duration>,
    /// How often the job's progress is read (and shown as the operation's phase).
    pub poll: Duration,
    /// Bandwidth limit in MiB/s (None: the hypervisor's default, unlimited).
    pub bandwidth_mib: Option<u64>,
    /// Let QEMU throttle a guest whose memory changes faster than it moves
    /// (`VIR_MIGRATE_AUTO_CONVERGE`).
    pub auto_converge: bool,
    /// How long a destination whose agent cannot be reached after the guest moved (it is
    /// restarting) is asked again to take the guest over.
    pub handover_retry: Duration,
}

impl Default for MigrationPolicy {
    fn default() -> Self {
        MigrationPolicy {
            completion_timeout_per_gib: Some(Duration::from_secs(800)),
            poll: Duration::from_millis(500),
            bandwidth_mib: None,
            auto_converge: false,
            handover_retry: Duration::from_secs(120),
        }
    }
}

impl MigrationPolicy {
    /// How long a live migration of a guest with `memory_mb` may take (None: no limit).
    pub fn completion_timeout(&self, memory_mb: u64) -> Option<Duration> {
        let gib = (memory_mb as f64 / 1024.0).max(2.0);
        self.completion_timeout_per_gib.map(|t| t.mul_f64(gib))
    }
}

impl Default for InstanceConfig {
    fn default() -> Self {
        InstanceConfig {
            domain: DomainSettings {
                domain_type: vireo_xml::domain::DomainType::Kvm,
                machine: None,
                console_dir: None,
            },
            ovs_native_form: DomainForm::LibvirtManaged,
            wait: WaitPolicy::default(),
            profile_wait: Duration::from_secs(10),
            confirm_window: Duration::from_secs(10),
            power_off_timeout: Duration::from_secs(60),
            power_off_poll: Duration::from_millis(250),
            soft_reboot_timeout: Duration::from_secs(120),
            lifecycle_debounce: Duration::from_secs(2),
            set_migrating_to: true,
            migration: MigrationPolicy::default(),
            device_detach: DetachPolicy::default(),
        }
    }
}

impl InstanceConfig {
    /// What vireo keeps wired, for the event model.
    pub fn wiring(&self) -> Wiring {
        Wiring {
            ovs_native: match self.ovs_native_form {
                DomainForm::LibvirtManaged => DeviceForm::LibvirtManaged,
                DomainForm::PreCreated => DeviceForm::PreCreated,
            },
            linux_bridge: DeviceForm::LibvirtManaged,
        }
    }
}

/// Everything the actors of one host share.
#[derive(Debug)]
pub struct HostDeps {
    /// This host's name (as the network service knows it).
    pub host: String,
    /// The libvirt connection.
    pub libvirt: LibvirtHandle,
    /// The network-event actor.
    pub events: EventsHandle,
    /// VIF plugging.
    pub plugger: Arc<dyn VifPlugger>,
    /// The network service.
    pub network: Arc<dyn NetworkApi>,
    /// The instances' disks.
    pub storage: Arc<dyn InstanceStorage>,
    /// The builds that allocate ports, until their domain exists.
    pub builds: Arc<BuildJournal>,
    /// The outgoing live migrations, until they are finished or rolled back.
    pub migrations: Arc<LiveMigrationJournal>,
    /// The other hosts.
    pub peers: Arc<Peers>,
    /// Settings.
    pub config: InstanceConfig,
}
