//! PROVISIONAL: a stand-in for the `ComputeDriver` trait (driver/src/compute.rs) and the
//! instance types (`vireo_actors::instance`) that the lead is writing on another branch.
//!
//! The shapes follow what was announced: one async method per operation returning an
//! [`OpReport`] or an [`InstanceError`] with a stable [`InstanceError::code`], `show`/`list`
//! returning [`InstanceView`]s with the in-flight operation's progress, and a bounded
//! `shutdown`. The HTTP layer only calls a `dyn ComputeDriver` and converts these types in
//! `agent::view`; when the real trait lands, this file is deleted and the imports (plus the
//! conversions in `view.rs`) are switched. Nothing here is a driver: tests implement the
//! trait with an in-test fake.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::PathBuf;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use uuid::Uuid;
use vireo_actors::external::{EventName, ExternalEvent};
use vireo_actors::lifecycle::{InstanceState, Request};
use vireo_actors::vif::{NetworkInfo, PortId, Vif};

/// A flavor: the instance's size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Flavor {
    /// Flavor name.
    pub name: String,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Root disk in GiB (0: no root disk).
    #[serde(default)]
    pub root_gb: u64,
    /// Extra specs (`hw:vif_multiqueue_enabled`, `quota:vif_*`, ...).
    #[serde(default)]
    pub extra_specs: BTreeMap<String, String>,
}

/// What the instance boots: validated host paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootImage {
    /// Kernel for direct kernel boot.
    pub kernel: Option<PathBuf>,
    /// Initial ramdisk.
    pub initrd: Option<PathBuf>,
    /// Disk image.
    pub disk: Option<PathBuf>,
    /// Kernel command line.
    pub cmdline: Option<String>,
}

/// Everything `spawn` needs.
#[derive(Debug, Clone)]
pub struct SpawnArgs {
    /// Display name.
    pub name: String,
    /// Size.
    pub flavor: Flavor,
    /// What to boot.
    pub image: BootImage,
    /// Nova's network_info, parsed strictly.
    pub network_info: NetworkInfo,
    /// The serial console log file (inside the instance directory).
    pub console_log: PathBuf,
}

/// A resize's migration record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// Migration id.
    pub id: Uuid,
    /// Where the instance is now.
    pub source_host: String,
    /// Where it goes (the same host for an in-place resize).
    pub dest_host: String,
}

/// Arguments of a live migration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveMigrateArgs {
    /// Destination host name (Neutron's binding host).
    pub dest_host: String,
    /// Destination libvirt URI, when not derived from the host name.
    pub dest_uri: Option<String>,
    /// Copy the disks (no shared storage).
    pub block_migration: bool,
}

/// Soft (ACPI, then hard after a timeout) or hard reboot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebootKind {
    /// Guest-cooperative.
    Soft,
    /// Destroy and re-create the domain.
    Hard,
}

/// The domain's power state as libvirt reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PowerState {
    /// No domain.
    NoState,
    /// Running.
    Running,
    /// Paused.
    Paused,
    /// Shut off.
    Shutdown,
    /// Crashed.
    Crashed,
    /// Suspended (managed save / PM suspend).
    Suspended,
}

/// One VIF as the instance sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VifView {
    /// Port id.
    pub port: PortId,
    /// MAC address.
    pub address: String,
    /// Neutron vif_type.
    pub vif_type: String,
    /// Host device name.
    pub devname: Option<String>,
    /// Wired on the host.
    pub plugged: bool,
}

/// An event an operation is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Awaited {
    /// Event name.
    pub name: EventName,
    /// Port id.
    pub tag: PortId,
}

/// The in-flight operation of an instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Progress {
    /// Which operation.
    pub request: Request,
    /// Current step, e.g. `plug-vifs`.
    pub step: String,
    /// Steps done so far.
    pub steps_done: u32,
    /// Events the operation waits for right now.
    pub waiting_for: Vec<Awaited>,
}

/// One instance on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceView {
    /// Instance uuid.
    pub uuid: Uuid,
    /// Display name.
    pub name: String,
    /// Lifecycle state.
    pub state: InstanceState,
    /// Power state.
    pub power: PowerState,
    /// VIFs.
    pub vifs: Vec<VifView>,
    /// In-flight operation.
    pub operation: Option<Progress>,
}

/// How one wait of an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaitReport {
    /// What was awaited.
    pub events: Vec<Awaited>,
    /// `completed`, `timed-out`, `failed`, ...
    pub outcome: String,
    /// How long it took, ms.
    pub waited_ms: u64,
}

/// What a finished operation did.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct OpReport {
    /// Steps, in order.
    pub steps: Vec<String>,
    /// Waits for network events.
    pub waits: Vec<WaitReport>,
}

/// Why an instance operation failed. [`InstanceError::code`] is stable API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstanceError {
    /// Another operation is in flight.
    #[error("instance {0} is busy with another operation")]
    Busy(Uuid),
    /// Not allowed in the current state.
    #[error("{request} is not allowed while the instance is {state}")]
    IllegalState {
        /// The state.
        state: InstanceState,
        /// The refused request.
        request: Request,
    },
    /// No such instance here.
    #[error("instance {0} not found")]
    NotFound(Uuid),
    /// Bad arguments.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The operation failed (and was rolled back where possible).
    #[error("operation failed: {0}")]
    Failed(String),
    /// The driver is shutting down.
    #[error("driver shutting down")]
    ShuttingDown,
}

impl InstanceError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            InstanceError::Busy(_) => "busy",
            InstanceError::IllegalState { .. } => "illegal-state",
            InstanceError::NotFound(_) => "not-found",
            InstanceError::Invalid(_) => "invalid",
            InstanceError::Failed(_) => "failed",
            InstanceError::ShuttingDown => "shutting-down",
        }
    }
}

/// The driver's answer for one external event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventResult {
    /// Nova's per-event code (200, 404, 422, 400).
    pub code: u16,
}

/// The virt driver as the agent drives it.
#[async_trait]
pub trait ComputeDriver: Send + Sync + Debug {
    /// Driver name (`libvirt`).
    fn name(&self) -> &str;
    /// This host's name.
    fn host(&self) -> &str;
    /// Build and start an instance.
    async fn spawn(&self, uuid: Uuid, args: SpawnArgs) -> Result<OpReport, InstanceError>;
    /// Destroy an instance (idempotent).
    async fn destroy(&self, uuid: Uuid) -> Result<OpReport, InstanceError>;
    /// Power off.
    async fn power_off(&self, uuid: Uuid) -> Result<OpReport, InstanceError>;
    /// Power on.
    async fn power_on(&self, uuid: Uuid) -> Result<OpReport, InstanceError>;
    /// Reboot.
    async fn reboot(&self, uuid: Uuid, kind: RebootKind) -> Result<OpReport, InstanceError>;
    /// Pause.
    async fn pause(&self, uuid: Uuid) -> Result<OpReport, InstanceError>;
    /// Unpause.
    async fn unpause(&self, uuid: Uuid) -> Result<OpReport, InstanceError>;
    /// Suspend.
    async fn suspend(&self, uuid: Uuid) -> Result<OpReport, InstanceError>;
    /// Resume.
    async fn resume(&self, uuid: Uuid) -> Result<OpReport, InstanceError>;
    /// Resize to `new_flavor`.
    async fn resize(
        &self,
        uuid: Uuid,
        migration: Migration,
        new_flavor: Flavor,
    ) -> Result<OpReport, InstanceError>;
    /// Confirm a resize.
    async fn confirm_resize(&self, uuid: Uuid) -> Result<OpReport, InstanceError>;
    /// Revert a resize.
    async fn revert_resize(&self, uuid: Uuid) -> Result<OpReport, InstanceError>;
    /// Live-migrate away.
    async fn live_migrate(
        &self,
        uuid: Uuid,
        args: LiveMigrateArgs,
    ) -> Result<OpReport, InstanceError>;
    /// Attach an interface.
    async fn attach_interface(&self, uuid: Uuid, vif: Vif) -> Result<OpReport, InstanceError>;
    /// Detach an interface.
    async fn detach_interface(&self, uuid: Uuid, port: PortId) -> Result<OpReport, InstanceError>;
    /// One instance.
    async fn show(&self, uuid: Uuid) -> Result<InstanceView, InstanceError>;
    /// Every instance.
    async fn list(&self) -> Vec<InstanceView>;
    /// External events (the agent delivers them to the events actor itself).
    async fn external_events(&self, events: Vec<ExternalEvent>) -> Vec<EventResult>;
    /// Finish or roll back in-flight operations by `deadline`.
    async fn shutdown(&self, deadline: Instant);
}
