//! The HTTP layer (actix-web): routes, token checks, size-capped bodies, JSON in and out,
//! request metrics, and [`serve`], which runs the server on a given listener until a given
//! shutdown future resolves (tests pass a loopback listener on port 0 and their own signal).
//!
//! | method | path | answer |
//! |---|---|---|
//! | GET | `/healthz` | 200 `{"status": "ok", "host", "driver"}` (no token) |
//! | GET | `/v1/host` | 200 the host's resources (hypervisor, CPUs, memory, disk) |
//! | GET | `/metrics` | 200 Prometheus text |
//! | POST | `/v2.1/os-server-external-events`, `/v2.1/{project_id}/os-server-external-events`, `/os-server-external-events` | 200 / 207 (Nova's answer and faults) |
//! | GET | `/v1/instances` | 200 `{"instances": [...]}` |
//! | POST | `/v1/instances` | 202 `{"operation": {...}}` |
//! | GET | `/v1/instances/{uuid}` | 200 instance |
//! | DELETE | `/v1/instances/{uuid}[?deallocate_network=false]` | 202 `{"operation": {...}}` |
//! | POST | `/v1/instances/{uuid}/action` | 202 `{"operation": {...}}` |
//! | GET | `/v1/instances/{uuid}/handover` | 200 what another host needs to take it over |
//! | GET | `/v1/operations` | 200 `{"operations": [...]}` (`?instance=UUID` filters) |
//! | GET | `/v1/operations/{id}` | 200 operation (`?wait=S`: once it finished, or after S s, at most 30) |
//! | POST | `/v1/instances/{uuid}/half` | 200 `{"state", "report"}` (one host's half of a move Nova orchestrates; synchronous) |
//! | PUT | `/v1/storage/probes/{uuid}` | 201 `{"probe": uuid}` (a shared-directory probe written in the instances directory) |
//! | GET | `/v1/storage/probes/{uuid}` | 200 `{"seen": bool}` (is that probe in this host's instances directory?) |
//! | DELETE | `/v1/storage/probes/{uuid}` | 204 (removed; gone already is fine) |

use std::future::Future;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use actix_web::body::MessageBody;
use actix_web::dev::{Service, ServiceResponse};
use actix_web::http::header::{
    HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, LOCATION,
};
use actix_web::http::StatusCode;
use actix_web::web::{self, BytesMut};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio::time::Instant;
use tracing::{debug, info, info_span, warn, Instrument};
use uuid::Uuid;
use vireo_actors::instance::Operation;
use vireo_actors::lifecycle::Caller;

use super::auth::Scope;
use super::error::{ApiError, NovaFault};
use super::microversion;
use super::model::{Accepted, CreateInstance, InstanceList, OpStatus, OperationList};
use super::service::AgentService;

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listener could not be used.
    #[error("cannot serve on the listener")]
    Listen(#[source] std::io::Error),
    /// The server stopped with an error.
    #[error("HTTP server failed")]
    Run(#[source] std::io::Error),
}

type Svc = web::Data<AgentService>;

/// Read the body, refusing more than `limit` bytes (413) before reading further.
async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<BytesMut, ApiError> {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::BodyTooLarge { limit });
    }
    let mut buf = BytesMut::with_capacity(declared.map_or(1024, |n| n as usize));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|_| ApiError::ReadBody)?;
        if buf.len() + chunk.len() > limit {
            return Err(ApiError::BodyTooLarge { limit });
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

async fn json_body<T: DeserializeOwned>(
    req: &HttpRequest,
    payload: web::Payload,
    svc: &AgentService,
) -> Result<T, ApiError> {
    let body = read_body(req, payload, svc.settings().max_body_bytes).await?;
    serde_json::from_slice(&body).map_err(|e| ApiError::BadJson(e.to_string()))
}

/// An endpoint's body decodes only as the operations its caller may ask for: any other is
/// refused as the body an unknown action is (400 `bad-json`).
fn for_caller(op: Operation, caller: Caller) -> Result<Operation, ApiError> {
    if op.kind().caller() == caller {
        Ok(op)
    } else {
        Err(ApiError::BadJson(format!(
            "{} is not an operation this endpoint takes",
            op.kind()
        )))
    }
}

fn api(req: &HttpRequest, svc: &AgentService) -> Result<(), ApiError> {
    svc.authorize(req.headers(), Scope::Api, req.path())
}

fn parse_uuid(what: &str, s: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(s).map_err(|_| ApiError::Invalid(format!("{what}: {s:?} is not a UUID")))
}

fn accepted(op: OpStatus) -> HttpResponse {
    HttpResponse::Accepted()
        .insert_header((LOCATION, format!("/v1/operations/{}", op.id)))
        .json(Accepted { operation: op })
}

async fn healthz(svc: Svc) -> HttpResponse {
    let h = svc.health();
    let status = if h.status == "ok" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    HttpResponse::build(status).json(h)
}

async fn metrics(req: HttpRequest, svc: Svc) -> Result<HttpResponse, ApiError> {
    svc.authorize(req.headers(), Scope::Metrics, req.path())?;
    Ok(HttpResponse::Ok()
        .insert_header((CONTENT_TYPE, super::metrics::CONTENT_TYPE))
        .body(svc.metrics_text().await))
}

/// Nova's external-events endpoint: Nova's answers, Nova's faults, served at the request's
/// microversion (see [`super::microversion`]).
async fn external_events(
    req: HttpRequest,
    payload: web::Payload,
    svc: Svc,
) -> Result<HttpResponse, NovaFault> {
    svc.authorize(req.headers(), Scope::Events, req.path())
        .map_err(|e| NovaFault::new(e, None))?;
    let version = microversion::requested(req.headers())?;
    let fault = |e| NovaFault::new(e, Some(version));
    let body = read_body(&req, payload, svc.settings().max_body_bytes)
        .await
        .map_err(fault)?;
    let (status, answer) = svc.external_events(&body, version).await.map_err(fault)?;
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::MULTI_STATUS);
    let mut resp = HttpResponse::build(status);
    for h in microversion::answer_headers(version) {
        resp.append_header(h);
    }
    Ok(resp.json(answer))
}

async fn show_host(req: HttpRequest, svc: Svc) -> Result<HttpResponse, ApiError> {
    api(&req, &svc)?;
    Ok(HttpResponse::Ok().json(svc.host_resources().await?))
}

/// A caller's shared-directory check (Nova's, before a live migration): the destination's
/// host writes the probe (PUT), the source's looks for it (GET), the destination's removes
/// it (DELETE).
async fn probe(
    req: HttpRequest,
    path: web::Path<String>,
    svc: Svc,
) -> Result<HttpResponse, ApiError> {
    api(&req, &svc)?;
    let probe = parse_uuid("probe", &path)?;
    let driver = svc.driver();
    Ok(match *req.method() {
        actix_web::http::Method::PUT => {
            driver.write_probe(probe).await.map_err(ApiError::Probe)?;
            HttpResponse::Created().json(serde_json::json!({ "probe": probe }))
        }
        actix_web::http::Method::DELETE => {
            driver.remove_probe(probe).await;
            HttpResponse::NoContent().finish()
        }
        _ => HttpResponse::Ok().json(serde_json::json!({ "seen": driver.sees_probe(probe).await })),
    })
}

async fn list_instances(req: HttpRequest, svc: Svc) -> Result<HttpResponse, ApiError> {
    api(&req, &svc)?;
    Ok(HttpResponse::Ok().json(InstanceList {
        instances: svc.list().await,
    }))
}

async fn create_instance(
    req: HttpRequest,
    payload: web::Payload,
    svc: Svc,
) -> Result<HttpResponse, ApiError> {
    api(&req, &svc)?;
    let body: CreateInstance = json_body(&req, payload, &svc).await?;
    let svc: Arc<AgentService> = svc.into_inner();
    Ok(accepted(svc.create(body).await?))
}

async fn show_instance(
    req: HttpRequest,
    path: web::Path<String>,
    svc: Svc,
) -> Result<HttpResponse, ApiError> {
    api(&req, &svc)?;
    let uuid = parse_uuid("instance", &path)?;
    Ok(HttpResponse::Ok().json(svc.show(uuid).await?))
}

/// `GET /v1/instances/{uuid}/handover`: what another host needs to take the instance over
/// (under Nova, a live migration's source hands it to the destination as its disk info).
async fn show_handover(
    req: HttpRequest,
    path: web::Path<String>,
    svc: Svc,
) -> Result<HttpResponse, ApiError> {
    api(&req, &svc)?;
    let uuid = parse_uuid("instance", &path)?;
    Ok(HttpResponse::Ok().json(svc.handover(uuid).await?))
}

/// The most of a console log one request returns (Nova's libvirt driver's bound).
pub const MAX_CONSOLE_BYTES: u64 = 100 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsoleQuery {
    /// Bytes from the end of the log (at most, and by default, [`MAX_CONSOLE_BYTES`]).
    bytes: Option<u64>,
}

#[derive(Debug, serde::Serialize)]
struct ConsoleOutput {
    output: String,
}

async fn show_console(
    req: HttpRequest,
    path: web::Path<String>,
    query: Result<web::Query<ConsoleQuery>, actix_web::Error>,
    svc: Svc,
) -> Result<HttpResponse, ApiError> {
    api(&req, &svc)?;
    let uuid = parse_uuid("instance", &path)?;
    let query = query.map_err(|e| ApiError::Invalid(format!("query: {e}")))?;
    let bytes = query
        .bytes
        .unwrap_or(MAX_CONSOLE_BYTES)
        .min(MAX_CONSOLE_BYTES);
    let output = svc.console(uuid, bytes).await?;
    Ok(HttpResponse::Ok().json(ConsoleOutput { output }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LifecycleQuery {
    /// Events after this number (none: only the newest number is answered).
    after: Option<u64>,
    /// Seconds to wait for one when there are none yet (default 0, at most 30).
    wait: Option<u64>,
}

async fn lifecycle_events(
    req: HttpRequest,
    query: Result<web::Query<LifecycleQuery>, actix_web::Error>,
    svc: Svc,
) -> Result<HttpResponse, ApiError> {
    api(&req, &svc)?;
    let query = query.map_err(|e| ApiError::Invalid(format!("query: {e}")))?;
    let wait = Duration::from_secs(query.wait.unwrap_or(0));
    Ok(HttpResponse::Ok().json(svc.lifecycle(query.after, wait).await))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteQuery {
    deallocate_network: Option<bool>,
}

async fn delete_instance(
    req: HttpRequest,
    path: web::Path<String>,
    query: Result<web::Query<DeleteQuery>, actix_web::Error>,
    svc: Svc,
) -> Result<HttpResponse, ApiError> {
    api(&req, &svc)?;
    let uuid = parse_uuid("instance", &path)?;
    let query = query.map_err(|e| ApiError::Invalid(format!("query: {e}")))?;
    let svc: Arc<AgentService> = svc.into_inner();
    Ok(accepted(
        svc.delete(uuid, query.deallocate_network.unwrap_or(true))
            .await?,
    ))
}

async fn instance_action(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    svc: Svc,
) -> Result<HttpResponse, ApiError> {
    api(&req, &svc)?;
    let uuid = parse_uuid("instance", &path)?;
    let action = for_caller(json_body(&req, payload, &svc).await?, Caller::Api)?;
    let svc: Arc<AgentService> = svc.into_inner();
    Ok(accepted(svc.action(uuid, action).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpsQuery {
    instance: Option<Uuid>,
}

async fn list_operations(
    req: HttpRequest,
    query: Result<web::Query<OpsQuery>, actix_web::Error>,
    svc: Svc,
) -> Result<HttpResponse, ApiError> {
    api(&req, &svc)?;
    let query = query.map_err(|e| ApiError::Invalid(format!("query: {e}")))?;
    Ok(HttpResponse::Ok().json(OperationList {
        operations: svc.operations().list(query.instance),
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OperationQuery {
    /// Seconds to wait for the operation to finish before answering (default 0: at once; at
    /// most [`MAX_OPERATION_WAIT`]).
    wait: Option<u64>,
}

/// The longest long poll of one operation, in seconds (a caller asks again).
const MAX_OPERATION_WAIT: u64 = 30;

async fn show_operation(
    req: HttpRequest,
    path: web::Path<String>,
    query: Result<web::Query<OperationQuery>, actix_web::Error>,
    svc: Svc,
) -> Result<HttpResponse, ApiError> {
    api(&req, &svc)?;
    let id = parse_uuid("operation", &path)?;
    let query = query.map_err(|e| ApiError::Invalid(format!("query: {e}")))?;
    let wait = Duration::from_secs(query.wait.unwrap_or(0).min(MAX_OPERATION_WAIT));
    let op = svc
        .operations()
        .wait_finished(id, tokio::time::Instant::now() + wait)
        .await
        .ok_or(ApiError::OperationNotFound(id))?;
    Ok(HttpResponse::Ok().json(op))
}

async fn host_half(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    svc: Svc,
) -> Result<HttpResponse, ApiError> {
    api(&req, &svc)?;
    let uuid = parse_uuid("instance", &path)?;
    let body = for_caller(json_body(&req, payload, &svc).await?, Caller::Orchestrator)?;
    Ok(HttpResponse::Ok().json(svc.host_half(uuid, body).await?))
}

/// The request id header, as every OpenStack API names it: in an answer, this request's id
/// (`req-<uuid>`), which a client logs (Neutron's "Nova event matching [req-...]") and the
/// agent's log lines carry; in a request, the caller's global request id (oslo.context).
static REQUEST_ID: HeaderName = HeaderName::from_static("x-openstack-request-id");
/// The answer's request id under the name Nova's compute API also answers with.
static COMPUTE_REQUEST_ID: HeaderName = HeaderName::from_static("x-compute-request-id");

/// A new request id, `req-<uuid4>`.
fn request_id() -> String {
    format!("req-{}", Uuid::new_v4())
}

/// The caller's global request id when it is one (`req-` and a lower-case hyphenated UUID,
/// as oslo.context accepts it); anything else is ignored, as OpenStack services ignore it.
fn global_request_id(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(&REQUEST_ID)?.to_str().ok()?;
    let uuid = v.strip_prefix("req-")?;
    Uuid::parse_str(uuid)
        .is_ok_and(|u| u.hyphenated().to_string() == uuid)
        .then_some(v)
}

async fn no_route() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NoRoute)
}

fn record<B: MessageBody>(svc: &AgentService, res: &ServiceResponse<B>, started: StdInstant) {
    let route = res
        .request()
        .match_pattern()
        .unwrap_or_else(|| "unmatched".to_owned());
    let status = res.status();
    let took = started.elapsed();
    svc.metrics().http_requests.inc(&[&route, status.as_str()]);
    svc.metrics().http_duration.observe(&[&route], took);
    let instance = res.request().match_info().get("uuid").unwrap_or("");
    debug!(instance, method = %res.request().method(), route, status = status.as_u16(),
           us = took.as_micros() as u64, "request");
}

/// How long an idle keep-alive connection stays open: Nova's API server default
/// (`[wsgi] client_socket_timeout`, 900 s). A client may send its next request on a pooled
/// connection just as the server closes it for idleness and see the connection closed
/// without an answer; with actix's default of 5 s nova-compute met that between two
/// operations a few seconds apart (a `DELETE` after a revert). Long enough that nova-compute's
/// periodic calls (every 60 s) keep their connections; the driver also retries an idempotent
/// request once on a connection closed before any answer.
const KEEP_ALIVE: Duration = Duration::from_secs(900);

/// Run the API on `listener` until `shutdown` resolves, then stop accepting, let in-flight
/// requests finish and run [`AgentService::shutdown`]; everything within the service's
/// `drain_timeout`.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    svc: Arc<AgentService>,
) -> Result<(), ServeError> {
    let settings = svc.settings().clone();
    let data: Svc = web::Data::from(Arc::clone(&svc));
    let addr = listener.local_addr().map_err(ServeError::Listen)?;
    listener.set_nonblocking(true).map_err(ServeError::Listen)?;
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .wrap_fn(|req, srv| {
                let started = StdInstant::now();
                let svc = req.app_data::<Svc>().cloned();
                let id = request_id();
                let span = info_span!("request", request_id = %id,
                    global_request_id = global_request_id(req.headers()).unwrap_or(""));
                let fut = srv.call(req);
                async move {
                    let mut res = fut.await?;
                    if let Ok(v) = HeaderValue::from_str(&id) {
                        res.headers_mut().insert(REQUEST_ID.clone(), v.clone());
                        res.headers_mut().insert(COMPUTE_REQUEST_ID.clone(), v);
                    }
                    if let Some(svc) = svc {
                        record(&svc, &res, started);
                    }
                    Ok(res)
                }
                .instrument(span)
            })
            .route("/healthz", web::get().to(healthz))
            .route("/metrics", web::get().to(metrics))
            .route(
                "/v2.1/os-server-external-events",
                web::post().to(external_events),
            )
            .route(
                "/v2.1/{project_id}/os-server-external-events",
                web::post().to(external_events),
            )
            .route(
                "/os-server-external-events",
                web::post().to(external_events),
            )
            .service(
                web::scope("/v1")
                    .route("/host", web::get().to(show_host))
                    .route("/lifecycle-events", web::get().to(lifecycle_events))
                    .route("/instances", web::get().to(list_instances))
                    .route("/instances", web::post().to(create_instance))
                    .route("/instances/{uuid}", web::get().to(show_instance))
                    .route("/instances/{uuid}", web::delete().to(delete_instance))
                    .route("/instances/{uuid}/action", web::post().to(instance_action))
                    .route("/instances/{uuid}/console", web::get().to(show_console))
                    .route("/instances/{uuid}/half", web::post().to(host_half))
                    .route("/instances/{uuid}/handover", web::get().to(show_handover))
                    .route("/storage/probes/{uuid}", web::put().to(probe))
                    .route("/storage/probes/{uuid}", web::get().to(probe))
                    .route("/storage/probes/{uuid}", web::delete().to(probe))
                    .route("/operations", web::get().to(list_operations))
                    .route("/operations/{id}", web::get().to(show_operation)),
            )
            .default_service(web::to(no_route))
    })
    .workers(settings.http_workers)
    .keep_alive(KEEP_ALIVE)
    .disable_signals()
    .shutdown_timeout(settings.drain_timeout.as_secs().max(1))
    .listen(listener)
    .map_err(ServeError::Listen)?
    .run();
    let handle = server.handle();
    info!(%addr, host = %settings.host, "agent listening");
    super::systemd::ready(&format!("serving on {addr}"));
    let mut running = actix_rt::spawn(server);
    let stopped_by_itself = tokio::select! {
        r = &mut running => Some(r),
        () = shutdown => None,
    };
    if let Some(r) = stopped_by_itself {
        return match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ServeError::Run(e)),
            Err(_) => Err(ServeError::Run(std::io::Error::other("server task failed"))),
        };
    }
    let deadline = Instant::now() + settings.drain_timeout;
    info!("shutdown requested: no longer accepting connections");
    super::systemd::stopping();
    svc.operations().close();
    // Long polls of the lifecycle feed answer now instead of holding the drain.
    svc.close_lifecycle();
    let drain = async {
        if tokio::time::timeout_at(deadline, handle.stop(true))
            .await
            .is_err()
        {
            warn!("in-flight requests did not finish in time");
        }
    };
    if svc.host_halves_in_flight() > 0 {
        // A host half is an operation of this host that Nova's compute manager waits for
        // over HTTP, possibly waiting for network events itself: stop the driver while the
        // server drains, so that it rolls back now and its answer still goes out.
        info!(
            host_halves = svc.host_halves_in_flight(),
            "host halves in flight: stopping the driver while they finish"
        );
        tokio::join!(drain, svc.shutdown(deadline));
    } else {
        drain.await;
        svc.shutdown(deadline).await;
    }
    let _ = tokio::time::timeout_at(deadline, running).await;
    info!("agent stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_global_request_id_is_taken_only_in_oslo_contexts_shape() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(REQUEST_ID.clone(), HeaderValue::from_static(v));
            global_request_id(&h).map(str::to_owned)
        };
        let good = "req-9a1c2e44-5d2b-4e55-9c51-3f0f3a6c4d10";
        assert_eq!(with(good).as_deref(), Some(good));
        for bad in [
            "req-9A1C2E44-5D2B-4E55-9C51-3F0F3A6C4D10",
            "9a1c2e44-5d2b-4e55-9c51-3f0f3a6c4d10",
            "req-9a1c2e445d2b4e559c513f0f3a6c4d10",
            "req-nope",
            "",
        ] {
            assert_eq!(with(bad), None, "{bad:?}");
        }
        assert_eq!(global_request_id(&HeaderMap::new()), None);
        assert!(request_id().starts_with("req-"));
        assert_ne!(request_id(), request_id());
    }
}
