//! The agent's wire format: the JSON bodies of the HTTP API, shared by the server and the
//! client ([`crate::client`]).
//!
//! Requests are `deny_unknown_fields`. Every error is
//! `{"error": {"code": "<stable code>", "message": "..."}}` ([`ErrorBody`]); the codes are
//! listed in docs/AGENT.md.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use vireo_actors::instance::{Handover, InstanceRequest, Migration};
use vireo_actors::lifecycle::{InstanceState, Request};
use vireo_xml::metadata::Flavor as DriverFlavor;

/// `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// A stable code and a human message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Stable, machine-readable (`not-found`, `busy`, ...).
    pub code: String,
    /// For people.
    pub message: String,
}

/// A flavor: `{"name", "vcpus", "memory_mb", "root_gb"?, "extra_specs"?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Flavor {
    /// Flavor name.
    pub name: String,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Memory in MiB.
    pub memory_mb: u64,
    /// Root disk in GiB.
    #[serde(default)]
    pub root_gb: u64,
    /// Extra specs (`hw:vif_multiqueue_enabled`, `quota:vif_*`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_specs: BTreeMap<String, String>,
}

impl From<Flavor> for DriverFlavor {
    fn from(f: Flavor) -> DriverFlavor {
        DriverFlavor {
            name: f.name,
            vcpus: f.vcpus,
            memory_mb: f.memory_mb,
            root_gb: f.root_gb,
            extra_specs: f.extra_specs,
        }
    }
}

/// What to boot: nothing (a diskless domain), a kernel (with initrd and command line), or a
/// disk image. Every path must lie in one of the configured image directories.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRequest {
    /// Kernel (direct kernel boot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<PathBuf>,
    /// Initial ramdisk (needs `kernel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<PathBuf>,
    /// Kernel command line (needs `kernel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// Disk image (not with `kernel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<PathBuf>,
    /// The disk's format: `raw` (default) or `qcow2`. Never probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_format: Option<String>,
}

/// A port to allocate: on a network (vireo creates it and deletes it again on delete) or an
/// existing port (bound here, unbound again on delete).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
pub enum PortRequest {
    /// `{"network_id": ...}`.
    Network {
        /// The network.
        network_id: String,
    },
    /// `{"port_id": ...}`.
    Port {
        /// The port.
        port_id: String,
    },
}

/// `POST /v1/instances`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateInstance {
    /// The instance uuid; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<Uuid>,
    /// Domain name; defaults to `instance-<uuid>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Size.
    pub flavor: Flavor,
    /// What to boot.
    #[serde(default)]
    pub image: ImageRequest,
    /// Ports vireo allocates (on the configured network service). Not with `network_info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<PortRequest>>,
    /// Nova's network_info list for ports allocated already (parsed strictly). Not with
    /// `ports`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_info: Option<Value>,
    /// Start it (default) or leave it defined and stopped once built.
    #[serde(default = "yes")]
    pub power_on: bool,
}

fn yes() -> bool {
    true
}

/// `POST /v1/instances/{uuid}/action`: `{"action": "<name>", ...arguments}`. An argument the
/// action does not take is refused, also for the actions without arguments: every variant is
/// a struct (`PowerOn {}`), since serde ignores extra fields on unit variants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Action {
    /// Start a stopped instance.
    PowerOn {},
    /// Shut down gracefully within `timeout` seconds (default: the configured one), then hard.
    PowerOff {
        /// Seconds the guest gets.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout: Option<u64>,
    },
    /// Guest-cooperative reboot.
    RebootSoft {},
    /// Re-create the domain.
    RebootHard {},
    /// Pause the vCPUs.
    Pause {},
    /// Resume the vCPUs.
    Unpause {},
    /// Save to disk.
    Suspend {},
    /// Restore from disk.
    Resume {},
    /// Resize to a new flavor (to `dest_host`, default this host).
    Resize {
        /// The new size.
        flavor: Flavor,
        /// Destination host; default this host.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dest_host: Option<String>,
    },
    /// Confirm a resize.
    ConfirmResize {},
    /// Revert a resize.
    RevertResize {},
    /// Live-migrate to another host.
    LiveMigrate {
        /// Destination host name.
        dest_host: String,
        /// Disks are on shared block storage.
        #[serde(default)]
        shared_block_storage: bool,
        /// The instance directory is shared between the hosts.
        #[serde(default)]
        shared_instance_path: bool,
    },
    /// Attach an interface: one network_info entry.
    AttachInterface {
        /// The VIF dict.
        vif: Value,
    },
    /// Detach the interface of a port.
    DetachInterface {
        /// The port id.
        port_id: String,
    },
    /// Remove a failed build's remains and release its networking.
    CleanupForReschedule {},
}

impl Action {
    /// The operation kind (also the metric label).
    pub fn kind(&self) -> OpKind {
        match self {
            Action::PowerOn {} => OpKind::PowerOn,
            Action::PowerOff { .. } => OpKind::PowerOff,
            Action::RebootSoft {} => OpKind::RebootSoft,
            Action::RebootHard {} => OpKind::RebootHard,
            Action::Pause {} => OpKind::Pause,
            Action::Unpause {} => OpKind::Unpause,
            Action::Suspend {} => OpKind::Suspend,
            Action::Resume {} => OpKind::Resume,
            Action::Resize { .. } => OpKind::Resize,
            Action::ConfirmResize {} => OpKind::ConfirmResize,
            Action::RevertResize {} => OpKind::RevertResize,
            Action::LiveMigrate { .. } => OpKind::LiveMigrate,
            Action::AttachInterface { .. } => OpKind::AttachInterface,
            Action::DetachInterface { .. } => OpKind::DetachInterface,
            Action::CleanupForReschedule {} => OpKind::CleanupForReschedule,
        }
    }
}

/// Every long operation the API runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    /// `POST /v1/instances`.
    Create,
    /// `DELETE /v1/instances/{uuid}`.
    Delete,
    /// Action `power-on`.
    PowerOn,
    /// Action `power-off`.
    PowerOff,
    /// Action `reboot-soft`.
    RebootSoft,
    /// Action `reboot-hard`.
    RebootHard,
    /// Action `pause`.
    Pause,
    /// Action `unpause`.
    Unpause,
    /// Action `suspend`.
    Suspend,
    /// Action `resume`.
    Resume,
    /// Action `resize`.
    Resize,
    /// Action `confirm-resize`.
    ConfirmResize,
    /// Action `revert-resize`.
    RevertResize,
    /// Action `live-migrate`.
    LiveMigrate,
    /// Action `attach-interface`.
    AttachInterface,
    /// Action `detach-interface`.
    DetachInterface,
    /// Action `cleanup-for-reschedule`.
    CleanupForReschedule,
}

impl OpKind {
    /// Every kind.
    pub const ALL: [OpKind; 17] = [
        OpKind::Create,
        OpKind::Delete,
        OpKind::PowerOn,
        OpKind::PowerOff,
        OpKind::RebootSoft,
        OpKind::RebootHard,
        OpKind::Pause,
        OpKind::Unpause,
        OpKind::Suspend,
        OpKind::Resume,
        OpKind::Resize,
        OpKind::ConfirmResize,
        OpKind::RevertResize,
        OpKind::LiveMigrate,
        OpKind::AttachInterface,
        OpKind::DetachInterface,
        OpKind::CleanupForReschedule,
    ];

    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            OpKind::Create => "create",
            OpKind::Delete => "delete",
            OpKind::PowerOn => "power-on",
            OpKind::PowerOff => "power-off",
            OpKind::RebootSoft => "reboot-soft",
            OpKind::RebootHard => "reboot-hard",
            OpKind::Pause => "pause",
            OpKind::Unpause => "unpause",
            OpKind::Suspend => "suspend",
            OpKind::Resume => "resume",
            OpKind::Resize => "resize",
            OpKind::ConfirmResize => "confirm-resize",
            OpKind::RevertResize => "revert-resize",
            OpKind::LiveMigrate => "live-migrate",
            OpKind::AttachInterface => "attach-interface",
            OpKind::DetachInterface => "detach-interface",
            OpKind::CleanupForReschedule => "cleanup-for-reschedule",
        }
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpState {
    /// In flight.
    Running,
    /// Done.
    Succeeded,
    /// Failed (rolled back where the driver could), or aborted by shutdown.
    Failed,
}

impl OpState {
    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            OpState::Running => "running",
            OpState::Succeeded => "succeeded",
            OpState::Failed => "failed",
        }
    }
}

/// `GET /v1/operations/{id}`, and the body of every 202.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    /// Operation id.
    pub id: Uuid,
    /// The instance.
    pub instance: Uuid,
    /// What it does.
    pub kind: OpKind,
    /// Where it is.
    pub state: OpState,
    /// Start, milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// End, milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<u64>,
    /// The driver's report when it succeeded: `{"op_id", "request", "took_ms", "steps":
    /// [{"name", "kind", "took_ms", "at_ms", "failed"}], "waits": [{"timing", "expected":
    /// [{"name", "tag"}], "took_ms", "complete", "missing", "outcome"}], "released"?}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<Value>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

/// `{"operation": {...}}`, the 202 body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Accepted {
    /// The operation to poll.
    pub operation: Operation,
}

/// One VIF in [`Instance`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceVif {
    /// Port id.
    pub port: String,
    /// MAC.
    pub mac: String,
    /// Neutron vif_type.
    pub vif_type: String,
    /// vnic_type.
    pub vnic_type: String,
    /// OVS hybrid plug.
    pub hybrid: bool,
    /// Host device.
    pub device: String,
}

/// An awaited event, `{"name", "tag"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwaitedEvent {
    /// Event name.
    pub name: String,
    /// Port id.
    pub tag: String,
}

/// The in-flight operation in [`Instance`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceOperation {
    /// The agent's operation id (absent when the driver runs an operation the API did not
    /// start, e.g. recovery or a migration's other half).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Uuid>,
    /// What it does (the agent's kind when the API started it, else the driver's request).
    pub kind: String,
    /// The driver's current phase (`network`, `plug`, `wait for events`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Milliseconds since the driver started it.
    #[serde(default)]
    pub elapsed_ms: u64,
    /// Events it waits for now.
    #[serde(default)]
    pub waiting_for: Vec<AwaitedEvent>,
}

/// `GET /v1/instances/{uuid}`; `GET /v1/instances` returns `{"instances": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    /// Uuid.
    pub uuid: Uuid,
    /// The host it is on.
    pub host: String,
    /// Domain name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Lifecycle state (`running`, `building`, ...).
    pub state: String,
    /// Power state (`running`, `shutoff`, ...).
    pub power_state: String,
    /// Flavor name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flavor: Option<String>,
    /// VIFs.
    pub vifs: Vec<InstanceVif>,
    /// In-flight operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<InstanceOperation>,
    /// The last finished operation's report (see [`Operation::report`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<Value>,
}

/// `{"instances": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceList {
    /// The instances, by uuid.
    pub instances: Vec<Instance>,
}

/// `{"operations": [...]}` (`GET /v1/operations`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationList {
    /// Running first, then finished, newest first.
    pub operations: Vec<Operation>,
}

/// One event of a `POST /os-server-external-events` answer: the event as sent, `status`
/// defaulted, plus Nova's per-event `code`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventAnswer {
    /// Event name as sent.
    pub name: String,
    /// Instance uuid as sent.
    pub server_uuid: String,
    /// Tag as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// `completed` when accepted, `failed` otherwise (as Nova answers).
    pub status: String,
    /// 200 accepted, 404 unknown instance, 422 not on this host, 400 bad event.
    pub code: u16,
}

/// `{"events": [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventsAnswer {
    /// One answer per event, in order.
    pub events: Vec<EventAnswer>,
}

/// `POST /v1/peer/instances/{uuid}`: a request one host's flow sends another — exactly the
/// cross-host steps of resize/confirm/revert and of live migration and its rollback, as
/// `{"request": "<name>", ...arguments}`. Nothing else is a peer request: an unknown name or
/// an extra argument is refused (400).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "kebab-case", deny_unknown_fields)]
pub enum PeerRequest {
    /// Destination of a resize: build the resized instance here.
    FinishResize {
        /// The migration.
        migration: Migration,
        /// What to build.
        handover: Handover,
    },
    /// Source of a confirmed resize: remove the old instance.
    ConfirmResizeSource {},
    /// Source of a reverted resize: bring the instance back.
    FinishRevertResize {},
    /// Destination of a live migration: pre-wire the devices.
    PreLiveMigration {
        /// The migration.
        migration: Migration,
        /// The instance as the source knows it.
        handover: Handover,
    },
    /// Destination of a live migration that succeeded: take over.
    PostLiveMigrationAtDestination {
        /// The migration.
        migration: Migration,
    },
    /// Destination of a live migration that failed: remove what was prepared.
    RollbackLiveMigrationAtDestination {
        /// The instance's network_info (the destination may have lost its own record).
        handover: Handover,
        /// Remove the instance directory.
        do_cleanup: bool,
        /// Remove the disks.
        destroy_disks: bool,
    },
}

impl PeerRequest {
    /// The lifecycle request it is (also the metric label, via [`Request::as_str`]).
    pub fn kind(&self) -> Request {
        match self {
            PeerRequest::FinishResize { .. } => Request::FinishResize,
            PeerRequest::ConfirmResizeSource {} => Request::ConfirmResizeSource,
            PeerRequest::FinishRevertResize {} => Request::FinishRevertResize,
            PeerRequest::PreLiveMigration { .. } => Request::PreLiveMigration,
            PeerRequest::PostLiveMigrationAtDestination { .. } => {
                Request::PostLiveMigrationAtDestination
            }
            PeerRequest::RollbackLiveMigrationAtDestination { .. } => {
                Request::RollbackLiveMigrationAtDestination
            }
        }
    }
}

impl From<PeerRequest> for InstanceRequest {
    fn from(p: PeerRequest) -> InstanceRequest {
        match p {
            PeerRequest::FinishResize {
                migration,
                handover,
            } => InstanceRequest::FinishResize {
                migration,
                handover: Box::new(handover),
            },
            PeerRequest::ConfirmResizeSource {} => InstanceRequest::ConfirmResizeSource,
            PeerRequest::FinishRevertResize {} => InstanceRequest::FinishRevertResize,
            PeerRequest::PreLiveMigration {
                migration,
                handover,
            } => InstanceRequest::PreLiveMigration {
                migration,
                handover: Box::new(handover),
            },
            PeerRequest::PostLiveMigrationAtDestination { migration } => {
                InstanceRequest::PostLiveMigrationAtDestination { migration }
            }
            PeerRequest::RollbackLiveMigrationAtDestination {
                handover,
                do_cleanup,
                destroy_disks,
            } => InstanceRequest::RollbackLiveMigrationAtDestination {
                handover: Box::new(handover),
                do_cleanup,
                destroy_disks,
            },
        }
    }
}

impl TryFrom<InstanceRequest> for PeerRequest {
    /// The request's kind: it is not one host sends another.
    type Error = Request;

    fn try_from(r: InstanceRequest) -> Result<PeerRequest, Request> {
        Ok(match r {
            InstanceRequest::FinishResize {
                migration,
                handover,
            } => PeerRequest::FinishResize {
                migration,
                handover: *handover,
            },
            InstanceRequest::ConfirmResizeSource => PeerRequest::ConfirmResizeSource {},
            InstanceRequest::FinishRevertResize => PeerRequest::FinishRevertResize {},
            InstanceRequest::PreLiveMigration {
                migration,
                handover,
            } => PeerRequest::PreLiveMigration {
                migration,
                handover: *handover,
            },
            InstanceRequest::PostLiveMigrationAtDestination { migration } => {
                PeerRequest::PostLiveMigrationAtDestination { migration }
            }
            InstanceRequest::RollbackLiveMigrationAtDestination {
                handover,
                do_cleanup,
                destroy_disks,
            } => PeerRequest::RollbackLiveMigrationAtDestination {
                handover: *handover,
                do_cleanup,
                destroy_disks,
            },
            other => return Err(other.kind()),
        })
    }
}

/// The answer to a peer request that succeeded: the state it left the instance in on the
/// peer and what it did there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerReply {
    /// Lifecycle state on the peer.
    pub state: InstanceState,
    /// The peer's report.
    pub report: Report,
}

/// An operation's report on the wire (see [`Operation::report`]): times in whole
/// milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The driver's operation id.
    pub op_id: u64,
    /// The driver's request name (`spawn`, `finish-resize`, ...).
    pub request: String,
    /// Wall time.
    pub took_ms: u64,
    /// The steps in order.
    pub steps: Vec<ReportStep>,
    /// The event waits in order.
    pub waits: Vec<ReportWait>,
    /// Networking released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<ReportReleased>,
}

/// One step of a [`Report`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportStep {
    /// What it did.
    pub name: String,
    /// Its clock: `libvirt`, `plug`, `network`, `event-wait`, `peer`.
    pub kind: String,
    /// How long it took.
    pub took_ms: u64,
    /// Offset from the operation's start.
    pub at_ms: u64,
    /// It failed.
    pub failed: bool,
}

/// One event wait of a [`Report`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportWait {
    /// `bind-time`, `plug-time` or `none`.
    pub timing: String,
    /// What it waited for.
    pub expected: Vec<AwaitedEvent>,
    /// How long it took.
    pub took_ms: u64,
    /// Satisfied completely.
    pub complete: bool,
    /// Ports that never reported or failed.
    pub missing: Vec<String>,
    /// How it ended.
    pub outcome: String,
}

/// Networking released, in a [`Report`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportReleased {
    /// Ports deleted.
    pub deleted: Vec<String>,
    /// User ports unbound.
    pub unbound: Vec<String>,
    /// Ports that were already gone.
    pub already_gone: Vec<String>,
}

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `ok` or `shutting-down`.
    pub status: String,
    /// Host name.
    pub host: String,
    /// Driver name.
    pub driver: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn actions_round_trip_and_refuse_extra_arguments() {
        let cases = [
            json!({"action": "pause"}),
            json!({"action": "reboot-hard"}),
            json!({"action": "live-migrate", "dest_host": "h2", "shared_block_storage": true}),
            json!({"action": "power-off", "timeout": 5}),
            json!({"action": "power-off"}),
            json!({"action": "cleanup-for-reschedule"}),
            json!({"action": "detach-interface", "port_id": "p"}),
            json!({"action": "resize", "flavor": {"name": "m", "vcpus": 2, "memory_mb": 512,
                   "root_gb": 0, "extra_specs": {}}}),
        ];
        for c in cases {
            let a: Action = serde_json::from_value(c.clone()).unwrap();
            let back = serde_json::to_value(&a).unwrap();
            let again: Action = serde_json::from_value(back).unwrap();
            assert_eq!(a, again, "{c}");
        }
        for bad in [
            json!({"action": "pause", "force": true}),
            json!({"action": "explode"}),
            json!({"action": "live-migrate"}),
            json!({"action": "detach-interface", "port_id": "p", "x": 1}),
            json!({"pause": {}}),
            json!({"action": "power-off", "timeout": "soon"}),
        ] {
            assert!(
                serde_json::from_value::<Action>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }

    fn handover() -> Handover {
        let f = DriverFlavor {
            name: "m1".into(),
            vcpus: 1,
            memory_mb: 128,
            root_gb: 0,
            extra_specs: BTreeMap::new(),
        };
        Handover {
            name: "vm".into(),
            flavor: f.clone(),
            old_flavor: f,
            boot: vireo_actors::instance::BootSource::None,
            network_info: json!([]),
            power_on: true,
        }
    }

    fn migration() -> Migration {
        Migration {
            id: Uuid::nil(),
            source_host: "h1".into(),
            dest_host: "h2".into(),
        }
    }

    #[test]
    fn every_peer_request_round_trips_and_maps_to_its_instance_request() {
        let all = [
            PeerRequest::FinishResize {
                migration: migration(),
                handover: handover(),
            },
            PeerRequest::ConfirmResizeSource {},
            PeerRequest::FinishRevertResize {},
            PeerRequest::PreLiveMigration {
                migration: migration(),
                handover: handover(),
            },
            PeerRequest::PostLiveMigrationAtDestination {
                migration: migration(),
            },
            PeerRequest::RollbackLiveMigrationAtDestination {
                handover: handover(),
                do_cleanup: true,
                destroy_disks: false,
            },
        ];
        for p in all {
            let wire = serde_json::to_value(&p).unwrap();
            assert_eq!(wire["request"], p.kind().as_str(), "{wire}");
            let back: PeerRequest = serde_json::from_value(wire).unwrap();
            assert_eq!(back, p);
            let r = InstanceRequest::from(p.clone());
            assert_eq!(r.kind(), p.kind());
            assert_eq!(PeerRequest::try_from(r).unwrap(), p);
        }
        // Every other request is refused, naming its kind.
        let others = [
            InstanceRequest::PowerOn,
            InstanceRequest::Pause,
            InstanceRequest::ConfirmResize,
            InstanceRequest::RevertResize,
            InstanceRequest::CleanupForReschedule,
            InstanceRequest::Destroy(Default::default()),
        ];
        for r in others {
            let kind = r.kind();
            assert_eq!(PeerRequest::try_from(r).unwrap_err(), kind);
        }
    }

    #[test]
    fn other_requests_and_extra_arguments_are_refused() {
        for bad in [
            json!({"request": "spawn"}),
            json!({"request": "destroy"}),
            json!({"request": "revert-resize"}),
            json!({"request": "confirm-resize-source", "force": true}),
            json!({"request": "post-live-migration-at-destination"}),
            json!({"request": "finish-resize", "migration": migration()}),
            json!({"finish-revert-resize": {}}),
        ] {
            assert!(
                serde_json::from_value::<PeerRequest>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
