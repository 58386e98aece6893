//! The one operation type: what a caller asks an instance to do.
//!
//! [`Operation`] is the body of the agent's `POST /v1/instances/{uuid}/action` and of the
//! host-half endpoint (`POST /v1/instances/{uuid}/half`), the argument of
//! `ComputeDriver::submit`, and the message the instance actor admits and runs. It is read
//! straight from JSON: `{"action": "<name>", ...arguments}`, kebab-case names, every
//! argument checked by serde (an unknown action or an extra argument is refused). Variants
//! without arguments are empty structs (`PowerOn {}`) because serde ignores extra fields on
//! unit variants.
//!
//! Three operations never come from JSON: [`Operation::Spawn`] (the agent builds it from a
//! `POST /v1/instances` body, whose image paths and ports it resolves first),
//! [`Operation::Destroy`] (the `DELETE` verb) and [`Operation::Recover`] (recovery at
//! start-up). Which endpoint may carry which operation is the lifecycle's
//! [`Request::caller`].
//!
//! The operation's name is its lifecycle [`Request`]: [`Operation::kind`] maps each variant
//! to it, and a test checks that the serde name is [`Request::as_str`].

use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;
use vireo_xml::metadata::Flavor;

use crate::external::ExternalEvent;
use crate::lifecycle::Request;
use crate::vif::{PortId, Vif};

use super::in_flight::Interrupted;
use super::types::{DestroyArgs, Handover, Migration, RebootKind, SpawnArgs};

/// Everything an instance can be asked to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Operation {
    /// Build here (from `POST /v1/instances`).
    #[serde(skip)]
    Spawn(Box<SpawnArgs>),
    /// Tear down; idempotent (from `DELETE /v1/instances/{uuid}`).
    #[serde(skip)]
    Destroy(DestroyArgs),
    /// Shut down gracefully within `timeout` seconds (default: the configured time), then
    /// hard.
    PowerOff {
        /// How long the guest gets to shut down, in seconds on the wire.
        #[serde(default, with = "seconds", skip_serializing_if = "Option::is_none")]
        timeout: Option<Duration>,
    },
    /// Start a stopped instance.
    PowerOn {},
    /// Guest-cooperative reboot, hard when the guest does not react.
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
    /// Source: resize to a new flavor, on `dest_host` (default: this host; same host: the
    /// whole resize).
    Resize(Box<ResizeArgs>),
    /// Destination of a resize: build the resized instance here.
    FinishResize {
        /// The migration.
        migration: Migration,
        /// What to build.
        handover: Box<Handover>,
        /// Nova's compute manager runs this half (not the source host): what it knows.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        caller: Option<Box<CallerTask>>,
    },
    /// Where the resized instance runs: confirm.
    ConfirmResize {},
    /// Source of a confirmed resize: remove the old instance.
    ConfirmResizeSource {
        /// Answer once the old instance is off and recorded as gone, then remove it (the
        /// devices kept wired through the resize, the definition, the disks) right after,
        /// as the leftovers of an instance that left this host. Nova's confirm waits for
        /// none of that removal, and a failure in it is this host's to retry, not a fault
        /// of the resized server. Without it (a destination's own confirm) the answer comes
        /// once everything is removed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        remove_after: bool,
    },
    /// Where the resized instance runs: revert.
    RevertResize {},
    /// Source of a reverted resize: bring the instance back after the destination removed
    /// its copy.
    FinishRevertResize {
        /// Nova's compute manager runs this half (not the destination host), and has moved
        /// the port bindings back already: what it knows.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        caller: Option<Box<CallerTask>>,
    },
    /// Source: live-migrate to another host.
    LiveMigrate(Box<LiveMigrateArgs>),
    /// Destination of a live migration: pre-wire the devices.
    PreLiveMigration {
        /// The migration.
        migration: Migration,
        /// The instance as the source knows it.
        handover: Box<Handover>,
        /// Nova's compute manager runs this half (not the source host): what it knows.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        caller: Option<Box<CallerTask>>,
    },
    /// Destination of a live migration that succeeded: take over.
    PostLiveMigrationAtDestination {
        /// The migration.
        migration: Migration,
        /// Nova's compute manager runs this half and activated the bindings here already.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        caller: Option<Box<CallerTask>>,
    },
    /// Destination of a live migration that failed: remove what was prepared.
    RollbackLiveMigrationAtDestination {
        /// The instance's network_info (the destination may have lost its own record).
        handover: Box<Handover>,
        /// Remove the instance directory.
        do_cleanup: bool,
        /// Remove the disks (unless the destination sees the migration's probe: then the
        /// directory is the source's).
        destroy_disks: bool,
        /// The migration (names its probe file); without it no disk is removed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        migration_id: Option<Uuid>,
        /// Nova's compute manager runs this half: only disks this host prepared (it holds
        /// the incoming instance) are removed, whatever `destroy_disks` says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        caller: Option<Box<CallerTask>>,
    },
    /// Hot-plug an interface: one `network_info` entry, parsed strictly.
    AttachInterface {
        /// The VIF.
        #[serde(with = "vif_dict")]
        vif: Box<Vif>,
    },
    /// Hot-unplug the interface of a port.
    DetachInterface {
        /// The port.
        port_id: PortId,
    },
    /// Make sure the host side of every VIF is plugged (Nova's `plug_vifs`, for the
    /// instances it finds on this host when nova-compute starts): idempotent, no event waits
    /// (nothing changes for a VIF already plugged; a re-made one reports to nobody waiting).
    PlugVifs {},
    /// Remove the host side of every VIF (Nova's `unplug_vifs`, when it cleans up a build's
    /// networks); the guest and its definition stay.
    UnplugVifs {},
    /// Remove a failed build's remains and release its networking, so the build can be
    /// rescheduled.
    CleanupForReschedule {},
    /// Finish or roll back an operation that was in flight when the agent stopped.
    #[serde(skip)]
    Recover(Box<Interrupted>),
}

impl Operation {
    /// The lifecycle request this is (also its name, [`Request::as_str`]).
    pub fn kind(&self) -> Request {
        match self {
            Operation::Spawn(_) => Request::Spawn,
            Operation::Destroy(_) => Request::Destroy,
            Operation::PowerOff { .. } => Request::PowerOff,
            Operation::PowerOn {} => Request::PowerOn,
            Operation::RebootSoft {} => Request::RebootSoft,
            Operation::RebootHard {} => Request::RebootHard,
            Operation::Pause {} => Request::Pause,
            Operation::Unpause {} => Request::Unpause,
            Operation::Suspend {} => Request::Suspend,
            Operation::Resume {} => Request::Resume,
            Operation::Resize(_) => Request::Resize,
            Operation::FinishResize { .. } => Request::FinishResize,
            Operation::ConfirmResize {} => Request::ConfirmResize,
            Operation::ConfirmResizeSource { .. } => Request::ConfirmResizeSource,
            Operation::RevertResize {} => Request::RevertResize,
            Operation::FinishRevertResize { .. } => Request::FinishRevertResize,
            Operation::LiveMigrate(_) => Request::LiveMigrate,
            Operation::PreLiveMigration { .. } => Request::PreLiveMigration,
            Operation::PostLiveMigrationAtDestination { .. } => {
                Request::PostLiveMigrationAtDestination
            }
            Operation::RollbackLiveMigrationAtDestination { .. } => {
                Request::RollbackLiveMigrationAtDestination
            }
            Operation::AttachInterface { .. } => Request::AttachInterface,
            Operation::DetachInterface { .. } => Request::DetachInterface,
            Operation::PlugVifs {} => Request::PlugVifs,
            Operation::UnplugVifs {} => Request::UnplugVifs,
            Operation::CleanupForReschedule {} => Request::CleanupForReschedule,
            Operation::Recover(_) => Request::Recover,
        }
    }

    /// A reboot of this kind.
    pub fn reboot(kind: RebootKind) -> Operation {
        match kind {
            RebootKind::Soft => Operation::RebootSoft {},
            RebootKind::Hard => Operation::RebootHard {},
        }
    }
}

/// Resize (or cold-migrate, when the flavor is unchanged), started on the source. The
/// migration's source is the host that runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResizeArgs {
    /// The new flavor.
    #[serde(rename = "flavor")]
    pub new_flavor: Flavor,
    /// The destination host; None: this host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest_host: Option<String>,
    /// The migration's id (a caller that tracks migrations, like Nova, gives its own).
    #[serde(default = "Uuid::new_v4")]
    pub migration_id: Uuid,
    /// The caller (Nova's compute manager) carries the instance to the destination itself:
    /// this host powers the guest off, keeps it for a revert and answers with the
    /// [`Handover`] in its report instead of asking the destination to finish.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub caller_finishes: bool,
}

/// What a caller that runs each host's half of a move itself (Nova's compute manager) tells
/// the half it asks for. Nova moves the port bindings *before* it calls a host's driver, so
/// events caused by that move may have come before this operation began: they count.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallerTask {
    /// Network events the caller received for the instance during its task before it asked
    /// (this host may not have known the instance then, and dropped them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<ExternalEvent>,
    /// When the caller's task began here (unix milliseconds): events this host received
    /// since then count for the operation's waits (at most `vif_plugging_timeout` back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events_since_ms: Option<u64>,
    /// The source host's libvirt URI, which a resize's destination copies the disks from
    /// (without a caller: the peer directory's `migration_uri`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_uri: Option<String>,
    /// The destination's libvirt URI, which a live migration's source migrates to
    /// (without a caller: the peer directory's `migration_uri`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest_uri: Option<String>,
    /// The token an HTTP image source wants (Glance's, from the caller's request context):
    /// the destination fetches the base image into its own cache. Never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_token: Option<String>,
    /// A live migration's ports as bound to the destination (Nova-format `network_info`;
    /// Nova's migrate data, with a port binding per host): where a VIF's type or details
    /// differ from this host's binding (another firewall driver there: hybrid plug on one
    /// host, native OVS on the other), the domain the destination defines gets the
    /// interface its own binding calls for, as the destination plugged it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest_network_info: Option<serde_json::Value>,
    /// A live migration between hosts that share the instances directory (the caller's
    /// probe, written by the destination's host and seen by the source's, said so before
    /// the migration began): the destination makes no disks (it checks the instance's are
    /// there), the migration copies none and the source's clean-up keeps them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_instance_path: bool,
}

impl ResizeArgs {
    /// Resize to `new_flavor` on `dest_host` (None: this host), as a new migration.
    pub fn new(dest_host: Option<&str>, new_flavor: Flavor) -> ResizeArgs {
        ResizeArgs {
            new_flavor,
            dest_host: dest_host.map(str::to_owned),
            migration_id: Uuid::new_v4(),
            caller_finishes: false,
        }
    }

    /// Resize as `migration` (its id and destination; its source is the host that runs it).
    pub fn of(migration: &Migration, new_flavor: Flavor) -> ResizeArgs {
        ResizeArgs {
            new_flavor,
            dest_host: Some(migration.dest_host.clone()),
            migration_id: migration.id,
            caller_finishes: false,
        }
    }

    /// The migration, run from `source`.
    pub fn migration(&self, source: &str) -> Migration {
        Migration {
            id: self.migration_id,
            source_host: source.to_owned(),
            dest_host: self.dest_host.as_deref().unwrap_or(source).to_owned(),
        }
    }
}

/// Live-migrate to another host, started on the source. Whether the hosts share the
/// instances directory is found out, not told: the source writes a probe file there and the
/// destination looks for it (Nova's check, from the other side); with disks and no shared
/// directory the migration copies them (a block migration).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveMigrateArgs {
    /// The destination host.
    pub dest_host: String,
    /// The migration's id (a caller that tracks migrations, like Nova, gives its own).
    #[serde(default = "Uuid::new_v4")]
    pub migration_id: Uuid,
    /// Nova's compute manager runs the migration: it moved nothing of the network yet and
    /// asks the destination itself before and after (pre-live-migration, post- or
    /// rollback-at-destination); this host migrates to `caller.dest_uri`, copying the disks
    /// into the destination's at the same paths, and rolls back only its own part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<Box<CallerTask>>,
}

impl LiveMigrateArgs {
    /// Migrate to `dest_host`, as a new migration.
    pub fn new(dest_host: &str) -> Self {
        LiveMigrateArgs {
            dest_host: dest_host.to_owned(),
            migration_id: Uuid::new_v4(),
            caller: None,
        }
    }

    /// Migrate as `migration` (its id and destination; its source is the host that runs
    /// it).
    pub fn of(migration: &Migration) -> Self {
        LiveMigrateArgs {
            dest_host: migration.dest_host.clone(),
            migration_id: migration.id,
            caller: None,
        }
    }

    /// The migration, run from `source`.
    pub fn migration(&self, source: &str) -> Migration {
        Migration {
            id: self.migration_id,
            source_host: source.to_owned(),
            dest_host: self.dest_host.clone(),
        }
    }
}

/// Nova's rollback clean-up flags for the destination, (`do_cleanup`, `destroy_disks`), from
/// what the migration found: disks on shared block storage (vireo's are local files, so
/// this means "no local disk") and a shared instances directory.
pub fn cleanup_flags(shared_block_storage: bool, shared_instance_path: bool) -> (bool, bool) {
    match (shared_block_storage, shared_instance_path) {
        (false, false) => (true, true),
        (true, false) => (true, false),
        (false, true) | (true, true) => (false, false),
    }
}

/// `Option<Duration>` as whole seconds.
mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_u64(d.as_secs()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_secs))
    }
}

/// A [`Vif`] as its `network_info` dict: parsed strictly, written back as received.
mod vif_dict {
    use serde::{de::Error as _, Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    use crate::vif::Vif;

    pub fn serialize<S: Serializer>(vif: &Vif, s: S) -> Result<S::Ok, S::Error> {
        vif.raw_value().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Box<Vif>, D::Error> {
        let v = Value::deserialize(d)?;
        Vif::from_value(0, &v)
            .map(Box::new)
            .map_err(|e| D::Error::custom(format!("vif: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn flavor() -> serde_json::Value {
        json!({"name": "m1", "vcpus": 1, "memory_mb": 64, "root_gb": 1})
    }

    /// Every operation that travels as JSON, with its arguments.
    fn wire_forms() -> Vec<serde_json::Value> {
        let port = Uuid::new_v4().to_string();
        let vif = json!({"id": port, "address": "fa:16:3e:00:00:01", "type": "ovs",
                         "network": {"id": Uuid::new_v4().to_string(), "bridge": "br-int"},
                         "details": {"port_filter": true, "ovs_hybrid_plug": false}});
        let mig = json!({"id": Uuid::new_v4(), "source_host": "a", "dest_host": "b"});
        let handover = json!({"name": "i", "flavor": flavor(), "old_flavor": flavor(),
                              "boot": {"type": "none"}, "network_info": [], "power_on": true});
        vec![
            json!({"action": "power-off", "timeout": 30}),
            json!({"action": "power-on"}),
            json!({"action": "reboot-soft"}),
            json!({"action": "reboot-hard"}),
            json!({"action": "pause"}),
            json!({"action": "unpause"}),
            json!({"action": "suspend"}),
            json!({"action": "resume"}),
            json!({"action": "resize", "flavor": flavor(), "dest_host": "b",
                   "migration_id": Uuid::new_v4()}),
            json!({"action": "finish-resize", "migration": mig, "handover": handover}),
            json!({"action": "confirm-resize"}),
            json!({"action": "confirm-resize-source"}),
            json!({"action": "revert-resize"}),
            json!({"action": "finish-revert-resize"}),
            json!({"action": "live-migrate", "dest_host": "b", "migration_id": Uuid::new_v4()}),
            json!({"action": "pre-live-migration", "migration": mig, "handover": handover}),
            json!({"action": "post-live-migration-at-destination", "migration": mig}),
            json!({"action": "rollback-live-migration-at-destination", "handover": handover,
                   "do_cleanup": true, "destroy_disks": false, "migration_id": Uuid::new_v4()}),
            json!({"action": "attach-interface", "vif": vif}),
            json!({"action": "detach-interface", "port_id": port}),
            json!({"action": "plug-vifs"}),
            json!({"action": "unplug-vifs"}),
            json!({"action": "cleanup-for-reschedule"}),
        ]
    }

    /// The forms a caller that runs each host's half itself (Nova) sends.
    fn caller_forms() -> Vec<serde_json::Value> {
        let mig = json!({"id": Uuid::new_v4(), "source_host": "a", "dest_host": "b"});
        let handover = json!({"name": "i", "flavor": flavor(), "old_flavor": flavor(),
                              "boot": {"type": "none"}, "network_info": [], "power_on": true});
        let event = json!({"name": "network-vif-plugged", "server_uuid": Uuid::new_v4(),
                           "tag": Uuid::new_v4().to_string(), "status": "completed"});
        vec![
            json!({"action": "resize", "flavor": flavor(), "dest_host": "b",
                   "migration_id": Uuid::new_v4(), "caller_finishes": true}),
            json!({"action": "finish-resize", "migration": mig, "handover": handover,
                   "caller": {"events": [event], "events_since_ms": 1_796_000_000_000u64,
                              "source_uri": "qemu+tcp://a/system", "image_token": "t"}}),
            json!({"action": "finish-revert-resize",
                   "caller": {"events_since_ms": 1_796_000_000_000u64}}),
        ]
    }

    #[test]
    fn a_callers_forms_round_trip_and_refuse_unknown_keys() {
        for form in caller_forms() {
            let op: Operation =
                serde_json::from_value(form.clone()).unwrap_or_else(|e| panic!("{form}: {e}"));
            assert_eq!(serde_json::to_value(&op).unwrap(), form);
        }
        let bad = json!({"action": "finish-revert-resize", "caller": {"since": 1}});
        assert!(serde_json::from_value::<Operation>(bad).is_err());
    }

    #[test]
    fn the_wire_name_is_the_lifecycle_name_and_the_form_round_trips() {
        let forms = wire_forms();
        let skipped = [Request::Spawn, Request::Destroy, Request::Recover];
        assert_eq!(forms.len() + skipped.len(), Request::ALL.len());
        for form in forms {
            let op: Operation =
                serde_json::from_value(form.clone()).unwrap_or_else(|e| panic!("{form}: {e}"));
            assert_eq!(form["action"], op.kind().as_str());
            assert!(!skipped.contains(&op.kind()));
            assert_eq!(serde_json::to_value(&op).unwrap(), form, "round trip");
        }
    }

    #[test]
    fn unknown_actions_extra_arguments_and_bad_values_are_refused() {
        for bad in [
            json!({"action": "pause", "force": true}),
            json!({"action": "reboot"}),
            json!({"action": "spawn"}),
            json!({"action": "destroy"}),
            json!({"action": "recover"}),
            json!({"action": "detach-interface", "port_id": "nope"}),
            json!({"action": "attach-interface", "vif": {"id": "x"}}),
            json!({"action": "resize", "flavor": flavor(), "to": "b"}),
            json!({"action": "live-migrate"}),
            json!({"action": "power-off", "timeout": -1}),
            json!({"action": "power-off", "timeout": "soon"}),
            json!({"power-on": {}}),
        ] {
            assert!(
                serde_json::from_value::<Operation>(bad.clone()).is_err(),
                "{bad} was accepted"
            );
        }
    }

    #[test]
    fn resize_defaults_to_this_host_and_a_fresh_migration() {
        let op: Operation = serde_json::from_value(json!({"action": "resize",
                                         "flavor": {"name": "m1", "vcpus": 1, "memory_mb": 64}}))
        .unwrap();
        let Operation::Resize(args) = op else {
            panic!("{op:?}")
        };
        let m = args.migration("a");
        assert!(m.same_host());
        assert_eq!(m.source_host, "a");
        assert!(!m.id.is_nil());
        assert_eq!(args.new_flavor.root_gb, 0, "root_gb defaults to 0");
    }
}
