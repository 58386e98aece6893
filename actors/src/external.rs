//! Nova-shaped external events, and the sink that receives them.
//!
//! The network service (real Neutron through the agent's HTTP endpoint, or the embedded
//! service in-process) reports port status changes as Nova "external events":
//! `{"name", "server_uuid", "tag", "status"}`. This module owns that shape; the
//! NetworkEventActor consumes it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The name of an external event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventName {
    /// A port became ACTIVE (status `completed`) or ERROR (status `failed`).
    NetworkVifPlugged,
    /// A port went DOWN.
    NetworkVifUnplugged,
    /// A port was deleted.
    NetworkVifDeleted,
    /// A port's data (binding, fixed IPs, ...) changed.
    NetworkChanged,
    /// A volume was extended (accepted, not used by vireo).
    VolumeExtended,
    /// A power state update (accepted, not used by vireo).
    PowerUpdate,
    /// An accelerator request was bound (accepted, not used by vireo).
    AcceleratorRequestBound,
    /// A volume was reimaged (accepted, not used by vireo).
    VolumeReimaged,
}

impl EventName {
    /// Every name Nova's API accepts.
    pub const ALL: [EventName; 8] = [
        EventName::NetworkVifPlugged,
        EventName::NetworkVifUnplugged,
        EventName::NetworkVifDeleted,
        EventName::NetworkChanged,
        EventName::VolumeExtended,
        EventName::PowerUpdate,
        EventName::AcceleratorRequestBound,
        EventName::VolumeReimaged,
    ];

    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            EventName::NetworkVifPlugged => "network-vif-plugged",
            EventName::NetworkVifUnplugged => "network-vif-unplugged",
            EventName::NetworkVifDeleted => "network-vif-deleted",
            EventName::NetworkChanged => "network-changed",
            EventName::VolumeExtended => "volume-extended",
            EventName::PowerUpdate => "power-update",
            EventName::AcceleratorRequestBound => "accelerator-request-bound",
            EventName::VolumeReimaged => "volume-reimaged",
        }
    }
}

impl fmt::Display for EventName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventName {
    type Err = UnknownEventName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventName::ALL
            .into_iter()
            .find(|n| n.as_str() == s)
            .ok_or_else(|| UnknownEventName(s.to_owned()))
    }
}

/// An event name Nova's API would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown event name {0:?}")]
pub struct UnknownEventName(pub String);

/// An external event's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventStatus {
    /// The change completed (port ACTIVE for `network-vif-plugged`).
    #[default]
    Completed,
    /// The change failed (port ERROR).
    Failed,
    /// Still under way.
    InProgress,
}

/// One external event, in Nova's shape. Like Nova's API schema, keys other than these four
/// are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalEvent {
    /// What happened.
    pub name: EventName,
    /// The instance it concerns.
    pub server_uuid: Uuid,
    /// The port id for network events (Nova's `tag`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Outcome (Nova's default is `completed`).
    #[serde(default)]
    pub status: EventStatus,
}

/// Where the network service sends the events it emits.
pub trait EventSink: Send + Sync + fmt::Debug + 'static {
    /// Hand one event over. Must not block.
    fn deliver(&self, event: ExternalEvent);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in EventName::ALL {
            assert_eq!(n.as_str().parse::<EventName>(), Ok(n));
            let json = serde_json::to_string(&n).unwrap();
            assert_eq!(json, format!("\"{}\"", n.as_str()));
        }
        assert!("network-vif-plugged ".parse::<EventName>().is_err());
    }

    #[test]
    fn nova_body_parses_with_default_status() {
        let e: ExternalEvent = serde_json::from_str(
            r#"{"name":"network-vif-plugged","server_uuid":"9a1c2e44-5d2b-4e55-9c51-3f0f3a6c4d10","tag":"p1"}"#,
        )
        .unwrap();
        assert_eq!(e.status, EventStatus::Completed);
        assert_eq!(e.tag.as_deref(), Some("p1"));
        let e: ExternalEvent = serde_json::from_str(
            r#"{"name":"network-vif-plugged","server_uuid":"9a1c2e44-5d2b-4e55-9c51-3f0f3a6c4d10","status":"failed"}"#,
        )
        .unwrap();
        assert_eq!(e.status, EventStatus::Failed);
    }

    // Found by the `external_event` fuzz target (fuzz/): unknown keys were skipped unchecked,
    // so a body Nova's API refuses (`additionalProperties: false`) was accepted, even with
    // JSON `serde_json::Value` refuses (an unpaired surrogate escape) inside such a key.
    #[test]
    fn unknown_keys_are_refused_as_nova_does() {
        let base =
            r#""name":"network-vif-plugged","server_uuid":"9a1c2e44-5d2b-4e55-9c51-3f0f3a6c4d10""#;
        for extra in [
            r#","extra":1"#,
            r#","s,t@tus":"\ud804\\b""#,
            r#","Tag":"p1""#,
        ] {
            let text = format!("{{{base}{extra}}}");
            let err = serde_json::from_str::<ExternalEvent>(&text).unwrap_err();
            if extra.contains("ud804") {
                assert!(serde_json::from_str::<serde_json::Value>(&text).is_err());
            }
            assert!(err.to_string().contains("unknown field"), "{text}: {err}");
        }
        assert!(serde_json::from_str::<ExternalEvent>(&format!("{{{base}}}")).is_ok());
    }
}
