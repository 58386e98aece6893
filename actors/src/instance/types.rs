//! The instance actor's request, reply and error types (one request enum in, one reply and one
//! error enum out).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;
use vireo_xml::metadata::Flavor;

use crate::events::WaitError;
use crate::libvirt::LibvirtError;
use crate::lifecycle::{InstanceState, Request};
use crate::network::{Deallocation, NetworkError, PortRequest};
use crate::plug::PlugError;
use crate::predict::{ExpectedEvent, PredictError, Timing};
use crate::vif::{NetworkInfo, PortId};
use crate::vif_config::VifConfigError;

use crate::storage::{ConfigDrive, ImageRef, StorageError};

use super::record::{BootSource, RecordError, StorageRecord};

/// How the instance gets its network.
#[derive(Debug, Clone, PartialEq)]
pub enum NetworkRequest {
    /// The caller allocated the ports already; this is their `network_info`.
    Allocated(NetworkInfo),
    /// vireo allocates: a port per request, bound to this host.
    Allocate(Vec<PortRequest>),
}

/// Build an instance here.
#[derive(Debug, Clone, PartialEq)]
pub struct SpawnArgs {
    /// The libvirt domain name.
    pub name: String,
    /// The flavor.
    pub flavor: Flavor,
    /// What the guest boots.
    pub boot: BootSource,
    /// Its root disk's image and its config drive.
    pub storage: SpawnStorage,
    /// The ports.
    pub network: NetworkRequest,
    /// Start it (true) or leave it defined and stopped once built (false).
    pub power_on: bool,
}

/// What a build makes disks from.
#[derive(Clone, Default, PartialEq)]
pub struct SpawnStorage {
    /// The root disk's image (none: no root disk).
    pub image: Option<ImageRef>,
    /// A token to fetch it with (Glance's `X-Auth-Token`); used once, never recorded.
    pub image_token: Option<String>,
    /// A config drive and what it holds besides what vireo knows (none: no config drive).
    pub config_drive: Option<ConfigDrive>,
}

impl std::fmt::Debug for SpawnStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnStorage")
            .field("image", &self.image)
            .field(
                "image_token",
                &self.image_token.as_ref().map(|_| "<redacted>"),
            )
            .field("config_drive", &self.config_drive)
            .finish()
    }
}

/// Tear an instance down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DestroyArgs {
    /// Also release its networking (delete the ports vireo created, unbind user ports).
    pub deallocate_network: bool,
}

/// How to reboot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RebootKind {
    /// ACPI reboot, falling back to hard when the guest does not react.
    Soft,
    /// Destroy and recreate the domain.
    Hard,
}

/// A migration (resize, cold or live migration) as both hosts know it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migration {
    /// Migration id.
    pub id: Uuid,
    /// The host the instance leaves.
    pub source_host: String,
    /// The host the instance goes to.
    pub dest_host: String,
}

impl Migration {
    /// Source and destination are the same host.
    pub fn same_host(&self) -> bool {
        self.source_host == self.dest_host
    }
}

/// What the destination of a resize needs to build the instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handover {
    /// The libvirt domain name.
    pub name: String,
    /// The flavor to build with.
    pub flavor: Flavor,
    /// The flavor the instance had before the resize.
    pub old_flavor: Flavor,
    /// What the guest boots.
    pub boot: BootSource,
    /// Its image, config drive and disks.
    #[serde(default, skip_serializing_if = "StorageRecord::is_empty")]
    pub storage: StorageRecord,
    /// Nova-format `network_info`.
    pub network_info: serde_json::Value,
    /// The instance was running before and must run after.
    pub power_on: bool,
}

/// Which part of an operation a step's time counts toward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepKind {
    /// libvirt calls.
    Libvirt,
    /// VIF plugging and unplugging.
    Plug,
    /// Network-service calls.
    Network,
    /// Waiting for network events.
    EventWait,
    /// Calls to the other host of a migration.
    Peer,
    /// Making, copying and removing disks (image fetches included).
    Storage,
}

/// One step of an operation, for the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// What it did.
    pub name: String,
    /// Which clock it counts toward.
    pub kind: StepKind,
    /// How long it took.
    pub took: Duration,
    /// Offset from the operation's start.
    pub at: Duration,
    /// It failed (the operation then rolled back or stopped).
    pub failed: bool,
}

/// One event wait of an operation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WaitReport {
    /// Which prediction it covered.
    pub timing: Timing,
    /// What it waited for.
    pub expected: Vec<ExpectedEvent>,
    /// How long the wait took (registration to release).
    pub took: Duration,
    /// The wait was satisfied completely.
    pub complete: bool,
    /// Ports that never reported (non-fatal waits) or that failed.
    pub missing: Vec<PortId>,
    /// Ports whose first `network-vif-plugged` was stale (the network service did not show
    /// the port ACTIVE a second after it): the wait went on until it was, or until the
    /// confirmation window ended (then the port is in `unconfirmed` too).
    pub stale: Vec<PortId>,
    /// Ports whose `network-vif-plugged` came but which the network service still did not
    /// show ACTIVE when the confirmation window ended: the events were trusted.
    pub unconfirmed: Vec<PortId>,
    /// How it ended, in words.
    pub outcome: String,
}

/// What one operation did.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct OpReport {
    /// The operation id.
    pub op_id: u64,
    /// The request.
    pub request: String,
    /// Wall time.
    pub took: Duration,
    /// The steps in order.
    pub steps: Vec<Step>,
    /// The event waits in order.
    pub waits: Vec<WaitReport>,
    /// What networking was released (spawn failures, destroy with deallocation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released: Option<Released>,
    /// What a live migration's destination prepared for the disks (pre-live-migration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incoming: Option<IncomingDisks>,
    /// What a resize's source hands to a caller that carries it to the destination itself
    /// (`caller_finishes`): the destination's `finish-resize` takes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handover: Option<Handover>,
}

/// What a live migration's destination prepared for the instance's disks, told back to the
/// source in the pre-live-migration's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IncomingDisks {
    /// The destination sees the source's instances directory (the source's probe file is
    /// in its own): the disks are where the guest will use them already, nothing is copied.
    pub shared_instance_path: bool,
    /// The disks on the destination, in device order (empty for an instance without
    /// disks).
    pub disks: Vec<crate::storage::InstanceDisk>,
}

impl OpReport {
    /// Total time of the steps of one kind.
    pub fn total(&self, kind: StepKind) -> Duration {
        self.steps
            .iter()
            .filter(|s| s.kind == kind)
            .map(|s| s.took)
            .sum()
    }
}

/// Networking released by vireo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Released {
    /// Ports deleted.
    pub deleted: Vec<PortId>,
    /// User ports unbound.
    pub unbound: Vec<PortId>,
    /// Ports that were already gone.
    pub already_gone: Vec<PortId>,
}

impl From<Deallocation> for Released {
    fn from(d: Deallocation) -> Self {
        Released {
            deleted: d.deleted,
            unbound: d.unbound,
            already_gone: d.already_gone,
        }
    }
}

/// The power state libvirt reports, simplified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PowerState {
    /// No domain.
    NoDomain,
    /// Running.
    Running,
    /// Paused.
    Paused,
    /// Shut off (or crashed).
    Shutoff,
    /// Suspended to disk / PM-suspended.
    Suspended,
    /// libvirt cannot tell.
    Unknown,
}

/// What an operation in progress is doing, for `show`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Progress {
    /// The operation id.
    pub op_id: u64,
    /// The request.
    pub request: String,
    /// The current phase.
    pub phase: String,
    /// Time since it started.
    pub elapsed: Duration,
    /// Events it is waiting for right now.
    pub waiting_for: Vec<ExpectedEvent>,
    /// Time left before the earliest of those waits times out.
    pub wait_remaining: Option<Duration>,
}

/// A VIF as `show` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VifView {
    /// The port.
    pub port: PortId,
    /// Its MAC.
    pub mac: String,
    /// vif_type.
    pub vif_type: String,
    /// vnic_type.
    pub vnic_type: String,
    /// OVS hybrid plug.
    pub hybrid: bool,
    /// The host device.
    pub device: String,
    /// The ML2 mechanism driver that bound the port (`bound_drivers`), when Neutron said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_by: Option<String>,
}

/// What `show` reports about one instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceView {
    /// The instance.
    pub uuid: Uuid,
    /// This host.
    pub host: String,
    /// The domain name.
    pub name: Option<String>,
    /// Lifecycle state.
    pub state: InstanceState,
    /// Power state (as last read).
    pub power: PowerState,
    /// Flavor name.
    pub flavor: Option<String>,
    /// The flavor's vCPUs and memory (MiB): what the instance takes of the host.
    pub size: Option<(u32, u64)>,
    /// VIFs.
    pub vifs: Vec<VifView>,
    /// Disks on this host, in device order.
    pub disks: Vec<crate::storage::InstanceDisk>,
    /// The operation in progress.
    pub operation: Option<Progress>,
    /// The last operation's report.
    pub last_operation: Option<OpReport>,
    /// What another host needs to take the instance over (a live migration's destination
    /// under Nova, which carries it as the source's disk info); None without a record.
    pub handover: Option<Handover>,
}

/// What went wrong with a request to an instance actor.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// The instance refused the request: nothing was started.
    #[error(transparent)]
    Refused(#[from] super::admission::AdmissionError),
    /// The request cannot apply to this instance or host.
    #[error(transparent)]
    Invalid(InvalidOperation),
    /// The domain XML a live migration's destination is given could not be written.
    #[error("the destination's domain XML")]
    DestinationXml {
        /// Why.
        #[source]
        source: vireo_xml::XmlError,
    },
    /// A libvirt call failed.
    #[error("libvirt {step} failed")]
    Libvirt {
        /// The step.
        step: &'static str,
        /// Why.
        #[source]
        source: LibvirtError,
    },
    /// Plugging or unplugging failed.
    #[error("{step} failed")]
    Plug {
        /// The step.
        step: &'static str,
        /// Why.
        #[source]
        source: PlugError,
    },
    /// Making or removing the instance's disks failed.
    #[error("storage {step} failed")]
    Storage {
        /// The step.
        step: &'static str,
        /// Why.
        #[source]
        source: StorageError,
    },
    /// A journal (a build's, a live migration's) could not be written.
    #[error("journal {step} failed")]
    Journal {
        /// The step.
        step: &'static str,
        /// Why.
        #[source]
        source: super::journal::JournalError,
    },
    /// A live migration ran past its completion timeout: its job was aborted.
    #[error(
        "the live migration was aborted after {after:?} (its completion timeout is {limit:?})"
    )]
    MigrationAborted {
        /// How long it had run.
        after: Duration,
        /// The limit.
        limit: Duration,
        /// What the aborted migration call answered.
        #[source]
        source: LibvirtError,
    },
    /// The guest did not release a device detached from it: no device-removed event and the
    /// device still in its live definition after every attempt. The host side stays plugged.
    #[error("the guest did not release device {alias} after {attempts} requests ({waited:?})")]
    DeviceNotReleased {
        /// The device's alias.
        alias: String,
        /// How many times the guest was asked.
        attempts: u32,
        /// How long it was waited for in all.
        waited: Duration,
    },
    /// A network-service call failed.
    #[error("network {step} failed")]
    Network {
        /// The step.
        step: &'static str,
        /// Why.
        #[source]
        source: NetworkError,
    },
    /// An event wait failed (fatal).
    #[error("waiting for {timing} events failed")]
    EventWait {
        /// Which wait.
        timing: &'static str,
        /// Why.
        #[source]
        source: WaitError,
    },
    /// The event model cannot handle a VIF.
    #[error("event prediction failed")]
    Predict(#[source] PredictError),
    /// A VIF has no libvirt device.
    #[error("device configuration failed")]
    VifConfig(#[source] VifConfigError),
    /// The instance record or domain XML could not be built or read.
    #[error("instance record")]
    Record(#[source] RecordError),
    /// The other host of a migration failed.
    #[error("host {host} failed {step}")]
    Peer {
        /// The host.
        host: String,
        /// What it was asked.
        step: &'static str,
        /// Why.
        #[source]
        source: Box<InstanceError>,
    },
    /// The other host of a migration is not known.
    #[error("unknown host {0}")]
    UnknownHost(String),
    /// The build failed; everything it created here was removed and its networking released.
    #[error("build failed and was cleaned up (reschedulable: {reschedule})")]
    BuildFailed {
        /// Another host may try.
        reschedule: bool,
        /// What networking was released.
        released: Released,
        /// The failure.
        #[source]
        cause: Box<InstanceError>,
    },
    /// The operation failed and was rolled back; the instance is as before.
    #[error("{request} failed and was rolled back")]
    RolledBack {
        /// The request.
        request: Request,
        /// The failure.
        #[source]
        cause: Box<InstanceError>,
    },
    /// The operation failed, and so did part of its rollback: the instance is in `error`.
    #[error("{request} failed; rollback incomplete: {rollback}")]
    RollbackFailed {
        /// The request.
        request: Request,
        /// What of the rollback failed.
        rollback: String,
        /// The original failure.
        #[source]
        cause: Box<InstanceError>,
    },
    /// The operation ended in a state the lifecycle does not allow for it (a bug in its
    /// flow): reported instead of the result, which `cause` keeps when it was a failure.
    #[error("{transition}")]
    UnexpectedTransition {
        /// Where it started and ended.
        transition: crate::lifecycle::UnexpectedTransition,
        /// The failure the operation reported, if it failed.
        #[source]
        cause: Option<Box<InstanceError>>,
    },
    /// A destroy admitted next to a running operation failed (every caller whose destroy was
    /// queued behind that operation gets the one failure).
    #[error("destroy failed")]
    QueuedDestroy {
        /// Why.
        #[source]
        cause: std::sync::Arc<InstanceError>,
    },
    /// The operation was cancelled (destroy or shutdown).
    #[error("operation cancelled")]
    Cancelled,
    /// The actor is gone (host shutting down).
    #[error("instance actor unavailable")]
    Unavailable,
}

/// Why an admitted operation cannot apply (the API answers 400 `invalid`).
#[derive(Debug, thiserror::Error)]
pub enum InvalidOperation {
    /// Confirm or revert of an instance with no resize waiting.
    #[error("{request}: the instance has no resize waiting")]
    NoResize {
        /// The request.
        request: Request,
    },
    /// A live migration whose destination is the host it runs on.
    #[error("live migration from {host} to itself")]
    MigrationToItself {
        /// The host.
        host: String,
    },
    /// A live migration's rollback at the destination found the guest running there: it
    /// arrived (an incoming guest stays paused until the switch-over), so it is not
    /// destroyed; the source's hand-over (post-live-migration) takes it.
    #[error("the guest runs on {host} already (it arrived): not rolled back")]
    GuestArrived {
        /// This host.
        host: String,
    },
    /// The destination has no migration URI configured.
    #[error("host {host} takes no live migrations")]
    NoLiveMigrationTo {
        /// The destination.
        host: String,
    },
    /// An attach of a port (or MAC) the instance has already.
    #[error("port {port} or its MAC is attached already")]
    AlreadyAttached {
        /// The port.
        port: PortId,
    },
    /// A detach of a port the instance does not have.
    #[error("port {port} is not attached")]
    NotAttached {
        /// The port.
        port: PortId,
    },
    /// A live migration's destination answered with disks that are not the instance's (a
    /// different count or order): the source does not migrate onto them.
    #[error("the disks {host} prepared are not the instance's")]
    DisksNotPrepared {
        /// The destination.
        host: String,
    },
    /// A resize's or a block live migration's destination finds the instance's disks in its
    /// own instance directory already without the source's probe file there (a leftover, or
    /// a shared directory the probe did not show): it neither copies over them nor removes
    /// them.
    #[error(
        "the instance's disks are on {host} already (a shared or leftover instance directory)"
    )]
    DisksAlreadyHere {
        /// This host.
        host: String,
    },
    /// A live migration's destination shares the instances directory with the source (the
    /// source's probe is here, or the caller's probe said so) but does not find the
    /// instance's disks in it: nothing is made in their place.
    #[error(
        "the instance's disks are not on {host}, although it shares the instances directory \
         with the source"
    )]
    SharedDisksMissing {
        /// This host.
        host: String,
    },
    /// A resize's destination cannot copy the disks: the source has no libvirt URI (its
    /// migration URI) to read them through.
    #[error("host {host} has no libvirt URI to copy disks from")]
    NoDiskCopyFrom {
        /// The source.
        host: String,
    },
    /// A resize that Nova runs found the source's instances directory shared with this host
    /// (its probe is here): Nova would destroy or keep the in-place disks wrongly.
    #[error(
        "host {host} shares the instances directory with the resize's source: a resize that \
         Nova runs copies the disks and cannot resize them in place"
    )]
    SharedResizeUnderNova {
        /// This host.
        host: String,
    },
    /// The other host's `network_info` in a handover does not parse.
    #[error("the handover's network_info")]
    HandoverNetworkInfo(#[source] crate::vif::VifError),
    /// The caller's `dest_network_info` (a live migration's destination bindings) does not
    /// parse.
    #[error("the caller's dest_network_info")]
    DestinationNetworkInfo(#[source] crate::vif::VifError),
    /// A request sent to another host that is not one host sends another.
    #[error("{request} is not a request one host sends another")]
    NotPeerRequest {
        /// The request.
        request: Request,
    },
    /// An operation reached a part of the dispatch that does not run it (a bug).
    #[error("{request} was dispatched to the wrong flow")]
    Misrouted {
        /// The request.
        request: Request,
    },
    /// An operation the agent died in, which recovery could not finish.
    #[error("interrupted {operation}")]
    Interrupted {
        /// The operation, as recorded.
        operation: String,
    },
}

impl From<InvalidOperation> for InstanceError {
    fn from(e: InvalidOperation) -> Self {
        InstanceError::Invalid(e)
    }
}

impl InstanceError {
    /// A stable, machine-readable code for APIs.
    pub fn code(&self) -> &str {
        match self {
            InstanceError::Refused(e) => e.code(),
            InstanceError::Invalid(_) => "invalid",
            InstanceError::Libvirt { .. } => "libvirt",
            InstanceError::DestinationXml { .. } => "libvirt",
            InstanceError::Plug { .. } => "plug",
            InstanceError::Network { .. } => "network",
            InstanceError::Storage { .. } => "storage",
            InstanceError::Journal { .. } => "journal",
            InstanceError::MigrationAborted { .. } => "migration-timeout",
            InstanceError::DeviceNotReleased { .. } => "device-not-released",
            InstanceError::EventWait { .. } => "event-wait",
            InstanceError::Predict(_) => "unsupported-vif",
            InstanceError::VifConfig(_) => "unsupported-vif",
            InstanceError::Record(_) => "record",
            InstanceError::Peer { .. } => "peer",
            InstanceError::UnknownHost(_) => "unknown-host",
            InstanceError::BuildFailed { .. } => "build-failed",
            InstanceError::RolledBack { .. } => "rolled-back",
            InstanceError::RollbackFailed { .. } => "rollback-failed",
            InstanceError::UnexpectedTransition { .. } => "unexpected-transition",
            InstanceError::QueuedDestroy { cause } => cause.code(),
            InstanceError::Cancelled => "cancelled",
            InstanceError::Unavailable => "unavailable",
        }
    }
}

/// A successful reply.
#[derive(Debug, Clone)]
pub enum InstanceReply {
    /// The operation completed.
    Done {
        /// The state it left the instance in.
        state: InstanceState,
        /// What it did.
        report: OpReport,
    },
}
