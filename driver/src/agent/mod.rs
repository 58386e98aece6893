//! The compute agent (`vireo agent --config FILE`): an HTTP API over the virt driver, Nova's
//! external-events endpoint for Neutron, health and metrics, and an ordered shutdown.
//!
//! # Layout
//! - [`server`]: the HTTP layer (actix-web) and [`server::serve`], which takes its listener
//!   and shutdown signal as arguments.
//! - [`service`]: what the handlers do, without HTTP: validation, admission of long
//!   operations, background tasks, the events hand-over, shutdown.
//! - [`events`]: the external-events body rules and Nova's answer codes;
//!   [`microversion`]: the compute API versions that endpoint speaks.
//! - [`lifecycle`]: the lifecycle feed (guests' power changes as they happen, long-polled).
//! - [`ops`]: the operation registry (one operation per instance, bounded history).
//! - [`auth`]: token files and constant-time checks. [`paths`]: which host paths a request
//!   may name. [`metrics`]: the Prometheus registry. [`model`]: the wire format.
//! - [`view`]: converts the driver's types to the wire format.
//! - [`systemd`]: readiness and stop notifications, whether stderr is the journal.
//!
//! [`run`] is the binary's entry: load the config, check the token files, prepare the state
//! directory, bind, start the actors and the driver, serve until SIGTERM/SIGINT.

pub mod auth;
pub mod error;
pub mod events;
pub mod lifecycle;
pub mod metrics;
pub mod microversion;
pub mod model;
pub mod ops;
pub mod paths;
pub mod server;
pub mod service;
pub mod systemd;
pub mod view;

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use actix_web::http::header::HeaderName;
use std::time::Duration;

use tracing::{info, warn};
use tracing_subscriber::EnvFilter;

use crate::compute::{ComputeDriver, DriverError};
use crate::config::{AgentConfig, ConfigError, LogOutput};
use auth::{Auth, Token, TokenError};
use paths::PathPolicy;
use service::Settings;

/// Exit code: clean shutdown.
pub const EXIT_OK: u8 = 0;
/// Exit code: the agent failed while starting or running.
pub const EXIT_FAILURE: u8 = 1;
/// Exit code: the configuration (or a token file it names) is invalid.
pub const EXIT_CONFIG: u8 = 2;

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The config file is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A token file is unusable.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The state directory could not be prepared.
    #[error("instances.state_dir {}: cannot prepare the directory", path.display())]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The listen address could not be bound.
    #[error("listen {addr}: cannot bind")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The driver could not be loaded.
    #[error("driver.name {name:?}: cannot load the driver")]
    Driver {
        /// The configured name.
        name: String,
        /// Why (boxed: the driver's error is large).
        #[source]
        source: Box<DriverError>,
    },
    /// The runtime could not be built.
    #[error("cannot start the runtime")]
    Runtime(#[source] io::Error),
    /// The server failed.
    #[error("the HTTP server failed")]
    Serve(#[source] server::ServeError),
}

impl StartError {
    /// The exit code for this error: 2 for configuration and token files, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Config(_) | StartError::Token(_) => EXIT_CONFIG,
            _ => EXIT_FAILURE,
        }
    }
}

impl Settings {
    /// Settings from a validated config: loads the token files (refusing group/world-
    /// accessible ones), creates `<state_dir>/instances` (mode 0700) and resolves the image
    /// directories.
    pub fn from_config(cfg: &AgentConfig) -> Result<Settings, StartError> {
        let api = Token::load("api_token_file", &cfg.api_token_file)?;
        let events = cfg
            .events_token_file
            .as_deref()
            .map(|p| Token::load("events_token_file", p))
            .transpose()?;
        let metrics = cfg
            .metrics_token_file
            .as_deref()
            .map(|p| Token::load("metrics_token_file", p))
            .transpose()?;
        let header = HeaderName::from_bytes(cfg.token_header.as_bytes()).map_err(|_| {
            ConfigError::Invalid {
                path: PathBuf::new(),
                key: "token_header",
                reason: "not an HTTP header name".into(),
            }
        })?;
        let instances = cfg.instances_dir();
        make_private_dir(&cfg.instances.state_dir)?;
        make_private_dir(&instances)?;
        let paths = PathPolicy::new(&instances, &cfg.instances.image_dirs).map_err(|source| {
            StartError::StateDir {
                path: instances.clone(),
                source,
            }
        })?;
        Ok(Settings {
            host: cfg.host_name(),
            auth: Auth::new(header, api, events, cfg.accept_noauth_events)
                .with_metrics_token(metrics),
            paths,
            max_body_bytes: cfg.max_body_bytes,
            finished_operations: cfg.finished_operations,
            drain_timeout: cfg.drain_timeout(),
            http_workers: cfg.http_workers,
            half_timeout: cfg.half_timeout(),
        })
    }
}

fn make_private_dir(path: &Path) -> Result<(), StartError> {
    let err = |source| StartError::StateDir {
        path: path.to_owned(),
        source,
    };
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "exists and is not a directory",
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::DirBuilder::new()
            .recursive(true)
            // Traversable, not listable: QEMU (another user under qemu:///system) opens
            // the disks and bases below it by path.
            .mode(0o711)
            .create(path)
            // The mode asked for, whatever the umask.
            .and_then(|()| fs::set_permissions(path, fs::Permissions::from_mode(0o711)))
            .map_err(err),
        Err(e) => Err(err(e)),
    }
}

/// An empty node for libvirt's test driver, written when the embedded URI's file is missing.
pub const EMPTY_TEST_NODE: &str = "<node/>\n";

/// Create the test-driver node file when the config asks for the embedded default
/// (`[libvirt] uri = "embedded"`).
pub fn prepare_default_libvirt(cfg: &AgentConfig) -> Result<(), StartError> {
    if !cfg.uses_embedded_libvirt() {
        return Ok(());
    }
    let node = cfg.default_test_node();
    if node.exists() {
        return Ok(());
    }
    fs::write(&node, EMPTY_TEST_NODE)
        .and_then(|()| fs::set_permissions(&node, fs::Permissions::from_mode(0o600)))
        .map_err(|source| StartError::StateDir { path: node, source })
}

/// Load the virt driver named in `[driver] name` with the configuration derived from the
/// file (see [`AgentConfig::driver_config`]): it opens libvirt, starts its actors, the
/// network service and the plugger, and recovers the instances libvirt has.
pub async fn load_driver(cfg: &AgentConfig) -> Result<Arc<dyn ComputeDriver>, StartError> {
    let driver = crate::compute::load_driver(&cfg.driver.name, &cfg.driver_config())
        .await
        .map_err(|source| StartError::Driver {
            name: cfg.driver.name.clone(),
            source: Box::new(source),
        })?;
    Ok(Arc::from(driver))
}

/// Install the tracing subscriber from `[logging]` (`RUST_LOG` overrides the level): journald
/// or stderr (see [`crate::config::LogOutput`]).
pub fn init_logging(cfg: &AgentConfig) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = || {
        EnvFilter::try_from_default_env().unwrap_or_else(|_| {
            EnvFilter::new(format!(
                "vireo={0},vireo_actors={0},warn",
                cfg.logging.level
            ))
        })
    };
    let journald = match cfg.logging.output {
        LogOutput::Stderr => None,
        LogOutput::Journald => Some(tracing_journald::layer()),
        LogOutput::Auto => systemd::stderr_is_journal().then(tracing_journald::layer),
    };
    let journald_error = match journald {
        Some(Ok(layer)) => {
            let layer = layer.with_syslog_identifier("vireo".to_owned());
            // Already installed (tests, a host process): keep the existing one.
            let _ = tracing_subscriber::registry()
                .with(filter())
                .with(layer)
                .try_init();
            return;
        }
        Some(Err(e)) => Some(e),
        None => None,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_ansi(std::io::IsTerminal::is_terminal(&io::stderr()))
        .with_writer(io::stderr);
    let _ = if cfg.logging.json {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    } else {
        builder.try_init()
    };
    if let Some(e) = journald_error {
        warn!(error = %e, "journald cannot be reached: logging to stderr");
    }
}

/// A future resolving at SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => info!("SIGTERM received"),
                _ = int.recv() => info!("SIGINT received"),
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Check everything the agent needs before it binds: config, token files, state directory.
pub fn prepare(config_path: &Path) -> Result<(AgentConfig, Settings), StartError> {
    let cfg = AgentConfig::load(config_path)?;
    let settings = Settings::from_config(&cfg)?;
    prepare_default_libvirt(&cfg)?;
    Ok((cfg, settings))
}

/// Every `every`, remove the cached bases no instance uses (the task ends with the agent's
/// runtime).
async fn evict_unused_images(driver: Arc<dyn ComputeDriver>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: the first pass waits one period, as after a start the
    // instances are still being recovered.
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = driver.evict_unused_images().await {
            warn!(error = %e, "removing unused base images failed; tried again next period");
        }
    }
}

/// `vireo agent --config FILE`: run until SIGTERM/SIGINT. Returns the exit code; errors are
/// written to `stderr` as one line.
pub fn run(config_path: &Path, stderr: &mut dyn io::Write) -> u8 {
    match run_inner(config_path) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(": ");
                msg.push_str(&s.to_string());
                src = s.source();
            }
            let _ = writeln!(stderr, "vireo agent: {msg}");
            e.exit_code()
        }
    }
}

fn run_inner(config_path: &Path) -> Result<(), StartError> {
    let (cfg, settings) = prepare(config_path)?;
    init_logging(&cfg);
    let listener = std::net::TcpListener::bind(cfg.listen).map_err(|source| StartError::Bind {
        addr: cfg.listen,
        source,
    })?;
    let system = actix_rt::System::new();
    system.block_on(async move {
        systemd::status("loading the driver and recovering this host's instances");
        let driver = load_driver(&cfg).await?;
        info!(driver = driver.name(), host = %settings.host, uri = %cfg.libvirt_uri(),
              network = %cfg.network.kind, "agent starting");
        if cfg.instances.image_cache_interval > 0 {
            let every = Duration::from_secs(cfg.instances.image_cache_interval);
            actix_rt::spawn(evict_unused_images(driver.clone(), every));
        }
        let svc = service::AgentService::new(driver, settings);
        server::serve(listener, shutdown_signal(), svc)
            .await
            .map_err(StartError::Serve)
    })
}
