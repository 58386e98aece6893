//! Shared set-up of the cross-crate tests: a local cloud on private test-driver files with
//! the embedded network service, and ports of every kind.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tempfile::TempDir;
use uuid::Uuid;
use vireo::local::{LocalCloud, LocalCloudConfig};
use vireo::network::embedded::{EmbeddedConfig, EmbeddedNetworkDef, Mechanism};
use vireo_actors::events::{EventConfig, WaitPolicy};
use vireo_actors::instance::{
    BootSource, InstanceConfig, LiveMigrateArgs, Migration, NetworkRequest, SpawnArgs,
};
use vireo_actors::network::{NetworkApi, PortRequest, PortUpdate};
use vireo_actors::vif::{PortId, VnicType};
use vireo_xml::metadata::Flavor;

pub const NET_HYBRID: &str = "11111111-0000-4000-8000-000000000001";
pub const NET_NATIVE: &str = "11111111-0000-4000-8000-000000000002";
pub const NET_LB: &str = "11111111-0000-4000-8000-000000000003";
pub const NET_SRIOV: &str = "11111111-0000-4000-8000-000000000004";

pub fn networks() -> Vec<EmbeddedNetworkDef> {
    let def = |id: &str, name: &str, mechanism, hybrid, physnet: Option<&str>| EmbeddedNetworkDef {
        id: id.into(),
        name: name.into(),
        mtu: Some(1450),
        mechanism,
        ovs_hybrid_plug: hybrid,
        bridge_name: None,
        datapath_type: None,
        physical_network: physnet.map(Into::into),
        vlan: physnet.map(|_| 100),
    };
    vec![
        def(NET_HYBRID, "ovs-hybrid", Mechanism::Openvswitch, true, None),
        def(
            NET_NATIVE,
            "ovs-native",
            Mechanism::Openvswitch,
            false,
            None,
        ),
        def(NET_LB, "linuxbridge", Mechanism::Linuxbridge, false, None),
        def(
            NET_SRIOV,
            "sriov",
            Mechanism::Openvswitch,
            false,
            Some("physnet1"),
        ),
    ]
}

pub struct Cloud {
    pub cloud: LocalCloud<RecordingPlugger>,
    pub dir: TempDir,
}

/// A local cloud with `hosts`, fatal waits of `timeout`.
pub async fn cloud(hosts: &[&str], timeout: Duration) -> Cloud {
    warm_up_libvirt().await;
    let dir = tempfile::tempdir().unwrap();
    let instances = InstanceConfig {
        wait: WaitPolicy {
            timeout,
            fatal: true,
        },
        profile_wait: Duration::from_secs(2),
        power_off_timeout: Duration::from_secs(5),
        power_off_poll: Duration::from_millis(20),
        ..InstanceConfig::default()
    };
    let network = EmbeddedConfig {
        networks: networks(),
        ..serde_json::from_str("{}").unwrap()
    };
    let cloud = LocalCloud::start(LocalCloudConfig {
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        dir: dir.path().to_owned(),
        network,
        instances,
        events: EventConfig::default(),
    })
    .await
    .unwrap();
    Cloud { cloud, dir }
}

pub fn flavor(name: &str, vcpus: u32, memory_mb: u64) -> Flavor {
    Flavor {
        name: name.into(),
        vcpus,
        memory_mb,
        root_gb: 1,
        extra_specs: Default::default(),
    }
}

pub fn spawn_args(name: &str, requests: Vec<PortRequest>) -> SpawnArgs {
    SpawnArgs {
        name: name.into(),
        flavor: flavor("m1.tiny", 1, 256),
        boot: BootSource::None,
        network: NetworkRequest::Allocate(requests),
        power_on: true,
    }
}

pub fn on(network: &str) -> PortRequest {
    PortRequest::Network {
        network_id: network.into(),
    }
}

/// A user-supplied SR-IOV port on the physnet network.
pub async fn sriov_port(net: &dyn NetworkApi, vnic: VnicType, pci: &str) -> PortRequest {
    let port = net.create_port(NET_SRIOV).await.unwrap();
    let mut profile = serde_json::Map::new();
    profile.insert("pci_slot".into(), pci.into());
    profile.insert("physical_network".into(), "physnet1".into());
    net.update_port(
        port.id,
        &PortUpdate {
            vnic_type: Some(vnic),
            profile: Some(profile),
            ..PortUpdate::default()
        },
    )
    .await
    .unwrap();
    PortRequest::Port { port_id: port.id }
}

/// A live migration from h1 to `dest` with the given storage flags.
pub fn lm(dest: &str, shared_block: bool, shared_path: bool) -> LiveMigrateArgs {
    LiveMigrateArgs::of(
        &Migration {
            id: uuid(),
            source_host: "h1".into(),
            dest_host: dest.into(),
        },
        shared_block,
        shared_path,
    )
}

pub fn uuid() -> Uuid {
    Uuid::new_v4()
}

pub fn ports(view: &vireo_actors::instance::InstanceView) -> Vec<PortId> {
    view.vifs.iter().map(|v| v.port).collect()
}

// ----------------------------------------------------------------------------------------
// A test cloud with a recording event sink, fault-injectable network and restartable hosts

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use vireo::compute::{
    ComputeDriver, ComputeOps, DriverConfig, LibvirtDriver, NetworkConfig, PluggingConfig,
    SharedNetwork,
};
use vireo::local::test_uri;
use vireo::network::embedded::EmbeddedNetwork;
use vireo_actors::events::{EventStats, EventsHandle};
use vireo_actors::external::{EventName, EventSink, EventStatus, ExternalEvent};
use vireo_actors::instance::{InstanceError, InstanceView, OpReport, Peers, WaitReport};
use vireo_actors::libvirt::LibvirtConfig;
use vireo_actors::network::{
    Deallocation, Failure, HostSetupChange, MigrationHosts, NetworkError, NetworkSummary,
    NewBinding, Port, PortBinding, Removal, PCI_PROFILE_KEYS,
};
use vireo_actors::plug::testing::RecordingPlugger;
use vireo_actors::plug::VifPlugger;
use vireo_actors::predict::Timing;
use vireo_actors::runtime::ActorSystem;
use vireo_actors::vif::NetworkInfo;

/// One event the network service sent, with when.
#[derive(Debug, Clone)]
pub struct Sent {
    pub at: Instant,
    pub event: ExternalEvent,
}

/// The network service's sink in these tests: keeps every event it sends (the service's own
/// log) and hands it on to the current network-event actor.
#[derive(Debug, Default)]
pub struct TeeSink {
    log: Mutex<Vec<Sent>>,
    targets: Mutex<Vec<EventsHandle>>,
    /// The event fault applied between the service and the actors, if any.
    rule: Mutex<Option<EventRule>>,
    /// Events a [`EventFault::Held`] rule kept back.
    held: Mutex<Vec<ExternalEvent>>,
    /// Events the rule changed, dropped or kept back so far.
    hits: std::sync::atomic::AtomicUsize,
    /// The rule acts on the events of this target only (the nth host's actor); the others
    /// get them as sent. `None`: every target.
    scope: Mutex<Option<usize>>,
}

/// What happens to the `network-vif-plugged` events of one instance on their way from the
/// service to the actors (the seam of the event faults; every other event passes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFault {
    /// Dropped.
    Lost,
    /// Kept back until [`TeeSink::release_held`] (delivered late).
    Held,
    /// Delivered twice.
    Duplicated,
    /// Delivered with status `failed`.
    Failed,
    /// Delivered with the tag of a port the instance does not have.
    WrongPort,
    /// Delivered for another instance (`server_uuid` rewritten).
    OtherInstance(Uuid),
}

/// An [`EventFault`] for one instance's `network-vif-plugged` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRule {
    pub instance: Uuid,
    pub fault: EventFault,
}

impl TeeSink {
    /// Deliver to no actor (the agent crashed).
    pub fn clear_targets(&self) {
        self.targets.lock().unwrap().clear();
    }

    /// Deliver to this host's actor too: every host's actor gets every event and keeps
    /// those of the instances it knows.
    pub fn add_target(&self, to: EventsHandle) {
        self.targets.lock().unwrap().push(to);
    }

    /// The counters of every host's actor, summed.
    pub async fn stats(&self) -> EventStats {
        let targets = self.targets.lock().unwrap().clone();
        let mut sum = EventStats::default();
        for t in targets {
            sum += t.stats().await.unwrap();
        }
        sum
    }

    pub fn log(&self) -> Vec<Sent> {
        self.log.lock().unwrap().clone()
    }

    /// Ports for which `network-vif-plugged` `completed` was sent for `instance` in
    /// `[from, to]`.
    pub fn plugged(&self, instance: Uuid, from: Instant, to: Instant) -> Vec<PortId> {
        self.log()
            .into_iter()
            .filter(|s| {
                s.at >= from
                    && s.at <= to
                    && s.event.server_uuid == instance
                    && s.event.name == EventName::NetworkVifPlugged
                    && s.event.status == EventStatus::Completed
            })
            .filter_map(|s| s.event.tag.and_then(|t| t.parse().ok()))
            .collect()
    }
}

impl TeeSink {
    /// Apply `rule` to the events from now on (None: deliver as sent).
    pub fn set_event_fault(&self, rule: Option<EventRule>) {
        *self.rule.lock().unwrap() = rule;
    }

    /// Apply the rule to the events of the `nth` host's actor only (`None`: every host's).
    pub fn set_event_scope(&self, nth: Option<usize>) {
        *self.scope.lock().unwrap() = nth;
    }

    /// How many events the rule acted on so far.
    pub fn fault_hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Deliver the events a [`EventFault::Held`] rule kept back (now late); how many.
    pub fn release_held(&self) -> usize {
        let held = std::mem::take(&mut *self.held.lock().unwrap());
        let n = held.len();
        for e in held {
            self.to_targets(&e);
        }
        n
    }

    /// Deliver an event the service did not send (a stray, an early copy), logged too.
    pub fn inject(&self, event: ExternalEvent) {
        self.log.lock().unwrap().push(Sent {
            at: Instant::now(),
            event: event.clone(),
        });
        self.to_targets(&event);
    }

    fn to_targets(&self, event: &ExternalEvent) {
        for t in self.targets.lock().unwrap().iter() {
            t.deliver(event.clone());
        }
    }

    /// What the rule makes of an event: the events to deliver now.
    fn apply(&self, event: ExternalEvent) -> Vec<ExternalEvent> {
        let rule = *self.rule.lock().unwrap();
        let Some(rule) = rule.filter(|r| {
            r.instance == event.server_uuid && event.name == EventName::NetworkVifPlugged
        }) else {
            return vec![event];
        };
        self.hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match rule.fault {
            EventFault::Lost => vec![],
            EventFault::Held => {
                self.held.lock().unwrap().push(event);
                vec![]
            }
            EventFault::Duplicated => vec![event.clone(), event],
            EventFault::Failed => vec![ExternalEvent {
                status: EventStatus::Failed,
                ..event
            }],
            EventFault::WrongPort => vec![ExternalEvent {
                tag: Some(Uuid::new_v4().to_string()),
                ..event
            }],
            EventFault::OtherInstance(other) => vec![ExternalEvent {
                server_uuid: other,
                ..event
            }],
        }
    }
}

impl EventSink for TeeSink {
    fn deliver(&self, event: ExternalEvent) {
        self.log.lock().unwrap().push(Sent {
            at: Instant::now(),
            event: event.clone(),
        });
        let scope = *self.scope.lock().unwrap();
        let Some(nth) = scope else {
            for e in self.apply(event) {
                self.to_targets(&e);
            }
            return;
        };
        let faulted = self.apply(event.clone());
        let targets = self.targets.lock().unwrap().clone();
        for (i, t) in targets.iter().enumerate() {
            if i == nth {
                for e in &faulted {
                    t.deliver(e.clone());
                }
            } else {
                t.deliver(event.clone());
            }
        }
    }
}

/// Calls of [`FaultyNetwork`] a fault can be armed on (every call of [`NetworkApi`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NetCall {
    GetPort,
    UpdatePort,
    CreateBinding,
    ActivateBinding,
    DeleteBinding,
    Allocate,
    Deallocate,
    SetupNetworks,
    ListPorts,
    GetNetwork,
    CreatePort,
    DeletePort,
    ShowBindings,
}

impl NetCall {
    /// The call's name in tables and messages.
    pub fn as_str(&self) -> &'static str {
        match self {
            NetCall::GetPort => "get port",
            NetCall::UpdatePort => "update port",
            NetCall::CreateBinding => "create binding",
            NetCall::ActivateBinding => "activate binding",
            NetCall::DeleteBinding => "delete binding",
            NetCall::Allocate => "allocate",
            NetCall::Deallocate => "deallocate",
            NetCall::SetupNetworks => "setup networks",
            NetCall::ListPorts => "list ports",
            NetCall::GetNetwork => "get network",
            NetCall::CreatePort => "create port",
            NetCall::DeletePort => "delete port",
            NetCall::ShowBindings => "show bindings",
        }
    }

    /// True for calls that change the service (a timeout may have applied them).
    pub fn mutates(&self) -> bool {
        !matches!(
            self,
            NetCall::GetPort | NetCall::ListPorts | NetCall::GetNetwork | NetCall::ShowBindings
        )
    }
}

/// How an armed [`FaultyNetwork`] call fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NetFailure {
    /// The service answers this HTTP status, mapped to the error the Neutron client gives
    /// for it on that call (404 → `PortNotFound`/`BindingNotFound`/`NetworkNotFound`, 409 on
    /// a binding → `BindingExists`/`BindingAlreadyActive`, otherwise the call's variant with
    /// `Failure::Status`). Where the client reads the status as "already so" (404 on a
    /// delete, 409 on creating or activating a binding) the service really is so: the
    /// change is applied and the status is what a retry of a lost answer gets.
    Status(u16),
    /// No answer in time (`Failure::Timeout`). A change the call asked for was applied: the
    /// answer, not the request, was lost.
    Timeout,
    /// The service is down (`Failure::Connect`): this call and every later one fail until
    /// [`FaultyNetwork::set_down`]`(false)`.
    Down,
}

impl NetFailure {
    /// Every failure the matrix injects.
    pub const ALL: [NetFailure; 5] = [
        NetFailure::Status(500),
        NetFailure::Status(409),
        NetFailure::Status(404),
        NetFailure::Timeout,
        NetFailure::Down,
    ];

    pub fn label(&self) -> String {
        match self {
            NetFailure::Status(s) => s.to_string(),
            NetFailure::Timeout => "timeout".into(),
            NetFailure::Down => "down".into(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct NetFault {
    call: NetCall,
    skip: usize,
    failure: NetFailure,
}

/// The injected cause of a [`FaultyNetwork`] failure.
#[derive(Debug, thiserror::Error)]
#[error("injected network failure")]
pub struct InjectedNetworkFailure;

/// A point an operation is held at until the test lets it go.
#[derive(Debug)]
pub struct Hold {
    reached: tokio::sync::watch::Sender<bool>,
    released: tokio::sync::watch::Sender<bool>,
}

impl Default for Hold {
    fn default() -> Self {
        Hold {
            reached: tokio::sync::watch::channel(false).0,
            released: tokio::sync::watch::channel(false).0,
        }
    }
}

impl Hold {
    pub fn new() -> Arc<Hold> {
        Arc::new(Hold::default())
    }

    /// Called by the seam: mark the hold reached and wait for the release.
    pub async fn pass(&self) {
        self.reached.send_replace(true);
        let mut rx = self.released.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    pub fn is_reached(&self) -> bool {
        *self.reached.borrow()
    }

    /// Wait (10 s at most) until the operation is held here.
    pub async fn reached(&self, what: &str) {
        let mut rx = self.reached.subscribe();
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|r| *r))
            .await
            .unwrap_or_else(|_| panic!("the operation never reached {what}"))
            .unwrap();
    }

    pub fn release(&self) {
        self.released.send_replace(true);
    }
}

/// The embedded network service behind a fault seam: an armed call fails after `skip`
/// successful ones (see [`NetFailure`]); a held call waits for the test. Every call is
/// recorded. Everything else goes through.
#[derive(Debug)]
pub struct FaultyNetwork {
    inner: Arc<EmbeddedNetwork>,
    faults: Mutex<Vec<NetFault>>,
    /// Shared by the seams of every host of a cloud: the service is down for all of them.
    down: Arc<std::sync::atomic::AtomicBool>,
    calls: Mutex<Vec<NetCall>>,
    holds: Mutex<Vec<(NetCall, usize, Arc<Hold>)>>,
}

impl FaultyNetwork {
    pub fn new(inner: Arc<EmbeddedNetwork>) -> Self {
        Self::sharing(inner, Arc::default())
    }

    /// A seam whose "down" state is `down` (shared with other hosts' seams).
    pub fn sharing(inner: Arc<EmbeddedNetwork>, down: Arc<std::sync::atomic::AtomicBool>) -> Self {
        FaultyNetwork {
            inner,
            faults: Mutex::default(),
            down,
            calls: Mutex::default(),
            holds: Mutex::default(),
        }
    }

    /// Fail the next call of `call` after `skip` successful ones (once) with HTTP 503.
    pub fn fail(&self, call: NetCall, skip: usize) {
        self.fail_with(call, skip, NetFailure::Status(503));
    }

    /// Fail the next call of `call` after `skip` successful ones with `failure`.
    pub fn fail_with(&self, call: NetCall, skip: usize, failure: NetFailure) {
        self.faults.lock().unwrap().push(NetFault {
            call,
            skip,
            failure,
        });
    }

    /// Hold the next call of `call` after `skip` others until the hold is released.
    pub fn hold(&self, call: NetCall, skip: usize) -> Arc<Hold> {
        let h = Hold::new();
        self.holds.lock().unwrap().push((call, skip, h.clone()));
        h
    }

    /// The service goes down (every call of every host sharing the state fails to connect)
    /// or comes back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_down(&self) -> bool {
        self.down.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn clear(&self) {
        self.faults.lock().unwrap().clear();
        self.holds.lock().unwrap().clear();
        self.set_down(false);
    }

    pub fn armed(&self) -> usize {
        self.faults.lock().unwrap().len()
    }

    /// The calls made since the last [`FaultyNetwork::take_calls`], in order.
    pub fn take_calls(&self) -> Vec<NetCall> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }

    /// Record the call, pass a hold armed on it, and tell how it fails (if it does).
    async fn enter(&self, call: NetCall) -> Option<NetFailure> {
        self.calls.lock().unwrap().push(call);
        let hold = {
            let mut holds = self.holds.lock().unwrap();
            match holds.iter().position(|(c, _, _)| *c == call) {
                Some(i) if holds[i].1 == 0 => Some(holds.remove(i).2),
                Some(i) => {
                    holds[i].1 -= 1;
                    None
                }
                None => None,
            }
        };
        if let Some(h) = hold {
            h.pass().await;
        }
        if self.is_down() {
            return Some(NetFailure::Down);
        }
        let mut faults = self.faults.lock().unwrap();
        let i = faults.iter().position(|f| f.call == call)?;
        if faults[i].skip > 0 {
            faults[i].skip -= 1;
            return None;
        }
        let f = faults.remove(i);
        if f.failure == NetFailure::Down {
            self.set_down(true);
        }
        Some(f.failure)
    }
}

fn injected() -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(InjectedNetworkFailure)
}

/// The request failure a [`NetFailure`] is on the wire.
fn wire(f: NetFailure) -> Failure {
    match f {
        NetFailure::Status(s) => Failure::Status(s),
        NetFailure::Timeout => Failure::Timeout,
        NetFailure::Down => Failure::Connect,
    }
}

/// `Ok(())`: the call goes to the service as usual (the failure, if any, is the caller's to
/// build after it). `Err`: fail now without touching the service.
fn applied_first(call: NetCall, f: NetFailure) -> bool {
    match f {
        NetFailure::Timeout => call.mutates(),
        NetFailure::Status(404) => matches!(
            call,
            NetCall::DeleteBinding | NetCall::DeletePort | NetCall::Deallocate
        ),
        NetFailure::Status(409) => {
            matches!(call, NetCall::CreateBinding | NetCall::ActivateBinding)
        }
        _ => false,
    }
}

#[async_trait]
impl NetworkApi for FaultyNetwork {
    async fn list_instance_ports(&self, instance: Uuid) -> Result<Vec<Port>, NetworkError> {
        if let Some(f) = self.enter(NetCall::ListPorts).await {
            return Err(NetworkError::ListPorts {
                instance,
                failure: wire(f),
                source: injected(),
            });
        }
        self.inner.list_instance_ports(instance).await
    }

    async fn get_port(&self, port: PortId) -> Result<Port, NetworkError> {
        match self.enter(NetCall::GetPort).await {
            None => self.inner.get_port(port).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::PortNotFound { port }),
            Some(f) => Err(NetworkError::GetPort {
                port,
                failure: wire(f),
                source: injected(),
            }),
        }
    }

    async fn get_network(&self, network_id: &str) -> Result<NetworkSummary, NetworkError> {
        match self.enter(NetCall::GetNetwork).await {
            None => self.inner.get_network(network_id).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::NetworkNotFound {
                network: network_id.to_owned(),
            }),
            Some(f) => Err(NetworkError::GetNetwork {
                network: network_id.to_owned(),
                failure: wire(f),
                source: injected(),
            }),
        }
    }

    async fn create_port(&self, network_id: &str) -> Result<Port, NetworkError> {
        match self.enter(NetCall::CreatePort).await {
            None => self.inner.create_port(network_id).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::NetworkNotFound {
                network: network_id.to_owned(),
            }),
            Some(f) => {
                if applied_first(NetCall::CreatePort, f) {
                    let _ = self.inner.create_port(network_id).await;
                }
                Err(NetworkError::CreatePort {
                    network: network_id.to_owned(),
                    failure: wire(f),
                    source: injected(),
                })
            }
        }
    }

    async fn update_port(&self, port: PortId, update: &PortUpdate) -> Result<Port, NetworkError> {
        match self.enter(NetCall::UpdatePort).await {
            None => self.inner.update_port(port, update).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::PortNotFound { port }),
            Some(f) => {
                if applied_first(NetCall::UpdatePort, f) {
                    let _ = self.inner.update_port(port, update).await;
                }
                Err(NetworkError::UpdatePort {
                    port,
                    failure: wire(f),
                    source: injected(),
                })
            }
        }
    }

    async fn delete_port(&self, port: PortId) -> Result<Removal, NetworkError> {
        match self.enter(NetCall::DeletePort).await {
            None => self.inner.delete_port(port).await,
            Some(NetFailure::Status(404)) => {
                let _ = self.inner.delete_port(port).await;
                Ok(Removal::AlreadyGone)
            }
            Some(f) => {
                if applied_first(NetCall::DeletePort, f) {
                    let _ = self.inner.delete_port(port).await;
                }
                Err(NetworkError::DeletePort {
                    port,
                    failure: wire(f),
                    source: injected(),
                })
            }
        }
    }

    async fn show_bindings(&self, port: PortId) -> Result<Vec<PortBinding>, NetworkError> {
        match self.enter(NetCall::ShowBindings).await {
            None => self.inner.show_bindings(port).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::PortNotFound { port }),
            Some(f) => Err(NetworkError::ShowBindings {
                port,
                failure: wire(f),
                source: injected(),
            }),
        }
    }

    async fn create_binding(
        &self,
        port: PortId,
        binding: &NewBinding,
    ) -> Result<PortBinding, NetworkError> {
        match self.enter(NetCall::CreateBinding).await {
            None => self.inner.create_binding(port, binding).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::PortNotFound { port }),
            Some(f) => {
                if applied_first(NetCall::CreateBinding, f) {
                    let _ = self.inner.create_binding(port, binding).await;
                }
                if f == NetFailure::Status(409) {
                    return Err(NetworkError::BindingExists {
                        port,
                        host: binding.host.clone(),
                    });
                }
                Err(NetworkError::CreateBinding {
                    port,
                    host: binding.host.clone(),
                    failure: wire(f),
                    source: injected(),
                })
            }
        }
    }

    async fn activate_binding(
        &self,
        port: PortId,
        host: &str,
    ) -> Result<PortBinding, NetworkError> {
        match self.enter(NetCall::ActivateBinding).await {
            None => self.inner.activate_binding(port, host).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::BindingNotFound {
                port,
                host: host.to_owned(),
            }),
            Some(f) => {
                if applied_first(NetCall::ActivateBinding, f) {
                    let _ = self.inner.activate_binding(port, host).await;
                }
                if f == NetFailure::Status(409) {
                    return Err(NetworkError::BindingAlreadyActive {
                        port,
                        host: host.to_owned(),
                    });
                }
                Err(NetworkError::ActivateBinding {
                    port,
                    host: host.to_owned(),
                    failure: wire(f),
                    source: injected(),
                })
            }
        }
    }

    async fn delete_binding(&self, port: PortId, host: &str) -> Result<Removal, NetworkError> {
        match self.enter(NetCall::DeleteBinding).await {
            None => self.inner.delete_binding(port, host).await,
            Some(NetFailure::Status(404)) => {
                let _ = self.inner.delete_binding(port, host).await;
                Ok(Removal::AlreadyGone)
            }
            Some(f) => {
                if applied_first(NetCall::DeleteBinding, f) {
                    let _ = self.inner.delete_binding(port, host).await;
                }
                Err(NetworkError::DeleteBinding {
                    port,
                    host: host.to_owned(),
                    failure: wire(f),
                    source: injected(),
                })
            }
        }
    }

    async fn allocate_for_instance(
        &self,
        instance: Uuid,
        host: &str,
        requests: &[PortRequest],
    ) -> Result<NetworkInfo, NetworkError> {
        match self.enter(NetCall::Allocate).await {
            None => {
                self.inner
                    .allocate_for_instance(instance, host, requests)
                    .await
            }
            // A composite call: the service's own clean-up of a failed allocation ran.
            Some(NetFailure::Status(404)) => Err(NetworkError::NetworkNotFound {
                network: "any".into(),
            }),
            Some(f) => Err(NetworkError::CreatePort {
                network: "any".into(),
                failure: wire(f),
                source: injected(),
            }),
        }
    }

    async fn deallocate_for_instance(
        &self,
        instance: Uuid,
        network_info: &NetworkInfo,
    ) -> Result<Deallocation, NetworkError> {
        let port = network_info
            .vifs
            .first()
            .map_or(PortId(Uuid::nil()), |v| v.id);
        match self.enter(NetCall::Deallocate).await {
            None => {
                self.inner
                    .deallocate_for_instance(instance, network_info)
                    .await
            }
            // A 404 on a port is "already gone" to the client: the deallocation completes.
            Some(NetFailure::Status(404)) => {
                self.inner
                    .deallocate_for_instance(instance, network_info)
                    .await
            }
            Some(f) => {
                let done = if applied_first(NetCall::Deallocate, f) {
                    self.inner
                        .deallocate_for_instance(instance, network_info)
                        .await
                        .unwrap_or_default()
                } else {
                    Deallocation::default()
                };
                Err(NetworkError::Deallocate {
                    instance,
                    done: Box::new(done),
                    failures: vec![NetworkError::DeletePort {
                        port,
                        failure: wire(f),
                        source: injected(),
                    }],
                })
            }
        }
    }

    async fn setup_networks_on_host(
        &self,
        instance: Uuid,
        host: &str,
        teardown: bool,
        migration: Option<&MigrationHosts>,
    ) -> Result<Vec<HostSetupChange>, NetworkError> {
        match self.enter(NetCall::SetupNetworks).await {
            None => {
                self.inner
                    .setup_networks_on_host(instance, host, teardown, migration)
                    .await
            }
            // A 404 on a port is skipped by the client's flow: the setup completes.
            Some(NetFailure::Status(404)) => {
                self.inner
                    .setup_networks_on_host(instance, host, teardown, migration)
                    .await
            }
            Some(f) => {
                let done = if applied_first(NetCall::SetupNetworks, f) {
                    self.inner
                        .setup_networks_on_host(instance, host, teardown, migration)
                        .await
                        .unwrap_or_default()
                } else {
                    Vec::new()
                };
                Err(NetworkError::SetupNetworksOnHost {
                    instance,
                    done,
                    failures: vec![NetworkError::UpdatePort {
                        port: PortId(Uuid::nil()),
                        failure: wire(f),
                        source: injected(),
                    }],
                })
            }
        }
    }
}

/// A plugger call a [`PlugGate`] can hold an operation at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PlugPoint {
    Plug,
    Unplug,
    /// libvirt made the domain's devices (it started).
    Attached,
    /// libvirt removed the domain's devices (it stopped).
    Detached,
}

/// The pause seam of the plugger: holds an operation at a [`PlugPoint`].
#[derive(Debug, Default)]
pub struct PlugGate {
    holds: Mutex<Vec<(PlugPoint, usize, Arc<Hold>)>>,
}

impl PlugGate {
    /// Hold the operation at the next call of `point` after `skip` others.
    pub fn hold(&self, point: PlugPoint, skip: usize) -> Arc<Hold> {
        let h = Hold::new();
        self.holds.lock().unwrap().push((point, skip, h.clone()));
        h
    }

    pub fn clear(&self) {
        self.holds.lock().unwrap().clear();
    }

    async fn pass(&self, point: PlugPoint) {
        let hold = {
            let mut holds = self.holds.lock().unwrap();
            match holds.iter().position(|(p, _, _)| *p == point) {
                Some(i) if holds[i].1 == 0 => Some(holds.remove(i).2),
                Some(i) => {
                    holds[i].1 -= 1;
                    None
                }
                None => None,
            }
        };
        if let Some(h) = hold {
            h.pass().await;
        }
    }
}

/// The recording plugger behind a [`PlugGate`] (the hosts of a [`TestCloud`] use it).
#[derive(Debug)]
pub struct GatedPlugger {
    inner: Arc<RecordingPlugger>,
    gate: Arc<PlugGate>,
}

#[async_trait]
impl VifPlugger for GatedPlugger {
    async fn plug(
        &self,
        ctx: &vireo_actors::plug::PlugContext,
        vif: &vireo_actors::vif::Vif,
    ) -> Result<vireo_actors::plug::Plugged, vireo_actors::plug::PlugError> {
        self.gate.pass(PlugPoint::Plug).await;
        self.inner.plug(ctx, vif).await
    }

    async fn unplug(
        &self,
        ctx: &vireo_actors::plug::PlugContext,
        vif: &vireo_actors::vif::Vif,
    ) -> Result<(), vireo_actors::plug::PlugError> {
        self.gate.pass(PlugPoint::Unplug).await;
        self.inner.unplug(ctx, vif).await
    }

    fn wiring(&self) -> Arc<dyn vireo_actors::wiring::WiringSource> {
        self.inner.wiring()
    }

    async fn devices_attached(&self, ports: &[PortId]) {
        self.gate.pass(PlugPoint::Attached).await;
        self.inner.devices_attached(ports).await
    }

    async fn devices_detached(&self, ports: &[PortId]) {
        self.gate.pass(PlugPoint::Detached).await;
        self.inner.devices_detached(ports).await
    }
}

/// Every libvirt worker of a connection busy with a call that waits for the test: the next
/// call an operation makes queues behind them (the operation is held there).
#[derive(Debug)]
pub struct LibvirtHold {
    gate: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl LibvirtHold {
    /// Occupy every worker of `lv`; returns once all of them are held.
    pub async fn start(lv: &vireo_actors::libvirt::LibvirtHandle) -> LibvirtHold {
        let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let entered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers = lv.config().workers;
        let mut tasks = Vec::new();
        for _ in 0..workers {
            let (lv, gate, entered) = (lv.clone(), gate.clone(), entered.clone());
            tasks.push(tokio::spawn(async move {
                let _ = lv
                    .call_with_timeout("test hold", Duration::from_secs(120), move |_conn| {
                        entered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let (lock, cv) = &*gate;
                        let mut released = lock.lock().unwrap();
                        while !*released {
                            released = cv.wait(released).unwrap();
                        }
                        Ok(())
                    })
                    .await;
            }));
        }
        eventually(Duration::from_secs(10), "every libvirt worker held", || {
            let n = entered.load(std::sync::atomic::Ordering::SeqCst);
            async move { (n == workers).then_some(()) }
        })
        .await;
        LibvirtHold { gate, tasks }
    }

    /// Let the workers go; returns once they are free.
    pub async fn release(mut self) {
        self.open();
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
    }

    fn open(&self) {
        let (lock, cv) = &*self.gate;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }
}

impl Drop for LibvirtHold {
    fn drop(&mut self) {
        self.open();
    }
}

/// What a test cloud is made of.
#[derive(Debug, Clone)]
pub struct Spec {
    pub hosts: Vec<String>,
    pub instances: InstanceConfig,
    pub event_delay_ms: u64,
    /// Hosts whose libvirt is a private libvirtd (the socket it listens on) instead of an
    /// in-process `test:///` connection: the host's node file is read by that daemon.
    pub remote: BTreeMap<String, PathBuf>,
}

/// Hosts `hosts`, fatal waits of 30 s (an operation that waits that long has failed), fast
/// power-off polling and a 100 ms lifecycle debounce.
pub fn spec(hosts: &[&str]) -> Spec {
    Spec {
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        instances: InstanceConfig {
            wait: WaitPolicy {
                timeout: Duration::from_secs(30),
                fatal: true,
            },
            profile_wait: Duration::from_secs(2),
            power_off_timeout: Duration::from_secs(5),
            power_off_poll: Duration::from_millis(20),
            lifecycle_debounce: Duration::from_millis(100),
            ..InstanceConfig::default()
        },
        event_delay_ms: 0,
        remote: BTreeMap::new(),
    }
}

impl Spec {
    /// `host`'s libvirt is the private libvirtd listening on `socket`.
    pub fn remote(mut self, host: &str, socket: PathBuf) -> Self {
        self.remote.insert(host.to_owned(), socket);
        self
    }

    pub fn timeout(mut self, t: Duration) -> Self {
        self.instances.wait.timeout = t;
        self
    }

    pub fn event_delay_ms(mut self, ms: u64) -> Self {
        self.event_delay_ms = ms;
        self
    }

    pub async fn start(self) -> TestCloud {
        TestCloud::start(self).await
    }
}

/// One host of a test cloud.
#[derive(Debug)]
pub struct Host {
    pub name: String,
    pub driver: Arc<LibvirtDriver>,
    pub plugger: Arc<RecordingPlugger>,
    pub net: Arc<FaultyNetwork>,
    pub uri: String,
    /// The pause seam in front of the plugger.
    pub gate: Arc<PlugGate>,
    /// The test-driver node file the host's connection was opened on.
    pub node_file: PathBuf,
}

/// Compute hosts on private `test:///` files sharing one actor system, one network-event
/// actor and the embedded network service (as `vireo::local::LocalCloud`), with the
/// service's events logged ([`TeeSink`]), a network fault seam per host ([`FaultyNetwork`]),
/// and the means to crash the agent and start it again on the domains it left.
#[derive(Debug)]
pub struct TestCloud {
    pub system: Arc<ActorSystem>,
    pub network: Arc<EmbeddedNetwork>,
    pub sink: Arc<TeeSink>,
    pub peers: Arc<Peers>,
    pub hosts: Vec<Host>,
    pub spec: Spec,
    pub dir: Arc<TempDir>,
    files: usize,
    net_down: Arc<std::sync::atomic::AtomicBool>,
}

/// What survives an agent crash: the network service, the host devices (the pluggers) and
/// the directory.
#[derive(Debug)]
pub struct Remains {
    pub network: Arc<EmbeddedNetwork>,
    pub sink: Arc<TeeSink>,
    pub pluggers: BTreeMap<String, Arc<RecordingPlugger>>,
    pub spec: Spec,
    pub dir: Arc<TempDir>,
    files: usize,
    net_down: Arc<std::sync::atomic::AtomicBool>,
}

pub async fn on_thread<T: Send + 'static>(
    system: &ActorSystem,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = tokio::sync::oneshot::channel();
    system.arbiter().spawn(async move {
        let _ = tx.send(f());
    });
    rx.await.unwrap()
}

/// libvirt validates domain XML in this process on `test:///` connections (RelaxNG, through
/// libxml2). libxml2 2.9 builds its XML Schema type library lazily and not thread-safely:
/// the first validations running at once on several threads can fail with "Error type
/// 'unsignedLong' is not exported by type library". One validated define before any test
/// goes on builds it once.
pub async fn warm_up_libvirt() {
    static WARM: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    WARM.get_or_init(|| async {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("warm-up.xml");
        std::fs::write(&file, "<node/>\n").unwrap();
        let lv = vireo_actors::libvirt::Libvirt::open(LibvirtConfig::for_uri(test_uri(&file)))
            .await
            .unwrap();
        let id = Uuid::new_v4();
        lv.define_xml(
            format!(
                "<domain type='test'><name>warm-up</name><uuid>{id}</uuid>\
                 <memory>65536</memory><vcpu>1</vcpu><os><type>hvm</type></os></domain>"
            ),
            true,
        )
        .await
        .unwrap();
        lv.undefine(id).await.unwrap();
    })
    .await;
}

impl TestCloud {
    pub async fn start(spec: Spec) -> TestCloud {
        warm_up_libvirt().await;
        let system = Arc::new(ActorSystem::start().unwrap());
        let sink = Arc::new(TeeSink::default());
        let cfg = EmbeddedConfig {
            networks: networks(),
            event_delay_ms: spec.event_delay_ms,
            ..EmbeddedConfig::default()
        };
        let s: Arc<dyn EventSink> = sink.clone();
        let network = on_thread(&system, move || EmbeddedNetwork::new(cfg, s))
            .await
            .unwrap();
        let remains = Remains {
            network,
            sink,
            pluggers: BTreeMap::new(),
            spec: spec.clone(),
            dir: Arc::new(tempfile::tempdir().unwrap()),
            files: 0,
            net_down: Arc::default(),
        };
        let nodes = spec.hosts.iter().map(|h| (h.clone(), None)).collect();
        Self::restart_on(system, remains, nodes).await
    }

    /// Start the agent again after [`TestCloud::crash`]: every host on a fresh connection to
    /// a new test-driver file holding the domains given (the node XML's `<domain>`
    /// elements), with the same network service and host devices.
    pub async fn restart(remains: Remains, domains: BTreeMap<String, String>) -> TestCloud {
        let system = Arc::new(ActorSystem::start().unwrap());
        let nodes = remains
            .spec
            .hosts
            .iter()
            .map(|h| (h.clone(), domains.get(h).cloned()))
            .collect();
        Self::restart_on(system, remains, nodes).await
    }

    async fn restart_on(
        system: Arc<ActorSystem>,
        remains: Remains,
        nodes: Vec<(String, Option<String>)>,
    ) -> TestCloud {
        remains.sink.clear_targets();
        let mut cloud = TestCloud {
            system,
            network: remains.network,
            sink: remains.sink,
            peers: Peers::new(),
            hosts: Vec::new(),
            spec: remains.spec,
            dir: remains.dir,
            files: remains.files,
            net_down: remains.net_down,
        };
        let mut pluggers = remains.pluggers;
        for (name, domains) in nodes {
            let plugger = pluggers
                .remove(&name)
                .unwrap_or_else(|| Arc::new(RecordingPlugger::new()));
            cloud.add_host(&name, plugger, domains.as_deref()).await;
        }
        cloud
    }

    async fn add_host(
        &mut self,
        name: &str,
        plugger: Arc<RecordingPlugger>,
        domains: Option<&str>,
    ) {
        self.files += 1;
        let file: PathBuf = self.dir.path().join(format!("{name}-{}.xml", self.files));
        std::fs::write(&file, format!("<node>\n{}</node>\n", domains.unwrap_or(""))).unwrap();
        let remote = self.spec.remote.get(name).cloned();
        let uri = match &remote {
            Some(socket) => format!("test+unix://{}?socket={}", file.display(), socket.display()),
            None => test_uri(&file),
        };
        let (n, h, w) = (self.network.clone(), name.to_owned(), plugger.wiring());
        on_thread(&self.system, move || n.attach_host(&h, w))
            .await
            .unwrap();
        let net = Arc::new(FaultyNetwork::sharing(
            self.network.clone(),
            self.net_down.clone(),
        ));
        let libvirt = match remote {
            // A daemon that dies or freezes is noticed within ~2 s and reconnected to fast.
            Some(_) => LibvirtConfig {
                keepalive: vireo_actors::libvirt::Keepalive {
                    interval_s: 1,
                    count: 1,
                },
                reconnect_min_ms: 50,
                reconnect_max_ms: 200,
                call_timeout_ms: 30_000,
                join_timeout_ms: 500,
                ..LibvirtConfig::for_uri(uri.clone())
            },
            None => LibvirtConfig::for_uri(uri.clone()),
        };
        let gate = Arc::new(PlugGate::default());
        let config = DriverConfig {
            host: name.to_owned(),
            libvirt,
            instances: self.spec.instances.clone(),
            events: EventConfig::default(),
            plugging: PluggingConfig::Static,
            network: NetworkConfig::Embedded(EmbeddedConfig::default()),
            migration_uri: Some(uri.clone()),
        };
        let events = self.system.start_events(EventConfig::default());
        self.sink.add_target(events.clone());
        let driver = LibvirtDriver::builder(config)
            .system(self.system.clone())
            .events(events)
            .peers(self.peers.clone())
            .network(SharedNetwork::Api(net.clone()))
            .plugger(Arc::new(GatedPlugger {
                inner: plugger.clone(),
                gate: gate.clone(),
            }))
            .build()
            .await
            .unwrap();
        self.hosts.push(Host {
            name: name.to_owned(),
            driver: Arc::new(driver),
            plugger,
            net,
            uri,
            gate,
            node_file: file,
        });
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts.iter().find(|h| h.name == name).unwrap()
    }

    /// The agent dies: the actor system stops with whatever operation was running (no
    /// rollback runs); libvirt's test driver loses its per-connection state with the
    /// connection. Call [`TestCloud::dump_domains`] first to keep the domains.
    pub fn crash(self) -> Remains {
        let TestCloud {
            system,
            network,
            sink,
            peers,
            hosts,
            spec,
            dir,
            files,
            net_down,
        } = self;
        let pluggers = hosts
            .iter()
            .map(|h| (h.name.clone(), h.plugger.clone()))
            .collect();
        drop(hosts);
        drop(peers);
        sink.clear_targets();
        assert_eq!(
            Arc::strong_count(&system),
            1,
            "something still holds the actor system"
        );
        drop(system);
        Remains {
            network,
            sink,
            pluggers,
            spec,
            dir,
            files,
            net_down,
        }
    }

    /// Every domain of every host as `<domain>` elements for a test-driver node file, each
    /// in the state it is in now (libvirt's test driver starts node-file domains running
    /// unless `test:runstate` says otherwise).
    pub async fn dump_domains(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for h in &self.hosts {
            let lv = h.driver.libvirt();
            let mut xml = String::new();
            for d in lv.list_all().await.unwrap() {
                let desc = lv.xml_desc(d.uuid, true).await.unwrap();
                let runstate = match d.state {
                    vireo_actors::libvirt::DomainState::Running => 1,
                    vireo_actors::libvirt::DomainState::Paused => 3,
                    _ => 5,
                };
                let desc = desc.replacen(
                    "<domain ",
                    "<domain xmlns:test='http://libvirt.org/schemas/domain/test/1.0' ",
                    1,
                );
                let desc = desc.replacen(
                    "</domain>",
                    &format!("  <test:runstate>{runstate}</test:runstate>\n</domain>"),
                    1,
                );
                xml.push_str(&desc);
                xml.push('\n');
            }
            out.insert(h.name.clone(), xml);
        }
        out
    }

    /// Write `host`'s domains, as they are now, into its node file: what a new connection
    /// (after a reconnect, or a restart of its private libvirtd) finds, as a real libvirtd
    /// finds its domains again after a restart.
    pub async fn persist_domains(&self, host: &str) {
        let dump = self.dump_domains().await;
        let h = self.host(host);
        std::fs::write(&h.node_file, format!("<node>\n{}</node>\n", dump[host])).unwrap();
    }

    /// Stop every host and the event actor.
    pub async fn shutdown(&self) {
        for h in &self.hosts {
            h.driver.shutdown(Duration::from_secs(5)).await;
            let _ = h.driver.events().shutdown().await;
        }
    }

    pub async fn stats(&self) -> EventStats {
        self.sink.stats().await
    }

    /// A port of the service.
    pub async fn port(&self, id: PortId) -> Port {
        self.network.get_port(id).await.unwrap()
    }

    /// Wait (2 s at most) until the port has `status`: the service hears of devices that
    /// go away through its watcher, a moment later.
    pub async fn port_eventually(&self, id: PortId, status: vireo_actors::network::PortStatus) {
        eventually(
            Duration::from_secs(2),
            &format!("{id} {status}"),
            || async { (self.port(id).await.status == status).then_some(()) },
        )
        .await
    }

    /// [`leak_check`] of this cloud.
    pub async fn assert_clean(&self, user_ports: &[PortId]) {
        let hosts: Vec<_> = self
            .hosts
            .iter()
            .map(|h| (h.name.as_str(), &*h.driver, &*h.plugger))
            .collect();
        let events: Vec<EventsHandle> = self
            .hosts
            .iter()
            .map(|h| h.driver.events().clone())
            .collect();
        leak_check(&hosts, &self.network, &events, user_ports).await;
    }

    /// Destroy (with deallocation) on every host that knows it.
    pub async fn destroy_everywhere(&self, id: Uuid) {
        for h in &self.hosts {
            h.driver
                .destroy(
                    id,
                    vireo_actors::instance::DestroyArgs {
                        deallocate_network: true,
                    },
                )
                .await
                .unwrap();
        }
    }

    /// A user-supplied (pre-created, unbound) port on `network`.
    pub async fn user_port(&self, network: &str) -> PortId {
        self.network.create_port(network).await.unwrap().id
    }

    /// Delete user ports at the end of a test (after the leak check saw them unbound).
    pub async fn delete_ports(&self, ports: &[PortId]) {
        for p in ports {
            self.network.delete_port(*p).await.unwrap();
        }
    }
}

/// Poll `f` until it returns `Some` or `within` passes.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The view of an instance once its running operation reached `phase`.
pub async fn at_phase(driver: &LibvirtDriver, id: Uuid, phase: &str) -> InstanceView {
    eventually(Duration::from_secs(10), phase, || async {
        match driver.show(id).await {
            Ok(v) if v.operation.as_ref().is_some_and(|o| o.phase == phase) => Some(v),
            _ => None,
        }
    })
    .await
}

/// The waits of a report with timing `t`, their expected ports in order.
pub fn waited(report: &OpReport, t: Timing) -> Vec<PortId> {
    report
        .waits
        .iter()
        .filter(|w| w.timing == t)
        .flat_map(|w: &WaitReport| w.expected.iter().map(|e| e.tag))
        .collect()
}

pub fn set(ports: impl IntoIterator<Item = PortId>) -> BTreeSet<PortId> {
    ports.into_iter().collect()
}

/// The error chain of an instance error, for messages.
pub fn chain(e: &InstanceError) -> String {
    vireo_actors::instance::error_chain(e)
}

/// The ports of an instance, by the networks they are on (in `view` order).
pub async fn ports_by_network(c: &TestCloud, view: &InstanceView) -> BTreeMap<String, PortId> {
    let mut out = BTreeMap::new();
    for v in &view.vifs {
        let p = c.port(v.port).await;
        out.insert(p.network_id, v.port);
    }
    out
}

/// A network_info for user ports as they are now (preserve_on_delete), for
/// `NetworkRequest::Allocated`.
pub async fn network_info(net: &dyn NetworkApi, ports: &[PortId]) -> NetworkInfo {
    let mut vifs = Vec::new();
    for p in ports {
        let port = net.get_port(*p).await.unwrap();
        let summary = net.get_network(&port.network_id).await.unwrap();
        vifs.push(vireo::network::vif_dict(&port, &summary, true));
    }
    NetworkInfo::from_value(&serde_json::Value::Array(vifs)).unwrap()
}

/// A user port of `id` whose `network-vif-plugged` never comes, and its VIF: bound to h1
/// when the caller read `network_info`, then moved to a host without an L2 agent.
pub async fn silent_port(
    c: &TestCloud,
    id: Uuid,
    network: &str,
) -> (PortId, vireo_actors::vif::Vif) {
    let p = c.user_port(network).await;
    c.network
        .update_port(
            p,
            &PortUpdate {
                host_id: Some("h1".into()),
                device_id: Some(id.to_string()),
                device_owner: Some("compute:nova".into()),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
    let vif = network_info(&*c.network, &[p]).await.vifs.remove(0);
    c.network
        .update_port(
            p,
            &PortUpdate {
                host_id: Some("elsewhere".into()),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
    (p, vif)
}

/// An unbound user port keeps no binding for another host. (The service shows bindings of
/// compute ports only: the port is made one for the look.)
pub async fn assert_no_inactive_binding(c: &TestCloud, p: PortId) {
    let Ok(port) = c.network.get_port(p).await else {
        return;
    };
    let owner = |o: &str| PortUpdate {
        device_owner: Some(o.to_owned()),
        ..PortUpdate::default()
    };
    c.network
        .update_port(p, &owner("compute:nova"))
        .await
        .unwrap();
    let bindings = c.network.show_bindings(p).await.unwrap();
    c.network
        .update_port(p, &owner(&port.device_owner))
        .await
        .unwrap();
    let inactive: Vec<_> = bindings
        .iter()
        .filter(|b| b.status == vireo_actors::network::BindingStatus::Inactive)
        .collect();
    assert!(inactive.is_empty(), "user port {p} keeps {inactive:?}");
}

/// Leak check: no domain on any host, nothing plugged, no instance actor, no port left but
/// `user_ports` and those unbound (no host, device id/owner, PCI keys, `migrating_to`),
/// nothing wired, no pending wait.
pub async fn leak_check(
    hosts: &[(&str, &LibvirtDriver, &RecordingPlugger)],
    network: &EmbeddedNetwork,
    events: &[EventsHandle],
    user_ports: &[PortId],
) {
    for (name, driver, plugger) in hosts {
        let domains = driver.libvirt().list_all().await.unwrap();
        assert!(domains.is_empty(), "{name}: domains left: {domains:?}");
        let plugged = plugger.plugged();
        assert!(plugged.is_empty(), "{name}: plugged left: {plugged:?}");
        let views = driver.list().await;
        assert!(views.is_empty(), "{name}: instances left: {views:?}");
    }
    for p in network.ports() {
        assert!(
            user_ports.contains(&p.id),
            "port {} created by vireo left behind: {p:?}",
            p.id
        );
        assert!(p.host_id.is_empty(), "port {} still bound: {p:?}", p.id);
        assert!(p.device_id.is_empty(), "port {} device id: {p:?}", p.id);
        assert!(p.device_owner.is_empty(), "port {} owner: {p:?}", p.id);
        for k in PCI_PROFILE_KEYS {
            assert!(!p.profile.contains_key(k), "port {} keeps {k}: {p:?}", p.id);
        }
        assert!(p.migrating_to().is_none(), "port {} migrating_to", p.id);
    }
    // The service learns of unplugs through its watcher, and the event actor of ended
    // waits through its mailbox: both may lag a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut stats = EventStats::default();
        for e in events {
            stats += e.stats().await.unwrap();
        }
        let wired: Vec<(String, PortId)> = network
            .ports()
            .iter()
            .flat_map(|p| {
                hosts
                    .iter()
                    .filter(|(name, _, _)| network.is_wired(name, p.id))
                    .map(|(name, _, _)| (name.to_string(), p.id))
            })
            .collect();
        // Nothing of an instance is left once it is gone: no wait, no buffered event, no
        // entry (the actor forgets an instance when it goes).
        if stats.waits_now == 0
            && stats.buffered_now == 0
            && stats.instances_now == 0
            && wired.is_empty()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "waits, buffered events or instances left: {stats:?}; still wired: {wired:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl Cloud {
    /// [`leak_check`] of a `LocalCloud`.
    pub async fn assert_clean(&self, user_ports: &[PortId]) {
        let hosts: Vec<_> = self
            .cloud
            .hosts
            .iter()
            .map(|h| (h.name.as_str(), &*h.driver, &*h.plugger))
            .collect();
        let events = self.cloud.events.handles();
        leak_check(&hosts, &self.cloud.network, &events, user_ports).await;
    }
}

/// The host domain `id`'s vireo record names as its owner on `lv` (None: no owner recorded).
pub async fn owner_of(lv: &vireo_actors::libvirt::LibvirtHandle, id: Uuid) -> Option<String> {
    let xml = lv
        .get_metadata(
            id,
            vireo_xml::metadata::NAMESPACE_URI,
            vireo_actors::libvirt::Affect::Current,
        )
        .await
        .unwrap()
        .expect("no vireo metadata");
    let meta = vireo_xml::metadata::VireoMetadata::from_xml(&xml).unwrap();
    vireo_actors::instance::InstanceRecord::owner(&meta).unwrap()
}
