//! The operation in flight, as the domain's `<vireo:operation>` records it: a typed value, so
//! recovery after a restart matches it exhaustively instead of comparing kind strings and
//! digging fields out of JSON.
//!
//! Stored form: the xml crate keeps `<vireo:operation id kind phase started_at>` with a JSON
//! body (`vireo_xml::metadata::InFlightOperation`, opaque to it). [`InFlight`] is that kind and
//! body: its serde tag is the `kind` attribute (the running request's name, as
//! [`Request::as_str`] spells it) and its other fields are the body. That is the format vireo
//! wrote before the value was typed, so records of running domains read back unchanged.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use vireo_xml::metadata::InFlightOperation;

use crate::lifecycle::Request;

use super::types::Migration;

/// The migration an in-flight resize, revert or live migration belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationStep {
    /// The migration.
    pub migration: Migration,
    /// A caller (Nova) runs the migration across the hosts and rolls back the other host's
    /// part itself: recovery here asks no other host's agent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_caller: bool,
}

impl MigrationStep {
    /// The step of `migration`, run by this host's agent with its peer.
    pub fn of(migration: Migration) -> MigrationStep {
        MigrationStep {
            migration,
            by_caller: false,
        }
    }
}

/// A revert in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevertStep {
    /// The migration.
    pub migration: Migration,
    /// The guest ran before the resize (recorded by the same-host revert, which may have to
    /// boot it again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub was_running: Option<bool>,
}

/// An interface attach or detach in flight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InterfaceStep {
    /// The interface, in Nova's `network_info` form (parsed again by recovery).
    pub vif: Value,
    /// Its position in the instance's `network_info`.
    pub index: usize,
}

/// What was in flight. One variant per request that records itself before it changes the
/// domain; requests that never record have none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum InFlight {
    /// A build.
    Spawn,
    /// A start.
    PowerOn,
    /// A hard reboot.
    RebootHard,
    /// A soft reboot that fell back to a hard one.
    RebootSoft,
    /// A resize: the source's (cross-host) or the whole one (same host); also the source
    /// bringing the instance back after a failed hand-over.
    Resize(MigrationStep),
    /// The destination building the resized instance.
    FinishResize(MigrationStep),
    /// A revert: the destination removing its copy, or the whole same-host revert.
    RevertResize(RevertStep),
    /// The source bringing a reverted instance back.
    FinishRevertResize(MigrationStep),
    /// The source of a live migration.
    LiveMigrate(MigrationStep),
    /// An interface being attached.
    AttachInterface(InterfaceStep),
    /// An interface being detached.
    DetachInterface(InterfaceStep),
}

impl InFlight {
    /// A hard reboot's record: its own, or that of the soft reboot falling back to it.
    pub(crate) fn reboot(running: Request) -> InFlight {
        if running == Request::RebootSoft {
            InFlight::RebootSoft
        } else {
            InFlight::RebootHard
        }
    }

    /// The record of bringing a resized-away instance back on the source: a revert's, or a
    /// failed resize's own roll back; `by_caller`: a revert Nova runs.
    pub(crate) fn bring_back(running: Request, migration: Migration, by_caller: bool) -> InFlight {
        let step = MigrationStep {
            migration,
            by_caller,
        };
        if running == Request::Resize {
            InFlight::Resize(step)
        } else {
            InFlight::FinishRevertResize(step)
        }
    }

    /// The request this is the in-flight record of.
    pub fn request(&self) -> Request {
        match self {
            InFlight::Spawn => Request::Spawn,
            InFlight::PowerOn => Request::PowerOn,
            InFlight::RebootHard => Request::RebootHard,
            InFlight::RebootSoft => Request::RebootSoft,
            InFlight::Resize(_) => Request::Resize,
            InFlight::FinishResize(_) => Request::FinishResize,
            InFlight::RevertResize(_) => Request::RevertResize,
            InFlight::FinishRevertResize(_) => Request::FinishRevertResize,
            InFlight::LiveMigrate(_) => Request::LiveMigrate,
            InFlight::AttachInterface(_) => Request::AttachInterface,
            InFlight::DetachInterface(_) => Request::DetachInterface,
        }
    }

    /// The migration of a migration-family record.
    pub fn migration(&self) -> Option<&Migration> {
        match self {
            InFlight::Resize(s)
            | InFlight::FinishResize(s)
            | InFlight::FinishRevertResize(s)
            | InFlight::LiveMigrate(s) => Some(&s.migration),
            InFlight::RevertResize(s) => Some(&s.migration),
            InFlight::Spawn
            | InFlight::PowerOn
            | InFlight::RebootHard
            | InFlight::RebootSoft
            | InFlight::AttachInterface(_)
            | InFlight::DetachInterface(_) => None,
        }
    }

    /// Splits into the stored kind and body.
    fn to_parts(&self) -> Result<(String, Value), InFlightError> {
        let mut value = serde_json::to_value(self).map_err(InFlightError::Encode)?;
        let kind = match value.as_object_mut().and_then(|o| o.remove("kind")) {
            Some(Value::String(kind)) => kind,
            _ => return Err(InFlightError::NoKind),
        };
        Ok((kind, value))
    }
}

/// The `<vireo:operation>` element of a running operation: which one, since when, how far.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    /// The operation id.
    pub id: String,
    /// How far it got (for logs and `show`; recovery does not depend on it).
    pub phase: String,
    /// Start, Unix milliseconds.
    pub started_at: u64,
    /// What it is.
    pub operation: InFlight,
}

impl Marker {
    /// The stored element.
    pub fn to_stored(&self) -> Result<InFlightOperation, InFlightError> {
        let (kind, data) = self.operation.to_parts()?;
        Ok(InFlightOperation {
            id: self.id.clone(),
            kind,
            phase: self.phase.clone(),
            started_at: self.started_at,
            data,
        })
    }

    /// Reads a stored element.
    pub fn from_stored(stored: &InFlightOperation) -> Result<Marker, InFlightError> {
        let mut body = match &stored.data {
            Value::Object(o) => o.clone(),
            Value::Null => serde_json::Map::new(),
            _ => {
                return Err(InFlightError::NotAnObject {
                    kind: stored.kind.clone(),
                })
            }
        };
        body.insert("kind".to_owned(), Value::String(stored.kind.clone()));
        let operation = serde_json::from_value(Value::Object(body)).map_err(|source| {
            InFlightError::Decode {
                kind: stored.kind.clone(),
                phase: stored.phase.clone(),
                source,
            }
        })?;
        Ok(Marker {
            id: stored.id.clone(),
            phase: stored.phase.clone(),
            started_at: stored.started_at,
            operation,
        })
    }
}

/// An in-flight element vireo cannot write or read.
#[derive(Debug, thiserror::Error)]
pub enum InFlightError {
    /// Serialising the value failed.
    #[error("encoding the in-flight operation")]
    Encode(#[source] serde_json::Error),
    /// The value did not serialise to a tagged object (a bug).
    #[error("the in-flight operation has no kind")]
    NoKind,
    /// The stored body is not a JSON object.
    #[error("in-flight {kind}: the body is not an object")]
    NotAnObject {
        /// The stored kind.
        kind: String,
    },
    /// The stored kind is unknown or its body does not fit it.
    #[error("in-flight {kind} at {phase} cannot be read")]
    Decode {
        /// The stored kind.
        kind: String,
        /// The stored phase.
        phase: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// An operation the agent died in, as recovery gets it.
#[derive(Debug, Clone)]
pub enum Interrupted {
    /// Read back.
    Marked(Marker),
    /// The element was there but could not be read (another version's kind, a damaged body):
    /// recovery can only reconcile with libvirt.
    Unreadable(Arc<InFlightError>),
}

impl Interrupted {
    /// Reads the stored element.
    pub fn from_stored(stored: &InFlightOperation) -> Interrupted {
        match Marker::from_stored(stored) {
            Ok(marker) => Interrupted::Marked(marker),
            Err(error) => Interrupted::Unreadable(Arc::new(error)),
        }
    }

    /// `kind at phase`, for messages.
    pub fn describe(&self) -> String {
        match self {
            Interrupted::Marked(m) => format!("{} at {}", m.operation.request(), m.phase),
            Interrupted::Unreadable(e) => e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn migration() -> Migration {
        Migration {
            id: uuid::Uuid::from_u128(7),
            source_host: "h1".into(),
            dest_host: "h2".into(),
        }
    }

    fn every() -> Vec<InFlight> {
        let step = || MigrationStep::of(migration());
        let iface = || InterfaceStep {
            vif: serde_json::json!({"id": "p1"}),
            index: 2,
        };
        vec![
            InFlight::Spawn,
            InFlight::PowerOn,
            InFlight::RebootHard,
            InFlight::RebootSoft,
            InFlight::Resize(step()),
            InFlight::FinishResize(step()),
            InFlight::RevertResize(RevertStep {
                migration: migration(),
                was_running: Some(false),
            }),
            InFlight::RevertResize(RevertStep {
                migration: migration(),
                was_running: None,
            }),
            InFlight::FinishRevertResize(step()),
            InFlight::LiveMigrate(step()),
            // Nova's: its recovery asks no other host.
            InFlight::LiveMigrate(MigrationStep {
                by_caller: true,
                ..step()
            }),
            InFlight::AttachInterface(iface()),
            InFlight::DetachInterface(iface()),
        ]
    }

    #[test]
    fn the_stored_kind_is_the_requests_name_and_every_value_reads_back() {
        for operation in every() {
            let marker = Marker {
                id: "9".into(),
                phase: "somewhere".into(),
                started_at: 12,
                operation: operation.clone(),
            };
            let stored = marker.to_stored().unwrap();
            assert_eq!(stored.kind, operation.request().as_str());
            assert!(stored.data.get("kind").is_none(), "{stored:?}");
            assert_eq!(Marker::from_stored(&stored).unwrap(), marker);
        }
    }

    #[test]
    fn records_written_before_the_value_was_typed_read_back() {
        let m = serde_json::to_value(migration()).unwrap();
        let cases = [
            ("spawn", serde_json::json!({}), InFlight::Spawn),
            ("power-on", serde_json::json!({}), InFlight::PowerOn),
            (
                "resize",
                serde_json::json!({ "migration": m }),
                InFlight::Resize(MigrationStep::of(migration())),
            ),
            (
                "revert-resize",
                serde_json::json!({ "migration": m, "was_running": true }),
                InFlight::RevertResize(RevertStep {
                    migration: migration(),
                    was_running: Some(true),
                }),
            ),
            (
                "detach-interface",
                serde_json::json!({ "vif": {"id": "p"}, "index": 0 }),
                InFlight::DetachInterface(InterfaceStep {
                    vif: serde_json::json!({"id": "p"}),
                    index: 0,
                }),
            ),
        ];
        for (kind, data, want) in cases {
            let stored = InFlightOperation {
                id: "1".into(),
                kind: kind.into(),
                phase: "p".into(),
                started_at: 0,
                data,
            };
            assert_eq!(Marker::from_stored(&stored).unwrap().operation, want);
        }
    }

    #[test]
    fn unknown_kinds_and_bodies_that_do_not_fit_are_typed_errors() {
        let stored = |kind: &str, data: Value| InFlightOperation {
            id: "1".into(),
            kind: kind.into(),
            phase: "p".into(),
            started_at: 0,
            data,
        };
        let e = Marker::from_stored(&stored("teleport", serde_json::json!({}))).unwrap_err();
        assert!(matches!(e, InFlightError::Decode { ref kind, .. } if kind == "teleport"));
        let e = Marker::from_stored(&stored("live-migrate", serde_json::json!({}))).unwrap_err();
        assert!(matches!(e, InFlightError::Decode { .. }), "{e:?}");
        let e = Marker::from_stored(&stored("spawn", serde_json::json!([1]))).unwrap_err();
        assert!(matches!(e, InFlightError::NotAnObject { .. }), "{e:?}");
        assert!(matches!(
            Interrupted::from_stored(&stored("teleport", Value::Null)),
            Interrupted::Unreadable(_)
        ));
    }
}
