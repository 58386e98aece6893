//! The agent's configuration file (`vireo agent --config FILE`): TOML, plain serde data.
//!
//! This module owns the file's schema, its defaults and its validation. Every table and key is
//! `deny_unknown_fields`; every key has a default except where noted, and docs/AGENT.md lists
//! them all. [`AgentConfig::load`] reads and checks a file and fails with one [`ConfigError`]
//! whose message names the offending key (`events.vif_plugging_timeout: invalid type ...`);
//! the CLI prints it and exits with code 2.
//!
//! ```toml
//! host = "compute-1"                       # default: the machine's host name
//! listen = "127.0.0.1:8774"
//! api_token_file = "/etc/vireo/api-token"  # mode 0600 or stricter
//!
//! [network]
//! kind = "neutron"
//! [network.neutron]
//! url = "http://127.0.0.1:9696"
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use vireo_actors::events::{EventConfig, WaitPolicy};
use vireo_actors::instance::{DomainSettings, InstanceConfig, MigrationPolicy};
use vireo_actors::libvirt::{LibvirtConfig, MAX_WORKERS};
use vireo_actors::plug::DomainForm;
use vireo_xml::domain::DomainType;

use crate::compute::{DriverConfig, NetworkConfig, PluggingConfig};
use crate::network::embedded::EmbeddedConfig;
use crate::network::neutron::NeutronConfig;
use crate::plug::PlugConfig;

/// Where the agent keeps its state unless `[instances] state_dir` says otherwise.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/vireo";
/// The API token file unless `api_token_file` says otherwise.
pub const DEFAULT_API_TOKEN_FILE: &str = "/etc/vireo/api-token";
/// The listen address unless `listen` says otherwise (Nova's compute API port, loopback).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8774";
/// The header carrying the token unless `token_header` says otherwise (what Neutron sends).
pub const DEFAULT_TOKEN_HEADER: &str = "X-Auth-Token";
/// The file name of the private libvirt test-driver node under the state directory, used when
/// `[libvirt] uri` is [`EMBEDDED_URI`].
pub const DEFAULT_TEST_NODE_FILE: &str = "libvirt-test-node.xml";
/// The libvirt URI unless `[libvirt] uri` says otherwise: the host's QEMU/KVM.
pub const DEFAULT_LIBVIRT_URI: &str = "qemu:///system";
/// The `[libvirt] uri` that asks for the embedded default: libvirt's test driver on a private
/// node file under the state directory (the demo and the fast tests), never chosen by default.
pub const EMBEDDED_URI: &str = "embedded";
/// Largest request body accepted unless `max_body_bytes` says otherwise (1 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
/// Largest `max_body_bytes` accepted (16 MiB).
pub const MAX_BODY_BYTES_LIMIT: usize = 16 << 20;
/// Finished operations kept for `GET /v1/operations/{id}` unless `finished_operations` says
/// otherwise; the oldest is forgotten first.
pub const DEFAULT_FINISHED_OPERATIONS: usize = 1_024;
/// Shortest token accepted in a token file.
pub const MIN_TOKEN_LEN: usize = 16;

/// The whole file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// This compute host's name, as Neutron binds ports to it (`binding:host_id`).
    /// Default: the machine's host name.
    #[serde(default)]
    pub host: Option<String>,
    /// Address the HTTP API listens on. Default `127.0.0.1:8774`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// HTTP worker threads. Default 2 (1..=64).
    #[serde(default = "default_http_workers")]
    pub http_workers: usize,
    /// File holding the API token (one line; mode 0600 or stricter, at least 16 characters).
    /// Every API request and every events POST must carry it. Default `/etc/vireo/api-token`.
    #[serde(default = "default_api_token_file")]
    pub api_token_file: PathBuf,
    /// Optional second token accepted on the external-events endpoint only (what Neutron's
    /// `[nova]` section is configured with). Same file rules. Default: none.
    #[serde(default)]
    pub events_token_file: Option<PathBuf>,
    /// Optional token accepted on `GET /metrics` only (Prometheus's `bearer_token_file`), so
    /// that scraping needs no token that can change an instance. Same file rules. Default:
    /// none (`/metrics` then takes the API token alone).
    #[serde(default)]
    pub metrics_token_file: Option<PathBuf>,
    /// Accept the literal token `notused` on the external-events endpoint: what Neutron's Nova
    /// notifier sends with `[nova] auth_type = none`. Only allowed when `listen` is a loopback
    /// address. Default false.
    #[serde(default)]
    pub accept_noauth_events: bool,
    /// The request header carrying the token. `Authorization: Bearer <token>` is accepted too.
    /// Default `X-Auth-Token`.
    #[serde(default = "default_token_header")]
    pub token_header: String,
    /// Largest request body in bytes; larger bodies get 413. Default 1048576 (1 MiB).
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Finished operations kept for polling (oldest forgotten first). Default 1024.
    #[serde(default = "default_finished_operations")]
    pub finished_operations: usize,
    /// Seconds the agent's own shutdown may take (stop accepting, let in-flight operations
    /// finish or roll back, fail waiters). Default 30. Not Nova's `shutdown_timeout` (a
    /// guest's clean shut-down, here `[instances] power_off_timeout`), hence the name.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout: u64,
    /// `[libvirt]`.
    #[serde(default)]
    pub libvirt: LibvirtSection,
    /// `[driver]`.
    #[serde(default)]
    pub driver: DriverSection,
    /// `[network]`.
    #[serde(default)]
    pub network: NetworkSection,
    /// `[events]`.
    #[serde(default)]
    pub events: EventsSection,
    /// `[instances]`.
    #[serde(default)]
    pub instances: InstancesSection,
    /// `[logging]`.
    #[serde(default)]
    pub logging: LoggingSection,
    /// `[plugging]`: host VIF plugging (OVSDB socket, datapath type, sysfs root, OVS
    /// timeout). Only with a real hypervisor: with a `test:` URI the test driver creates no
    /// devices and plugging is recorded only, so the section is refused there.
    #[serde(default)]
    pub plugging: Option<PlugConfig>,
    /// Seconds one host's half of a move (`POST /v1/instances/{uuid}/half`, Nova's
    /// finish-resize, finish-revert, pre-live-migration …) may run before it is answered
    /// `timed-out` (the operation goes on). Default `2 × events.vif_plugging_timeout + 360`
    /// (960 with the defaults); 1..=200000.
    #[serde(default)]
    pub half_timeout: Option<u64>,
    /// `[[peers]]`, retired with the agents' own peer protocol: refused with an error that
    /// names Nova, which orchestrates moves between hosts.
    #[serde(default)]
    peers: Option<serde::de::IgnoredAny>,
    /// `[peering]`, retired likewise.
    #[serde(default)]
    peering: Option<serde::de::IgnoredAny>,
}

/// `[libvirt]`: the hypervisor connection.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LibvirtSection {
    /// Connection URI. Default `qemu:///system`. `"embedded"` asks for libvirt's test driver
    /// on a private node file, `test:///<state_dir>/libvirt-test-node.xml` (created empty when
    /// missing): the demo's and the fast tests' hypervisor, which runs no guest.
    #[serde(default)]
    pub uri: Option<String>,
    /// libvirt worker threads = calls in flight on the connection (1..=4). Default 4.
    #[serde(default = "default_libvirt_workers")]
    pub workers: usize,
    /// Per-call deadline in seconds. Default 60.
    #[serde(default = "default_call_timeout")]
    pub call_timeout: u64,
    /// Retired with the agents' peer protocol: Nova tells each host's half the other host's
    /// URI (nova.conf `[vireo] migration_uri`). Refused.
    #[serde(default)]
    migration_uri: Option<serde::de::IgnoredAny>,
    /// Seconds per GiB of guest memory (at least 2 GiB) a live migration from this host may
    /// take before its job is aborted and it is rolled back (Nova's
    /// `live_migration_completion_timeout`); 0: no limit. Default 800.
    #[serde(default = "default_live_migration_completion_timeout")]
    pub live_migration_completion_timeout: u64,
    /// Live-migration bandwidth limit in MiB/s; 0: unlimited. Default 0.
    #[serde(default)]
    pub live_migration_bandwidth: u64,
    /// Let QEMU throttle a guest whose memory changes faster than it migrates. Default false.
    #[serde(default)]
    pub live_migration_permit_auto_converge: bool,
    /// Retired with the agents' peer protocol (a source asked the destination's agent to
    /// take the guest over; under Nova its compute manager does). Refused.
    #[serde(default)]
    live_migration_handover_retry: Option<serde::de::IgnoredAny>,
}

fn default_live_migration_completion_timeout() -> u64 {
    800
}

/// `[driver]`: which virt driver the agent loads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverSection {
    /// The name given to `load_driver`. Default `libvirt`.
    #[serde(default = "default_driver_name")]
    pub name: String,
}

/// Which network service the agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkKind {
    /// vireo's in-process port store (no Neutron).
    Embedded,
    /// A real Neutron, configured in `[network.neutron]`.
    Neutron,
}

impl NetworkKind {
    /// The config value.
    pub fn as_str(&self) -> &'static str {
        match self {
            NetworkKind::Embedded => "embedded",
            NetworkKind::Neutron => "neutron",
        }
    }
}

/// `[network]`: the network service.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    /// `embedded` (default) or `neutron`.
    #[serde(default = "default_network_kind")]
    pub kind: NetworkKind,
    /// `[network.neutron]`: required when `kind = "neutron"`, refused otherwise. The Neutron
    /// client's own keys (`url`, `auth`, timeouts, retries, `device_owner`).
    #[serde(default)]
    pub neutron: Option<NeutronConfig>,
    /// `[network.embedded]`: the embedded service's keys (`networks`, `event_delay_ms`,
    /// `device_owner`, `project_id`); refused when `kind = "neutron"`. Default: no networks.
    #[serde(default)]
    pub embedded: Option<EmbeddedConfig>,
}

/// `[events]`: waiting for Neutron's external events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsSection {
    /// Seconds an operation waits for its network events; 0 = do not wait. Default 300.
    #[serde(default = "default_vif_plugging_timeout")]
    pub vif_plugging_timeout: u64,
    /// A timeout or a `failed` event fails the operation (it rolls back). Default true.
    #[serde(default = "default_true")]
    pub vif_plugging_is_fatal: bool,
    /// Seconds a wait released by `network-vif-plugged` reads its ports back until the
    /// network service shows them ACTIVE, before it trusts the events (a stale event keeps
    /// the wait open that long); 0 = trust the events at once. Default 10, at most 600.
    #[serde(default = "default_confirm_active_timeout")]
    pub confirm_active_timeout: u64,
}

/// How OVS native ports are wired (see `vireo events explain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OvsNativeForm {
    /// libvirt creates the tap and plugs it (`<virtualport type='openvswitch'>`).
    LibvirtManaged,
    /// vireo creates the tap; libvirt uses it unmanaged.
    PreCreated,
}

impl OvsNativeForm {
    /// The driver's domain form.
    pub fn domain_form(&self) -> DomainForm {
        match self {
            OvsNativeForm::LibvirtManaged => DomainForm::LibvirtManaged,
            OvsNativeForm::PreCreated => DomainForm::PreCreated,
        }
    }
}

/// The libvirt domain type instances get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DomainTypeName {
    /// QEMU with KVM.
    Kvm,
    /// QEMU with TCG (no KVM).
    Qemu,
    /// libvirt's test driver type.
    Test,
}

impl DomainTypeName {
    /// The XML model's type.
    pub fn domain_type(&self) -> DomainType {
        match self {
            DomainTypeName::Kvm => DomainType::Kvm,
            DomainTypeName::Qemu => DomainType::Qemu,
            DomainTypeName::Test => DomainType::Test,
        }
    }
}

/// `[instances]`: where instance files live and which images may be used.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstancesSection {
    /// The agent's state directory; instance directories (console logs, disks) live under
    /// `<state_dir>/instances/<uuid>`. Default `/var/lib/vireo`.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// Where the instance directories are (Nova's `instances_path`); default
    /// `<state_dir>/instances`. Hosts that mount one shared directory at the same path
    /// live-migrate without copying disks (each finds the other's probe file there); the
    /// image cache stays per host, in `<state_dir>/_base`.
    #[serde(default)]
    pub instances_path: Option<PathBuf>,
    /// Directories kernels, initrds and disk images may be taken from; a path given in a
    /// request must resolve (symlinks followed) inside one of them. Default
    /// `["/var/lib/vireo/images"]`.
    #[serde(default = "default_image_dirs")]
    pub image_dirs: Vec<PathBuf>,
    /// `pre-created` (default: vireo creates the tap and keeps it wired until it unplugs the
    /// VIF, so a domain recreated by a reboot, start, resume or resize keeps its port up and
    /// awaits no event) or `libvirt-managed` (libvirt creates and deletes the tap with the
    /// domain; the OVS agent reports the port down and up again each time).
    #[serde(default = "default_ovs_native_form")]
    pub ovs_native_form: OvsNativeForm,
    /// Domain type: `kvm` (default), `qemu` (TCG) or `test`.
    #[serde(default = "default_domain_type")]
    pub domain_type: DomainTypeName,
    /// Machine type (e.g. `q35`). Default: libvirt's choice.
    #[serde(default)]
    pub machine: Option<String>,
    /// Seconds a graceful power off may take before the domain is destroyed. Default 60.
    #[serde(default = "default_power_off_timeout")]
    pub power_off_timeout: u64,
    /// Seconds a soft reboot waits for the guest to shut down before it reboots hard (Nova's
    /// `[libvirt] wait_soft_reboot_seconds`). Default 120.
    #[serde(default = "default_soft_reboot_timeout")]
    pub soft_reboot_timeout: u64,
    /// Seconds one request to a running guest to release a detached interface waits for
    /// libvirt's device-removed event (Nova's `[libvirt] device_detach_timeout`). Default 20.
    #[serde(default = "default_device_detach_timeout")]
    pub device_detach_timeout: u64,
    /// How many times the guest is asked before the detach fails with the interface left
    /// plugged (Nova's `[libvirt] device_detach_attempts`). Default 8.
    #[serde(default = "default_device_detach_attempts")]
    pub device_detach_attempts: u32,
    /// Seconds a cached base image (`<state_dir>/_base/<image id>`) no instance uses is kept
    /// after its last use (Nova's `remove_unused_original_minimum_age_seconds`). Default 86400.
    #[serde(default = "default_remove_unused_base_after")]
    pub remove_unused_base_after: u64,
    /// Seconds an image download may receive nothing before it fails (1 to 3600). Default 60.
    #[serde(default = "default_image_read_timeout")]
    pub image_read_timeout: u64,
    /// Seconds between two passes that remove unused cached bases (Nova's
    /// `[image_cache] manager_interval`); 0: never. Default 2400.
    #[serde(default = "default_image_cache_interval")]
    pub image_cache_interval: u64,
}

impl InstancesSection {
    /// The image cache's settings.
    pub fn image_cache(&self) -> crate::storage::CacheConfig {
        crate::storage::CacheConfig {
            remove_unused_after: std::time::Duration::from_secs(self.remove_unused_base_after),
            read_timeout: std::time::Duration::from_secs(self.image_read_timeout),
            ..crate::storage::CacheConfig::in_state_dir(&self.state_dir)
        }
    }
}

/// Log output level names accepted by `[logging] level`.
pub const LOG_LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

/// `[logging]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingSection {
    /// One JSON object per line instead of text (on stderr). Default false.
    #[serde(default)]
    pub json: bool,
    /// Where events go: `auto` (default: journald natively when stderr is connected to the
    /// journal, as under systemd, else stderr), `stderr` or `journald`.
    #[serde(default)]
    pub output: LogOutput,
    /// `error`, `warn`, `info` (default), `debug` or `trace`; `RUST_LOG` overrides it.
    #[serde(default = "default_log_level")]
    pub level: String,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8774))
}
fn default_http_workers() -> usize {
    2
}
fn default_api_token_file() -> PathBuf {
    PathBuf::from(DEFAULT_API_TOKEN_FILE)
}
fn default_token_header() -> String {
    DEFAULT_TOKEN_HEADER.to_owned()
}
fn default_max_body_bytes() -> usize {
    DEFAULT_MAX_BODY_BYTES
}
fn default_finished_operations() -> usize {
    DEFAULT_FINISHED_OPERATIONS
}
fn default_drain_timeout() -> u64 {
    30
}
fn default_libvirt_workers() -> usize {
    MAX_WORKERS
}
fn default_call_timeout() -> u64 {
    60
}
fn default_driver_name() -> String {
    "libvirt".to_owned()
}
fn default_network_kind() -> NetworkKind {
    NetworkKind::Embedded
}
fn default_vif_plugging_timeout() -> u64 {
    300
}
fn default_confirm_active_timeout() -> u64 {
    10
}
fn default_true() -> bool {
    true
}
fn default_state_dir() -> PathBuf {
    PathBuf::from(DEFAULT_STATE_DIR)
}
fn default_remove_unused_base_after() -> u64 {
    86_400
}
fn default_image_cache_interval() -> u64 {
    2400
}
fn default_image_read_timeout() -> u64 {
    60
}
fn default_image_dirs() -> Vec<PathBuf> {
    vec![Path::new(DEFAULT_STATE_DIR).join("images")]
}
fn default_ovs_native_form() -> OvsNativeForm {
    OvsNativeForm::PreCreated
}
fn default_domain_type() -> DomainTypeName {
    DomainTypeName::Kvm
}
fn default_power_off_timeout() -> u64 {
    60
}
fn default_soft_reboot_timeout() -> u64 {
    120
}
fn default_device_detach_timeout() -> u64 {
    20
}
fn default_device_detach_attempts() -> u32 {
    8
}
fn default_log_level() -> String {
    "info".to_owned()
}
/// Largest `half_timeout`, seconds.
pub const MAX_HALF_TIMEOUT: u64 = 200_000;

impl Default for LibvirtSection {
    fn default() -> Self {
        LibvirtSection {
            uri: None,
            workers: default_libvirt_workers(),
            call_timeout: default_call_timeout(),
            migration_uri: None,
            live_migration_completion_timeout: default_live_migration_completion_timeout(),
            live_migration_bandwidth: 0,
            live_migration_permit_auto_converge: false,
            live_migration_handover_retry: None,
        }
    }
}

impl Default for DriverSection {
    fn default() -> Self {
        DriverSection {
            name: default_driver_name(),
        }
    }
}

impl Default for NetworkSection {
    fn default() -> Self {
        NetworkSection {
            kind: default_network_kind(),
            neutron: None,
            embedded: None,
        }
    }
}

impl Default for EventsSection {
    fn default() -> Self {
        EventsSection {
            vif_plugging_timeout: default_vif_plugging_timeout(),
            vif_plugging_is_fatal: true,
            confirm_active_timeout: default_confirm_active_timeout(),
        }
    }
}

impl Default for InstancesSection {
    fn default() -> Self {
        InstancesSection {
            state_dir: default_state_dir(),
            instances_path: None,
            image_dirs: default_image_dirs(),
            ovs_native_form: default_ovs_native_form(),
            domain_type: default_domain_type(),
            machine: None,
            power_off_timeout: default_power_off_timeout(),
            soft_reboot_timeout: default_soft_reboot_timeout(),
            device_detach_timeout: default_device_detach_timeout(),
            device_detach_attempts: default_device_detach_attempts(),
            remove_unused_base_after: default_remove_unused_base_after(),
            image_read_timeout: default_image_read_timeout(),
            image_cache_interval: default_image_cache_interval(),
        }
    }
}

/// `[logging] output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogOutput {
    /// journald when stderr is the journal, else stderr.
    #[default]
    Auto,
    /// stderr, text or JSON.
    Stderr,
    /// journald's native protocol (falls back to stderr, with a warning, when its socket
    /// cannot be opened).
    Journald,
}

impl Default for LoggingSection {
    fn default() -> Self {
        LoggingSection {
            json: false,
            output: LogOutput::default(),
            level: default_log_level(),
        }
    }
}

impl Default for AgentConfig {
    /// Every key at its default.
    fn default() -> Self {
        AgentConfig {
            host: None,
            listen: default_listen(),
            http_workers: default_http_workers(),
            api_token_file: default_api_token_file(),
            events_token_file: None,
            metrics_token_file: None,
            accept_noauth_events: false,
            token_header: default_token_header(),
            max_body_bytes: default_max_body_bytes(),
            finished_operations: default_finished_operations(),
            drain_timeout: default_drain_timeout(),
            libvirt: LibvirtSection::default(),
            driver: DriverSection::default(),
            network: NetworkSection::default(),
            events: EventsSection::default(),
            instances: InstancesSection::default(),
            logging: LoggingSection::default(),
            plugging: None,
            half_timeout: None,
            peers: None,
            peering: None,
        }
    }
}

/// Why a configuration file was refused. The message names the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config {}: cannot read the file", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not fit the schema (unknown key, wrong type, ...).
    #[error("config {}: {}{}", path.display(), key_prefix(key), message)]
    Parse {
        /// The file.
        path: PathBuf,
        /// Dotted key (or table) the error is at, when it could be located.
        key: Option<String>,
        /// Line (1-based) of the error, when known.
        line: Option<usize>,
        /// What is wrong (the TOML/serde message, one line).
        message: String,
    },
    /// A value is well-formed but not acceptable.
    #[error("config {}: `{key}`: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Dotted key.
        key: &'static str,
        /// Why.
        reason: String,
    },
}

fn key_prefix(key: &Option<String>) -> String {
    match key {
        Some(k) => format!("`{k}`: "),
        None => String::new(),
    }
}

impl ConfigError {
    /// The dotted key the error names, when there is one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Read { .. } => None,
            ConfigError::Parse { key, .. } => key.as_deref(),
            ConfigError::Invalid { key, .. } => Some(key),
        }
    }
}

impl AgentConfig {
    /// Read, parse and validate `path`.
    pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parse and validate `text`; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<AgentConfig, ConfigError> {
        let cfg: AgentConfig = toml::from_str(text).map_err(|e| {
            let (key, line) = match e.span() {
                Some(span) => locate(text, span.start),
                None => (None, None),
            };
            ConfigError::Parse {
                path: path.to_owned(),
                key,
                line,
                message: e.message().trim().replace('\n', " "),
            }
        })?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Check the values serde cannot check.
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |key: &'static str, reason: String| {
            Err(ConfigError::Invalid {
                path: path.to_owned(),
                key,
                reason,
            })
        };
        if let Some(h) = &self.host {
            if h.is_empty() || h.len() > 255 || !h.bytes().all(|b| b.is_ascii_graphic()) {
                return bad("host", format!("{h:?} is not a host name"));
            }
        }
        if self.http_workers == 0 || self.http_workers > 64 {
            return bad(
                "http_workers",
                format!("{} is not in 1..=64", self.http_workers),
            );
        }
        if self.accept_noauth_events && !self.listen.ip().is_loopback() {
            return bad(
                "accept_noauth_events",
                format!(
                    "may only be true when `listen` is a loopback address (it is {})",
                    self.listen
                ),
            );
        }
        if actix_web::http::header::HeaderName::from_bytes(self.token_header.as_bytes()).is_err() {
            return bad(
                "token_header",
                format!("{:?} is not an HTTP header name", self.token_header),
            );
        }
        if self.max_body_bytes < 1024 || self.max_body_bytes > MAX_BODY_BYTES_LIMIT {
            return bad(
                "max_body_bytes",
                format!(
                    "{} is not in 1024..={MAX_BODY_BYTES_LIMIT}",
                    self.max_body_bytes
                ),
            );
        }
        if self.finished_operations == 0 || self.finished_operations > 1_000_000 {
            return bad(
                "finished_operations",
                format!("{} is not in 1..=1000000", self.finished_operations),
            );
        }
        if self.drain_timeout == 0 || self.drain_timeout > 3_600 {
            return bad(
                "drain_timeout",
                format!("{} is not in 1..=3600 seconds", self.drain_timeout),
            );
        }
        if let Some(uri) = &self.libvirt.uri {
            if uri.is_empty() || uri.contains(char::is_whitespace) {
                return bad("libvirt.uri", format!("{uri:?} is not a libvirt URI"));
            }
        }
        if self.libvirt.workers == 0 || self.libvirt.workers > MAX_WORKERS {
            return bad(
                "libvirt.workers",
                format!("{} is not in 1..={MAX_WORKERS}", self.libvirt.workers),
            );
        }
        if self.libvirt.call_timeout == 0 || self.libvirt.call_timeout > 86_400 {
            return bad(
                "libvirt.call_timeout",
                format!("{} is not in 1..=86400 seconds", self.libvirt.call_timeout),
            );
        }
        if self.driver.name.is_empty() {
            return bad("driver.name", "is empty".to_owned());
        }
        if self.network.kind == NetworkKind::Neutron && self.network.embedded.is_some() {
            return bad(
                "network.embedded",
                "is set but network.kind is \"neutron\"".to_owned(),
            );
        }
        if self.plugging.is_some() && self.uses_test_driver() {
            return bad(
                "plugging",
                "is only used with a real hypervisor (libvirt.uri is a test: URI)".to_owned(),
            );
        }
        if self.instances.device_detach_timeout == 0 || self.instances.device_detach_timeout > 600 {
            return bad(
                "instances.device_detach_timeout",
                format!(
                    "{} is not in 1..=600 seconds",
                    self.instances.device_detach_timeout
                ),
            );
        }
        if self.instances.device_detach_attempts == 0 || self.instances.device_detach_attempts > 100
        {
            return bad(
                "instances.device_detach_attempts",
                format!(
                    "{} is not in 1..=100",
                    self.instances.device_detach_attempts
                ),
            );
        }
        if self.instances.soft_reboot_timeout == 0 || self.instances.soft_reboot_timeout > 3_600 {
            return bad(
                "instances.soft_reboot_timeout",
                format!(
                    "{} is not in 1..=3600 seconds",
                    self.instances.soft_reboot_timeout
                ),
            );
        }
        if self.instances.power_off_timeout == 0 || self.instances.power_off_timeout > 3_600 {
            return bad(
                "instances.power_off_timeout",
                format!(
                    "{} is not in 1..=3600 seconds",
                    self.instances.power_off_timeout
                ),
            );
        }
        match (self.network.kind, &self.network.neutron) {
            (NetworkKind::Neutron, None) => {
                return bad(
                    "network.neutron",
                    "is required when network.kind = \"neutron\"".to_owned(),
                )
            }
            (NetworkKind::Embedded, Some(_)) => {
                return bad(
                    "network.neutron",
                    "is set but network.kind is \"embedded\"".to_owned(),
                )
            }
            (NetworkKind::Neutron, Some(n)) => {
                let noauth = matches!(n.auth, crate::network::neutron::Auth::Noauth { .. });
                if n.url.is_empty() && noauth {
                    return bad(
                        "network.neutron.url",
                        "is required without Keystone (no catalog to find Neutron in)".to_owned(),
                    );
                }
                if !(n.url.is_empty()
                    || n.url.starts_with("http://")
                    || n.url.starts_with("https://"))
                {
                    return bad(
                        "network.neutron.url",
                        format!("{:?} is not an http(s) URL", n.url),
                    );
                }
                if n.valid_interfaces.is_empty() {
                    return bad(
                        "network.neutron.valid_interfaces",
                        "names no interface".to_owned(),
                    );
                }
                if let Some(ca) = &n.cafile {
                    if !ca.is_absolute() {
                        return bad(
                            "network.neutron.cafile",
                            format!("{} is not an absolute path", ca.display()),
                        );
                    }
                }
            }
            (NetworkKind::Embedded, None) => {}
        }
        if self.events.vif_plugging_timeout > 86_400 {
            return bad(
                "events.vif_plugging_timeout",
                format!(
                    "{} is more than 86400 seconds",
                    self.events.vif_plugging_timeout
                ),
            );
        }
        if self.events.confirm_active_timeout > 600 {
            return bad(
                "events.confirm_active_timeout",
                format!(
                    "{} is more than 600 seconds",
                    self.events.confirm_active_timeout
                ),
            );
        }
        if let Some(p) = &self.instances.instances_path {
            if !p.is_absolute() {
                return bad(
                    "instances.instances_path",
                    format!("{} is not an absolute path", p.display()),
                );
            }
        }
        if !self.instances.state_dir.is_absolute() {
            return bad(
                "instances.state_dir",
                format!(
                    "{} is not an absolute path",
                    self.instances.state_dir.display()
                ),
            );
        }
        if !(1..=3600).contains(&self.instances.image_read_timeout) {
            return bad(
                "instances.image_read_timeout",
                format!(
                    "{} is not 1 to 3600 seconds",
                    self.instances.image_read_timeout
                ),
            );
        }
        if let Some(p) = self.instances.image_dirs.iter().find(|p| !p.is_absolute()) {
            return bad(
                "instances.image_dirs",
                format!("{} is not an absolute path", p.display()),
            );
        }
        if !LOG_LEVELS.contains(&self.logging.level.as_str()) {
            return bad(
                "logging.level",
                format!(
                    "{:?} is not one of {}",
                    self.logging.level,
                    LOG_LEVELS.join(", ")
                ),
            );
        }
        if !self.api_token_file.is_absolute() {
            return bad(
                "api_token_file",
                format!("{} is not an absolute path", self.api_token_file.display()),
            );
        }
        for (key, file) in [
            ("events_token_file", &self.events_token_file),
            ("metrics_token_file", &self.metrics_token_file),
        ] {
            if let Some(p) = file {
                if !p.is_absolute() {
                    return bad(key, format!("{} is not an absolute path", p.display()));
                }
            }
        }
        self.validate_retired(path)
    }

    fn validate_retired(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |key: &'static str, reason: String| {
            Err(ConfigError::Invalid {
                path: path.to_owned(),
                key,
                reason,
            })
        };
        for (key, present) in [
            ("peers", self.peers.is_some()),
            ("peering", self.peering.is_some()),
            (
                "libvirt.migration_uri",
                self.libvirt.migration_uri.is_some(),
            ),
            (
                "libvirt.live_migration_handover_retry",
                self.libvirt.live_migration_handover_retry.is_some(),
            ),
        ] {
            if present {
                return bad(
                    key,
                    "retired: agents no longer talk to each other; moves between hosts run \
                     under Nova (nova-compute with compute_driver = vireo.VireoDriver, see \
                     docs/NOVA.md). Remove it"
                        .into(),
                );
            }
        }
        if let Some(t) = self.half_timeout {
            if t == 0 || t > MAX_HALF_TIMEOUT {
                return bad(
                    "half_timeout",
                    format!("{t} is not in 1..={MAX_HALF_TIMEOUT} seconds"),
                );
            }
        }
        Ok(())
    }

    /// How long one host's half of a move may run here before it is answered `timed-out`:
    /// `half_timeout`, else `2 × vif_plugging_timeout + 360` s (a half may wait twice for
    /// network events — a revert's bind-time and plug-time waits — plus its libvirt calls
    /// and a disk copy).
    pub fn half_timeout(&self) -> Duration {
        Duration::from_secs(
            self.half_timeout
                .unwrap_or_else(|| self.events.vif_plugging_timeout.saturating_mul(2) + 360),
        )
    }

    /// The host name: `host`, else the machine's.
    pub fn host_name(&self) -> String {
        if let Some(h) = &self.host {
            return h.clone();
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned())
    }

    /// The libvirt URI: `[libvirt] uri`, `qemu:///system` when unset, the private
    /// test-driver node under the state directory when `"embedded"`.
    pub fn libvirt_uri(&self) -> String {
        match self.libvirt.uri.as_deref() {
            None => DEFAULT_LIBVIRT_URI.to_owned(),
            Some(EMBEDDED_URI) => format!("test://{}", self.default_test_node().display()),
            Some(uri) => uri.to_owned(),
        }
    }

    /// True when `[libvirt] uri` asks for the embedded default.
    pub fn uses_embedded_libvirt(&self) -> bool {
        self.libvirt.uri.as_deref() == Some(EMBEDDED_URI)
    }

    /// The node file of the default test-driver URI.
    pub fn default_test_node(&self) -> PathBuf {
        self.instances.state_dir.join(DEFAULT_TEST_NODE_FILE)
    }

    /// True when the libvirt URI is the test driver's, local (`test:`) or through a daemon
    /// (`test+unix:`, ...): it creates no devices, so plugging is recorded only.
    pub fn uses_test_driver(&self) -> bool {
        let uri = self.libvirt_uri();
        uri.starts_with("test:") || uri.starts_with("test+")
    }

    /// The instance settings the driver uses.
    pub fn instance_config(&self) -> InstanceConfig {
        InstanceConfig {
            domain: DomainSettings {
                domain_type: self.instances.domain_type.domain_type(),
                machine: self.instances.machine.clone(),
                console_dir: Some(self.instances_dir().display().to_string()),
            },
            ovs_native_form: self.instances.ovs_native_form.domain_form(),
            wait: self.wait_policy(),
            confirm_window: Duration::from_secs(self.events.confirm_active_timeout),
            power_off_timeout: Duration::from_secs(self.instances.power_off_timeout),
            soft_reboot_timeout: Duration::from_secs(self.instances.soft_reboot_timeout),
            device_detach: vireo_actors::instance::DetachPolicy {
                timeout: Duration::from_secs(self.instances.device_detach_timeout),
                attempts: self.instances.device_detach_attempts,
            },
            migration: MigrationPolicy {
                completion_timeout_per_gib: Some(self.libvirt.live_migration_completion_timeout)
                    .filter(|s| *s > 0)
                    .map(Duration::from_secs),
                bandwidth_mib: Some(self.libvirt.live_migration_bandwidth).filter(|b| *b > 0),
                auto_converge: self.libvirt.live_migration_permit_auto_converge,
                ..MigrationPolicy::default()
            },
            ..InstanceConfig::default()
        }
    }

    /// What `load_driver` needs.
    pub fn driver_config(&self) -> DriverConfig {
        DriverConfig {
            host: self.host_name(),
            libvirt: self.libvirt_config(),
            instances: self.instance_config(),
            events: EventConfig::default(),
            plugging: if self.uses_test_driver() {
                PluggingConfig::Static
            } else {
                PluggingConfig::Host(self.plugging.clone().unwrap_or_default())
            },
            network: match (&self.network.kind, &self.network.neutron) {
                (NetworkKind::Neutron, Some(n)) => NetworkConfig::Neutron(Box::new(n.clone())),
                _ => NetworkConfig::Embedded(self.network.embedded.clone().unwrap_or_default()),
            },
            // An agent is one host: no other host of its process migrates to it.
            migration_uri: None,
            storage: crate::storage::StorageConfig {
                instances_dir: self.instances_dir(),
                cache: self.instances.image_cache(),
                journal_dir: self.instances.state_dir.join("builds"),
                migration_journal_dir: self.instances.state_dir.join("live-migrations"),
            },
        }
    }

    /// The libvirt layer's configuration.
    pub fn libvirt_config(&self) -> LibvirtConfig {
        LibvirtConfig {
            workers: self.libvirt.workers,
            call_timeout_ms: self.libvirt.call_timeout.saturating_mul(1_000),
            ..LibvirtConfig::for_uri(self.libvirt_uri())
        }
    }

    /// The wait policy operations use.
    pub fn wait_policy(&self) -> WaitPolicy {
        WaitPolicy {
            timeout: Duration::from_secs(self.events.vif_plugging_timeout),
            fatal: self.events.vif_plugging_is_fatal,
        }
    }

    /// `drain_timeout` as a duration.
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs(self.drain_timeout)
    }

    /// Where instance directories live: `<state_dir>/instances`.
    pub fn instances_dir(&self) -> PathBuf {
        match &self.instances.instances_path {
            Some(p) => p.clone(),
            None => self.instances.state_dir.join("instances"),
        }
    }
}

impl fmt::Display for NetworkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The dotted key at byte `offset` of `text` and its line: the last `[table]` header before
/// it, plus the key on its line (text before `=`), or the header itself when the offset is on
/// a header line.
fn locate(text: &str, offset: usize) -> (Option<String>, Option<usize>) {
    let mut table: Option<String> = None;
    let mut pos = 0;
    for (n, raw) in text.split_inclusive('\n').enumerate() {
        let end = pos + raw.len();
        let line = raw.trim();
        let header = line
            .strip_prefix("[[")
            .and_then(|l| l.split("]]").next())
            .or_else(|| line.strip_prefix('[').and_then(|l| l.split(']').next()))
            .map(|h| h.trim().replace([' ', '"', '\''], ""));
        if offset < end || end == text.len() {
            if let Some(h) = header {
                return (Some(h), Some(n + 1));
            }
            let key = line
                .split_once('=')
                .map(|(k, _)| k.trim().replace([' ', '"', '\''], ""))
                .filter(|k| !k.is_empty() && !k.starts_with('#'));
            let full = match (table, key) {
                (Some(t), Some(k)) => Some(format!("{t}.{k}")),
                (None, Some(k)) => Some(k),
                (t, None) => t,
            };
            return (full, Some(n + 1));
        }
        if let Some(h) = header {
            table = Some(h);
        }
        pos = end;
    }
    (table, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AgentConfig, ConfigError> {
        AgentConfig::parse(text, Path::new("/etc/vireo/agent.toml"))
    }

    #[test]
    fn empty_file_gives_every_default() {
        let cfg = parse("").unwrap();
        assert_eq!(cfg, AgentConfig::default());
        assert_eq!(cfg.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(cfg.wait_policy(), WaitPolicy::default());
        assert_eq!(
            cfg.libvirt_uri(),
            "qemu:///system",
            "no key: the real hypervisor, never the test driver"
        );
        assert!(!cfg.uses_test_driver() && !cfg.uses_embedded_libvirt());
        assert!(!matches!(
            cfg.driver_config().plugging,
            PluggingConfig::Static
        ));
        assert_eq!(cfg.libvirt_config().workers, 4);
        assert_eq!(cfg.libvirt_config().call_timeout_ms, 60_000);
        assert_eq!(cfg.instances_dir(), Path::new("/var/lib/vireo/instances"));
        assert_eq!(
            cfg.driver_config().instances.ovs_native_form,
            DomainForm::PreCreated,
            "native OVS taps are vireo's by default"
        );
        let shared = parse(
            "[instances]\nstate_dir = \"/srv/vireo\"\ninstances_path = \"/mnt/nfs/instances\"\n",
        )
        .unwrap();
        assert!(parse("[instances]\ninstances_path = \"rel\"\n").is_err());
        assert_eq!(shared.instances_dir(), Path::new("/mnt/nfs/instances"));
        assert_eq!(
            shared.instances.image_cache().dir,
            Path::new("/srv/vireo/_base"),
            "the cache stays per host"
        );
        // The embedded default, asked for.
        let cfg = parse("[libvirt]\nuri = \"embedded\"\n").unwrap();
        assert!(cfg.uses_embedded_libvirt() && cfg.uses_test_driver());
        let d = cfg.driver_config();
        assert!(matches!(d.plugging, PluggingConfig::Static), "test: URI");
        assert!(matches!(d.network, NetworkConfig::Embedded(_)));
        assert_eq!(d.libvirt.uri, "test:///var/lib/vireo/libvirt-test-node.xml");
        assert_eq!(d.instances.wait, WaitPolicy::default());
        assert_eq!(d.migration_uri, None);
        let cfg = parse("[libvirt]\nuri = \"test+unix:///n.xml?socket=/tmp/s\"\n").unwrap();
        assert!(cfg.uses_test_driver());
        assert!(matches!(
            cfg.driver_config().plugging,
            PluggingConfig::Static
        ));
    }

    #[test]
    fn embedded_networks_and_plugging_parse() {
        let cfg = parse(
            r#"
[libvirt]
uri = "qemu:///system"
[plugging]
datapath_type = "netdev"
[network.embedded]
event_delay_ms = 500
[[network.embedded.networks]]
id = "11111111-0000-4000-8000-000000000001"
name = "private"
mechanism = "openvswitch"
ovs_hybrid_plug = true
"#,
        )
        .unwrap();
        let d = cfg.driver_config();
        match d.network {
            NetworkConfig::Embedded(e) => {
                assert_eq!(e.networks.len(), 1);
                assert_eq!(e.event_delay_ms, 500);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(d.plugging, PluggingConfig::Host(_)));
        assert_eq!(d.migration_uri, None, "an agent is one host");
    }

    #[test]
    fn a_full_file_parses() {
        let cfg = parse(
            r#"
host = "compute-1"
listen = "127.0.0.1:9000"
http_workers = 1
api_token_file = "/run/vireo/api"
events_token_file = "/run/vireo/events"
accept_noauth_events = true
drain_timeout = 5

[libvirt]
uri = "qemu:///system"
workers = 2
call_timeout = 10

[driver]
name = "libvirt"

[network]
kind = "neutron"
[network.neutron]
url = "http://127.0.0.1:9696"
auth = { type = "noauth" }

[events]
vif_plugging_timeout = 0
vif_plugging_is_fatal = false

[instances]
state_dir = "/srv/vireo"
image_dirs = ["/srv/images", "/srv/kernels"]
ovs_native_form = "libvirt-managed"

[logging]
json = true
level = "debug"
"#,
        )
        .unwrap();
        assert_eq!(cfg.host_name(), "compute-1");
        assert_eq!(cfg.network.kind, NetworkKind::Neutron);
        assert_eq!(
            cfg.network.neutron.as_ref().unwrap().url,
            "http://127.0.0.1:9696"
        );
        assert_eq!(cfg.libvirt_uri(), "qemu:///system");
        assert!(!cfg.wait_policy().fatal);
        assert_eq!(
            cfg.instances.ovs_native_form.domain_form(),
            DomainForm::LibvirtManaged
        );
        let d = cfg.driver_config();
        assert_eq!(d.host, "compute-1");
        assert!(matches!(d.network, NetworkConfig::Neutron(_)));
        assert!(matches!(d.plugging, PluggingConfig::Host(_)));
        assert_eq!(d.instances.ovs_native_form, DomainForm::LibvirtManaged);
        assert_eq!(
            d.instances.domain.console_dir.as_deref(),
            Some("/srv/vireo/instances")
        );
        assert!(!d.instances.wait.fatal);
        assert_eq!(cfg.drain_timeout(), Duration::from_secs(5));
    }

    /// packaging/agent.toml.sample parses, and so does every key it shows commented out: they
    /// are real keys with valid values.
    #[test]
    fn the_packaged_sample_is_valid_with_every_key_uncommented() {
        let sample = include_str!("../../packaging/agent.toml.sample");
        let cfg = parse(sample).unwrap();
        assert_eq!(cfg.libvirt_uri(), "qemu:///system");
        assert_eq!(cfg.api_token_file, Path::new("/etc/vireo/api-token"));
        let uncommented: String = sample
            .lines()
            .map(|l| match l.strip_prefix('#') {
                Some(rest) if !rest.is_empty() && !rest.starts_with(' ') => rest,
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let all = parse(&uncommented).unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
        assert_eq!(all.network.kind, NetworkKind::Neutron);
        assert_eq!(all.instances.domain_type, DomainTypeName::Kvm);
        assert_eq!(
            all.plugging
                .as_ref()
                .map(|p| p.ovsdb_connection.to_string()),
            Some("unix:/var/run/openvswitch/db.sock".to_owned())
        );
    }

    fn key_of(text: &str) -> String {
        let e = parse(text).unwrap_err();
        e.key().unwrap_or("<none>").to_owned()
    }

    #[test]
    fn errors_name_the_key() {
        assert_eq!(key_of("lisen = \"127.0.0.1:1\""), "lisen");
        assert_eq!(key_of("listen = \"nope\""), "listen");
        assert_eq!(
            key_of("[events]\nvif_plugging_timeout = \"x\"\n"),
            "events.vif_plugging_timeout"
        );
        assert_eq!(key_of("[events]\nbogus = 1\n"), "events.bogus");
        assert_eq!(
            key_of("[events]\nconfirm_active_timeout = 601\n"),
            "events.confirm_active_timeout"
        );
        assert_eq!(
            key_of("[instances]\novs_native_form = \"magic\"\n"),
            "instances.ovs_native_form"
        );
        assert_eq!(key_of("[network]\nkind = \"neutron\"\n"), "network.neutron");
        assert_eq!(
            key_of("[network]\nkind = \"embedded\"\n[network.neutron]\nurl = \"http://x\"\n"),
            "network.neutron"
        );
        assert_eq!(
            key_of("[network]\nkind = \"neutron\"\n[network.neutron]\nurl = \"ftp://x\"\n"),
            "network.neutron.url"
        );
        assert_eq!(
            key_of("[network]\nkind = \"neutron\"\n[network.neutron]\nurll = \"http://x\"\n"),
            "network.neutron.urll"
        );
        assert_eq!(key_of("[libvirt]\nworkers = 9\n"), "libvirt.workers");
        assert_eq!(key_of("[logging]\nlevel = \"loud\"\n"), "logging.level");
        assert_eq!(key_of("drain_timeout = 0\n"), "drain_timeout");
        assert_eq!(key_of("[bogus]\nx = 1\n"), "bogus");
        assert_eq!(
            key_of("[libvirt]\nuri = \"embedded\"\n[plugging]\ndatapath_type = \"netdev\"\n"),
            "plugging"
        );
        assert_eq!(
            key_of("[network]\nkind = \"neutron\"\n[network.neutron]\nurl = \"http://x\"\n[network.embedded]\n"),
            "network.embedded"
        );
        assert_eq!(
            key_of("[[network.embedded.networks]]\nid = \"x\"\nname = \"n\"\nmtu = \"big\"\n"),
            "network.embedded.networks.mtu"
        );
        assert_eq!(
            key_of("[instances]\ndomain_type = \"xen\"\n"),
            "instances.domain_type"
        );
        assert_eq!(
            key_of("listen = \"0.0.0.0:8774\"\naccept_noauth_events = true\n"),
            "accept_noauth_events"
        );
        assert_eq!(key_of("token_header = \"X Auth\"\n"), "token_header");
        assert_eq!(
            key_of("[instances]\nimage_dirs = [\"relative\"]\n"),
            "instances.image_dirs"
        );
    }

    #[test]
    fn half_timeout_defaults_from_the_event_timeout() {
        let d = parse("").unwrap();
        assert_eq!(d.half_timeout(), Duration::from_secs(960));
        let e = parse("[events]\nvif_plugging_timeout = 100\n").unwrap();
        assert_eq!(e.half_timeout(), Duration::from_secs(560));
        assert_eq!(
            parse("half_timeout = 60\n").unwrap().half_timeout(),
            Duration::from_secs(60)
        );
        assert_eq!(key_of("half_timeout = 0\n"), "half_timeout");
        assert_eq!(key_of("half_timeout = 200001\n"), "half_timeout");
    }

    #[test]
    fn retired_peer_sections_are_refused_naming_nova() {
        for text in [
            "[[peers]]\nname = \"h2\"\nurl = \"http://h2:8774\"\ntoken_file = \"/t\"\n",
            "[peering]\nforward_events = false\n",
            "[libvirt]\nmigration_uri = \"qemu+tcp://h1/system\"\n",
            "[libvirt]\nlive_migration_handover_retry = 30\n",
        ] {
            let e = parse(text).unwrap_err();
            let key = e.key().unwrap_or("<none>").to_owned();
            let last = key.rsplit('.').next().unwrap_or_default();
            assert!(text.contains(last), "{key}: {e}");
            let msg = e.to_string();
            assert!(
                msg.contains("retired") && msg.contains("vireo.VireoDriver"),
                "{msg}"
            );
        }
    }

    #[test]
    fn messages_are_one_line_and_name_file_and_key() {
        let e = parse("[events]\nvif_plugging_timeout = \"x\"\n").unwrap_err();
        let msg = e.to_string();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.starts_with("config /etc/vireo/agent.toml: `events.vif_plugging_timeout`: "));
        assert!(msg.contains("invalid type"), "{msg}");
        let e = parse("x = [").unwrap_err();
        assert!(
            matches!(e, ConfigError::Parse { line: Some(1), .. }),
            "{e:?}"
        );
    }
}
