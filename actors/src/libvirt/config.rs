//! The libvirt layer's configuration: plain serde data.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::LibvirtError;

/// The most calls a connection may have in flight: libvirtd serves 5 concurrent requests per
/// client by default (`max_client_requests`), and the layer keeps one spare.
pub const MAX_WORKERS: usize = 4;

/// Keepalive probes on remote connections (`virConnectSetKeepAlive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Keepalive {
    /// Seconds between probes while the daemon is silent; 0 turns keepalive off.
    pub interval_s: u32,
    /// Unanswered probes before the connection is closed. The connection is declared dead after
    /// about `interval_s * (count + 1)` seconds of silence.
    pub count: u32,
}

impl Default for Keepalive {
    fn default() -> Self {
        Self {
            interval_s: 2,
            count: 2,
        }
    }
}

/// How to reach libvirt and how hard to try.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LibvirtConfig {
    /// The connection URI (`qemu:///system`, `test:///abs/path.xml`,
    /// `test+unix:///default?socket=...`).
    pub uri: String,
    /// Worker threads, which is also the most calls in flight on the connection
    /// (1..=[`MAX_WORKERS`]).
    pub workers: usize,
    /// The default per-call deadline, milliseconds (queueing included).
    pub call_timeout_ms: u64,
    /// The deadline for [`crate::libvirt::LibvirtHandle::migrate`], milliseconds.
    pub migrate_timeout_ms: u64,
    /// Keepalive, applied to every connection whose driver supports it (the remote driver: every
    /// connection to a daemon, including `qemu:///system`).
    pub keepalive: Keepalive,
    /// First reconnect delay after a connection loss, milliseconds.
    pub reconnect_min_ms: u64,
    /// The reconnect delay doubles per failed attempt up to this, milliseconds.
    pub reconnect_max_ms: u64,
    /// Slots of the event channel (see [`crate::libvirt::EventStream`]).
    pub event_capacity: usize,
    /// How long dropping the last handle waits for its threads, milliseconds. A thread still
    /// blocked in libvirt after that is left to finish on its own.
    pub join_timeout_ms: u64,
}

impl Default for LibvirtConfig {
    fn default() -> Self {
        Self {
            uri: "qemu:///system".to_owned(),
            workers: MAX_WORKERS,
            call_timeout_ms: 60_000,
            migrate_timeout_ms: 6 * 3_600_000,
            keepalive: Keepalive::default(),
            reconnect_min_ms: 200,
            reconnect_max_ms: 10_000,
            event_capacity: 1024,
            join_timeout_ms: 5_000,
        }
    }
}

impl LibvirtConfig {
    /// The defaults, for `uri`.
    pub fn for_uri(uri: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            ..Self::default()
        }
    }

    /// Checks the values.
    pub fn validate(&self) -> Result<(), LibvirtError> {
        let invalid = |reason: String| Err(LibvirtError::InvalidConfig { reason });
        if self.uri.is_empty() {
            return invalid("uri is empty".to_owned());
        }
        if self.workers == 0 || self.workers > MAX_WORKERS {
            return invalid(format!(
                "workers is {}, must be 1..={MAX_WORKERS}",
                self.workers
            ));
        }
        if self.call_timeout_ms == 0 || self.migrate_timeout_ms == 0 {
            return invalid("call and migrate timeouts must be positive".to_owned());
        }
        if i32::try_from(self.keepalive.interval_s).is_err() {
            return invalid("keepalive.interval_s is too large".to_owned());
        }
        if self.keepalive.interval_s > 0 && self.keepalive.count == 0 {
            return invalid("keepalive.count must be positive".to_owned());
        }
        if self.reconnect_min_ms == 0 || self.reconnect_min_ms > self.reconnect_max_ms {
            return invalid("need 0 < reconnect_min_ms <= reconnect_max_ms".to_owned());
        }
        if self.event_capacity == 0 || self.event_capacity > 1 << 20 {
            return invalid("event_capacity must be 1..=1048576".to_owned());
        }
        Ok(())
    }

    /// [`Self::call_timeout_ms`].
    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms)
    }

    /// [`Self::migrate_timeout_ms`].
    pub fn migrate_timeout(&self) -> Duration {
        Duration::from_millis(self.migrate_timeout_ms)
    }

    /// [`Self::reconnect_min_ms`].
    pub fn reconnect_min(&self) -> Duration {
        Duration::from_millis(self.reconnect_min_ms)
    }

    /// [`Self::reconnect_max_ms`].
    pub fn reconnect_max(&self) -> Duration {
        Duration::from_millis(self.reconnect_max_ms)
    }

    /// [`Self::join_timeout_ms`].
    pub fn join_timeout(&self) -> Duration {
        Duration::from_millis(self.join_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let config = LibvirtConfig::default();
        assert!(config.validate().is_ok());
        assert_eq!(config.workers, 4);
        assert_eq!(
            config.keepalive,
            Keepalive {
                interval_s: 2,
                count: 2
            }
        );
    }

    #[test]
    fn bad_values_are_rejected() {
        let base = LibvirtConfig::for_uri("test:///default");
        let bad = [
            LibvirtConfig {
                uri: String::new(),
                ..base.clone()
            },
            LibvirtConfig {
                workers: 0,
                ..base.clone()
            },
            LibvirtConfig {
                workers: 5,
                ..base.clone()
            },
            LibvirtConfig {
                call_timeout_ms: 0,
                ..base.clone()
            },
            LibvirtConfig {
                keepalive: Keepalive {
                    interval_s: 2,
                    count: 0,
                },
                ..base.clone()
            },
            LibvirtConfig {
                reconnect_min_ms: 0,
                ..base.clone()
            },
            LibvirtConfig {
                reconnect_min_ms: 20,
                reconnect_max_ms: 10,
                ..base.clone()
            },
            LibvirtConfig {
                event_capacity: 0,
                ..base.clone()
            },
        ];
        for config in bad {
            assert!(
                matches!(config.validate(), Err(LibvirtError::InvalidConfig { .. })),
                "{config:?}"
            );
        }
        let off = LibvirtConfig {
            keepalive: Keepalive {
                interval_s: 0,
                count: 0,
            },
            ..base
        };
        assert!(off.validate().is_ok());
    }

    #[test]
    fn parses_from_toml_like_json_and_rejects_unknown_fields() {
        let parsed: LibvirtConfig =
            serde_json::from_str(r#"{"uri":"test:///default","workers":2}"#).unwrap();
        assert_eq!(parsed.workers, 2);
        assert_eq!(parsed.call_timeout_ms, 60_000);
        assert!(serde_json::from_str::<LibvirtConfig>(r#"{"uri":"x","wrokers":2}"#).is_err());
    }
}
