//! The agent's service: everything the HTTP handlers do, without HTTP.
//!
//! This module owns request validation (flavors, image paths, ports / network_info), admission
//! of long operations (one per instance, a delete may preempt; checked against the lifecycle
//! before the driver is called: 404 for an unknown instance, 409 when busy or illegal in its
//! state), the background tasks that hold the driver futures, the external-events hand-over
//! (which instances are here comes from the driver), the metrics scrape and the ordered
//! shutdown.
//!
//! Shutdown order ([`AgentService::shutdown`], within one deadline): the HTTP server has
//! already stopped accepting; new operations are refused; the driver is shut down with the
//! time left (its running operations' event waits fail, so they roll back now rather than at
//! their timeout — no external event can arrive once the endpoint is closed — and its actors
//! stop); the agent waits for its operation tasks until the deadline; whatever still runs
//! then is aborted and recorded as failed with code `shutdown`.

use std::collections::HashMap;
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
use vireo_actors::instance::{
    AdmissionError, Admitted, BootSource, DestroyArgs, InstanceReply, NetworkRequest, Operation,
    SpawnArgs, SpawnStorage, Ticket,
};
use vireo_actors::lifecycle::{Caller, Request};
use vireo_actors::network::PortRequest as DriverPortRequest;
use vireo_actors::storage::{Checksum, ConfigDrive, ImageFormat, ImageId, ImageRef, MAX_USER_DATA};
use vireo_actors::vif::{NetworkInfo, PortId};

use crate::storage::ImageSource;

use super::auth::{Auth, Scope};
use super::error::ApiError;
use super::events::{self, Departed, Placement};
use super::metrics::{LibvirtStatus, Metrics, Snapshot};
use super::microversion::ApiVersion;
use super::model::{
    CreateInstance, ErrorDetail, EventsAnswer, Flavor, HalfReply, Health, Instance, OpKind,
    OpStatus, PortRequest,
};
use super::ops::Operations;
use super::paths::PathPolicy;
use super::view;
use crate::compute::{ComputeDriver, ComputeOps};

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
    /// Finished operations kept.
    pub finished_operations: usize,
    /// Bound on the whole shutdown.
    pub drain_timeout: Duration,
    /// HTTP worker threads.
    pub http_workers: usize,
    /// Bound on one host half served here (`half_timeout`).
    pub half_timeout: Duration,
}

/// Largest vCPU count accepted in a flavor.
pub const MAX_VCPUS: u32 = 1_024;
/// Smallest memory accepted in a flavor, MiB.
pub const MIN_MEMORY_MB: u64 = 16;
/// Largest memory accepted in a flavor, MiB (16 TiB).
pub const MAX_MEMORY_MB: u64 = 1 << 24;

fn check_flavor(f: &Flavor) -> Result<(), ApiError> {
    check_flavor_values("flavor", &f.name, f.vcpus, f.memory_mb)?;
    for (key, gb) in [("root_gb", f.root_gb), ("ephemeral_gb", f.ephemeral_gb)] {
        if gb > MAX_DISK_GB {
            return Err(ApiError::Invalid(format!(
                "flavor.{key}: {gb} is more than {MAX_DISK_GB}"
            )));
        }
    }
    if f.swap_mb > MAX_SWAP_MB {
        return Err(ApiError::Invalid(format!(
            "flavor.swap_mb: {} is more than {MAX_SWAP_MB}",
            f.swap_mb
        )));
    }
    Ok(())
}

/// Largest root or ephemeral disk a flavor may ask for, in GiB (64 TiB).
const MAX_DISK_GB: u64 = 1 << 16;
/// Largest swap disk, in MiB (1 TiB).
const MAX_SWAP_MB: u64 = 1 << 20;

fn check_config_drive(d: &ConfigDrive) -> Result<(), ApiError> {
    if let Some(u) = &d.user_data {
        if u.len() > MAX_USER_DATA {
            return Err(ApiError::Invalid(format!(
                "config_drive.user_data: {} bytes, at most {MAX_USER_DATA}",
                u.len()
            )));
        }
    }
    let fields = d
        .public_keys
        .iter()
        .chain(d.meta.iter())
        .flat_map(|(k, v)| [k.as_str(), v.as_str()]);
    let names = d
        .hostname
        .iter()
        .chain(d.availability_zone.iter())
        .map(String::as_str);
    if d.public_keys.len() + d.meta.len() > 128 || fields.chain(names).any(|s| s.len() > 16_384) {
        return Err(ApiError::Invalid(
            "config_drive: at most 128 keys and metadata items, each at most 16 KiB".into(),
        ));
    }
    Ok(())
}

fn check_flavor_values(key: &str, name: &str, vcpus: u32, memory_mb: u64) -> Result<(), ApiError> {
    if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
        return Err(ApiError::Invalid(format!(
            "{key}.name: {name:?} is not a valid name"
        )));
    }
    if vcpus == 0 || vcpus > MAX_VCPUS {
        return Err(ApiError::Invalid(format!(
            "{key}.vcpus: {vcpus} is not in 1..={MAX_VCPUS}"
        )));
    }
    if !(MIN_MEMORY_MB..=MAX_MEMORY_MB).contains(&memory_mb) {
        return Err(ApiError::Invalid(format!(
            "{key}.memory_mb: {memory_mb} is not in {MIN_MEMORY_MB}..={MAX_MEMORY_MB}"
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

/// A libvirt domain name: 1..=255 characters, no `/`, no control characters.
fn check_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty()
        || name.len() > 255
        || name.contains('/')
        || name.chars().any(char::is_control)
    {
        return Err(ApiError::Invalid(format!(
            "name: {name:?} is not a valid domain name"
        )));
    }
    Ok(())
}

/// The agent's state, shared by the HTTP workers and the operation tasks.
pub struct AgentService {
    driver: Arc<dyn ComputeDriver>,
    settings: Settings,
    ops: Operations,
    metrics: Metrics,
    departed: Departed,
    highest_generation: AtomicU64,
    spawner: tokio::runtime::Handle,
    lifecycle: Arc<super::lifecycle::LifecycleFeed>,
}

impl std::fmt::Debug for AgentService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentService")
            .field("host", &self.settings.host)
            .field("driver", &self.driver.name())
            .field("running", &self.ops.running_count())
            .finish()
    }
}

/// Departed instances remembered for 422 answers.
pub const DEPARTED_REMEMBERED: usize = 4_096;

impl AgentService {
    /// A service on the current tokio runtime: operation tasks run there, so it must outlive
    /// the HTTP workers (the agent's main runtime).
    pub fn new(driver: Arc<dyn ComputeDriver>, settings: Settings) -> Arc<AgentService> {
        let lifecycle = super::lifecycle::LifecycleFeed::new();
        if let Some(stream) = driver.domain_events() {
            let (feed, driver) = (lifecycle.clone(), Arc::downgrade(&driver));
            tokio::spawn(async move { feed.follow(stream, driver).await });
        }
        Arc::new(AgentService {
            ops: Operations::new(settings.finished_operations),
            metrics: Metrics::new(),
            departed: Departed::new(DEPARTED_REMEMBERED),
            highest_generation: AtomicU64::new(0),
            spawner: tokio::runtime::Handle::current(),
            lifecycle,
            driver,
            settings,
        })
    }

    /// End the lifecycle feed's waits (at shutdown): every read answers at once.
    pub fn close_lifecycle(&self) {
        self.lifecycle.close();
    }

    /// `GET /v1/lifecycle-events`: the guests' power changes after `after`.
    pub async fn lifecycle(
        &self,
        after: Option<u64>,
        wait: Duration,
    ) -> super::lifecycle::LifecyclePage {
        self.lifecycle.after(after, wait).await
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

    /// The driver.
    pub fn driver(&self) -> &Arc<dyn ComputeDriver> {
        &self.driver
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
    pub async fn create(self: &Arc<Self>, req: CreateInstance) -> Result<OpStatus, ApiError> {
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

    fn boot_source(
        &self,
        image: super::model::ImageRequest,
    ) -> Result<(BootSource, SpawnStorage), ApiError> {
        let p = &self.settings.paths;
        let resolve = |what, path: &std::path::Path| -> Result<String, ApiError> {
            let real = p.image(what, path).map_err(ApiError::Path)?;
            real.to_str()
                .map(str::to_owned)
                .ok_or_else(|| ApiError::Invalid(format!("image.{what}: not UTF-8")))
        };
        if let Some(c) = &image.cmdline {
            if c.len() > 4096 || c.chars().any(char::is_control) {
                return Err(ApiError::Invalid(
                    "image.cmdline: longer than 4096 bytes or holds control characters".into(),
                ));
            }
        }
        let boot = match image.kernel {
            Some(kernel) => BootSource::Kernel {
                kernel: resolve("kernel", &kernel)?,
                initrd: image
                    .initrd
                    .as_deref()
                    .map(|i| resolve("initrd", i))
                    .transpose()?,
                cmdline: image.cmdline,
            },
            None => {
                if image.initrd.is_some() || image.cmdline.is_some() {
                    return Err(ApiError::Invalid(
                        "image: initrd and cmdline need a kernel".into(),
                    ));
                }
                BootSource::None
            }
        };
        let root = match (image.id, image.source) {
            (Some(id), Some(source)) => {
                let id =
                    ImageId::new(id).map_err(|e| ApiError::Invalid(format!("image.id: {e}")))?;
                let source = match ImageSource::parse(&source)
                    .map_err(|e| ApiError::Invalid(format!("image.source: {e}")))?
                {
                    // A file the agent reads for its caller: only inside an image directory.
                    ImageSource::File(path) => resolve("source", &path)?,
                    ImageSource::Http(_) => source,
                };
                let checksum = image
                    .checksum
                    .as_deref()
                    .map(Checksum::parse)
                    .transpose()
                    .map_err(|e| ApiError::Invalid(format!("image.{e}")))?;
                let format = match image.disk_format.as_deref() {
                    None | Some("raw") => ImageFormat::Raw,
                    Some("qcow2") => ImageFormat::Qcow2,
                    Some(other) => {
                        return Err(ApiError::Invalid(format!(
                            "image.disk_format: {other:?} is not raw or qcow2"
                        )))
                    }
                };
                Some(ImageRef {
                    id,
                    source,
                    checksum,
                    format,
                })
            }
            (None, None) => {
                if image.checksum.is_some() || image.disk_format.is_some() || image.token.is_some()
                {
                    return Err(ApiError::Invalid(
                        "image: checksum, disk_format and token need an id and a source".into(),
                    ));
                }
                None
            }
            _ => return Err(ApiError::Invalid("image: id and source go together".into())),
        };
        Ok((
            boot,
            SpawnStorage {
                image: root,
                image_token: image.token,
                config_drive: None,
            },
        ))
    }

    fn prepare_create(&self, req: CreateInstance) -> Result<(Uuid, Operation), ApiError> {
        let uuid = req.uuid.unwrap_or_else(Uuid::new_v4);
        if uuid.is_nil() {
            return Err(ApiError::Invalid(
                "uuid: the nil UUID is not allowed".into(),
            ));
        }
        let name = req.name.unwrap_or_else(|| format!("instance-{uuid}"));
        check_name(&name)?;
        check_flavor(&req.flavor)?;
        let (boot, mut storage) = self.boot_source(req.image)?;
        if let Some(drive) = req.config_drive {
            check_config_drive(&drive)?;
            storage.config_drive = Some(drive);
        }
        let network = match (req.ports, req.network_info) {
            (Some(_), Some(_)) => {
                return Err(ApiError::Invalid(
                    "give ports or network_info, not both".into(),
                ))
            }
            (Some(ports), None) => {
                let mut out = Vec::with_capacity(ports.len());
                for (i, p) in ports.into_iter().enumerate() {
                    out.push(match p {
                        PortRequest::Network { network_id } => {
                            if network_id.is_empty() {
                                return Err(ApiError::Invalid(format!(
                                    "ports[{i}].network_id: empty"
                                )));
                            }
                            DriverPortRequest::Network { network_id }
                        }
                        PortRequest::Port { port_id } => DriverPortRequest::Port {
                            port_id: port_id.parse::<PortId>().map_err(|e| {
                                ApiError::Invalid(format!("ports[{i}].port_id: {e}"))
                            })?,
                        },
                    });
                }
                NetworkRequest::Allocate(out)
            }
            (None, Some(ni)) => NetworkRequest::Allocated(
                NetworkInfo::from_value(&ni)
                    .map_err(|e| ApiError::Invalid(format!("network_info: {e}")))?,
            ),
            (None, None) => NetworkRequest::Allocated(NetworkInfo::default()),
        };
        let args = SpawnArgs {
            name,
            flavor: req.flavor,
            boot,
            storage,
            network,
            power_on: req.power_on,
        };
        Ok((uuid, Operation::Spawn(Box::new(args))))
    }

    /// `DELETE /v1/instances/{uuid}`: destroy, and release the networking unless
    /// `deallocate_network` is false.
    pub async fn delete(
        self: &Arc<Self>,
        uuid: Uuid,
        deallocate_network: bool,
    ) -> Result<OpStatus, ApiError> {
        let args = DestroyArgs { deallocate_network };
        self.start(uuid, OpKind::Delete, Operation::Destroy(args))
            .await
    }

    /// `POST /v1/instances/{uuid}/action`: an [`Operation`] as read from the body; only the
    /// ones an API caller may ask for (not one host's half of a move).
    pub async fn action(self: &Arc<Self>, uuid: Uuid, op: Operation) -> Result<OpStatus, ApiError> {
        let kind = OpKind::of(&op);
        if let Err(e) = self.check_action(&op) {
            self.rejected(kind);
            return Err(e);
        }
        self.start(uuid, kind, op).await
    }

    /// What serde cannot check of an action: the limits of flavors and timeouts, host names.
    fn check_action(&self, op: &Operation) -> Result<(), ApiError> {
        match op {
            op if op.kind().caller() != Caller::Api => Err(ApiError::Invalid(format!(
                "action: {} is not an action (it is one host's half of a move: POST \
                 /v1/instances/{{uuid}}/half)",
                op.kind()
            ))),
            Operation::PowerOff { timeout } if timeout.is_some_and(|t| t.as_secs() > 3_600) => {
                Err(ApiError::Invalid("timeout: more than 3600 seconds".into()))
            }
            Operation::Resize(args) => {
                check_flavor(&args.new_flavor)?;
                match &args.dest_host {
                    Some(h) if args.caller_finishes && *h == self.settings.host => {
                        Err(ApiError::Invalid(format!(
                            "dest_host: {h:?} is this host (caller_finishes hands the \
                             instance to another host)"
                        )))
                    }
                    Some(h) => check_host("dest_host", h),
                    None if args.caller_finishes => Err(ApiError::Invalid(
                        "caller_finishes: needs a dest_host".into(),
                    )),
                    None => Ok(()),
                }
            }
            Operation::LiveMigrate(args) => {
                check_host("dest_host", &args.dest_host)?;
                if args.dest_host == self.settings.host {
                    return Err(ApiError::Invalid(format!(
                        "dest_host: {:?} is this host",
                        args.dest_host
                    )));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Submit to the driver (the instance admits or refuses it: the one admission check),
    /// record the admitted operation and wait for its ticket in a background task.
    async fn start(
        self: &Arc<Self>,
        uuid: Uuid,
        kind: OpKind,
        op: Operation,
    ) -> Result<OpStatus, ApiError> {
        if self.ops.is_closed() {
            self.rejected(kind);
            return Err(ApiError::ShuttingDown);
        }
        let destroy = match &op {
            Operation::Destroy(args) => Some(*args),
            _ => None,
        };
        let submitted = match (self.driver.submit(uuid, op).await, destroy) {
            // A destroy that preempted a running operation can reach the instance's actor
            // just as that operation's rollback removes it; destroy is idempotent, so ask
            // once more.
            (Err(AdmissionError::Unavailable), Some(args)) => {
                self.driver.submit(uuid, Operation::Destroy(args)).await
            }
            (other, _) => other,
        };
        let ticket = match submitted {
            // Deleting what is not here: the API's answer is 404 (the driver's is done).
            Ok(t) if t.admitted() == Admitted::NothingHere && kind == OpKind::Delete => {
                Err(ApiError::InstanceNotFound(uuid))
            }
            Ok(t) => Ok(t),
            Err(e) => Err(self.refusal(uuid, kind, e)),
        };
        let ticket = match ticket {
            Ok(t) => t,
            Err(e) => {
                self.rejected(kind);
                info!(instance = %uuid, kind = kind.as_str(), code = e.code(), "operation refused");
                return Err(e);
            }
        };
        let op = self.ops.record(uuid, kind);
        if kind == OpKind::Create {
            self.departed.remove(&uuid);
        }
        self.metrics.ops_in_flight.fetch_add(1, Ordering::Relaxed);
        let span = info_span!("operation", instance = %uuid, op = %op.id, kind = kind.as_str());
        let svc = Arc::clone(self);
        let started = op.clone();
        let task = self
            .spawner
            .spawn(async move { svc.run(started, ticket).await }.instrument(span));
        self.ops.attach(op.id, task.abort_handle());
        info!(instance = %uuid, op = %op.id, kind = kind.as_str(), "operation accepted");
        Ok(op)
    }

    /// The API's answer to a refused admission.
    fn refusal(&self, uuid: Uuid, kind: OpKind, e: AdmissionError) -> ApiError {
        match e {
            // Name the API operation that runs, when the API started it.
            AdmissionError::Busy { .. } => match self.ops.running_for(uuid) {
                Some(running) => ApiError::Busy {
                    instance: uuid,
                    op: running.id,
                    kind: running.kind,
                },
                None => ApiError::Refused(e),
            },
            AdmissionError::IllegalState { .. } if kind == OpKind::Create => ApiError::Exists(uuid),
            AdmissionError::IllegalState { state, .. } => ApiError::IllegalState {
                kind,
                state: state.as_str().to_owned(),
            },
            AdmissionError::NotFound(_) => ApiError::InstanceNotFound(uuid),
            AdmissionError::NotAttached { port } => ApiError::Invalid(format!(
                "port_id: port {port} is not attached to the instance"
            )),
            AdmissionError::Unavailable | AdmissionError::CrossHost { .. } => ApiError::Refused(e),
        }
    }

    async fn run(self: Arc<Self>, op: OpStatus, ticket: Ticket) {
        let t0 = Instant::now();
        info!(instance = %op.instance, "operation started");
        let outcome: Result<Value, ErrorDetail> =
            match AssertUnwindSafe(ticket.finished()).catch_unwind().await {
                Ok(Ok(InstanceReply::Done { report, .. })) => {
                    self.metrics.observe_waits(&report.waits);
                    Ok(view::report(&report))
                }
                Ok(Err(e)) => Err(view::error(&e)),
                Err(_) => Err(ErrorDetail {
                    code: "internal".into(),
                    message: "the driver panicked".into(),
                }),
            };
        if op.kind == OpKind::Action(Request::LiveMigrate) && outcome.is_ok() {
            self.departed.insert(op.instance);
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
        let v = self.driver.show(uuid).await?;
        let op = self.ops.running_for(uuid);
        Ok(view::instance(&v, op.as_ref()))
    }

    /// `GET /v1/instances/{uuid}/handover`.
    pub async fn handover(&self, uuid: Uuid) -> Result<vireo_actors::instance::Handover, ApiError> {
        self.driver
            .show(uuid)
            .await?
            .handover
            .ok_or(ApiError::InstanceNotFound(uuid))
    }

    /// `GET /v1/host`.
    pub async fn host_resources(&self) -> Result<crate::compute::HostResources, ApiError> {
        self.driver.host_resources().await.map_err(ApiError::Host)
    }

    /// `GET /v1/instances/{uuid}/console`: the last `max_bytes` of its serial console log.
    pub async fn console(&self, uuid: Uuid, max_bytes: u64) -> Result<String, ApiError> {
        Ok(self.driver.console_output(uuid, max_bytes).await?)
    }

    /// `GET /v1/instances`.
    pub async fn list(&self) -> Vec<Instance> {
        let mut all: Vec<Instance> = self
            .driver
            .list()
            .await
            .iter()
            .map(|v| view::instance(v, self.ops.running_for(v.uuid).as_ref()))
            .collect();
        all.sort_by_key(|i| i.uuid);
        all
    }

    /// `POST /v1/instances/{uuid}/half`: run one host's half of a move that Nova's compute
    /// manager orchestrates (finish a resize, clean up a confirmed one's source, finish a
    /// revert, the destination's parts of a live migration) and wait for it (at most
    /// `half_timeout`; the operation itself is not cut short then, only the answer).
    pub async fn host_half(&self, uuid: Uuid, req: Operation) -> Result<HalfReply, ApiError> {
        let kind = req.kind();
        let label = kind.as_str();
        if self.ops.is_closed() {
            self.metrics.host_halves.inc(&[label, "refused"]);
            return Err(ApiError::ShuttingDown);
        }
        let req = match self.check_host_half(req) {
            Ok(r) => r,
            Err(e) => {
                self.metrics.host_halves.inc(&[label, "refused"]);
                return Err(e);
            }
        };
        self.metrics
            .halves_in_flight
            .fetch_add(1, Ordering::Relaxed);
        let t0 = Instant::now();
        info!(instance = %uuid, request = label, "host half");
        let bound = self.settings.half_timeout;
        let r = tokio::time::timeout(bound, self.driver.complete(uuid, req)).await;
        self.metrics
            .halves_in_flight
            .fetch_sub(1, Ordering::Relaxed);
        let ms = t0.elapsed().as_millis() as u64;
        let (result, answer) = match r {
            Err(_) => (
                "timed-out",
                Err(ApiError::HalfTimeout {
                    secs: bound.as_secs(),
                }),
            ),
            Ok(Ok(InstanceReply::Done { state, report })) => (
                "succeeded",
                Ok(HalfReply {
                    state,
                    report: view::report_wire(&report),
                }),
            ),
            Ok(Err(e)) => ("failed", Err(ApiError::from(e))),
        };
        self.metrics.host_halves.inc(&[label, result]);
        match &answer {
            Ok(_) => info!(instance = %uuid, request = label, ms, "host half done"),
            Err(e) => warn!(instance = %uuid, request = label, ms, code = e.code(),
                            error = %e, "host half failed"),
        }
        answer
    }

    /// The same rules as a create for what a host half builds here: the domain name, the
    /// flavors, and the boot source's paths, which must resolve inside this host's
    /// `image_dirs` (they are replaced by the resolved paths). A rollback builds nothing:
    /// only its name is checked, so that it can always clean up.
    fn check_host_half(&self, mut req: Operation) -> Result<Operation, ApiError> {
        if req.kind().caller() != Caller::Orchestrator {
            return Err(ApiError::Invalid(format!(
                "action: {} is not one host's half of a move",
                req.kind()
            )));
        }
        let (handover, builds) = match &mut req {
            Operation::FinishResize { handover, .. }
            | Operation::PreLiveMigration { handover, .. } => (handover, true),
            Operation::RollbackLiveMigrationAtDestination { handover, .. } => (handover, false),
            _ => return Ok(req),
        };
        check_name(&handover.name)?;
        if !builds {
            return Ok(req);
        }
        for (key, f) in [
            ("handover.flavor", &handover.flavor),
            ("handover.old_flavor", &handover.old_flavor),
        ] {
            check_flavor_values(key, &f.name, f.vcpus, f.memory_mb)?;
        }
        let p = &self.settings.paths;
        let resolve = |what, path: &str| -> Result<String, ApiError> {
            let real = p
                .image(what, std::path::Path::new(path))
                .map_err(ApiError::Path)?;
            real.to_str()
                .map(str::to_owned)
                .ok_or_else(|| ApiError::Invalid(format!("handover.boot.{what}: not UTF-8")))
        };
        match &mut handover.boot {
            BootSource::None => {}
            BootSource::Kernel { kernel, initrd, .. } => {
                *kernel = resolve("kernel", kernel)?;
                if let Some(i) = initrd {
                    *i = resolve("initrd", i)?;
                }
            }
        }
        Ok(req)
    }

    /// Host halves being served now.
    pub fn host_halves_in_flight(&self) -> i64 {
        self.metrics.halves_in_flight.load(Ordering::Relaxed)
    }

    async fn placement(&self, uuid: Uuid) -> Placement {
        if self.driver.knows(uuid).await {
            Placement::OnHost
        } else if self.departed.contains(&uuid) {
            Placement::NotOnHost
        } else {
            Placement::Unknown
        }
    }

    /// `POST /os-server-external-events`: validate, ask the driver once per distinct
    /// instance whether it is here, answer per event and hand the accepted ones to the
    /// driver as one batch. `version` is the request's microversion (it decides which event
    /// names are valid). Returns the HTTP status (200 or 207) and the body. An event for an
    /// instance not here is answered 404 (422 when it left through this agent): Nova casts
    /// each event to its instance's host only, and its driver hands it to that host's
    /// agent.
    pub async fn external_events(
        &self,
        body: &[u8],
        version: ApiVersion,
    ) -> Result<(u16, EventsAnswer), ApiError> {
        let parsed = events::parse(body, version)?;
        let ids = parsed.instances();
        let found = futures::future::join_all(ids.iter().map(|u| self.placement(*u))).await;
        let placements: HashMap<Uuid, Placement> = ids.into_iter().zip(found).collect();
        let mut outcome = events::decide(parsed, &placements);
        let accepted = std::mem::take(&mut outcome.accepted);
        if !accepted.is_empty() {
            self.driver.external_events(accepted);
            self.metrics.event_batches.inc(&[]);
        }
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
        info!(
            events = outcome.answer.events.len(),
            accepted = counts[code_slot(200)],
            status,
            "external events"
        );
        Ok((status, outcome.answer))
    }

    /// `GET /metrics`.
    pub async fn metrics_text(&self) -> String {
        let events = tokio::time::timeout(Duration::from_secs(1), self.driver.event_stats())
            .await
            .ok()
            .flatten();
        let generation = self.driver.libvirt_generation();
        if let Some(g) = generation {
            self.highest_generation.fetch_max(g, Ordering::Relaxed);
        }
        let highest = self.highest_generation.load(Ordering::Relaxed);
        let libvirt = (highest > 0).then(|| LibvirtStatus {
            reconnects: highest.saturating_sub(1),
            connected: generation.is_some(),
        });
        let instances = tokio::time::timeout(Duration::from_secs(1), self.driver.list())
            .await
            .ok()
            .map(|l| l.len() as u64);
        self.metrics.render(&Snapshot {
            events,
            libvirt,
            instances,
        })
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
            driver: self.driver.name().to_owned(),
        }
    }

    /// The ordered shutdown (see the module docs), bounded by `deadline`.
    pub async fn shutdown(&self, deadline: Instant) {
        self.ops.close();
        info!(
            running = self.ops.running_count(),
            "shutting down: stopping the driver (event waits fail, operations roll back)"
        );
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = tokio::time::timeout_at(deadline, self.driver.shutdown(left)).await;
        if self.ops.drain(deadline).await {
            info!("every operation finished");
            return;
        }
        let error = ErrorDetail {
            code: "shutdown".into(),
            message: "aborted at shutdown: not finished within drain_timeout".into(),
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
    fn flavors_and_names_are_checked() {
        let f = |vcpus, memory_mb| Flavor {
            name: "m1".into(),
            vcpus,
            memory_mb,
            root_gb: 0,
            ephemeral_gb: 0,
            swap_mb: 0,
            extra_specs: Default::default(),
        };
        assert!(check_flavor(&f(1, 64)).is_ok());
        assert!(check_flavor(&f(0, 64)).is_err());
        assert!(check_flavor(&f(1, 8)).is_err());
        assert!(check_flavor(&f(MAX_VCPUS + 1, 64)).is_err());
        assert!(check_name("vm-1").is_ok());
        assert!(check_name("a/b").is_err());
        assert!(check_name("").is_err());
        assert!(check_name("a\nb").is_err());
    }
}
