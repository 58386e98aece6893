//! The agent's wire format: the JSON bodies of the HTTP API, shared by the server and the
//! client ([`crate::client`]).
//!
//! Requests are `deny_unknown_fields`. Every error is
//! `{"error": {"code": "<stable code>", "message": "..."}}` ([`ErrorBody`]); the codes are
//! listed in docs/AGENT.md.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::provisional::Flavor;

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

/// What to boot; every path must lie in one of the configured image directories.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRequest {
    /// Kernel (direct kernel boot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<PathBuf>,
    /// Initial ramdisk (needs `kernel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<PathBuf>,
    /// Disk image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<PathBuf>,
    /// Kernel command line (needs `kernel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
}

/// `POST /v1/instances`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateInstance {
    /// The instance uuid; generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<Uuid>,
    /// Display name; defaults to `instance-<uuid>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Size.
    pub flavor: Flavor,
    /// What to boot.
    #[serde(default)]
    pub image: ImageRequest,
    /// Nova's network_info list (parsed strictly).
    #[serde(default = "empty_list")]
    pub network_info: Value,
    /// Console log file; must lie in the instance's directory. Default
    /// `<state_dir>/instances/<uuid>/console.log`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console_log: Option<PathBuf>,
}

fn empty_list() -> Value {
    Value::Array(Vec::new())
}

/// `POST /v1/instances/{uuid}/action`: `{"action": "<name>", ...arguments}`. An argument the
/// action does not take is refused (also for the actions without arguments).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case", from = "ActionWire")]
pub enum Action {
    /// Start a stopped instance.
    PowerOn,
    /// Shut down (graceful, then hard).
    PowerOff,
    /// Guest-cooperative reboot.
    RebootSoft,
    /// Re-create the domain.
    RebootHard,
    /// Pause the vCPUs.
    Pause,
    /// Resume the vCPUs.
    Unpause,
    /// Save to disk.
    Suspend,
    /// Restore from disk.
    Resume,
    /// Resize to a new flavor (to `dest_host`, default this host).
    Resize {
        /// The new size.
        flavor: Flavor,
        /// Destination host; default this host.
        #[serde(skip_serializing_if = "Option::is_none")]
        dest_host: Option<String>,
    },
    /// Confirm a resize.
    ConfirmResize,
    /// Revert a resize.
    RevertResize,
    /// Live-migrate to another host.
    LiveMigrate {
        /// Destination host name.
        dest_host: String,
        /// Destination libvirt URI when not derived from the host name.
        #[serde(skip_serializing_if = "Option::is_none")]
        dest_uri: Option<String>,
        /// Copy the disks.
        block_migration: bool,
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
}

/// [`Action`] as read: every variant a struct, so that `deny_unknown_fields` also refuses
/// arguments given to an action that takes none (serde ignores them on unit variants).
#[derive(Debug, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case", deny_unknown_fields)]
enum ActionWire {
    PowerOn {},
    PowerOff {},
    RebootSoft {},
    RebootHard {},
    Pause {},
    Unpause {},
    Suspend {},
    Resume {},
    Resize {
        flavor: Flavor,
        #[serde(default)]
        dest_host: Option<String>,
    },
    ConfirmResize {},
    RevertResize {},
    LiveMigrate {
        dest_host: String,
        #[serde(default)]
        dest_uri: Option<String>,
        #[serde(default)]
        block_migration: bool,
    },
    AttachInterface {
        vif: Value,
    },
    DetachInterface {
        port_id: String,
    },
}

impl From<ActionWire> for Action {
    fn from(w: ActionWire) -> Action {
        match w {
            ActionWire::PowerOn {} => Action::PowerOn,
            ActionWire::PowerOff {} => Action::PowerOff,
            ActionWire::RebootSoft {} => Action::RebootSoft,
            ActionWire::RebootHard {} => Action::RebootHard,
            ActionWire::Pause {} => Action::Pause,
            ActionWire::Unpause {} => Action::Unpause,
            ActionWire::Suspend {} => Action::Suspend,
            ActionWire::Resume {} => Action::Resume,
            ActionWire::Resize { flavor, dest_host } => Action::Resize { flavor, dest_host },
            ActionWire::ConfirmResize {} => Action::ConfirmResize,
            ActionWire::RevertResize {} => Action::RevertResize,
            ActionWire::LiveMigrate {
                dest_host,
                dest_uri,
                block_migration,
            } => Action::LiveMigrate {
                dest_host,
                dest_uri,
                block_migration,
            },
            ActionWire::AttachInterface { vif } => Action::AttachInterface { vif },
            ActionWire::DetachInterface { port_id } => Action::DetachInterface { port_id },
        }
    }
}

impl Action {
    /// The operation kind (also the metric label).
    pub fn kind(&self) -> OpKind {
        match self {
            Action::PowerOn => OpKind::PowerOn,
            Action::PowerOff => OpKind::PowerOff,
            Action::RebootSoft => OpKind::RebootSoft,
            Action::RebootHard => OpKind::RebootHard,
            Action::Pause => OpKind::Pause,
            Action::Unpause => OpKind::Unpause,
            Action::Suspend => OpKind::Suspend,
            Action::Resume => OpKind::Resume,
            Action::Resize { .. } => OpKind::Resize,
            Action::ConfirmResize => OpKind::ConfirmResize,
            Action::RevertResize => OpKind::RevertResize,
            Action::LiveMigrate { .. } => OpKind::LiveMigrate,
            Action::AttachInterface { .. } => OpKind::AttachInterface,
            Action::DetachInterface { .. } => OpKind::DetachInterface,
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
}

impl OpKind {
    /// Every kind.
    pub const ALL: [OpKind; 16] = [
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
    /// The driver's report (steps, waits) when it succeeded.
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
    pub address: String,
    /// Neutron vif_type.
    pub vif_type: String,
    /// Host device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devname: Option<String>,
    /// Wired on the host.
    pub plugged: bool,
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
    /// start, e.g. recovery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Uuid>,
    /// What it does.
    pub kind: String,
    /// Current step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// Steps done.
    #[serde(default)]
    pub steps_done: u32,
    /// Events it waits for now.
    #[serde(default)]
    pub waiting_for: Vec<AwaitedEvent>,
}

/// `GET /v1/instances/{uuid}`; `GET /v1/instances` returns `{"instances": [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// Uuid.
    pub uuid: Uuid,
    /// Name.
    pub name: String,
    /// Lifecycle state (`running`, `building`, ...).
    pub state: String,
    /// Power state (`running`, `shutdown`, ...).
    pub power_state: String,
    /// VIFs.
    pub vifs: Vec<InstanceVif>,
    /// In-flight operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<InstanceOperation>,
}

/// `{"instances": [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
            json!({"action": "live-migrate", "dest_host": "h2", "block_migration": true}),
            json!({"action": "detach-interface", "port_id": "p"}),
            json!({"action": "resize", "flavor": {"name": "m", "vcpus": 2, "memory_mib": 512,
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
        ] {
            assert!(
                serde_json::from_value::<Action>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
