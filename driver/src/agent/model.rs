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

use vireo_actors::instance::Operation;
use vireo_actors::lifecycle::{Caller, InstanceState, Request};
/// A flavor: `{"name", "vcpus", "memory_mb", "root_gb"?, "extra_specs"?}`.
pub use vireo_xml::metadata::Flavor;

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

/// What to boot and what the root disk is made from: nothing (a diskless domain), an image
/// (the root disk, an overlay on the image's cached base), a kernel (with initrd and command
/// line), or an image and a kernel. A kernel, an initrd and a file image must lie in one of
/// the configured image directories.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The image's id (a Glance image id): its base file's name in the cache. With `source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Where the image is fetched from when the cache does not hold it: an absolute path in
    /// an image directory, or an `http(s)://` URL (a Glance download URL). With `id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// `sha256:<hex>` or `md5:<hex>` (a bare digest by its length): the fetched bytes must
    /// have it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// The image's format: `raw` (default) or `qcow2`. Never probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_format: Option<String>,
    /// Sent as `X-Auth-Token` with an HTTP fetch; never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl std::fmt::Debug for ImageRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageRequest")
            .field("kernel", &self.kernel)
            .field("initrd", &self.initrd)
            .field("cmdline", &self.cmdline)
            .field("id", &self.id)
            .field("source", &self.source)
            .field("checksum", &self.checksum)
            .field("disk_format", &self.disk_format)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
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
    /// A config drive (ISO 9660, label `config-2`) with this user data, keys and metadata
    /// besides what vireo knows (uuid, name, network_data.json). Absent: no config drive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_drive: Option<vireo_actors::storage::ConfigDrive>,
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

/// What an API operation does: a create, a delete, or one of the actions
/// ([`vireo_actors::instance::Operation`], the body of `POST /v1/instances/{uuid}/action`).
/// Its wire name, also the metric label, is `create`, `delete` or the action's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// `POST /v1/instances`.
    Create,
    /// `DELETE /v1/instances/{uuid}`.
    Delete,
    /// `POST /v1/instances/{uuid}/action`.
    Action(Request),
}

impl OpKind {
    /// Every kind the API runs.
    pub fn all() -> impl Iterator<Item = OpKind> {
        [OpKind::Create, OpKind::Delete].into_iter().chain(
            Request::ALL
                .into_iter()
                .filter(|r| r.caller() == Caller::Api)
                .filter(|r| !matches!(r, Request::Spawn | Request::Destroy))
                .map(OpKind::Action),
        )
    }

    /// The API operation that submits `op`.
    pub fn of(op: &Operation) -> OpKind {
        match op.kind() {
            Request::Spawn => OpKind::Create,
            Request::Destroy => OpKind::Delete,
            r => OpKind::Action(r),
        }
    }

    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            OpKind::Create => "create",
            OpKind::Delete => "delete",
            OpKind::Action(r) => r.as_str(),
        }
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for OpKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for OpKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OpKind, D::Error> {
        let name = String::deserialize(d)?;
        OpKind::all()
            .find(|k| k.as_str() == name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown operation kind {name:?}")))
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
pub struct OpStatus {
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
    /// Start, RFC 3339 (UTC, milliseconds).
    #[serde(default)]
    pub started_at: String,
    /// End, milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<u64>,
    /// End, RFC 3339 (UTC, milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// The driver's report when it succeeded: `{"op_id", "request", "took_ms", "steps":
    /// [{"name", "kind", "took_ms", "at_ms", "failed"}], "waits": [{"timing", "expected":
    /// [{"name", "tag"}], "took_ms", "complete", "missing", "stale"?, "outcome"}], "released"?}`.
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
    pub operation: OpStatus,
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
    /// Milliseconds left before the earliest of those waits times out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_remaining_ms: Option<u64>,
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
    /// The flavor's vCPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    /// The flavor's memory, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// VIFs.
    pub vifs: Vec<InstanceVif>,
    /// Disks, in device order: `role` (root, ephemeral, swap, config-drive), `path`,
    /// `format`, `virtual_size` in bytes and, for the root disk, its `image`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<vireo_actors::storage::InstanceDisk>,
    /// In-flight operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<InstanceOperation>,
    /// The last finished operation's report (see [`OpStatus::report`]).
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
    pub operations: Vec<OpStatus>,
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

/// The answer to a host half that succeeded: the state it left the instance in here and what
/// it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HalfReply {
    /// Lifecycle state here.
    pub state: InstanceState,
    /// The report.
    pub report: Report,
}

/// An operation's report on the wire (see [`OpStatus::report`]): times in whole
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
    /// What a live migration's destination prepared for the disks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incoming: Option<vireo_actors::instance::IncomingDisks>,
    /// What a resize's source hands to a caller that carries it to the destination
    /// (`caller_finishes`), as the destination's `finish-resize` takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<serde_json::Value>,
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
    /// Ports whose first `network-vif-plugged` was stale (not ACTIVE in the network service
    /// a second after it); the wait went on until it was, or until the confirmation window
    /// ended. Absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stale: Vec<String>,
    /// Ports whose `network-vif-plugged` came but which the network service still did not
    /// show ACTIVE when the confirmation window ended: the events were trusted. Absent when
    /// none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unconfirmed: Vec<String>,
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

/// `ms` since the Unix epoch as RFC 3339, UTC, with milliseconds
/// (`2026-12-05T03:40:00.123Z`).
pub fn rfc3339(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_wire_name_and_reads_back() {
        let all: Vec<OpKind> = OpKind::all().collect();
        assert_eq!(all.len(), 19);
        for k in all {
            let wire = serde_json::to_value(k).unwrap();
            assert_eq!(wire, k.as_str());
            assert_eq!(serde_json::from_value::<OpKind>(wire).unwrap(), k);
        }
        for peer in ["finish-resize", "recover", "spawn", "nonsense"] {
            assert!(
                serde_json::from_value::<OpKind>(peer.into()).is_err(),
                "{peer}"
            );
        }
    }
}
