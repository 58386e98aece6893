//! The embedded network service: an in-process port store that behaves like Neutron with
//! ML2 (openvswitch / linuxbridge / sriovnicswitch) and its Nova notifier, for hosts with no
//! Neutron. One [`EmbeddedNetwork`] is shared (`Arc`) by every host of a process.
//!
//! It owns networks (from [`EmbeddedConfig`]) and ports (id, MAC, network, device id/owner,
//! active binding: host, vnic_type, vif_type, vif_details, profile; inactive bindings per
//! host; status). Each attached host ([`EmbeddedNetwork::attach_host`]) plays the part of
//! that host's L2 agent: the service learns what is wired there from a
//! [`WiringSource`] and moves ports the way Neutron's server does when its agent reports a
//! device up or down. It never calls vireo's event prediction: it is the ground truth that
//! prediction is tested against.
//!
//! # Rules (Neutron Zed, read from its code)
//!
//! `driver/tests/network_neutron.rs` runs one scenario against a real Neutron (ML2/OVS,
//! a real OVS device in br-int) and this service and requires the same events at every step:
//! bind, plug, same-host rebind, move away, move back with the device present (bind time),
//! set and clear `migrating_to`, unplug, re-plug, create an inactive binding, activate it,
//! delete. The destination-plug rule (`migrating_to`) and the agentless rules could not be
//! checked there (one real agent, no SR-IOV) and rest on Neutron's code.
//!
//! Statuses and events (`neutron/notifiers/nova.py`, `record_port_status_changed`):
//! ACTIVE → DOWN sends `network-vif-unplugged`; DOWN/BUILD → ACTIVE sends
//! `network-vif-plugged` `completed`; DOWN/BUILD → ERROR sends `network-vif-plugged`
//! `failed`; no other transition sends anything. Only "compute ports" are reported: a UUID
//! `device_id` and a `compute:` owner (`_can_notify`); the event's `server_uuid` is the
//! device id and its `tag` the port id.
//!
//! - **Binding change** (`ml2/plugin.py` `_process_port_binding`): a port update that changes
//!   `binding:host_id`, `binding:vnic_type` or `binding:profile` clears the binding and sets
//!   the port DOWN (`network-vif-unplugged` if it was ACTIVE), then binds it again. A binding
//!   update that changes none of them changes nothing and sends no status event, except that
//!   any update of a port with a host but no usable binding (`unbound`, `binding_failed`)
//!   tries to bind it again (`_bind_port_if_needed`).
//! - **Binding**: an agent-served vnic type (`normal` on openvswitch/linuxbridge networks;
//!   `direct`/`macvtap` on networks with a physical network, the SR-IOV agent) binds only on a
//!   host with an agent, here an attached host; elsewhere the binding fails
//!   (`binding_failed`, port stays DOWN). `direct-physical` and `remote-managed` are
//!   agentless: bound anywhere and set ACTIVE at bind (`mech_sriov` `try_to_bind_segment_for_agent`
//!   binds with `status=ACTIVE` when no agent is involved) → `network-vif-plugged`.
//! - **Agent-served ports become ACTIVE when the agent on the bound host reports the device
//!   up** (`ml2/rpc.py` `update_device_up` → provisioning complete → `_port_provisioned`).
//!   The agent reports a device when it appears (wired) and when it is told the port changed:
//!   after a binding change every attached host where the device is wired re-processes it
//!   (port_update fan-out). So: wired on the new host already → ACTIVE right after the
//!   binding update (the "bind-time" event); not wired → ACTIVE when it gets wired (plug
//!   time). A profile change on a plugged port therefore gives `network-vif-unplugged` then
//!   `network-vif-plugged` (as measured in NEUTRON.md).
//! - **Device up on a host the port is not bound to**: nothing, unless the active binding's
//!   profile has `migrating_to` (any value), then `network-vif-plugged` `completed` with no
//!   status change (`get_device_details` returns full details while migrating, the agent
//!   reports up, the server calls `notify_port_active_direct`). This is what a live
//!   migration's destination plug produces.
//! - **Device down (unwired) on the bound host** → DOWN (`network-vif-unplugged` if it was
//!   ACTIVE) (`update_device_down`); on another host: nothing.
//! - **Port update** of a compute port (any attribute) → `network-changed` (no status), after
//!   the status events of the update itself (`send_network_change` on the API response).
//!   **Delete** → `network-vif-deleted`. Creating a port sends nothing.
//! - **Multiple bindings** (`create_port_binding`, `activate`, `delete_port_binding`): a new
//!   binding for a host is inactive, sends nothing, and is refused with 409 when the host has
//!   one already, with 400 for a non-compute port, and fails for a host where binding fails.
//!   Activation: 409 when already active, 404 when there is no binding for the host;
//!   otherwise the old active binding is cleared (`vif_type` `unbound`) and kept inactive, the
//!   port goes DOWN (`network-vif-unplugged`), and the new host's agent processes the device
//!   if it is wired there (→ ACTIVE, `network-vif-plugged`). An agentless port stays DOWN
//!   after activation (Neutron's activation does not reuse the bind-time status). Deleting a
//!   binding sends nothing. (Neutron's agent on the old host also removes the device from
//!   br-int on activation; this service has no hands on the host and leaves that to vireo.)
//! - [`EmbeddedNetwork::set_port_error`] injects an ERROR status (`network-vif-plugged`
//!   `failed` from DOWN/BUILD), which a real agent produces when wiring fails.
//!
//! Neutron sends events in 2 s batches, 0.3–1.6 s after the cause. `event_delay_ms` delays
//! every event by a fixed time (tokio time: tests can pause it), keeping their order. With no
//! delay, events are handed to the sink while the store's lock is held, in causal order: the
//! sink must not call back into the service.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};
use uuid::Uuid;
use vireo_actors::external::{EventName, EventSink, EventStatus, ExternalEvent};
use vireo_actors::network::{
    BindingStatus, Deallocation, Failure, HostSetupChange, MigrationHosts, NetworkApi,
    NetworkError, NetworkSummary, NewBinding, Port, PortBinding, PortRequest, PortStatus,
    PortUpdate, Removal, VIF_TYPE_BINDING_FAILED, VIF_TYPE_UNBOUND,
};
use vireo_actors::vif::{valid_ifname, NetworkInfo, PortId, VnicType};
use vireo_actors::wiring::{WiringChange, WiringSource};
use vireo_xml::types::MacAddress;

use super::{flows, valid_device_owner, DEFAULT_DEVICE_OWNER, DEFAULT_OVS_BRIDGE};

/// The L2 mechanism serving a network's `normal` ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    /// Open vSwitch agent: `vif_type` `ovs`.
    #[default]
    Openvswitch,
    /// Linux bridge agent: `vif_type` `bridge`.
    Linuxbridge,
}

/// One network of the embedded service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddedNetworkDef {
    /// Network id (a UUID).
    pub id: String,
    /// Name.
    pub name: String,
    /// MTU.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Mechanism for `normal` ports.
    #[serde(default)]
    pub mechanism: Mechanism,
    /// OVS: `vif_details.ovs_hybrid_plug` (the firewall driver's choice in Neutron).
    #[serde(default)]
    pub ovs_hybrid_plug: bool,
    /// OVS: `vif_details.bridge_name` (Nova then uses it instead of br-int).
    #[serde(default)]
    pub bridge_name: Option<String>,
    /// OVS: `vif_details.datapath_type` (`system` or `netdev`).
    #[serde(default)]
    pub datapath_type: Option<String>,
    /// Provider physical network; SR-IOV vnic types bind only on networks that have one.
    #[serde(default)]
    pub physical_network: Option<String>,
    /// VLAN of the segment (`vif_details.vlan` of SR-IOV bindings; 0 = flat).
    #[serde(default)]
    pub vlan: Option<u16>,
}

/// The embedded service's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddedConfig {
    /// The networks.
    #[serde(default)]
    pub networks: Vec<EmbeddedNetworkDef>,
    /// Delay before each event is delivered (Neutron takes 0.3–1.6 s); 0 = at once.
    #[serde(default)]
    pub event_delay_ms: u64,
    /// `device_owner` of instance ports: `compute:<zone>`.
    #[serde(default = "default_device_owner")]
    pub device_owner: String,
    /// Project owning networks and ports.
    #[serde(default = "default_project")]
    pub project_id: String,
}

fn default_device_owner() -> String {
    DEFAULT_DEVICE_OWNER.to_owned()
}

fn default_project() -> String {
    "vireo".to_owned()
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        EmbeddedConfig {
            networks: Vec::new(),
            event_delay_ms: 0,
            device_owner: default_device_owner(),
            project_id: default_project(),
        }
    }
}

/// The embedded service's own errors: bad configuration, and the refusals it reports as the
/// `source` of a [`NetworkError`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbeddedError {
    /// A network definition is unusable.
    #[error("network {id:?}: {problem}")]
    BadNetwork {
        /// The network id as given.
        id: String,
        /// What is wrong.
        problem: String,
    },
    /// Two networks have the same id.
    #[error("duplicate network id {0}")]
    DuplicateNetwork(String),
    /// The device owner is not `compute:<zone>`.
    #[error("device_owner {0:?} is not compute:<zone>")]
    BadDeviceOwner(String),
    /// Delayed event delivery needs a tokio runtime.
    #[error("event_delay_ms needs a tokio runtime")]
    NoRuntime,
    /// Attaching a host needs a tokio runtime.
    #[error("attach_host needs a tokio runtime")]
    AttachNeedsRuntime,
    /// The host name is empty.
    #[error("empty host name")]
    EmptyHost,
    /// The operation is only valid on compute ports (Neutron's 400).
    #[error("operation only valid on compute ports")]
    NotComputePort,
    /// No unused MAC address was found.
    #[error("no free MAC address")]
    NoFreeMac,
}

impl EmbeddedConfig {
    fn validate(&self) -> Result<(), EmbeddedError> {
        if !valid_device_owner(&self.device_owner) {
            return Err(EmbeddedError::BadDeviceOwner(self.device_owner.clone()));
        }
        let mut seen = HashSet::new();
        for n in &self.networks {
            let bad = |problem: &str| EmbeddedError::BadNetwork {
                id: n.id.clone(),
                problem: problem.to_owned(),
            };
            if Uuid::parse_str(&n.id).is_err() {
                return Err(bad("id is not a UUID"));
            }
            if !seen.insert(n.id.clone()) {
                return Err(EmbeddedError::DuplicateNetwork(n.id.clone()));
            }
            if let Some(mtu) = n.mtu {
                if !(vireo_actors::vif::MIN_MTU..=vireo_actors::vif::MAX_MTU).contains(&mtu) {
                    return Err(bad("mtu out of range"));
                }
            }
            if n.vlan.is_some_and(|v| v > 4094) {
                return Err(bad("vlan out of range"));
            }
            if let Some(b) = &n.bridge_name {
                if !valid_ifname(b) {
                    return Err(bad("bridge_name is not an interface name"));
                }
            }
            if n.mechanism == Mechanism::Linuxbridge
                && (n.ovs_hybrid_plug || n.bridge_name.is_some() || n.datapath_type.is_some())
            {
                return Err(bad("OVS settings on a linuxbridge network"));
            }
            if let Some(d) = &n.datapath_type {
                if d != "system" && d != "netdev" {
                    return Err(bad("datapath_type is neither system nor netdev"));
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq)]
struct BindingRec {
    host: String,
    vnic_type: VnicType,
    profile: Map<String, Value>,
    vif_type: String,
    vif_details: Map<String, Value>,
}

impl BindingRec {
    fn unbound() -> Self {
        BindingRec {
            host: String::new(),
            vnic_type: VnicType::Normal,
            profile: Map::new(),
            vif_type: VIF_TYPE_UNBOUND.to_owned(),
            vif_details: Map::new(),
        }
    }

    fn is_bound(&self) -> bool {
        !self.host.is_empty()
            && self.vif_type != VIF_TYPE_UNBOUND
            && self.vif_type != VIF_TYPE_BINDING_FAILED
    }

    fn view(&self, status: BindingStatus) -> PortBinding {
        PortBinding {
            host: self.host.clone(),
            vif_type: self.vif_type.clone(),
            vnic_type: self.vnic_type,
            vif_details: self.vif_details.clone(),
            profile: self.profile.clone(),
            status,
        }
    }
}

#[derive(Debug, Clone)]
struct PortRec {
    id: PortId,
    network_id: String,
    mac: MacAddress,
    device_id: String,
    device_owner: String,
    status: PortStatus,
    active: BindingRec,
    inactive: BTreeMap<String, BindingRec>,
}

impl PortRec {
    fn view(&self) -> Port {
        Port {
            id: self.id,
            network_id: self.network_id.clone(),
            mac_address: self.mac,
            device_id: self.device_id.clone(),
            device_owner: self.device_owner.clone(),
            status: self.status,
            admin_state_up: true,
            host_id: self.active.host.clone(),
            vif_type: self.active.vif_type.clone(),
            vnic_type: self.active.vnic_type,
            vif_details: self.active.vif_details.clone(),
            profile: self.active.profile.clone(),
            fixed_ips: Vec::new(),
        }
    }

    fn is_compute(&self) -> bool {
        self.device_owner
            .starts_with(vireo_actors::network::COMPUTE_OWNER_PREFIX)
            && Uuid::parse_str(&self.device_id).is_ok()
    }

    fn event(&self, name: EventName, status: EventStatus) -> Option<ExternalEvent> {
        let server_uuid = Uuid::parse_str(&self.device_id).ok()?;
        self.is_compute().then(|| ExternalEvent {
            name,
            server_uuid,
            tag: Some(self.id.to_string()),
            status,
        })
    }

    /// Neutron's `record_port_status_changed`.
    fn set_status(&mut self, new: PortStatus, out: &mut Vec<ExternalEvent>) {
        let prev = self.status;
        if prev == new {
            return;
        }
        self.status = new;
        debug!(port = %self.id, from = %prev, to = %new, "port status");
        use PortStatus as S;
        let ev = match (prev, new) {
            (S::Active, S::Down) => {
                self.event(EventName::NetworkVifUnplugged, EventStatus::Completed)
            }
            (S::Down | S::Build, S::Active) => {
                self.event(EventName::NetworkVifPlugged, EventStatus::Completed)
            }
            (S::Down | S::Build, S::Error) => {
                self.event(EventName::NetworkVifPlugged, EventStatus::Failed)
            }
            _ => None,
        };
        out.extend(ev);
    }
}

#[derive(Debug, Default)]
struct HostRec {
    /// Port → devices wired for it on this host (`""` stands for "wired, device unknown"
    /// after a resync).
    wired: HashMap<PortId, HashSet<String>>,
    generation: u64,
    task: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct State {
    networks: BTreeMap<String, EmbeddedNetworkDef>,
    ports: BTreeMap<PortId, PortRec>,
    hosts: BTreeMap<String, HostRec>,
    macs: HashSet<MacAddress>,
    next_generation: u64,
}

/// How a binding is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    /// An L2 agent on the host wires the device and reports it.
    Agent,
    /// No agent: ACTIVE at bind.
    Agentless,
}

/// `(vif_type, vif_details, service)` for a vnic type on a network, `None` when no
/// mechanism binds it.
fn mechanism_for(
    net: &EmbeddedNetworkDef,
    vnic: VnicType,
) -> Option<(&'static str, Map<String, Value>, Service)> {
    let vlan = net.vlan.unwrap_or(0).to_string();
    let sriov_details = || {
        json!({"port_filter": false, "vlan": vlan, "connectivity": "l2"})
            .as_object()
            .cloned()
            .unwrap_or_default()
    };
    match vnic {
        VnicType::Normal => match net.mechanism {
            Mechanism::Openvswitch => {
                let mut d = Map::new();
                d.insert("connectivity".into(), Value::from("l2"));
                d.insert("port_filter".into(), Value::Bool(true));
                d.insert("ovs_hybrid_plug".into(), Value::Bool(net.ovs_hybrid_plug));
                d.insert(
                    "bridge_name".into(),
                    Value::from(net.bridge_name.as_deref().unwrap_or(DEFAULT_OVS_BRIDGE)),
                );
                if let Some(dp) = &net.datapath_type {
                    d.insert("datapath_type".into(), Value::from(dp.clone()));
                }
                Some(("ovs", d, Service::Agent))
            }
            Mechanism::Linuxbridge => {
                let d = json!({"connectivity": "l2", "port_filter": true});
                Some((
                    "bridge",
                    d.as_object().cloned().unwrap_or_default(),
                    Service::Agent,
                ))
            }
        },
        VnicType::Direct | VnicType::Macvtap if net.physical_network.is_some() => {
            Some(("hw_veb", sriov_details(), Service::Agent))
        }
        VnicType::DirectPhysical if net.physical_network.is_some() => {
            Some(("hostdev_physical", sriov_details(), Service::Agentless))
        }
        VnicType::RemoteManaged => {
            let d = json!({"connectivity": "l2", "port_filter": true});
            Some((
                "ovs",
                d.as_object().cloned().unwrap_or_default(),
                Service::Agentless,
            ))
        }
        _ => None,
    }
}

/// Whether a binding's vnic type is agent-served on its network.
fn agent_served(state: &State, network_id: &str, vnic: VnicType) -> bool {
    state
        .networks
        .get(network_id)
        .and_then(|n| mechanism_for(n, vnic))
        .is_some_and(|(_, _, s)| s == Service::Agent)
}

/// Bind `b` (its host, vnic type and profile are set): fills vif_type and details. Returns
/// the service when bound.
fn bind(state: &State, network_id: &str, b: &mut BindingRec) -> Option<Service> {
    b.vif_details = Map::new();
    if b.host.is_empty() {
        b.vif_type = VIF_TYPE_UNBOUND.to_owned();
        return None;
    }
    let found = state
        .networks
        .get(network_id)
        .and_then(|n| mechanism_for(n, b.vnic_type))
        .filter(|(_, _, s)| *s == Service::Agentless || state.hosts.contains_key(&b.host));
    match found {
        Some((vif_type, details, service)) => {
            b.vif_type = vif_type.to_owned();
            b.vif_details = details;
            Some(service)
        }
        None => {
            b.vif_type = VIF_TYPE_BINDING_FAILED.to_owned();
            None
        }
    }
}

/// The agent on `host` processes the port's device (it appeared, or the agent was told the
/// port changed).
fn agent_device_up(state: &mut State, host: &str, id: PortId, out: &mut Vec<ExternalEvent>) {
    let Some(port) = state.ports.get(&id) else {
        return;
    };
    let served = agent_served(state, &port.network_id, port.active.vnic_type);
    let Some(port) = state.ports.get_mut(&id) else {
        return;
    };
    if !served {
        return;
    }
    if port.active.host == host {
        if port.active.is_bound() {
            port.set_status(PortStatus::Active, out);
        }
    } else if port
        .active
        .profile
        .contains_key(vireo_actors::network::MIGRATING_TO)
    {
        debug!(port = %id, host, "device up on a migration target");
        out.extend(port.event(EventName::NetworkVifPlugged, EventStatus::Completed));
    }
}

/// The agent on `host` reports the port's device gone.
fn agent_device_down(state: &mut State, host: &str, id: PortId, out: &mut Vec<ExternalEvent>) {
    let Some(port) = state.ports.get(&id) else {
        return;
    };
    if !agent_served(state, &port.network_id, port.active.vnic_type) {
        return;
    }
    if let Some(port) = state.ports.get_mut(&id) {
        if port.active.host == host {
            port.set_status(PortStatus::Down, out);
        }
    }
}

/// Hosts (attached) where the port's device is wired, in name order.
fn wired_hosts(state: &State, id: PortId) -> Vec<String> {
    state
        .hosts
        .iter()
        .filter(|(_, h)| h.wired.contains_key(&id))
        .map(|(name, _)| name.clone())
        .collect()
}

enum Delivery {
    Now,
    Delayed {
        delay: Duration,
        tx: mpsc::UnboundedSender<(tokio::time::Instant, ExternalEvent)>,
        task: JoinHandle<()>,
    },
}

/// The embedded network service. Share it with `Arc`; see the module docs for its rules.
pub struct EmbeddedNetwork {
    state: Mutex<State>,
    sink: Arc<dyn EventSink>,
    delivery: Delivery,
    device_owner: String,
    project_id: String,
}

impl fmt::Debug for EmbeddedNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (networks, ports, hosts) = match self.state.lock() {
            Ok(s) => (s.networks.len(), s.ports.len(), s.hosts.len()),
            Err(_) => (0, 0, 0),
        };
        f.debug_struct("EmbeddedNetwork")
            .field("networks", &networks)
            .field("ports", &ports)
            .field("hosts", &hosts)
            .field("sink", &self.sink)
            .finish_non_exhaustive()
    }
}

impl Drop for EmbeddedNetwork {
    fn drop(&mut self) {
        if let Ok(state) = self.state.get_mut() {
            for host in state.hosts.values_mut() {
                if let Some(t) = host.task.take() {
                    t.abort();
                }
            }
        }
        if let Delivery::Delayed { task, .. } = &self.delivery {
            task.abort();
        }
    }
}

fn refused(e: EmbeddedError) -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(e)
}

impl EmbeddedNetwork {
    /// A service with `config`'s networks, sending events to `sink`. With
    /// `event_delay_ms > 0` it must be called inside a tokio runtime (it starts the delivery
    /// task).
    pub fn new(
        config: EmbeddedConfig,
        sink: Arc<dyn EventSink>,
    ) -> Result<Arc<Self>, EmbeddedError> {
        config.validate()?;
        let delivery = if config.event_delay_ms == 0 {
            Delivery::Now
        } else {
            let handle =
                tokio::runtime::Handle::try_current().map_err(|_| EmbeddedError::NoRuntime)?;
            let (tx, mut rx) = mpsc::unbounded_channel::<(tokio::time::Instant, ExternalEvent)>();
            let sink2 = Arc::clone(&sink);
            let task = handle.spawn(async move {
                while let Some((due, ev)) = rx.recv().await {
                    tokio::time::sleep_until(due).await;
                    sink2.deliver(ev);
                }
            });
            Delivery::Delayed {
                delay: Duration::from_millis(config.event_delay_ms),
                tx,
                task,
            }
        };
        let state = State {
            networks: config
                .networks
                .into_iter()
                .map(|n| (n.id.clone(), n))
                .collect(),
            ..State::default()
        };
        Ok(Arc::new(EmbeddedNetwork {
            state: Mutex::new(state),
            sink,
            delivery,
            device_owner: config.device_owner,
            project_id: config.project_id,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than losing the service; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hand events over, in order. Called with the lock held (see the module docs).
    fn emit(&self, events: Vec<ExternalEvent>) {
        for ev in events {
            debug!(name = %ev.name, instance = %ev.server_uuid, tag = ?ev.tag, status = ?ev.status, "event");
            match &self.delivery {
                Delivery::Now => self.sink.deliver(ev),
                Delivery::Delayed { delay, tx, .. } => {
                    let due = tokio::time::Instant::now() + *delay;
                    if tx.send((due, ev)).is_err() {
                        warn!("event delivery task gone; event dropped");
                    }
                }
            }
        }
    }

    /// Add a network at run time.
    pub fn add_network(&self, def: EmbeddedNetworkDef) -> Result<(), EmbeddedError> {
        let mut state = self.lock();
        let check = EmbeddedConfig {
            networks: vec![def.clone()],
            ..EmbeddedConfig::default()
        };
        check.validate()?;
        if state.networks.contains_key(&def.id) {
            return Err(EmbeddedError::DuplicateNetwork(def.id));
        }
        state.networks.insert(def.id.clone(), def);
        Ok(())
    }

    /// Make `host` known, with its L2 agent: from now on ports bind there and the service
    /// follows what `source` reports wired there. Replaces an earlier attachment of the
    /// same host. Must be called inside a tokio runtime (it starts the watching task).
    pub fn attach_host(
        self: &Arc<Self>,
        host: &str,
        source: Arc<dyn WiringSource>,
    ) -> Result<(), EmbeddedError> {
        if host.is_empty() {
            return Err(EmbeddedError::EmptyHost);
        }
        let handle =
            tokio::runtime::Handle::try_current().map_err(|_| EmbeddedError::AttachNeedsRuntime)?;
        // Subscribe before reading the current set, so no change falls in between.
        let rx = source.subscribe();
        let initial = source.wired();
        let generation = {
            let mut state = self.lock();
            state.next_generation += 1;
            let generation = state.next_generation;
            let rec = state.hosts.entry(host.to_owned()).or_default();
            if let Some(old) = rec.task.take() {
                old.abort();
            }
            rec.generation = generation;
            let mut out = Vec::new();
            resync(&mut state, host, &initial, &mut out);
            self.emit(out);
            generation
        };
        info!(
            host,
            wired = initial.len(),
            "host attached to the embedded network service"
        );
        let task = handle.spawn(watch(
            Arc::downgrade(self),
            host.to_owned(),
            generation,
            rx,
            source,
        ));
        let mut state = self.lock();
        match state.hosts.get_mut(host) {
            Some(rec) if rec.generation == generation => rec.task = Some(task),
            _ => task.abort(),
        }
        Ok(())
    }

    /// Forget `host` and stop watching it (its agent is gone). Ports keep their state, as in
    /// Neutron when an agent dies. Returns false when the host was not attached.
    pub fn detach_host(&self, host: &str) -> bool {
        let mut state = self.lock();
        match state.hosts.remove(host) {
            Some(mut rec) => {
                if let Some(t) = rec.task.take() {
                    t.abort();
                }
                true
            }
            None => false,
        }
    }

    /// Every port, in id order (a snapshot).
    pub fn ports(&self) -> Vec<Port> {
        self.lock().ports.values().map(PortRec::view).collect()
    }

    /// The port's status, `None` when it does not exist.
    pub fn port_status(&self, port: PortId) -> Option<PortStatus> {
        self.lock().ports.get(&port).map(|p| p.status)
    }

    /// True when the service believes the port's device is wired on `host`.
    pub fn is_wired(&self, host: &str, port: PortId) -> bool {
        self.lock()
            .hosts
            .get(host)
            .is_some_and(|h| h.wired.contains_key(&port))
    }

    /// Put the port in ERROR, as an agent does when wiring fails (→ `network-vif-plugged`
    /// `failed` from DOWN/BUILD). Missing port: [`NetworkError::PortNotFound`].
    pub fn set_port_error(&self, port: PortId) -> Result<(), NetworkError> {
        let mut state = self.lock();
        let rec = state
            .ports
            .get_mut(&port)
            .ok_or(NetworkError::PortNotFound { port })?;
        let mut out = Vec::new();
        rec.set_status(PortStatus::Error, &mut out);
        self.emit(out);
        Ok(())
    }

    fn wiring_change(&self, host: &str, generation: u64, change: WiringChange) {
        let mut state = self.lock();
        let Some(rec) = state.hosts.get_mut(host) else {
            return;
        };
        if rec.generation != generation {
            return;
        }
        let mut out = Vec::new();
        if change.wired {
            let devices = rec.wired.entry(change.port).or_default();
            let first = devices.is_empty();
            devices.insert(change.device);
            if first {
                agent_device_up(&mut state, host, change.port, &mut out);
            }
        } else {
            let gone = match rec.wired.get_mut(&change.port) {
                Some(devices) => {
                    devices.remove(&change.device);
                    devices.remove("");
                    devices.is_empty()
                }
                None => false,
            };
            if gone {
                rec.wired.remove(&change.port);
                agent_device_down(&mut state, host, change.port, &mut out);
            }
        }
        self.emit(out);
    }

    fn wiring_resync(&self, host: &str, generation: u64, wired: &[PortId]) {
        let mut state = self.lock();
        if state.hosts.get(host).map(|h| h.generation) != Some(generation) {
            return;
        }
        let mut out = Vec::new();
        resync(&mut state, host, wired, &mut out);
        self.emit(out);
    }

    fn network_summary(&self, def: &EmbeddedNetworkDef) -> NetworkSummary {
        NetworkSummary {
            id: def.id.clone(),
            name: def.name.clone(),
            mtu: def.mtu,
            physical_network: def.physical_network.clone(),
            project_id: self.project_id.clone(),
        }
    }
}

/// Bring the host's wired set to `wired`: ports newly wired are reported up, ports no longer
/// wired down.
fn resync(state: &mut State, host: &str, wired: &[PortId], out: &mut Vec<ExternalEvent>) {
    let now: HashSet<PortId> = wired.iter().copied().collect();
    let Some(rec) = state.hosts.get_mut(host) else {
        return;
    };
    let known: HashSet<PortId> = rec.wired.keys().copied().collect();
    let mut gone: Vec<PortId> = known.difference(&now).copied().collect();
    let mut new: Vec<PortId> = now.difference(&known).copied().collect();
    gone.sort();
    new.sort();
    for id in &gone {
        rec.wired.remove(id);
    }
    for id in &new {
        rec.wired.insert(*id, HashSet::from([String::new()]));
    }
    for id in gone {
        agent_device_down(state, host, id, out);
    }
    for id in new {
        agent_device_up(state, host, id, out);
    }
}

async fn watch(
    service: Weak<EmbeddedNetwork>,
    host: String,
    generation: u64,
    mut rx: broadcast::Receiver<WiringChange>,
    source: Arc<dyn WiringSource>,
) {
    loop {
        match rx.recv().await {
            Ok(change) => {
                let Some(svc) = service.upgrade() else { return };
                svc.wiring_change(&host, generation, change);
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                warn!(
                    host,
                    missed = n,
                    "wiring watcher lagged; re-reading the wired set"
                );
                let Some(svc) = service.upgrade() else { return };
                let wired = source.wired();
                svc.wiring_resync(&host, generation, &wired);
            }
            Err(broadcast::error::RecvError::Closed) => {
                debug!(host, "wiring source closed");
                return;
            }
        }
    }
}

fn random_mac(taken: &HashSet<MacAddress>) -> Option<MacAddress> {
    for _ in 0..64 {
        let b = Uuid::new_v4().into_bytes();
        let mac = MacAddress([0xfa, 0x16, 0x3e, b[0], b[1], b[2]]);
        if !taken.contains(&mac) {
            return Some(mac);
        }
    }
    None
}

#[async_trait]
impl NetworkApi for EmbeddedNetwork {
    async fn list_instance_ports(&self, instance: Uuid) -> Result<Vec<Port>, NetworkError> {
        let device = instance.to_string();
        Ok(self
            .lock()
            .ports
            .values()
            .filter(|p| p.device_id == device)
            .map(PortRec::view)
            .collect())
    }

    async fn get_port(&self, port: PortId) -> Result<Port, NetworkError> {
        self.lock()
            .ports
            .get(&port)
            .map(PortRec::view)
            .ok_or(NetworkError::PortNotFound { port })
    }

    async fn get_network(&self, network_id: &str) -> Result<NetworkSummary, NetworkError> {
        let state = self.lock();
        let def = state
            .networks
            .get(network_id)
            .ok_or_else(|| NetworkError::NetworkNotFound {
                network: network_id.to_owned(),
            })?;
        Ok(self.network_summary(def))
    }

    async fn create_port_with(
        &self,
        network_id: &str,
        device_id: Option<Uuid>,
    ) -> Result<Port, NetworkError> {
        let mut state = self.lock();
        if !state.networks.contains_key(network_id) {
            return Err(NetworkError::NetworkNotFound {
                network: network_id.to_owned(),
            });
        }
        let mac = random_mac(&state.macs).ok_or_else(|| NetworkError::CreatePort {
            network: network_id.to_owned(),
            failure: Failure::Status(409),
            source: refused(EmbeddedError::NoFreeMac),
        })?;
        let id = PortId(Uuid::new_v4());
        let rec = PortRec {
            id,
            network_id: network_id.to_owned(),
            mac,
            device_id: device_id.map(|d| d.to_string()).unwrap_or_default(),
            device_owner: String::new(),
            status: PortStatus::Down,
            active: BindingRec::unbound(),
            inactive: BTreeMap::new(),
        };
        let view = rec.view();
        state.macs.insert(mac);
        state.ports.insert(id, rec);
        debug!(port = %id, network = network_id, "port created");
        Ok(view)
    }

    async fn update_port(&self, port: PortId, update: &PortUpdate) -> Result<Port, NetworkError> {
        let mut state = self.lock();
        let mut out = Vec::new();
        let Some(mut rec) = state.ports.get(&port).cloned() else {
            return Err(NetworkError::PortNotFound { port });
        };
        if let Some(d) = &update.device_id {
            rec.device_id.clone_from(d);
        }
        if let Some(o) = &update.device_owner {
            rec.device_owner.clone_from(o);
        }
        let mut changed = false;
        if let Some(h) = &update.host_id {
            if *h != rec.active.host {
                rec.active.host.clone_from(h);
                changed = true;
            }
        }
        if let Some(v) = update.vnic_type {
            if v != rec.active.vnic_type {
                rec.active.vnic_type = v;
                changed = true;
            }
        }
        if let Some(p) = &update.profile {
            if *p != rec.active.profile {
                rec.active.profile.clone_from(p);
                changed = true;
            }
        }
        if changed {
            rec.active.vif_type = VIF_TYPE_UNBOUND.to_owned();
            rec.active.vif_details = Map::new();
            rec.set_status(PortStatus::Down, &mut out);
        }
        // `_bind_port_if_needed`: a port with a host but no usable binding is bound again on
        // every update, changed or not.
        let mut newly_bound = false;
        if !rec.active.host.is_empty() && !rec.active.is_bound() {
            let service = bind(&state, &rec.network_id, &mut rec.active);
            newly_bound = service.is_some();
            if service == Some(Service::Agentless) {
                rec.set_status(PortStatus::Active, &mut out);
            }
        }
        // The API response: network-changed for a compute port.
        out.extend(rec.event(EventName::NetworkChanged, EventStatus::Completed));
        let view = rec.view();
        state.ports.insert(port, rec);
        if newly_bound {
            // port_update fan-out: every agent with the device re-processes it.
            for host in wired_hosts(&state, port) {
                agent_device_up(&mut state, &host, port, &mut out);
            }
        }
        let view = state.ports.get(&port).map_or(view, PortRec::view);
        self.emit(out);
        Ok(view)
    }

    async fn delete_port(&self, port: PortId) -> Result<Removal, NetworkError> {
        let mut state = self.lock();
        let Some(rec) = state.ports.remove(&port) else {
            return Ok(Removal::AlreadyGone);
        };
        state.macs.remove(&rec.mac);
        let out: Vec<ExternalEvent> = rec
            .event(EventName::NetworkVifDeleted, EventStatus::Completed)
            .into_iter()
            .collect();
        debug!(port = %port, "port deleted");
        self.emit(out);
        Ok(Removal::Deleted)
    }

    async fn show_bindings(&self, port: PortId) -> Result<Vec<PortBinding>, NetworkError> {
        let state = self.lock();
        let rec = state
            .ports
            .get(&port)
            .ok_or(NetworkError::PortNotFound { port })?;
        if !rec
            .device_owner
            .starts_with(vireo_actors::network::COMPUTE_OWNER_PREFIX)
        {
            return Err(NetworkError::ShowBindings {
                port,
                failure: Failure::Status(400),
                source: refused(EmbeddedError::NotComputePort),
            });
        }
        let mut out = vec![rec.active.view(BindingStatus::Active)];
        out.extend(
            rec.inactive
                .values()
                .map(|b| b.view(BindingStatus::Inactive)),
        );
        Ok(out)
    }

    async fn create_binding(
        &self,
        port: PortId,
        binding: &NewBinding,
    ) -> Result<PortBinding, NetworkError> {
        let mut state = self.lock();
        let rec = state
            .ports
            .get(&port)
            .ok_or(NetworkError::PortNotFound { port })?;
        if !rec
            .device_owner
            .starts_with(vireo_actors::network::COMPUTE_OWNER_PREFIX)
        {
            return Err(NetworkError::CreateBinding {
                port,
                host: binding.host.clone(),
                failure: Failure::Status(400),
                source: refused(EmbeddedError::NotComputePort),
            });
        }
        if rec.active.host == binding.host || rec.inactive.contains_key(&binding.host) {
            return Err(NetworkError::BindingExists {
                port,
                host: binding.host.clone(),
            });
        }
        let mut b = BindingRec {
            host: binding.host.clone(),
            vnic_type: binding.vnic_type.unwrap_or_default(),
            profile: binding.profile.clone().unwrap_or_default(),
            vif_type: VIF_TYPE_UNBOUND.to_owned(),
            vif_details: Map::new(),
        };
        let network_id = rec.network_id.clone();
        if bind(&state, &network_id, &mut b).is_none() {
            return Err(NetworkError::BindingFailed {
                port,
                host: binding.host.clone(),
                vif_type: b.vif_type,
            });
        }
        let view = b.view(BindingStatus::Inactive);
        if let Some(rec) = state.ports.get_mut(&port) {
            rec.inactive.insert(b.host.clone(), b);
        }
        debug!(port = %port, host = %binding.host, "inactive binding created");
        Ok(view)
    }

    async fn activate_binding(
        &self,
        port: PortId,
        host: &str,
    ) -> Result<PortBinding, NetworkError> {
        let mut state = self.lock();
        let rec = state
            .ports
            .get_mut(&port)
            .ok_or(NetworkError::PortNotFound { port })?;
        if !rec
            .device_owner
            .starts_with(vireo_actors::network::COMPUTE_OWNER_PREFIX)
        {
            return Err(NetworkError::ActivateBinding {
                port,
                host: host.to_owned(),
                failure: Failure::Status(400),
                source: refused(EmbeddedError::NotComputePort),
            });
        }
        if rec.active.host == host {
            return Err(NetworkError::BindingAlreadyActive {
                port,
                host: host.to_owned(),
            });
        }
        let Some(new_active) = rec.inactive.remove(host) else {
            return Err(NetworkError::BindingNotFound {
                port,
                host: host.to_owned(),
            });
        };
        let mut out = Vec::new();
        let mut old = std::mem::replace(&mut rec.active, new_active);
        old.vif_type = VIF_TYPE_UNBOUND.to_owned();
        old.vif_details = Map::new();
        if !old.host.is_empty() {
            rec.inactive.insert(old.host.clone(), old);
        }
        rec.set_status(PortStatus::Down, &mut out);
        let view = rec.active.view(BindingStatus::Active);
        // binding_activate to the new host's agent: it treats a present device as added.
        if state
            .hosts
            .get(host)
            .is_some_and(|h| h.wired.contains_key(&port))
        {
            agent_device_up(&mut state, host, port, &mut out);
        }
        debug!(port = %port, host, "binding activated");
        self.emit(out);
        Ok(view)
    }

    async fn delete_binding(&self, port: PortId, host: &str) -> Result<Removal, NetworkError> {
        let mut state = self.lock();
        let Some(rec) = state.ports.get_mut(&port) else {
            return Ok(Removal::AlreadyGone);
        };
        if rec.active.host == host {
            return Err(NetworkError::DeleteActiveBinding {
                port,
                host: host.to_owned(),
            });
        }
        Ok(match rec.inactive.remove(host) {
            Some(_) => Removal::Deleted,
            None => Removal::AlreadyGone,
        })
    }

    async fn allocate_for_instance(
        &self,
        instance: Uuid,
        host: &str,
        requests: &[PortRequest],
    ) -> Result<NetworkInfo, NetworkError> {
        // Every OVS network of this service names its bridge (`bridge_name`, else br-int).
        flows::allocate(
            self,
            &self.device_owner,
            DEFAULT_OVS_BRIDGE,
            instance,
            host,
            requests,
        )
        .await
    }

    async fn deallocate_for_instance(
        &self,
        instance: Uuid,
        network_info: &NetworkInfo,
    ) -> Result<Deallocation, NetworkError> {
        flows::deallocate(self, instance, network_info).await
    }

    async fn setup_networks_on_host(
        &self,
        instance: Uuid,
        host: &str,
        teardown: bool,
        migration: Option<&MigrationHosts>,
    ) -> Result<Vec<HostSetupChange>, NetworkError> {
        flows::setup_networks_on_host(self, instance, host, teardown, migration).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(id: &str) -> EmbeddedNetworkDef {
        EmbeddedNetworkDef {
            id: id.into(),
            name: "n".into(),
            mtu: Some(1450),
            mechanism: Mechanism::Openvswitch,
            ovs_hybrid_plug: false,
            bridge_name: None,
            datapath_type: None,
            physical_network: None,
            vlan: None,
        }
    }

    #[test]
    fn config_parses_with_defaults_and_refuses_unknown_fields() {
        let c: EmbeddedConfig = toml::from_str(
            r#"
            event_delay_ms = 300
            [[networks]]
            id = "5f0c7e2a-0000-4000-8000-000000000001"
            name = "private"
            ovs_hybrid_plug = true
            "#,
        )
        .unwrap();
        assert_eq!(c.device_owner, "compute:nova");
        assert_eq!(c.networks[0].mechanism, Mechanism::Openvswitch);
        assert!(c.validate().is_ok());
        assert!(toml::from_str::<EmbeddedConfig>("delay = 3").is_err());
        assert!(toml::from_str::<EmbeddedConfig>(
            "[[networks]]\nid = \"x\"\nname = \"n\"\nhybrid = true"
        )
        .is_err());
    }

    #[test]
    fn bad_networks_are_refused() {
        let id = "5f0c7e2a-0000-4000-8000-000000000001";
        let mut cases = Vec::new();
        cases.push(net("not-a-uuid"));
        let mut n = net(id);
        n.mtu = Some(10);
        cases.push(n);
        let mut n = net(id);
        n.vlan = Some(4095);
        cases.push(n);
        let mut n = net(id);
        n.mechanism = Mechanism::Linuxbridge;
        n.ovs_hybrid_plug = true;
        cases.push(n);
        let mut n = net(id);
        n.bridge_name = Some("br;x".into());
        cases.push(n);
        let mut n = net(id);
        n.datapath_type = Some("dpdk".into());
        cases.push(n);
        for n in cases {
            let c = EmbeddedConfig {
                networks: vec![n.clone()],
                ..EmbeddedConfig::default()
            };
            assert!(
                matches!(c.validate(), Err(EmbeddedError::BadNetwork { .. })),
                "{n:?}"
            );
        }
        let c = EmbeddedConfig {
            networks: vec![net(id), net(id)],
            ..EmbeddedConfig::default()
        };
        assert_eq!(
            c.validate(),
            Err(EmbeddedError::DuplicateNetwork(id.into()))
        );
        let c = EmbeddedConfig {
            device_owner: "nova".into(),
            ..EmbeddedConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(EmbeddedError::BadDeviceOwner(_))
        ));
    }

    #[test]
    fn mechanisms_per_vnic_type() {
        let mut n = net("5f0c7e2a-0000-4000-8000-000000000001");
        n.ovs_hybrid_plug = true;
        let (t, d, s) = mechanism_for(&n, VnicType::Normal).unwrap();
        assert_eq!((t, s), ("ovs", Service::Agent));
        assert_eq!(d["ovs_hybrid_plug"], json!(true));
        assert_eq!(d["bridge_name"], json!("br-int"));
        assert!(mechanism_for(&n, VnicType::Direct).is_none(), "no physnet");
        assert!(mechanism_for(&n, VnicType::DirectPhysical).is_none());
        n.physical_network = Some("physnet1".into());
        n.vlan = Some(100);
        let (t, d, s) = mechanism_for(&n, VnicType::Direct).unwrap();
        assert_eq!((t, s), ("hw_veb", Service::Agent));
        assert_eq!(d["vlan"], json!("100"));
        let (t, _, s) = mechanism_for(&n, VnicType::DirectPhysical).unwrap();
        assert_eq!((t, s), ("hostdev_physical", Service::Agentless));
        let (_, _, s) = mechanism_for(&n, VnicType::RemoteManaged).unwrap();
        assert_eq!(s, Service::Agentless);
        assert!(mechanism_for(&n, VnicType::Baremetal).is_none());
        n.mechanism = Mechanism::Linuxbridge;
        n.ovs_hybrid_plug = false;
        let (t, _, _) = mechanism_for(&n, VnicType::Normal).unwrap();
        assert_eq!(t, "bridge");
    }

    #[test]
    fn status_transitions_send_what_neutrons_notifier_sends() {
        use PortStatus as S;
        let all = [S::Active, S::Down, S::Build, S::Error, S::NotApplicable];
        let dev = Uuid::from_bytes([7; 16]);
        for from in all {
            for to in all {
                let mut p = PortRec {
                    id: PortId(Uuid::from_bytes([1; 16])),
                    network_id: "n".into(),
                    mac: MacAddress([0xfa, 0x16, 0x3e, 0, 0, 1]),
                    device_id: dev.to_string(),
                    device_owner: "compute:nova".into(),
                    status: from,
                    active: BindingRec::unbound(),
                    inactive: BTreeMap::new(),
                };
                let mut out = Vec::new();
                p.set_status(to, &mut out);
                assert_eq!(p.status, to);
                let got: Vec<(EventName, EventStatus)> =
                    out.iter().map(|e| (e.name, e.status)).collect();
                let want = match (from, to) {
                    (S::Active, S::Down) => {
                        vec![(EventName::NetworkVifUnplugged, EventStatus::Completed)]
                    }
                    (S::Down | S::Build, S::Active) => {
                        vec![(EventName::NetworkVifPlugged, EventStatus::Completed)]
                    }
                    (S::Down | S::Build, S::Error) => {
                        vec![(EventName::NetworkVifPlugged, EventStatus::Failed)]
                    }
                    _ => vec![],
                };
                assert_eq!(got, want, "{from} -> {to}");
                if let Some(e) = out.first() {
                    assert_eq!(e.server_uuid, dev);
                    assert_eq!(e.tag.as_deref(), Some(p.id.to_string().as_str()));
                }
                // A port that is not a compute port never reports.
                let mut p2 = p.clone();
                p2.status = from;
                p2.device_owner = "network:dhcp".into();
                let mut out = Vec::new();
                p2.set_status(to, &mut out);
                assert!(out.is_empty());
            }
        }
    }
}
