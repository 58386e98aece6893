//! The network service as vireo's flows see it: the [`NetworkApi`] trait and its plain data
//! and error types.
//!
//! Two implementations live in the `vireo` crate: a Neutron REST client and the embedded
//! in-process service. Both follow Neutron's semantics (statuses, bindings, multiple port
//! bindings, 404/409 answers), so a flow written against this trait behaves the same on
//! either.
//!
//! # Operations and how "not found" is handled
//!
//! | operation | port (or binding) missing |
//! |---|---|
//! | [`NetworkApi::get_port`], [`NetworkApi::update_port`], [`NetworkApi::show_bindings`], [`NetworkApi::create_binding`] | [`NetworkError::PortNotFound`] |
//! | [`NetworkApi::activate_binding`] | [`NetworkError::PortNotFound`] or [`NetworkError::BindingNotFound`] |
//! | [`NetworkApi::delete_port`], [`NetworkApi::delete_binding`] | `Ok(`[`Removal::AlreadyGone`]`)`: the goal is reached |
//! | [`NetworkApi::allocate_for_instance`] | [`NetworkError::PortNotFound`] / [`NetworkError::NetworkNotFound`] for a request naming a missing port / network |
//! | [`NetworkApi::deallocate_for_instance`], [`NetworkApi::setup_networks_on_host`] | the port is reported in `already_gone` / skipped: success |
//!
//! A second binding for the same host is [`NetworkError::BindingExists`] (Neutron's 409);
//! activating the binding that is already active is [`NetworkError::BindingAlreadyActive`]
//! (409). vireo refuses to delete a port's *active* binding
//! ([`NetworkError::DeleteActiveBinding`]): Neutron would accept it and leave the port
//! without an active binding, after which every update of the port answers 404.
//!
//! # Errors
//!
//! Every other failure is a variant named for the operation (`UpdatePort`, `CreateBinding`,
//! ...) carrying the port id (and host), a [`Failure`] (the HTTP status, a timeout, a
//! connection failure, ...) and the underlying error as `source`.
//! [`NetworkError::is_retryable`] says whether trying again later may help (5xx, timeouts,
//! connection failures); the Neutron client has already retried idempotent requests by then.

use std::error::Error as StdError;
use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use serde_json::{Map, Value};
use uuid::Uuid;
use vireo_xml::types::MacAddress;

use crate::vif::{NetworkInfo, PortId, VifError, VnicType};

/// A boxed error used as the `source` of [`NetworkError`] variants.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The `device_owner` prefix of ports that belong to an instance.
pub const COMPUTE_OWNER_PREFIX: &str = "compute:";

/// The `binding:profile` key Nova sets while an instance live-migrates.
pub const MIGRATING_TO: &str = "migrating_to";

/// The `binding:profile` keys that describe a host's PCI device; cleared when a user-supplied
/// port is unbound (Nova clears the same set).
pub const PCI_PROFILE_KEYS: [&str; 9] = [
    "pci_vendor_info",
    "pci_slot",
    "allocation",
    "arq_uuid",
    "physical_network",
    "card_serial_number",
    "vf_num",
    "pf_mac_address",
    "device_mac_address",
];

/// `binding:vif_type` of a port whose binding is not usable.
pub const VIF_TYPE_UNBOUND: &str = "unbound";
/// `binding:vif_type` after a failed binding attempt.
pub const VIF_TYPE_BINDING_FAILED: &str = "binding_failed";

/// A Neutron port's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortStatus {
    /// Wired and ready.
    Active,
    /// Not (or no longer) wired, or its binding changed.
    Down,
    /// The agent is wiring it.
    Build,
    /// Wiring failed.
    Error,
    /// Neutron's `N/A` (ports of some services).
    NotApplicable,
}

impl PortStatus {
    /// Neutron's spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            PortStatus::Active => "ACTIVE",
            PortStatus::Down => "DOWN",
            PortStatus::Build => "BUILD",
            PortStatus::Error => "ERROR",
            PortStatus::NotApplicable => "N/A",
        }
    }
}

impl fmt::Display for PortStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PortStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "ACTIVE" => PortStatus::Active,
            "DOWN" => PortStatus::Down,
            "BUILD" => PortStatus::Build,
            "ERROR" => PortStatus::Error,
            "N/A" => PortStatus::NotApplicable,
            other => return Err(format!("unknown port status {other:?}")),
        })
    }
}

/// One fixed IP of a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedIp {
    /// The subnet.
    pub subnet_id: String,
    /// The address, as Neutron prints it.
    pub ip_address: String,
}

/// A port, as vireo reads it (the attributes the flows use).
#[derive(Debug, Clone, PartialEq)]
pub struct Port {
    /// Port id.
    pub id: PortId,
    /// Its network.
    pub network_id: String,
    /// MAC address.
    pub mac_address: MacAddress,
    /// The instance (or other device) using it; empty when none.
    pub device_id: String,
    /// `compute:<zone>` for instance ports; empty when none.
    pub device_owner: String,
    /// Status.
    pub status: PortStatus,
    /// `admin_state_up`.
    pub admin_state_up: bool,
    /// `binding:host_id` of the active binding (empty when unbound).
    pub host_id: String,
    /// `binding:vif_type` of the active binding (`unbound`, `binding_failed`, `ovs`, ...).
    pub vif_type: String,
    /// `binding:vnic_type`.
    pub vnic_type: VnicType,
    /// `binding:vif_details`.
    pub vif_details: Map<String, Value>,
    /// `binding:profile`.
    pub profile: Map<String, Value>,
    /// Fixed IPs.
    pub fixed_ips: Vec<FixedIp>,
}

impl Port {
    /// `binding:profile.migrating_to`, when set to a string.
    pub fn migrating_to(&self) -> Option<&str> {
        self.profile.get(MIGRATING_TO).and_then(Value::as_str)
    }

    /// True when the active binding is on a host and usable.
    pub fn is_bound(&self) -> bool {
        !self.host_id.is_empty()
            && self.vif_type != VIF_TYPE_UNBOUND
            && self.vif_type != VIF_TYPE_BINDING_FAILED
    }

    /// True for a port Neutron reports to Nova about: a UUID device id and a `compute:`
    /// owner.
    pub fn is_compute_port(&self) -> bool {
        self.device_owner.starts_with(COMPUTE_OWNER_PREFIX)
            && Uuid::parse_str(&self.device_id).is_ok()
    }
}

/// Whether a port binding is the port's active one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BindingStatus {
    /// The binding the port uses.
    Active,
    /// A binding prepared for another host (live migration).
    Inactive,
}

impl BindingStatus {
    /// Neutron's spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            BindingStatus::Active => "ACTIVE",
            BindingStatus::Inactive => "INACTIVE",
        }
    }
}

/// One of a port's bindings (Neutron's multiple port bindings).
#[derive(Debug, Clone, PartialEq)]
pub struct PortBinding {
    /// The host.
    pub host: String,
    /// `vif_type` (`unbound`, `binding_failed`, `ovs`, ...).
    pub vif_type: String,
    /// `vnic_type`.
    pub vnic_type: VnicType,
    /// `vif_details`.
    pub vif_details: Map<String, Value>,
    /// `profile`.
    pub profile: Map<String, Value>,
    /// Active or inactive.
    pub status: BindingStatus,
}

/// A new (inactive) binding of a port for a host.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NewBinding {
    /// The host.
    pub host: String,
    /// `vnic_type`; Neutron's default (`normal`) when `None`.
    pub vnic_type: Option<VnicType>,
    /// `profile`; empty when `None`.
    pub profile: Option<Map<String, Value>>,
}

/// Changes to a port. `None` keeps a field. Neutron's semantics apply: an empty `host_id`
/// unbinds; an empty `device_id`/`device_owner` detaches; `profile` replaces the whole
/// `binding:profile` (an empty map clears it).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PortUpdate {
    /// `binding:host_id` (empty = unbind; sent as JSON `null`).
    pub host_id: Option<String>,
    /// `binding:profile`, replaced whole.
    pub profile: Option<Map<String, Value>>,
    /// `binding:vnic_type`.
    pub vnic_type: Option<VnicType>,
    /// `device_id`.
    pub device_id: Option<String>,
    /// `device_owner`.
    pub device_owner: Option<String>,
}

impl PortUpdate {
    /// True when nothing would change.
    pub fn is_empty(&self) -> bool {
        self == &PortUpdate::default()
    }
}

/// A port an instance should get in [`NetworkApi::allocate_for_instance`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortRequest {
    /// vireo creates a port on this network (`preserve_on_delete = false`: deleted again at
    /// deallocation).
    Network {
        /// The network id.
        network_id: String,
    },
    /// A port the user created (`preserve_on_delete = true`: unbound, not deleted, at
    /// deallocation).
    Port {
        /// The port id.
        port_id: PortId,
    },
}

/// A network, the attributes a VIF needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkSummary {
    /// Network id.
    pub id: String,
    /// Name (Nova's `label`).
    pub name: String,
    /// MTU, when Neutron reports one.
    pub mtu: Option<u32>,
    /// `provider:physical_network`, when set (and visible).
    pub physical_network: Option<String>,
    /// Owning project.
    pub project_id: String,
}

/// The result of a delete whose target may already be gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// It existed and was deleted.
    Deleted,
    /// It did not exist (Neutron answered 404).
    AlreadyGone,
}

/// What [`NetworkApi::deallocate_for_instance`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Deallocation {
    /// Ports deleted (created by vireo).
    pub deleted: Vec<PortId>,
    /// User-supplied ports unbound.
    pub unbound: Vec<PortId>,
    /// Ports that no longer existed.
    pub already_gone: Vec<PortId>,
    /// Ports `network_info` lists that another instance uses now: left alone.
    pub skipped: Vec<PortId>,
}

/// The live migration [`NetworkApi::setup_networks_on_host`] prepares or tears down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationHosts {
    /// The destination host.
    pub dest: String,
}

/// One change [`NetworkApi::setup_networks_on_host`] made to one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSetupChange {
    /// `binding:profile.migrating_to` set to the destination.
    MigratingToSet {
        /// The port.
        port: PortId,
    },
    /// `binding:profile.migrating_to` removed.
    MigratingToCleared {
        /// The port.
        port: PortId,
    },
    /// The port's (inactive) binding for the destination deleted.
    DestBindingDeleted {
        /// The port.
        port: PortId,
    },
}

impl HostSetupChange {
    /// The port it concerns.
    pub fn port(&self) -> PortId {
        match self {
            HostSetupChange::MigratingToSet { port }
            | HostSetupChange::MigratingToCleared { port }
            | HostSetupChange::DestBindingDeleted { port } => *port,
        }
    }
}

/// What went wrong with one request to the network service, independent of the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The service answered with this HTTP status. The embedded service uses the status
    /// Neutron gives for the same refusal.
    Status(u16),
    /// No answer within the request timeout.
    Timeout,
    /// The connection could not be made (or broke before an answer).
    Connect,
    /// Another transport error.
    Transport,
    /// An answer vireo could not understand.
    BadResponse,
}

impl Failure {
    /// True when trying again later may help: 5xx, timeouts, connection and transport
    /// failures.
    pub fn is_retryable(&self) -> bool {
        match self {
            Failure::Status(s) => *s >= 500,
            Failure::Timeout | Failure::Connect | Failure::Transport => true,
            Failure::BadResponse => false,
        }
    }

    /// The HTTP status, when there is one.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            Failure::Status(s) => Some(*s),
            _ => None,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Status(s) => write!(f, "HTTP {s}"),
            Failure::Timeout => f.write_str("timed out"),
            Failure::Connect => f.write_str("connection failed"),
            Failure::Transport => f.write_str("transport error"),
            Failure::BadResponse => f.write_str("bad response"),
        }
    }
}

/// Why a network-service operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// Nova owns the ports of this host's instances (Nova network mode): vireo reads them but
    /// never changes them.
    #[error(
        "Nova owns this host's ports ([network.neutron] ports_owner = \"nova\"): vireo does not \
         {operation}; Nova moves ports and bindings between hosts"
    )]
    OwnedByNova {
        /// What was asked (`create a port`, `create a binding`, ...).
        operation: &'static str,
    },
    /// The port does not exist (404).
    #[error("port {port} not found")]
    PortNotFound {
        /// The port.
        port: PortId,
    },
    /// The network does not exist (404).
    #[error("network {network} not found")]
    NetworkNotFound {
        /// The network.
        network: String,
    },
    /// The port has no binding for the host (404).
    #[error("port {port} has no binding for host {host}")]
    BindingNotFound {
        /// The port.
        port: PortId,
        /// The host.
        host: String,
    },
    /// The port already has a binding for the host (409).
    #[error("port {port} already has a binding for host {host}")]
    BindingExists {
        /// The port.
        port: PortId,
        /// The host.
        host: String,
    },
    /// The port's binding for the host is already the active one (409).
    #[error("port {port}: binding for host {host} is already active")]
    BindingAlreadyActive {
        /// The port.
        port: PortId,
        /// The host.
        host: String,
    },
    /// vireo refuses to delete the port's active binding.
    #[error("port {port}: refusing to delete the active binding for host {host}")]
    DeleteActiveBinding {
        /// The port.
        port: PortId,
        /// The host.
        host: String,
    },
    /// The port could not be bound to the host (`vif_type` is `binding_failed` or
    /// `unbound` after binding).
    #[error("port {port}: binding to host {host} failed (vif_type {vif_type})")]
    BindingFailed {
        /// The port.
        port: PortId,
        /// The host.
        host: String,
        /// The vif_type Neutron reported.
        vif_type: String,
    },
    /// A user-supplied port is already used by another instance.
    #[error("port {port} is in use by {device_id}")]
    PortInUse {
        /// The port.
        port: PortId,
        /// Its current device id.
        device_id: String,
    },
    /// The VIF built for a port failed the strict network_info parse.
    #[error("port {port}: network_info entry rejected")]
    BadVif {
        /// The port.
        port: PortId,
        /// Why.
        #[source]
        source: Box<VifError>,
    },
    /// Listing an instance's ports failed.
    #[error("list ports of instance {instance}: {failure}")]
    ListPorts {
        /// The instance.
        instance: Uuid,
        /// What went wrong.
        failure: Failure,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// Reading a port failed.
    #[error("get port {port}: {failure}")]
    GetPort {
        /// The port.
        port: PortId,
        /// What went wrong.
        failure: Failure,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// Reading a network failed.
    #[error("get network {network}: {failure}")]
    GetNetwork {
        /// The network.
        network: String,
        /// What went wrong.
        failure: Failure,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// Creating a port failed.
    #[error("create port on network {network}: {failure}")]
    CreatePort {
        /// The network.
        network: String,
        /// What went wrong.
        failure: Failure,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// Updating a port failed.
    #[error("update port {port}: {failure}")]
    UpdatePort {
        /// The port.
        port: PortId,
        /// What went wrong.
        failure: Failure,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// Deleting a port failed.
    #[error("delete port {port}: {failure}")]
    DeletePort {
        /// The port.
        port: PortId,
        /// What went wrong.
        failure: Failure,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// Listing a port's bindings failed.
    #[error("show bindings of port {port}: {failure}")]
    ShowBindings {
        /// The port.
        port: PortId,
        /// What went wrong.
        failure: Failure,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// Creating a binding failed.
    #[error("create binding of port {port} for host {host}: {failure}")]
    CreateBinding {
        /// The port.
        port: PortId,
        /// The host.
        host: String,
        /// What went wrong.
        failure: Failure,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// Activating a binding failed.
    #[error("activate binding of port {port} for host {host}: {failure}")]
    ActivateBinding {
        /// The port.
        port: PortId,
        /// The host.
        host: String,
        /// What went wrong.
        failure: Failure,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// Deleting a binding failed.
    #[error("delete binding of port {port} for host {host}: {failure}")]
    DeleteBinding {
        /// The port.
        port: PortId,
        /// The host.
        host: String,
        /// What went wrong.
        failure: Failure,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// Authenticating to the identity service failed.
    #[error("authenticate: {failure}")]
    Authenticate {
        /// What went wrong.
        failure: Failure,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// Allocation failed, and cleaning up what it had done failed too.
    #[error("allocate for instance {instance}: cleanup left {} port(s) behind", leftovers.len())]
    AllocateCleanup {
        /// The instance.
        instance: Uuid,
        /// The failure that stopped the allocation.
        #[source]
        cause: Box<NetworkError>,
        /// The cleanup steps that failed.
        leftovers: Vec<NetworkError>,
    },
    /// Deallocation failed for some ports (it went on with the others).
    #[error("deallocate for instance {instance}: {} port(s) failed", failures.len())]
    Deallocate {
        /// The instance.
        instance: Uuid,
        /// What was done.
        done: Box<Deallocation>,
        /// One error per failed port.
        failures: Vec<NetworkError>,
    },
    /// Setting up or tearing down networks for a host failed for some ports (it went on with
    /// the others).
    #[error("setup networks on host for instance {instance}: {} port(s) failed", failures.len())]
    SetupNetworksOnHost {
        /// The instance.
        instance: Uuid,
        /// What was done.
        done: Vec<HostSetupChange>,
        /// One error per failed step.
        failures: Vec<NetworkError>,
    },
}

impl NetworkError {
    /// The request failure, for the variants that carry one.
    pub fn failure(&self) -> Option<Failure> {
        use NetworkError as E;
        match self {
            E::ListPorts { failure, .. }
            | E::GetPort { failure, .. }
            | E::GetNetwork { failure, .. }
            | E::CreatePort { failure, .. }
            | E::UpdatePort { failure, .. }
            | E::DeletePort { failure, .. }
            | E::ShowBindings { failure, .. }
            | E::CreateBinding { failure, .. }
            | E::ActivateBinding { failure, .. }
            | E::DeleteBinding { failure, .. }
            | E::Authenticate { failure, .. } => Some(*failure),
            E::PortNotFound { .. } | E::NetworkNotFound { .. } | E::BindingNotFound { .. } => {
                Some(Failure::Status(404))
            }
            E::BindingExists { .. } | E::BindingAlreadyActive { .. } => Some(Failure::Status(409)),
            E::AllocateCleanup { cause, .. } => cause.failure(),
            _ => None,
        }
    }

    /// The HTTP status behind the error, when there is one.
    pub fn http_status(&self) -> Option<u16> {
        self.failure().and_then(|f| f.http_status())
    }

    /// True when trying again later may help (5xx, timeouts, connection failures; for the
    /// batch operations, when every failed step is retryable).
    pub fn is_retryable(&self) -> bool {
        match self {
            NetworkError::Deallocate { failures, .. }
            | NetworkError::SetupNetworksOnHost { failures, .. } => {
                !failures.is_empty() && failures.iter().all(NetworkError::is_retryable)
            }
            other => other.failure().is_some_and(|f| f.is_retryable()),
        }
    }

    /// The port the error concerns, when it concerns one.
    pub fn port(&self) -> Option<PortId> {
        use NetworkError as E;
        match self {
            E::PortNotFound { port }
            | E::BindingNotFound { port, .. }
            | E::BindingExists { port, .. }
            | E::BindingAlreadyActive { port, .. }
            | E::DeleteActiveBinding { port, .. }
            | E::BindingFailed { port, .. }
            | E::PortInUse { port, .. }
            | E::BadVif { port, .. }
            | E::GetPort { port, .. }
            | E::UpdatePort { port, .. }
            | E::DeletePort { port, .. }
            | E::ShowBindings { port, .. }
            | E::CreateBinding { port, .. }
            | E::ActivateBinding { port, .. }
            | E::DeleteBinding { port, .. } => Some(*port),
            E::AllocateCleanup { cause, .. } => cause.port(),
            _ => None,
        }
    }
}

/// The network service.
///
/// `instance` is always the instance uuid (Neutron's `device_id`); `host` a compute host
/// name as Neutron knows it (`binding:host_id`).
#[async_trait]
pub trait NetworkApi: Send + Sync + fmt::Debug + 'static {
    /// Ports whose `device_id` is the instance.
    async fn list_instance_ports(&self, instance: Uuid) -> Result<Vec<Port>, NetworkError>;

    /// One port. Missing: [`NetworkError::PortNotFound`].
    async fn get_port(&self, port: PortId) -> Result<Port, NetworkError>;

    /// One network. Missing: [`NetworkError::NetworkNotFound`].
    async fn get_network(&self, network_id: &str) -> Result<NetworkSummary, NetworkError>;

    /// Create an unbound port on a network, with no device. Missing network:
    /// [`NetworkError::NetworkNotFound`].
    async fn create_port(&self, network_id: &str) -> Result<Port, NetworkError> {
        self.create_port_with(network_id, None).await
    }

    /// Create an unbound port on a network; with `device_id`, the port names that instance
    /// from its creation on (so a build that dies before binding it still finds it by
    /// instance, see [`release_build_ports`]). Missing network:
    /// [`NetworkError::NetworkNotFound`].
    async fn create_port_with(
        &self,
        network_id: &str,
        device_id: Option<Uuid>,
    ) -> Result<Port, NetworkError>;

    /// Update a port (binding host, profile, vnic type, device id/owner) and return it as
    /// Neutron answered. Missing: [`NetworkError::PortNotFound`]. A binding that Neutron
    /// could not make is not an error here: check [`Port::vif_type`].
    async fn update_port(&self, port: PortId, update: &PortUpdate) -> Result<Port, NetworkError>;

    /// Delete a port. Missing: `Ok(Removal::AlreadyGone)`.
    async fn delete_port(&self, port: PortId) -> Result<Removal, NetworkError>;

    /// Every binding of a port (active and inactive). Missing port:
    /// [`NetworkError::PortNotFound`].
    async fn show_bindings(&self, port: PortId) -> Result<Vec<PortBinding>, NetworkError>;

    /// Create a binding for a host. When the port already has an active binding (always the
    /// case for a port Neutron knows) the new one is inactive. A binding for that host
    /// already: [`NetworkError::BindingExists`]; a port that is not a compute port: a
    /// `CreateBinding` error with HTTP 400; a host where Neutron cannot bind:
    /// [`NetworkError::BindingFailed`].
    async fn create_binding(
        &self,
        port: PortId,
        binding: &NewBinding,
    ) -> Result<PortBinding, NetworkError>;

    /// Make the port's inactive binding for `host` the active one (the old active binding
    /// becomes inactive, the port goes DOWN). Already active:
    /// [`NetworkError::BindingAlreadyActive`]; no binding for the host:
    /// [`NetworkError::BindingNotFound`]. Not retried by the Neutron client (a repeated
    /// activation answers 409).
    async fn activate_binding(&self, port: PortId, host: &str)
        -> Result<PortBinding, NetworkError>;

    /// Delete the port's inactive binding for `host`. Missing binding or port:
    /// `Ok(Removal::AlreadyGone)`. The active binding: [`NetworkError::DeleteActiveBinding`].
    async fn delete_binding(&self, port: PortId, host: &str) -> Result<Removal, NetworkError>;

    /// Give the instance its ports on `host`: create a port for each
    /// [`PortRequest::Network`], take each [`PortRequest::Port`] (refused with
    /// [`NetworkError::PortInUse`] when another instance has it), and bind every one to
    /// `host` with `device_id = instance` and the configured `compute:<zone>` owner.
    /// Returns Nova's network_info for them, in request order, parsed strictly
    /// (`preserve_on_delete` is true exactly for user-supplied ports). On failure it deletes
    /// the ports it created and unbinds the user-supplied ones it had bound.
    async fn allocate_for_instance(
        &self,
        instance: Uuid,
        host: &str,
        requests: &[PortRequest],
    ) -> Result<NetworkInfo, NetworkError>;

    /// Release the instance's ports: delete those vireo created, unbind the user-supplied
    /// ones (host, device id/owner cleared, PCI/physnet keys of the profile removed). The
    /// "user-supplied" fact comes from `network_info` (`preserve_on_delete`); ports found by
    /// `device_id` that `network_info` does not list are treated as vireo's and deleted (as
    /// Nova does). Goes on past failures and reports them all in
    /// [`NetworkError::Deallocate`]. Ports already gone count as done.
    async fn deallocate_for_instance(
        &self,
        instance: Uuid,
        network_info: &NetworkInfo,
    ) -> Result<Deallocation, NetworkError>;

    /// Prepare or tear down an instance's ports around a live migration (Nova's
    /// `setup_networks_on_host`). `host` is where the instance's ports are actively bound
    /// now (the source).
    ///
    /// - `teardown == false`, `migration == Some(m)`: set `binding:profile.migrating_to =
    ///   m.dest` on every port bound to `host` that does not have it already.
    /// - `teardown == true`: on every port of the instance (wherever bound), remove
    ///   `migrating_to`; with `migration == Some(m)` also delete the port's inactive binding
    ///   for `m.dest` (gone already = fine; a binding on `m.dest` that is the active one is
    ///   left alone).
    /// - `teardown == false`, `migration == None`: nothing to do.
    ///
    /// Idempotent: a second call changes nothing and returns no changes. Goes on past
    /// failures and reports them in [`NetworkError::SetupNetworksOnHost`]. Returns the
    /// changes made, in port order.
    async fn setup_networks_on_host(
        &self,
        instance: Uuid,
        host: &str,
        teardown: bool,
        migration: Option<&MigrationHosts>,
    ) -> Result<Vec<HostSetupChange>, NetworkError>;
}

/// Release what a build that died before its domain existed left on `host`
/// ([`crate::instance::journal`]): every port of the instance (by `device_id`) that is bound
/// to `host` or to no host is deleted, except `user_ports`, which are unbound. A port bound to
/// another host is left alone (a rescheduled build of the same instance owns it), as is a
/// user-supplied port the build never took. Goes on past failures and reports them in
/// [`NetworkError::Deallocate`].
pub async fn release_build_ports<A: NetworkApi + ?Sized>(
    api: &A,
    instance: Uuid,
    host: &str,
    user_ports: &[PortId],
) -> Result<Deallocation, NetworkError> {
    let mut done = Deallocation::default();
    let mut failures = Vec::new();
    for port in api.list_instance_ports(instance).await? {
        if !port.host_id.is_empty() && port.host_id != host {
            done.skipped.push(port.id);
            continue;
        }
        let preserve = user_ports.contains(&port.id);
        release_port(api, &port, preserve, &mut done, &mut failures).await;
    }
    Deallocation::into_result(done, instance, failures)
}

/// Release one port of an instance: unbind it when the user supplied it (`preserve`),
/// delete it otherwise; what happened goes into `done`, a failure into `failures`.
pub async fn release_port<A: NetworkApi + ?Sized>(
    api: &A,
    port: &Port,
    preserve: bool,
    done: &mut Deallocation,
    failures: &mut Vec<NetworkError>,
) {
    if preserve {
        match api.update_port(port.id, &unbind_update(port)).await {
            Ok(_) => done.unbound.push(port.id),
            Err(NetworkError::PortNotFound { .. }) => done.already_gone.push(port.id),
            Err(e) => failures.push(e),
        }
    } else {
        match api.delete_port(port.id).await {
            Ok(Removal::Deleted) => done.deleted.push(port.id),
            Ok(Removal::AlreadyGone) => done.already_gone.push(port.id),
            Err(e) => failures.push(e),
        }
    }
}

impl Deallocation {
    /// `Ok(self)`, or [`NetworkError::Deallocate`] with what was done when any port failed.
    pub fn into_result(
        self,
        instance: Uuid,
        failures: Vec<NetworkError>,
    ) -> Result<Deallocation, NetworkError> {
        if failures.is_empty() {
            Ok(self)
        } else {
            Err(NetworkError::Deallocate {
                instance,
                done: Box::new(self),
                failures,
            })
        }
    }
}

/// `profile` without the PCI/physnet keys ([`PCI_PROFILE_KEYS`]), as an unbound
/// user-supplied port keeps it.
pub fn profile_without_pci(profile: &Map<String, Value>) -> Map<String, Value> {
    profile
        .iter()
        .filter(|(k, _)| !PCI_PROFILE_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The [`PortUpdate`] that unbinds a user-supplied port at deallocation.
pub fn unbind_update(port: &Port) -> PortUpdate {
    PortUpdate {
        host_id: Some(String::new()),
        profile: Some(profile_without_pci(&port.profile)),
        vnic_type: None,
        device_id: Some(String::new()),
        device_owner: Some(String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid(n: u8) -> PortId {
        PortId(Uuid::from_bytes([n; 16]))
    }

    fn boxed(msg: &str) -> BoxError {
        msg.to_owned().into()
    }

    #[test]
    fn retryable_follows_the_failure() {
        let e = |failure| NetworkError::UpdatePort {
            port: pid(1),
            failure,
            source: boxed("x"),
        };
        assert!(e(Failure::Status(500)).is_retryable());
        assert!(e(Failure::Status(503)).is_retryable());
        assert!(!e(Failure::Status(400)).is_retryable());
        assert!(!e(Failure::Status(409)).is_retryable());
        assert!(e(Failure::Timeout).is_retryable());
        assert!(e(Failure::Connect).is_retryable());
        assert!(!e(Failure::BadResponse).is_retryable());
        assert!(!NetworkError::PortNotFound { port: pid(1) }.is_retryable());
        assert_eq!(
            NetworkError::PortNotFound { port: pid(1) }.http_status(),
            Some(404)
        );
        assert_eq!(e(Failure::Timeout).http_status(), None);
        assert_eq!(e(Failure::Status(502)).http_status(), Some(502));
    }

    #[test]
    fn batch_errors_are_retryable_only_when_every_step_is() {
        let retryable = NetworkError::DeletePort {
            port: pid(1),
            failure: Failure::Status(503),
            source: boxed("x"),
        };
        let fatal = NetworkError::DeletePort {
            port: pid(2),
            failure: Failure::Status(403),
            source: boxed("x"),
        };
        let batch = |failures| NetworkError::Deallocate {
            instance: Uuid::nil(),
            done: Box::default(),
            failures,
        };
        assert!(batch(vec![retryable]).is_retryable());
        let retryable = NetworkError::DeletePort {
            port: pid(1),
            failure: Failure::Timeout,
            source: boxed("x"),
        };
        assert!(!batch(vec![retryable, fatal]).is_retryable());
        assert!(!batch(vec![]).is_retryable());
    }

    #[test]
    fn messages_name_port_and_status_but_not_the_source() {
        let e = NetworkError::CreateBinding {
            port: pid(7),
            host: "h2".into(),
            failure: Failure::Status(500),
            source: boxed("secret detail"),
        };
        let text = e.to_string();
        assert!(text.contains(&pid(7).to_string()), "{text}");
        assert!(text.contains("h2") && text.contains("HTTP 500"), "{text}");
        assert!(!text.contains("secret detail"), "{text}");
        assert_eq!(
            std::error::Error::source(&e).map(|s| s.to_string()),
            Some("secret detail".to_owned())
        );
        assert_eq!(e.port(), Some(pid(7)));
    }

    #[test]
    fn port_status_round_trips() {
        for s in [
            PortStatus::Active,
            PortStatus::Down,
            PortStatus::Build,
            PortStatus::Error,
            PortStatus::NotApplicable,
        ] {
            assert_eq!(s.as_str().parse::<PortStatus>(), Ok(s));
        }
        assert!("active".parse::<PortStatus>().is_err());
    }

    #[test]
    fn unbind_clears_host_device_and_pci_keys_only() {
        let mut profile = Map::new();
        for k in PCI_PROFILE_KEYS {
            profile.insert(k.to_owned(), Value::from("x"));
        }
        profile.insert("trusted".into(), Value::from(true));
        profile.insert(MIGRATING_TO.into(), Value::from("h2"));
        let port = Port {
            id: pid(1),
            network_id: "n".into(),
            mac_address: "fa:16:3e:00:00:01".parse().unwrap(),
            device_id: Uuid::from_bytes([9; 16]).to_string(),
            device_owner: "compute:nova".into(),
            status: PortStatus::Active,
            admin_state_up: true,
            host_id: "h1".into(),
            vif_type: "ovs".into(),
            vnic_type: VnicType::Normal,
            vif_details: Map::new(),
            profile,
            fixed_ips: vec![],
        };
        assert!(port.is_compute_port() && port.is_bound());
        assert_eq!(port.migrating_to(), Some("h2"));
        let u = unbind_update(&port);
        assert_eq!(u.host_id.as_deref(), Some(""));
        assert_eq!(u.device_id.as_deref(), Some(""));
        assert_eq!(u.device_owner.as_deref(), Some(""));
        let p = u.profile.unwrap();
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p.contains_key("trusted") && p.contains_key(MIGRATING_TO));
    }

    #[test]
    fn compute_port_needs_uuid_device_and_compute_owner() {
        let mut port = Port {
            id: pid(1),
            network_id: "n".into(),
            mac_address: "fa:16:3e:00:00:01".parse().unwrap(),
            device_id: "not-a-uuid".into(),
            device_owner: "compute:nova".into(),
            status: PortStatus::Down,
            admin_state_up: true,
            host_id: String::new(),
            vif_type: VIF_TYPE_UNBOUND.into(),
            vnic_type: VnicType::Normal,
            vif_details: Map::new(),
            profile: Map::new(),
            fixed_ips: vec![],
        };
        assert!(!port.is_compute_port());
        port.device_id = Uuid::from_bytes([3; 16]).to_string();
        assert!(port.is_compute_port());
        port.device_owner = "network:dhcp".into();
        assert!(!port.is_compute_port());
        assert!(!port.is_bound());
    }
}
