//! The agent's service: everything the HTTP handlers do, without HTTP.
//!
//! This module owns request validation (flavors, paths, network_info), admission of long
//! operations (one per instance, checked against the lifecycle before the driver is called:
//! 404 for an unknown instance, 409 when busy or illegal in its state), the background tasks
//! that hold the driver futures, the external-events hand-over, the metrics scrape and the
//! ordered shutdown.
//!
//! Shutdown order ([`AgentService::shutdown`], all within one deadline): the HTTP server has
//! already stopped accepting; new operations are refused; the NetworkEventActor is shut down,
//! which fails every wait at once (no external event can arrive once the endpoint is closed,
//! so waiting for one would only delay the rollback until its timeout); the driver is asked to
//! finish or roll back its in-flight operations by the deadline; the agent waits for its
//! operation tasks until the deadline; whatever still runs then is aborted and recorded as
//! failed with code `shutdown`.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::HeaderMap;
use futures::FutureExt;
use serde_json::Value;
use tokio::time::Instant;
use tracing::{info, info_span, warn, Instrument};
use uuid::Uuid;
use vireo_actors::events::EventsHandle;
use vireo_actors::libvirt::LibvirtHandle;
use vireo_actors::lifecycle::{accepts, InstanceState, Request};
use vireo_actors::vif::{NetworkInfo, PortId, Vif};

use super::auth::{Auth, Scope};
use super::error::ApiError;
use super::events::{self, InstanceDirectory};
use super::metrics::{LibvirtStatus, Metrics, Snapshot};
use super::model::{
    Action, CreateInstance, ErrorDetail, EventsAnswer, Health, Instance, OpKind, Operation,
};
use super::ops::Operations;
use super::paths::PathPolicy;
use super::provisional::{
    BootImage, ComputeDriver, Flavor, LiveMigrateArgs, Migration, OpReport, RebootKind, SpawnArgs,
};
use super::view;

/// Reads the libvirt connection's status at scrape time.
pub type LibvirtProbe = Arc<dyn Fn() -> LibvirtStatus + Send + Sync>;

/// A probe on a libvirt handle: reconnects = highest connection generation seen - 1.
pub fn libvirt_probe(handle: LibvirtHandle) -> LibvirtProbe {
    let highest = AtomicU64::new(0);
    Arc::new(move || {
        let generation = handle.generation();
        if let Some(g) = generation {
            highest.fetch_max(g, Ordering::Relaxed);
        }
        LibvirtStatus {
            reconnects: highest.load(Ordering::Relaxed).saturating_sub(1),
            connected: generation.is_some(),
        }
    })
}

/// What the agent drives: built by `load_driver` in the binary, by fakes in tests.
#[derive(Clone)]
pub struct AgentParts {
    /// The virt driver.
    pub driver: Arc<dyn ComputeDriver>,
    /// The NetworkEventActor external events are delivered to.
    pub events: EventsHandle,
    /// Which instances are on this host (404 vs 200 for events).
    pub directory: Arc<dyn InstanceDirectory>,
    /// The libvirt connection's status, when the driver exposes its handle.
    pub libvirt: Option<LibvirtProbe>,
}

impl std::fmt::Debug for AgentParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentParts")
            .field("driver", &self.driver)
            .field("events", &self.events)
            .field("directory", &self.directory)
            .field("libvirt", &self.libvirt.is_some())
            .finish()
    }
}

/// The agent's settings, from the config file (see `Settings::from_config` in `agent`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// This host's name.
    pub host: String,
    /// Accepted tokens.
    pub auth: Auth,
    /// Allowed paths.
    pub paths: PathPolicy,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Most events per POST.
    pub max_events: usize,
    /// Finished operations kept.
    pub finished_operations: usize,
    /// Bound on the whole shutdown.
    pub shutdown_timeout: Duration,
    /// HTTP worker threads.
    pub http_workers: usize,
}

/// The driver call of one operation, with validated arguments.
#[derive(Debug)]
enum Call {
    Spawn(Box<SpawnArgs>),
    Destroy,
    PowerOn,
    PowerOff,
    Reboot(RebootKind),
    Pause,
    Unpause,
    Suspend,
    Resume,
    Resize(Migration, Flavor),
    ConfirmResize,
    RevertResize,
    LiveMigrate(LiveMigrateArgs),
    Attach(Box<Vif>),
    Detach(PortId),
}

impl Call {
    async fn run(
        self,
        d: &dyn ComputeDriver,
        uuid: Uuid,
    ) -> Result<OpReport, super::provisional::InstanceError> {
        match self {
            Call::Spawn(args) => d.spawn(uuid, *args).await,
            Call::Destroy => d.destroy(uuid).await,
            Call::PowerOn => d.power_on(uuid).await,
            Call::PowerOff => d.power_off(uuid).await,
            Call::Reboot(kind) => d.reboot(uuid, kind).await,
            Call::Pause => d.pause(uuid).await,
            Call::Unpause => d.unpause(uuid).await,
            Call::Suspend => d.suspend(uuid).await,
            Call::Resume => d.resume(uuid).await,
            Call::Resize(m, f) => d.resize(uuid, m, f).await,
            Call::ConfirmResize => d.confirm_resize(uuid).await,
            Call::RevertResize => d.revert_resize(uuid).await,
            Call::LiveMigrate(args) => d.live_migrate(uuid, args).await,
            Call::Attach(vif) => d.attach_interface(uuid, *vif).await,
            Call::Detach(port) => d.detach_interface(uuid, port).await,
        }
    }
}

/// Whether the lifecycle allows `kind` in `state` (the driver has the final word; this check
/// lets the API answer 409 at once instead of failing the operation later).
pub fn allowed(kind: OpKind, state: InstanceState) -> bool {
    use InstanceState as S;
    let req = |r: Request| accepts(state, r);
    match kind {
        OpKind::Create => matches!(state, S::Absent | S::Gone),
        OpKind::Delete => req(Request::Destroy),
        OpKind::PowerOn => req(Request::PowerOn),
        OpKind::PowerOff => req(Request::PowerOff),
        OpKind::RebootSoft => req(Request::RebootSoft),
        OpKind::RebootHard => req(Request::RebootHard),
        OpKind::Pause => req(Request::Pause),
        OpKind::Unpause => req(Request::Unpause),
        OpKind::Suspend => req(Request::Suspend),
        OpKind::Resume => req(Request::Resume),
        OpKind::Resize => req(Request::ResizeOut),
        OpKind::ConfirmResize => req(Request::ConfirmResize) || state == S::ResizeTarget,
        OpKind::RevertResize => {
            req(Request::FinishRevertResize) || req(Request::RevertResizeTarget)
        }
        OpKind::LiveMigrate => req(Request::LiveMigrate),
        OpKind::AttachInterface => req(Request::AttachInterface),
        OpKind::DetachInterface => req(Request::DetachInterface),
    }
}

/// Largest vCPU count accepted in a flavor.
pub const MAX_VCPUS: u32 = 1_024;
/// Smallest memory accepted in a flavor, MiB.
pub const MIN_MEMORY_MIB: u64 = 16;

fn check_flavor(f: &Flavor) -> Result<(), ApiError> {
    if f.name.is_empty() || f.name.len() > 255 || f.name.chars().any(char::is_control) {
        return Err(ApiError::Invalid(format!(
            "flavor.name: {:?} is not a valid name",
            f.name
        )));
    }
    if f.vcpus == 0 || f.vcpus > MAX_VCPUS {
        return Err(ApiError::Invalid(format!(
            "flavor.vcpus: {} is not in 1..={MAX_VCPUS}",
            f.vcpus
        )));
    }
    if f.memory_mib < MIN_MEMORY_MIB || f.memory_mib > (1 << 24) {
        return Err(ApiError::Invalid(format!(
            "flavor.memory_mib: {} is not in {MIN_MEMORY_MIB}..={}",
            f.memory_mib,
            1u64 << 24
        )));
    }
    Ok(())
}

fn check_host(key: &str, h: &str) -> Result<(), ApiError> {
    if h.is_empty() || h.len() > 255 || !h.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::Invalid(format!(
            "{key}: {h:?} is not a host name"
        )));
    }
    Ok(())
}

/// The agent's state, shared by the HTTP workers and the operation tasks.
pub struct AgentService {
    parts: AgentParts,
    settings: Settings,
    ops: Operations,
    metrics: Metrics,
    spawner: tokio::runtime::Handle,
}

impl std::fmt::Debug for AgentService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentService")
            .field("host", &self.settings.host)
            .field("driver", &self.parts.driver.name())
            .field("running", &self.ops.running_count())
            .finish()
    }
}

impl AgentService {
    /// A service on the current tokio runtime: operation tasks run there, so it must outlive
    /// the HTTP workers (the agent's main runtime).
    pub fn new(parts: AgentParts, settings: Settings) -> Arc<AgentService> {
        Arc::new(AgentService {
            ops: Operations::new(settings.finished_operations),
            metrics: Metrics::new(),
            spawner: tokio::runtime::Handle::current(),
            parts,
            settings,
        })
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The operation registry.
    pub fn operations(&self) -> &Operations {
        &self.ops
    }

    /// The parts.
    pub fn parts(&self) -> &AgentParts {
        &self.parts
    }

    /// Check a request's token for `scope`; a refusal is counted and logged (without the
    /// token).
    pub fn authorize(&self, headers: &HeaderMap, scope: Scope, path: &str) -> Result<(), ApiError> {
        if self.settings.auth.allows(headers, scope) {
            return Ok(());
        }
        self.metrics.auth_failures.inc(&[scope.as_str()]);
        warn!(
            path,
            scope = scope.as_str(),
            token_present = headers.contains_key(self.settings.auth.header()),
            "request refused: missing or invalid token"
        );
        Err(ApiError::Unauthorized)
    }

    fn rejected(&self, kind: OpKind) {
        self.metrics.operations.inc(&[kind.as_str(), "rejected"]);
    }

    /// `POST /v1/instances`.
    pub async fn create(self: &Arc<Self>, req: CreateInstance) -> Result<Operation, ApiError> {
        let kind = OpKind::Create;
        let (uuid, call) = match self.prepare_create(req) {
            Ok(c) => c,
            Err(e) => {
                self.rejected(kind);
                return Err(e);
            }
        };
        self.start(uuid, kind, call).await
    }

    fn prepare_create(&self, req: CreateInstance) -> Result<(Uuid, Call), ApiError> {
        let uuid = req.uuid.unwrap_or_else(Uuid::new_v4);
        if uuid.is_nil() {
            return Err(ApiError::Invalid(
                "uuid: the nil UUID is not allowed".into(),
            ));
        }
        let name = req.name.unwrap_or_else(|| format!("instance-{uuid}"));
        if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
            return Err(ApiError::Invalid(format!(
                "name: {name:?} is not a valid name"
            )));
        }
        check_flavor(&req.flavor)?;
        let p = &self.settings.paths;
        let image = |what, path: &Option<std::path::PathBuf>| {
            path.as_deref()
                .map(|x| p.image(what, x))
                .transpose()
                .map_err(ApiError::Path)
        };
        let boot = BootImage {
            kernel: image("kernel", &req.image.kernel)?,
            initrd: image("initrd", &req.image.initrd)?,
            disk: image("disk", &req.image.disk)?,
            cmdline: req.image.cmdline,
        };
        if boot.kernel.is_none() && (boot.initrd.is_some() || boot.cmdline.is_some()) {
            return Err(ApiError::Invalid(
                "image: initrd and cmdline need a kernel".into(),
            ));
        }
        if let Some(c) = &boot.cmdline {
            if c.len() > 4096 || c.chars().any(char::is_control) {
                return Err(ApiError::Invalid(
                    "image.cmdline: longer than 4096 bytes or holds control characters".into(),
                ));
            }
        }
        let network_info = NetworkInfo::from_value(&req.network_info)
            .map_err(|e| ApiError::Invalid(format!("network_info: {e}")))?;
        let console_log = p
            .console_log(uuid, req.console_log.as_deref())
            .map_err(ApiError::Path)?;
        let args = SpawnArgs {
            name,
            flavor: req.flavor,
            image: boot,
            network_info,
            console_log,
        };
        Ok((uuid, Call::Spawn(Box::new(args))))
    }

    /// `DELETE /v1/instances/{uuid}`.
    pub async fn delete(self: &Arc<Self>, uuid: Uuid) -> Result<Operation, ApiError> {
        self.start(uuid, OpKind::Delete, Call::Destroy).await
    }

    /// `POST /v1/instances/{uuid}/action`.
    pub async fn action(
        self: &Arc<Self>,
        uuid: Uuid,
        action: Action,
    ) -> Result<Operation, ApiError> {
        let kind = action.kind();
        let call = match self.prepare_action(action) {
            Ok(c) => c,
            Err(e) => {
                self.rejected(kind);
                return Err(e);
            }
        };
        self.start(uuid, kind, call).await
    }

    fn prepare_action(&self, action: Action) -> Result<Call, ApiError> {
        Ok(match action {
            Action::PowerOn => Call::PowerOn,
            Action::PowerOff => Call::PowerOff,
            Action::RebootSoft => Call::Reboot(RebootKind::Soft),
            Action::RebootHard => Call::Reboot(RebootKind::Hard),
            Action::Pause => Call::Pause,
            Action::Unpause => Call::Unpause,
            Action::Suspend => Call::Suspend,
            Action::Resume => Call::Resume,
            Action::Resize { flavor, dest_host } => {
                check_flavor(&flavor)?;
                let dest_host = dest_host.unwrap_or_else(|| self.settings.host.clone());
                check_host("dest_host", &dest_host)?;
                Call::Resize(
                    Migration {
                        id: Uuid::new_v4(),
                        source_host: self.settings.host.clone(),
                        dest_host,
                    },
                    flavor,
                )
            }
            Action::ConfirmResize => Call::ConfirmResize,
            Action::RevertResize => Call::RevertResize,
            Action::LiveMigrate {
                dest_host,
                dest_uri,
                block_migration,
            } => {
                check_host("dest_host", &dest_host)?;
                if dest_host == self.settings.host {
                    return Err(ApiError::Invalid(format!(
                        "dest_host: {dest_host:?} is this host"
                    )));
                }
                if let Some(u) = &dest_uri {
                    if u.is_empty() || u.contains(char::is_whitespace) || !u.contains("://") {
                        return Err(ApiError::Invalid(format!(
                            "dest_uri: {u:?} is not a libvirt URI"
                        )));
                    }
                }
                Call::LiveMigrate(LiveMigrateArgs {
                    dest_host,
                    dest_uri,
                    block_migration,
                })
            }
            Action::AttachInterface { vif } => Call::Attach(Box::new(
                Vif::from_value(0, &vif).map_err(|e| ApiError::Invalid(format!("vif: {e}")))?,
            )),
            Action::DetachInterface { port_id } => Call::Detach(
                port_id
                    .parse::<PortId>()
                    .map_err(|e| ApiError::Invalid(format!("port_id: {e}")))?,
            ),
        })
    }

    /// Admit, check against the instance's state, and start the background task.
    async fn start(
        self: &Arc<Self>,
        uuid: Uuid,
        kind: OpKind,
        call: Call,
    ) -> Result<Operation, ApiError> {
        let op = match self.ops.admit(uuid, kind) {
            Ok(op) => op,
            Err(e) => {
                self.rejected(kind);
                return Err(e);
            }
        };
        if let Err(e) = self.precheck(uuid, kind).await {
            self.ops.withdraw(op.id);
            self.rejected(kind);
            info!(instance = %uuid, kind = kind.as_str(), code = e.code(), "operation refused");
            return Err(e);
        }
        if kind == OpKind::Create {
            // Its events may start coming as soon as the ports are bound.
            self.parts.directory.admitted(uuid);
        }
        self.metrics.ops_in_flight.fetch_add(1, Ordering::Relaxed);
        let span = info_span!("operation", instance = %uuid, op = %op.id, kind = kind.as_str());
        let svc = Arc::clone(self);
        let started = op.clone();
        let task = self
            .spawner
            .spawn(async move { svc.run(started, call).await }.instrument(span));
        self.ops.attach(op.id, task.abort_handle());
        info!(instance = %uuid, op = %op.id, kind = kind.as_str(), "operation accepted");
        Ok(op)
    }

    async fn precheck(&self, uuid: Uuid, kind: OpKind) -> Result<(), ApiError> {
        match self.parts.driver.show(uuid).await {
            Ok(v) if kind == OpKind::Create => {
                if allowed(kind, v.state) {
                    Ok(())
                } else {
                    Err(ApiError::Exists(uuid))
                }
            }
            Ok(v) => {
                if v.operation.is_some() && kind != OpKind::Delete {
                    return Err(ApiError::Driver(super::provisional::InstanceError::Busy(
                        uuid,
                    )));
                }
                if allowed(kind, v.state) {
                    Ok(())
                } else {
                    Err(ApiError::IllegalState {
                        kind,
                        state: v.state.as_str().to_owned(),
                    })
                }
            }
            Err(super::provisional::InstanceError::NotFound(_)) if kind == OpKind::Create => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn run(self: Arc<Self>, op: Operation, call: Call) {
        let t0 = Instant::now();
        info!(instance = %op.instance, "operation started");
        let driver = Arc::clone(&self.parts.driver);
        let outcome: Result<Value, ErrorDetail> =
            match AssertUnwindSafe(call.run(&*driver, op.instance))
                .catch_unwind()
                .await
            {
                Ok(Ok(report)) => Ok(view::report(&report)),
                Ok(Err(e)) => Err(view::error(&e)),
                Err(_) => Err(ErrorDetail {
                    code: "internal".into(),
                    message: "the driver panicked".into(),
                }),
            };
        let dir = &self.parts.directory;
        match (op.kind, outcome.is_ok()) {
            (OpKind::Create, false) => dir.departed(op.instance, false),
            (OpKind::Delete, true) => dir.departed(op.instance, false),
            (OpKind::LiveMigrate, true) => dir.departed(op.instance, true),
            _ => {}
        }
        if let Some(done) = self.ops.finish(op.id, outcome) {
            let result = done.state.as_str();
            self.finished(op.kind, result, t0.elapsed());
            match &done.error {
                None => info!(instance = %op.instance, op = %op.id,
                              ms = t0.elapsed().as_millis() as u64, "operation succeeded"),
                Some(e) => warn!(instance = %op.instance, op = %op.id, code = %e.code,
                                 error = %e.message, "operation failed"),
            }
        }
    }

    fn finished(&self, kind: OpKind, result: &str, took: Duration) {
        self.metrics.ops_in_flight.fetch_sub(1, Ordering::Relaxed);
        self.metrics.operations.inc(&[kind.as_str(), result]);
        self.metrics
            .op_duration
            .observe(&[kind.as_str(), result], took);
    }

    /// `GET /v1/instances/{uuid}`.
    pub async fn show(&self, uuid: Uuid) -> Result<Instance, ApiError> {
        let v = self.parts.driver.show(uuid).await?;
        let op = self.ops.running_for(uuid);
        Ok(view::instance(&v, op.as_ref()))
    }

    /// `GET /v1/instances`.
    pub async fn list(&self) -> Vec<Instance> {
        let mut all: Vec<Instance> = self
            .parts
            .driver
            .list()
            .await
            .iter()
            .map(|v| view::instance(v, self.ops.running_for(v.uuid).as_ref()))
            .collect();
        all.sort_by_key(|i| i.uuid);
        all
    }

    /// `POST /os-server-external-events`: validate, answer per event, hand the accepted ones
    /// to the events actor as one batch. Returns the HTTP status (200 or 207) and the body;
    /// [`ApiError::NoEventAccepted`] (404) when no event was accepted.
    pub fn external_events(&self, body: &[u8]) -> Result<(u16, EventsAnswer), ApiError> {
        let outcome = events::process(body, &*self.parts.directory, self.settings.max_events)?;
        let mut counts = [0u64; 4];
        for e in &outcome.answer.events {
            counts[code_slot(e.code)] += 1;
        }
        for (slot, n) in counts.iter().enumerate() {
            if *n > 0 {
                self.metrics.events_received.add(&[CODES[slot]], *n);
            }
        }
        let status = outcome.status();
        if outcome.accepted.is_empty() {
            return Err(ApiError::NoEventAccepted);
        }
        self.parts.events.deliver_batch(outcome.accepted);
        self.metrics.event_batches.inc(&[]);
        Ok((status, outcome.answer))
    }

    /// `GET /metrics`.
    pub async fn metrics_text(&self) -> String {
        let events = tokio::time::timeout(Duration::from_secs(1), self.parts.events.stats())
            .await
            .ok()
            .and_then(Result::ok);
        let snap = Snapshot {
            events,
            libvirt: self.parts.libvirt.as_ref().map(|p| p()),
            instances: self.parts.directory.count().map(|n| n as u64),
        };
        self.metrics.render(&snap)
    }

    /// `GET /healthz`: ok, or shutting down.
    pub fn health(&self) -> Health {
        Health {
            status: if self.ops.is_closed() {
                "shutting-down"
            } else {
                "ok"
            }
            .to_owned(),
            host: self.settings.host.clone(),
            driver: self.parts.driver.name().to_owned(),
        }
    }

    /// The ordered shutdown (see the module docs), bounded by `deadline`.
    pub async fn shutdown(&self, deadline: Instant) {
        self.ops.close();
        info!(
            running = self.ops.running_count(),
            "shutting down: failing event waits, asking the driver to finish"
        );
        let _ = tokio::time::timeout_at(deadline, self.parts.events.shutdown()).await;
        let _ = tokio::time::timeout_at(deadline, self.parts.driver.shutdown(deadline)).await;
        if self.ops.drain(deadline).await {
            info!("every operation finished");
            return;
        }
        let error = ErrorDetail {
            code: "shutdown".into(),
            message: "aborted at shutdown: not finished within shutdown_timeout".into(),
        };
        for op in self.ops.abort_all(&error) {
            self.finished(op.kind, "failed", Duration::ZERO);
            warn!(instance = %op.instance, op = %op.id, kind = op.kind.as_str(),
                  "operation aborted at shutdown");
        }
    }
}

const CODES: [&str; 4] = ["200", "400", "404", "422"];

fn code_slot(code: u16) -> usize {
    match code {
        200 => 0,
        400 => 1,
        404 => 2,
        _ => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_precheck_follows_accepts() {
        use InstanceState as S;
        assert!(allowed(OpKind::Pause, S::Running));
        assert!(!allowed(OpKind::Pause, S::Stopped));
        assert!(allowed(OpKind::PowerOn, S::Stopped));
        assert!(!allowed(OpKind::PowerOn, S::Running));
        assert!(allowed(OpKind::Delete, S::Building));
        assert!(allowed(OpKind::ConfirmResize, S::ResizeSource));
        assert!(allowed(OpKind::ConfirmResize, S::ResizeTarget));
        assert!(!allowed(OpKind::ConfirmResize, S::Running));
        assert!(allowed(OpKind::RevertResize, S::ResizeTarget));
        assert!(allowed(OpKind::RevertResize, S::ResizeSource));
        assert!(allowed(OpKind::Create, S::Absent));
        assert!(!allowed(OpKind::Create, S::Running));
        for k in OpKind::ALL {
            if k != OpKind::Delete && k != OpKind::Create {
                assert!(!allowed(k, S::Gone), "{k:?} on a gone instance");
            }
        }
    }

    #[test]
    fn flavors_are_checked() {
        let f = |vcpus, memory_mib| Flavor {
            name: "m1".into(),
            vcpus,
            memory_mib,
            root_gb: 0,
            extra_specs: Default::default(),
        };
        assert!(check_flavor(&f(1, 64)).is_ok());
        assert!(check_flavor(&f(0, 64)).is_err());
        assert!(check_flavor(&f(1, 8)).is_err());
        assert!(check_flavor(&f(MAX_VCPUS + 1, 64)).is_err());
    }
}
