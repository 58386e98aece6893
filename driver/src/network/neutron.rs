//! A Neutron REST client implementing [`NetworkApi`].
//!
//! - Auth: [`Auth::Noauth`] (Neutron's `auth_strategy = noauth`: requests carry no token and
//!   no project header; Neutron's `fake_project_id` middleware then gives every request an
//!   admin context, which binding updates need. A configured `project_id` is put into the
//!   body of created ports instead of a header, because a project header would make the
//!   context non-admin), [`Auth::Keystone`] (v3 password, project-scoped) or
//!   [`Auth::ApplicationCredential`]. Keystone is spoken by the `osauth` crate (evaluated
//!   against keeping a hand-written v3 password request, which had no catalog, no application
//!   credentials and no token expiry, and against `openstack`, a higher-level crate built on
//!   it): it caches the token until it expires, renews it, and finds Neutron in the catalog
//!   (`region_name`, `valid_interfaces`) when `url` is not given. A 401 from Neutron renews the
//!   token once.
//! - TLS: the system's certificate store, plus `cafile` (a PEM bundle) when given, for both
//!   Keystone and Neutron.
//! - Timeouts: connect and whole-request timeouts from [`NeutronConfig`].
//! - Retries: GET, PUT and DELETE are retried on 5xx answers, timeouts and connection
//!   failures, at most `max_retries` times, with exponential backoff. POST is never retried;
//!   neither is binding activation (a PUT, but a repeated one answers 409).
//! - Errors: every failure is a [`NetworkError`] variant named for the operation, with the
//!   port id (and host) and a [`Failure`] carrying the HTTP status; the [`ClientError`] is the
//!   `source`. 404 is handled as the trait documents (not found on delete = done).
//! - Tracing: one `neutron_request` span per request with method, path, port id and attempt;
//!   the composite operations run in spans carrying the instance uuid.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::{Method, StatusCode, Url};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tracing::{debug, debug_span, warn, Instrument};
use uuid::Uuid;
use vireo_actors::network::{
    BindingStatus, BoxError, Deallocation, Failure, FixedIp, HostSetupChange, MigrationHosts,
    NetworkApi, NetworkError, NetworkSummary, NewBinding, Port, PortBinding, PortRequest,
    PortUpdate, Removal, VIF_TYPE_BINDING_FAILED,
};
use vireo_actors::vif::{NetworkInfo, PortId, VnicType};

use super::{flows, valid_device_owner, DEFAULT_DEVICE_OWNER, DEFAULT_OVS_BRIDGE};

/// How vireo authenticates to Neutron.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Auth {
    /// Neutron runs with `auth_strategy = noauth`.
    Noauth {
        /// Project that owns the ports vireo creates (Neutron's `fake_project_id` otherwise).
        #[serde(default)]
        project_id: Option<String>,
    },
    /// Keystone v3 password authentication, project-scoped.
    Keystone {
        /// Identity endpoint, e.g. `http://keystone:5000/v3` (`/v3` is added when missing).
        auth_url: String,
        /// User name.
        username: String,
        /// Password.
        password: String,
        /// Project name.
        project: String,
        /// Domain name of the user and the project.
        #[serde(default = "default_domain")]
        domain: String,
    },
    /// A Keystone application credential (its project is the one it was made in).
    ApplicationCredential {
        /// Identity endpoint, as for [`Auth::Keystone`].
        auth_url: String,
        /// The application credential's id.
        id: String,
        /// Its secret.
        secret: String,
    },
}

impl Default for Auth {
    fn default() -> Self {
        Auth::Noauth { project_id: None }
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::Noauth { project_id } => f
                .debug_struct("Noauth")
                .field("project_id", project_id)
                .finish(),
            Auth::Keystone {
                auth_url,
                username,
                project,
                domain,
                ..
            } => f
                .debug_struct("Keystone")
                .field("auth_url", auth_url)
                .field("username", username)
                .field("password", &"<redacted>")
                .field("project", project)
                .field("domain", domain)
                .finish(),
            Auth::ApplicationCredential { auth_url, id, .. } => f
                .debug_struct("ApplicationCredential")
                .field("auth_url", auth_url)
                .field("id", id)
                .field("secret", &"<redacted>")
                .finish(),
        }
    }
}

/// The endpoint interfaces Neutron may be reached on, from the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interface {
    /// `public`.
    Public,
    /// `internal`.
    Internal,
    /// `admin`.
    Admin,
}

impl Interface {
    fn osauth(self) -> osauth::InterfaceType {
        match self {
            Interface::Public => osauth::InterfaceType::Public,
            Interface::Internal => osauth::InterfaceType::Internal,
            Interface::Admin => osauth::InterfaceType::Admin,
        }
    }
}

fn default_valid_interfaces() -> Vec<Interface> {
    vec![Interface::Internal, Interface::Public]
}

fn default_domain() -> String {
    "Default".to_owned()
}

/// The Neutron client's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeutronConfig {
    /// Neutron's endpoint, e.g. `http://127.0.0.1:9696` (the `/v2.0` paths are added). Empty
    /// (or absent): the `network` endpoint of Keystone's catalog (Keystone auth only).
    #[serde(default)]
    pub url: String,
    /// Authentication.
    #[serde(default)]
    pub auth: Auth,
    /// A PEM file of CA certificates trusted besides the system's, for Keystone and Neutron.
    #[serde(default)]
    pub cafile: Option<std::path::PathBuf>,
    /// The catalog region Neutron is taken from (any when absent).
    #[serde(default)]
    pub region_name: Option<String>,
    /// The catalog interfaces Neutron may be reached on, in order of preference (Nova's
    /// `[neutron] valid_interfaces`). Default `["internal", "public"]`.
    #[serde(default = "default_valid_interfaces")]
    pub valid_interfaces: Vec<Interface>,
    /// TCP connect timeout.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Whole-request timeout (connect, send, answer).
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Retries of an idempotent request after a 5xx, timeout or connection failure.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// First backoff between retries; doubled each time up to `max_backoff_ms`.
    #[serde(default = "default_retry_backoff_ms")]
    pub retry_backoff_ms: u64,
    /// Largest backoff between retries.
    #[serde(default = "default_max_backoff_ms")]
    pub max_backoff_ms: u64,
    /// `device_owner` of instance ports: `compute:<availability zone>`.
    #[serde(default = "default_device_owner")]
    pub device_owner: String,
    /// Who owns the instances' ports: `vireo` (default: the agent allocates, binds, moves
    /// and releases them) or `nova` (under nova-compute: vireo only reads them; see
    /// [`super::nova_owned`]).
    #[serde(default)]
    pub ports_owner: super::nova_owned::PortsOwner,
    /// The OVS bridge of a port whose binding names none (Nova's `[neutron] ovs_bridge`):
    /// ML2/openvswitch names its integration bridge in `vif_details.bridge_name`, ML2/OVN
    /// names none, and its ports go on the bridge ovn-controller manages
    /// (`external_ids:ovn-bridge`). Default `br-int`.
    #[serde(default = "default_ovs_bridge")]
    pub ovs_bridge: String,
}

fn default_connect_timeout_ms() -> u64 {
    5_000
}
fn default_request_timeout_ms() -> u64 {
    30_000
}
fn default_max_retries() -> u32 {
    3
}
fn default_retry_backoff_ms() -> u64 {
    250
}
fn default_max_backoff_ms() -> u64 {
    4_000
}
fn default_device_owner() -> String {
    DEFAULT_DEVICE_OWNER.to_owned()
}
fn default_ovs_bridge() -> String {
    DEFAULT_OVS_BRIDGE.to_owned()
}

impl NeutronConfig {
    /// A configuration with defaults for everything but the URL (noauth).
    pub fn new(url: impl Into<String>) -> Self {
        NeutronConfig {
            url: url.into(),
            auth: Auth::default(),
            cafile: None,
            region_name: None,
            valid_interfaces: default_valid_interfaces(),
            connect_timeout_ms: default_connect_timeout_ms(),
            request_timeout_ms: default_request_timeout_ms(),
            max_retries: default_max_retries(),
            retry_backoff_ms: default_retry_backoff_ms(),
            max_backoff_ms: default_max_backoff_ms(),
            device_owner: default_device_owner(),
            ports_owner: super::nova_owned::PortsOwner::Vireo,
            ovs_bridge: default_ovs_bridge(),
        }
    }
}

/// Largest `max_retries` accepted.
pub const MAX_RETRIES_LIMIT: u32 = 10;

/// What went wrong talking to Neutron or Keystone (the `source` of a [`NetworkError`]).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The configuration is unusable.
    #[error("invalid Neutron configuration: {0}")]
    Config(String),
    /// The HTTP client could not be built.
    #[error("build the HTTP client")]
    Build(#[source] reqwest::Error),
    /// Neutron answered with an error status.
    #[error("{method} {path}: HTTP {status} {kind}: {message}")]
    Status {
        /// Request method.
        method: Method,
        /// Request path.
        path: String,
        /// HTTP status.
        status: u16,
        /// Neutron's error type (`PortNotFound`, ...), empty when the body had none.
        kind: String,
        /// Neutron's message.
        message: String,
    },
    /// The request could not be sent or answered.
    #[error("{method} {path}")]
    Send {
        /// Request method.
        method: Method,
        /// Request path.
        path: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The answer was not what Neutron sends.
    #[error("{method} {path}: unexpected response: {detail}")]
    Decode {
        /// Request method.
        method: Method,
        /// Request path.
        path: String,
        /// What was wrong.
        detail: String,
    },
    /// Keystone refused the credentials, could not be reached, or its catalog has no Neutron.
    #[error("keystone")]
    Keystone(#[source] osauth::Error),
    /// `cafile` could not be read or holds no certificate.
    #[error("cafile {path}")]
    CaFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: BoxError,
    },
}

impl ClientError {
    /// The failure kind, for [`NetworkError`].
    pub fn failure(&self) -> Failure {
        match self {
            ClientError::Status { status, .. } => Failure::Status(*status),
            ClientError::Send { source, .. } => transport_failure(source),
            ClientError::Keystone(e) => keystone_failure(e),
            ClientError::Build(_) | ClientError::Config(_) | ClientError::CaFile { .. } => {
                Failure::Transport
            }
            ClientError::Decode { .. } => Failure::BadResponse,
        }
    }

    /// The HTTP status, when Neutron answered with an error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Neutron's error type (`PortNotFound`, `PortBindingAlreadyExists`, ...).
    pub fn kind(&self) -> Option<&str> {
        match self {
            ClientError::Status { kind, .. } => Some(kind.as_str()),
            _ => None,
        }
    }

    fn is_auth(&self) -> bool {
        matches!(self, ClientError::Keystone(_))
    }
}

/// The failure of a Keystone exchange, from `osauth`'s error kind (it keeps the HTTP status
/// private): refused credentials are Keystone's 401, a refused scope its 403.
fn keystone_failure(e: &osauth::Error) -> Failure {
    use osauth::ErrorKind as K;
    match e.kind() {
        K::AuthenticationFailed => Failure::Status(401),
        K::AccessDenied => Failure::Status(403),
        K::ResourceNotFound | K::EndpointNotFound => Failure::Status(404),
        K::InternalServerError => Failure::Status(500),
        K::OperationTimedOut => Failure::Timeout,
        K::ProtocolError => Failure::Connect,
        K::InvalidResponse => Failure::BadResponse,
        _ => Failure::Transport,
    }
}

fn transport_failure(e: &reqwest::Error) -> Failure {
    if e.is_timeout() {
        Failure::Timeout
    } else if e.is_connect() {
        Failure::Connect
    } else {
        Failure::Transport
    }
}

/// Build the [`NetworkError`] for an operation from a [`ClientError`]; Keystone failures
/// become [`NetworkError::Authenticate`] whatever the operation.
fn op_error(e: ClientError, make: impl FnOnce(Failure, BoxError) -> NetworkError) -> NetworkError {
    let failure = e.failure();
    if e.is_auth() {
        return NetworkError::Authenticate {
            failure,
            source: Box::new(e),
        };
    }
    make(failure, Box::new(e))
}

/// One request.
struct Call {
    method: Method,
    segments: Vec<String>,
    query: Vec<(&'static str, String)>,
    body: Option<Value>,
    /// Retried on 5xx / transport failures.
    retry: bool,
    port: Option<PortId>,
}

impl Call {
    fn new(method: Method, segments: &[&str]) -> Self {
        let retry = matches!(method, Method::GET | Method::PUT | Method::DELETE);
        Call {
            method,
            segments: segments.iter().map(|s| (*s).to_owned()).collect(),
            query: Vec::new(),
            body: None,
            retry,
            port: None,
        }
    }

    fn body(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }

    fn port(mut self, port: PortId) -> Self {
        self.port = Some(port);
        self
    }

    fn no_retry(mut self) -> Self {
        self.retry = false;
        self
    }

    fn path(&self) -> String {
        format!("/{}", self.segments.join("/"))
    }
}

/// A Neutron REST client.
pub struct NeutronClient {
    http: reqwest::Client,
    /// Neutron's endpoint: configured, or found in the catalog on the first request.
    base: tokio::sync::OnceCell<Url>,
    config: NeutronConfig,
    /// Keystone (none with noauth). Replaced by a fresh one, with no cached token, when
    /// Neutron answers 401: osauth's forced refresh keeps a token that has not expired yet,
    /// and a revoked token has not.
    keystone: std::sync::Mutex<Option<Arc<dyn osauth::AuthType>>>,
    filters: osauth::EndpointFilters,
}

impl fmt::Debug for NeutronClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NeutronClient")
            .field("base", &self.base.get().map(Url::as_str))
            .field("auth", &self.config.auth)
            .finish_non_exhaustive()
    }
}

/// `osauth`'s authentication for `auth` (none for noauth).
fn keystone_auth(auth: &Auth) -> Result<Option<Arc<dyn osauth::AuthType>>, ClientError> {
    use osauth::common::IdOrName;
    let bad = |what: &str, e: osauth::Error| ClientError::Config(format!("{what}: {e}"));
    Ok(match auth {
        Auth::Noauth { .. } => None,
        Auth::Keystone {
            auth_url,
            username,
            password,
            project,
            domain,
        } => Some(Arc::new(
            osauth::identity::Password::new(
                auth_url,
                username.clone(),
                password.clone(),
                domain.clone(),
            )
            .map_err(|e| bad("auth_url", e))?
            .with_project_scope(
                IdOrName::Name(project.clone()),
                IdOrName::Name(domain.clone()),
            ),
        )),
        Auth::ApplicationCredential {
            auth_url,
            id,
            secret,
        } => Some(Arc::new(
            osauth::identity::ApplicationCredential::new(auth_url, id.clone(), secret.clone())
                .map_err(|e| bad("auth_url", e))?,
        )),
    })
}

/// The HTTP client: timeouts, the system's CA store and `cafile`.
fn http_client(config: &NeutronConfig) -> Result<reqwest::Client, ClientError> {
    let mut b = reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
        .timeout(Duration::from_millis(config.request_timeout_ms));
    if let Some(path) = &config.cafile {
        let ca_err = |source: BoxError| ClientError::CaFile {
            path: path.clone(),
            source,
        };
        let pem = std::fs::read(path).map_err(|e| ca_err(Box::new(e)))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| ca_err(Box::new(e)))?;
        if certs.is_empty() {
            return Err(ca_err("no PEM certificate in the file".into()));
        }
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    b.build().map_err(ClientError::Build)
}

impl NeutronClient {
    /// A client for `config` (validated: URL, timeouts, retries, device owner, auth, CA file).
    pub fn new(config: NeutronConfig) -> Result<Self, ClientError> {
        let base = tokio::sync::OnceCell::new();
        if config.url.is_empty() {
            if matches!(config.auth, Auth::Noauth { .. }) {
                return Err(ClientError::Config(
                    "url: required without Keystone (no catalog to find Neutron in)".into(),
                ));
            }
        } else {
            let url = Url::parse(&config.url)
                .map_err(|e| ClientError::Config(format!("url {:?}: {e}", config.url)))?;
            if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
                return Err(ClientError::Config(format!(
                    "url {:?}: not an http(s) URL",
                    config.url
                )));
            }
            let _ = base.set(url);
        }
        if config.connect_timeout_ms == 0 || config.request_timeout_ms == 0 {
            return Err(ClientError::Config("timeouts must be positive".into()));
        }
        if config.max_retries > MAX_RETRIES_LIMIT {
            return Err(ClientError::Config(format!(
                "max_retries {} exceeds {MAX_RETRIES_LIMIT}",
                config.max_retries
            )));
        }
        if !valid_device_owner(&config.device_owner) {
            return Err(ClientError::Config(format!(
                "device_owner {:?} is not compute:<zone>",
                config.device_owner
            )));
        }
        if !vireo_actors::vif::valid_ifname(&config.ovs_bridge) {
            return Err(ClientError::Config(format!(
                "ovs_bridge {:?} is not an interface name",
                config.ovs_bridge
            )));
        }
        if config.valid_interfaces.is_empty() {
            return Err(ClientError::Config("valid_interfaces: empty".into()));
        }
        let keystone = keystone_auth(&config.auth)?;
        // The catalog's endpoints are ranked by their position here: first preferred.
        let preferred: Vec<osauth::InterfaceType> =
            config.valid_interfaces.iter().map(|i| i.osauth()).collect();
        let interfaces: osauth::ValidInterfaces = preferred.iter().collect();
        let mut filters = osauth::EndpointFilters::default().with_interfaces(interfaces);
        if let Some(r) = &config.region_name {
            filters = filters.with_region(r.clone());
        }
        let http = http_client(&config)?;
        Ok(NeutronClient {
            http,
            base,
            config,
            keystone: std::sync::Mutex::new(keystone),
            filters,
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &NeutronConfig {
        &self.config
    }

    /// Neutron's endpoint: the configured one, else the catalog's (looked up once).
    async fn base(&self) -> Result<&Url, ClientError> {
        self.base
            .get_or_try_init(|| async {
                let auth = self
                    .keystone()
                    .ok_or_else(|| ClientError::Config("url: required without Keystone".into()))?;
                let url = auth
                    .get_endpoint(&self.http, "network", &self.filters)
                    .await
                    .map_err(ClientError::Keystone)?;
                debug!(%url, "Neutron's endpoint, from the catalog");
                Ok(url)
            })
            .await
    }

    fn url(base: &Url, call: &Call) -> Url {
        let mut url = base.clone();
        if let Ok(mut segs) = url.path_segments_mut() {
            segs.pop_if_empty().push("v2.0");
            for s in &call.segments {
                segs.push(s);
            }
        }
        if !call.query.is_empty() {
            let mut q = url.query_pairs_mut();
            for (k, v) in &call.query {
                q.append_pair(k, v);
            }
        }
        url
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let ms = self
            .config
            .retry_backoff_ms
            .saturating_mul(1u64 << attempt.min(20))
            .min(self.config.max_backoff_ms);
        Duration::from_millis(ms)
    }

    /// The Keystone authentication in use.
    fn keystone(&self) -> Option<Arc<dyn osauth::AuthType>> {
        self.keystone
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Start Keystone afresh: the next request authenticates again.
    fn renew_keystone(&self) -> Result<(), ClientError> {
        let fresh = keystone_auth(&self.config.auth)?;
        *self.keystone.lock().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    /// Add the Keystone token (fetched, or renewed once expired, by `osauth`); nothing with
    /// noauth.
    async fn authenticate(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::RequestBuilder, ClientError> {
        match self.keystone() {
            Some(auth) => auth
                .authenticate(&self.http, req)
                .await
                .map_err(ClientError::Keystone),
            None => Ok(req),
        }
    }

    /// Send a request with auth, retries and backoff; the JSON body of a 2xx answer
    /// (`Null` for an empty one).
    async fn send(&self, call: &Call) -> Result<Value, ClientError> {
        let path = call.path();
        let span = debug_span!(
            "neutron_request",
            method = %call.method,
            path = %path,
            port = call.port.map(|p| p.to_string()).unwrap_or_default(),
        );
        async {
            let url = Self::url(self.base().await?, call);
            let mut attempt: u32 = 0;
            let mut reauthenticated = false;
            loop {
                let mut req = self
                    .http
                    .request(call.method.clone(), url.clone())
                    .header("Accept", "application/json");
                if let Some(body) = &call.body {
                    req = req.json(body);
                }
                let req = self.authenticate(req).await?;
                let retryable_left = call.retry && attempt < self.config.max_retries;
                match req.send().await {
                    Ok(resp) => {
                        let status = resp.status();
                        if status == StatusCode::UNAUTHORIZED
                            && !reauthenticated
                            && self.keystone().is_some()
                        {
                            debug!("401: authenticating again");
                            self.renew_keystone()?;
                            reauthenticated = true;
                            continue;
                        }
                        if status.is_server_error() && retryable_left {
                            let wait = self.backoff(attempt);
                            warn!(status = status.as_u16(), attempt, ?wait, "retrying");
                            attempt += 1;
                            tokio::time::sleep(wait).await;
                            continue;
                        }
                        let text = resp.text().await.map_err(|source| ClientError::Send {
                            method: call.method.clone(),
                            path: path.clone(),
                            source,
                        })?;
                        if status.is_success() {
                            if text.trim().is_empty() {
                                return Ok(Value::Null);
                            }
                            return serde_json::from_str(&text).map_err(|e| ClientError::Decode {
                                method: call.method.clone(),
                                path: path.clone(),
                                detail: e.to_string(),
                            });
                        }
                        let (kind, message) = neutron_error(&text);
                        debug!(status = status.as_u16(), %kind, "error answer");
                        return Err(ClientError::Status {
                            method: call.method.clone(),
                            path: path.clone(),
                            status: status.as_u16(),
                            kind,
                            message,
                        });
                    }
                    Err(source) => {
                        if retryable_left {
                            let wait = self.backoff(attempt);
                            warn!(error = %source, attempt, ?wait, "retrying");
                            attempt += 1;
                            tokio::time::sleep(wait).await;
                            continue;
                        }
                        return Err(ClientError::Send {
                            method: call.method.clone(),
                            path: path.clone(),
                            source,
                        });
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    fn decode_err(call: &Call, detail: String) -> ClientError {
        ClientError::Decode {
            method: call.method.clone(),
            path: call.path(),
            detail,
        }
    }
}

/// Neutron's error body: `{"NeutronError": {"type", "message", "detail"}}`.
fn neutron_error(text: &str) -> (String, String) {
    let parsed: Option<Value> = serde_json::from_str(text).ok();
    let err = parsed.as_ref().and_then(|v| v.get("NeutronError"));
    match err {
        Some(e) => (
            e.get("type")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            truncate(e.get("message").and_then(Value::as_str).unwrap_or_default()),
        ),
        None => (String::new(), truncate(text)),
    }
}

fn truncate(s: &str) -> String {
    const MAX: usize = 300;
    let s = s.trim();
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

fn get_str<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<&'a str, String> {
    obj.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("missing string {key:?}"))
}

fn opt_str(obj: &Map<String, Value>, key: &str) -> String {
    obj.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn opt_map(obj: &Map<String, Value>, key: &str) -> Result<Map<String, Value>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        // Old Neutrons could return the profile as a JSON string.
        Some(Value::String(s)) if s.trim().is_empty() => Ok(Map::new()),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => Ok(m),
            _ => Err(format!("{key:?} is not an object")),
        },
        Some(_) => Err(format!("{key:?} is not an object")),
    }
}

fn vnic(obj: &Map<String, Value>, key: &str) -> Result<VnicType, String> {
    match obj.get(key).and_then(Value::as_str) {
        None => Ok(VnicType::Normal),
        Some(s) => s.parse().map_err(|e| format!("{key:?}: {e}")),
    }
}

/// Parse Neutron's port object.
pub fn parse_port(v: &Value) -> Result<Port, String> {
    let obj = v.as_object().ok_or("port is not an object")?;
    let id = get_str(obj, "id")?;
    let mac = get_str(obj, "mac_address")?;
    let fixed_ips = match obj.get("fixed_ips") {
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(Value::as_object)
            .map(|ip| FixedIp {
                subnet_id: opt_str(ip, "subnet_id"),
                ip_address: opt_str(ip, "ip_address"),
            })
            .collect(),
        _ => Vec::new(),
    };
    Ok(Port {
        id: id.parse().map_err(|e| format!("id: {e}"))?,
        network_id: get_str(obj, "network_id")?.to_owned(),
        mac_address: mac.parse().map_err(|e| format!("mac_address: {e}"))?,
        device_id: opt_str(obj, "device_id"),
        device_owner: opt_str(obj, "device_owner"),
        status: get_str(obj, "status")?.parse()?,
        admin_state_up: obj
            .get("admin_state_up")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        host_id: opt_str(obj, "binding:host_id"),
        vif_type: match obj.get("binding:vif_type").and_then(Value::as_str) {
            Some(s) => s.to_owned(),
            None => vireo_actors::network::VIF_TYPE_UNBOUND.to_owned(),
        },
        vnic_type: vnic(obj, "binding:vnic_type")?,
        vif_details: opt_map(obj, "binding:vif_details")?,
        profile: opt_map(obj, "binding:profile")?,
        fixed_ips,
    })
}

/// Parse Neutron's port binding object (`/ports/{id}/bindings`).
pub fn parse_binding(v: &Value) -> Result<PortBinding, String> {
    let obj = v.as_object().ok_or("binding is not an object")?;
    let status = match get_str(obj, "status")? {
        "ACTIVE" => BindingStatus::Active,
        "INACTIVE" => BindingStatus::Inactive,
        other => return Err(format!("unknown binding status {other:?}")),
    };
    Ok(PortBinding {
        host: get_str(obj, "host")?.to_owned(),
        vif_type: get_str(obj, "vif_type")?.to_owned(),
        vnic_type: vnic(obj, "vnic_type")?,
        vif_details: opt_map(obj, "vif_details")?,
        profile: opt_map(obj, "profile")?,
        status,
    })
}

/// Parse Neutron's network object.
pub fn parse_network(v: &Value) -> Result<NetworkSummary, String> {
    let obj = v.as_object().ok_or("network is not an object")?;
    let mtu = match obj.get("mtu") {
        None | Some(Value::Null) => None,
        Some(m) => Some(
            m.as_u64()
                .and_then(|m| u32::try_from(m).ok())
                .ok_or("mtu is not an integer")?,
        ),
    };
    let project = match obj.get("project_id").and_then(Value::as_str) {
        Some(p) => p.to_owned(),
        None => opt_str(obj, "tenant_id"),
    };
    Ok(NetworkSummary {
        id: get_str(obj, "id")?.to_owned(),
        name: opt_str(obj, "name"),
        mtu,
        physical_network: obj
            .get("provider:physical_network")
            .and_then(Value::as_str)
            .map(str::to_owned),
        project_id: project,
    })
}

fn member<'a>(body: &'a Value, key: &str) -> Result<&'a Value, String> {
    body.get(key)
        .ok_or_else(|| format!("answer has no {key:?} member"))
}

fn update_body(update: &PortUpdate) -> Value {
    let mut port = Map::new();
    if let Some(h) = &update.host_id {
        let v = if h.is_empty() {
            Value::Null
        } else {
            Value::from(h.clone())
        };
        port.insert("binding:host_id".into(), v);
    }
    if let Some(p) = &update.profile {
        port.insert("binding:profile".into(), Value::Object(p.clone()));
    }
    if let Some(v) = update.vnic_type {
        port.insert("binding:vnic_type".into(), Value::from(v.as_str()));
    }
    if let Some(d) = &update.device_id {
        port.insert("device_id".into(), Value::from(d.clone()));
    }
    if let Some(o) = &update.device_owner {
        port.insert("device_owner".into(), Value::from(o.clone()));
    }
    json!({ "port": port })
}

fn is_binding_failure(e: &ClientError) -> bool {
    e.kind() == Some("PortBindingError")
}

#[async_trait]
impl NetworkApi for NeutronClient {
    async fn list_instance_ports(&self, instance: Uuid) -> Result<Vec<Port>, NetworkError> {
        let mut call = Call::new(Method::GET, &["ports"]);
        call.query.push(("device_id", instance.to_string()));
        let wrap = |e: ClientError| {
            op_error(e, |failure, source| NetworkError::ListPorts {
                instance,
                failure,
                source,
            })
        };
        let body = self.send(&call).await.map_err(wrap)?;
        let list = member(&body, "ports")
            .and_then(|v| v.as_array().ok_or_else(|| "ports is not a list".to_owned()))
            .map_err(|d| wrap(Self::decode_err(&call, d)))?;
        list.iter()
            .map(|p| parse_port(p).map_err(|d| wrap(Self::decode_err(&call, d))))
            .collect()
    }

    async fn get_port(&self, port: PortId) -> Result<Port, NetworkError> {
        let id = port.to_string();
        let call = Call::new(Method::GET, &["ports", &id]).port(port);
        let wrap = |e: ClientError| {
            if e.status() == Some(404) {
                return NetworkError::PortNotFound { port };
            }
            op_error(e, |failure, source| NetworkError::GetPort {
                port,
                failure,
                source,
            })
        };
        let body = self.send(&call).await.map_err(wrap)?;
        member(&body, "port")
            .and_then(parse_port)
            .map_err(|d| wrap(Self::decode_err(&call, d)))
    }

    async fn get_network(&self, network_id: &str) -> Result<NetworkSummary, NetworkError> {
        let call = Call::new(Method::GET, &["networks", network_id]);
        let wrap = |e: ClientError| {
            if e.status() == Some(404) {
                return NetworkError::NetworkNotFound {
                    network: network_id.to_owned(),
                };
            }
            op_error(e, |failure, source| NetworkError::GetNetwork {
                network: network_id.to_owned(),
                failure,
                source,
            })
        };
        let body = self.send(&call).await.map_err(wrap)?;
        member(&body, "network")
            .and_then(parse_network)
            .map_err(|d| wrap(Self::decode_err(&call, d)))
    }

    async fn create_port_with(
        &self,
        network_id: &str,
        device_id: Option<Uuid>,
    ) -> Result<Port, NetworkError> {
        let mut port = Map::new();
        port.insert("network_id".into(), Value::from(network_id));
        port.insert("admin_state_up".into(), Value::Bool(true));
        if let Some(device) = device_id {
            port.insert("device_id".into(), Value::from(device.to_string()));
        }
        if let Auth::Noauth {
            project_id: Some(p),
        } = &self.config.auth
        {
            port.insert("project_id".into(), Value::from(p.clone()));
        }
        let call = Call::new(Method::POST, &["ports"]).body(json!({ "port": port }));
        let wrap = |e: ClientError| {
            if e.status() == Some(404) && e.kind() == Some("NetworkNotFound") {
                return NetworkError::NetworkNotFound {
                    network: network_id.to_owned(),
                };
            }
            op_error(e, |failure, source| NetworkError::CreatePort {
                network: network_id.to_owned(),
                failure,
                source,
            })
        };
        let body = self.send(&call).await.map_err(wrap)?;
        member(&body, "port")
            .and_then(parse_port)
            .map_err(|d| wrap(Self::decode_err(&call, d)))
    }

    async fn update_port(&self, port: PortId, update: &PortUpdate) -> Result<Port, NetworkError> {
        let id = port.to_string();
        let call = Call::new(Method::PUT, &["ports", &id])
            .port(port)
            .body(update_body(update));
        let wrap = |e: ClientError| {
            if e.status() == Some(404) {
                return NetworkError::PortNotFound { port };
            }
            op_error(e, |failure, source| NetworkError::UpdatePort {
                port,
                failure,
                source,
            })
        };
        let body = self.send(&call).await.map_err(wrap)?;
        member(&body, "port")
            .and_then(parse_port)
            .map_err(|d| wrap(Self::decode_err(&call, d)))
    }

    async fn delete_port(&self, port: PortId) -> Result<Removal, NetworkError> {
        let id = port.to_string();
        let call = Call::new(Method::DELETE, &["ports", &id]).port(port);
        match self.send(&call).await {
            Ok(_) => Ok(Removal::Deleted),
            Err(e) if e.status() == Some(404) => Ok(Removal::AlreadyGone),
            Err(e) => Err(op_error(e, |failure, source| NetworkError::DeletePort {
                port,
                failure,
                source,
            })),
        }
    }

    async fn show_bindings(&self, port: PortId) -> Result<Vec<PortBinding>, NetworkError> {
        let id = port.to_string();
        let call = Call::new(Method::GET, &["ports", &id, "bindings"]).port(port);
        let wrap = |e: ClientError| {
            if e.status() == Some(404) {
                return NetworkError::PortNotFound { port };
            }
            op_error(e, |failure, source| NetworkError::ShowBindings {
                port,
                failure,
                source,
            })
        };
        let body = self.send(&call).await.map_err(wrap)?;
        let list = member(&body, "bindings")
            .and_then(|v| {
                v.as_array()
                    .ok_or_else(|| "bindings is not a list".to_owned())
            })
            .map_err(|d| wrap(Self::decode_err(&call, d)))?;
        list.iter()
            .map(|b| parse_binding(b).map_err(|d| wrap(Self::decode_err(&call, d))))
            .collect()
    }

    async fn create_binding(
        &self,
        port: PortId,
        binding: &NewBinding,
    ) -> Result<PortBinding, NetworkError> {
        let id = port.to_string();
        let mut b = Map::new();
        b.insert("host".into(), Value::from(binding.host.clone()));
        if let Some(v) = binding.vnic_type {
            b.insert("vnic_type".into(), Value::from(v.as_str()));
        }
        if let Some(p) = &binding.profile {
            b.insert("profile".into(), Value::Object(p.clone()));
        }
        let call = Call::new(Method::POST, &["ports", &id, "bindings"])
            .port(port)
            .body(json!({ "binding": b }));
        let host = binding.host.clone();
        let wrap = |e: ClientError| {
            if e.status() == Some(404) {
                return NetworkError::PortNotFound { port };
            }
            if e.status() == Some(409) {
                return NetworkError::BindingExists {
                    port,
                    host: host.clone(),
                };
            }
            if is_binding_failure(&e) {
                return NetworkError::BindingFailed {
                    port,
                    host: host.clone(),
                    vif_type: VIF_TYPE_BINDING_FAILED.to_owned(),
                };
            }
            op_error(e, |failure, source| NetworkError::CreateBinding {
                port,
                host: host.clone(),
                failure,
                source,
            })
        };
        let body = self.send(&call).await.map_err(wrap)?;
        member(&body, "binding")
            .and_then(parse_binding)
            .map_err(|d| wrap(Self::decode_err(&call, d)))
    }

    async fn activate_binding(
        &self,
        port: PortId,
        host: &str,
    ) -> Result<PortBinding, NetworkError> {
        let id = port.to_string();
        let call = Call::new(Method::PUT, &["ports", &id, "bindings", host, "activate"])
            .port(port)
            .no_retry();
        let wrap = |e: ClientError| {
            if e.status() == Some(404) {
                if e.kind() == Some("PortNotFound") {
                    return NetworkError::PortNotFound { port };
                }
                return NetworkError::BindingNotFound {
                    port,
                    host: host.to_owned(),
                };
            }
            if e.status() == Some(409) {
                return NetworkError::BindingAlreadyActive {
                    port,
                    host: host.to_owned(),
                };
            }
            if is_binding_failure(&e) {
                return NetworkError::BindingFailed {
                    port,
                    host: host.to_owned(),
                    vif_type: VIF_TYPE_BINDING_FAILED.to_owned(),
                };
            }
            op_error(e, |failure, source| NetworkError::ActivateBinding {
                port,
                host: host.to_owned(),
                failure,
                source,
            })
        };
        let body = self.send(&call).await.map_err(wrap)?;
        // Neutron answers a member action with the bare binding object (not wrapped in
        // `{"binding": ...}` as the create answer is); accept both.
        body.get("binding")
            .map_or_else(|| parse_binding(&body), parse_binding)
            .map_err(|d| wrap(Self::decode_err(&call, d)))
    }

    async fn delete_binding(&self, port: PortId, host: &str) -> Result<Removal, NetworkError> {
        let bindings = match self.show_bindings(port).await {
            Ok(b) => b,
            Err(NetworkError::PortNotFound { .. }) => return Ok(Removal::AlreadyGone),
            Err(e) => return Err(e),
        };
        match bindings.iter().find(|b| b.host == host) {
            None => return Ok(Removal::AlreadyGone),
            Some(b) if b.status == BindingStatus::Active => {
                return Err(NetworkError::DeleteActiveBinding {
                    port,
                    host: host.to_owned(),
                })
            }
            Some(_) => {}
        }
        let id = port.to_string();
        let call = Call::new(Method::DELETE, &["ports", &id, "bindings", host]).port(port);
        match self.send(&call).await {
            Ok(_) => Ok(Removal::Deleted),
            Err(e) if e.status() == Some(404) => Ok(Removal::AlreadyGone),
            Err(e) => Err(op_error(e, |failure, source| NetworkError::DeleteBinding {
                port,
                host: host.to_owned(),
                failure,
                source,
            })),
        }
    }

    async fn allocate_for_instance(
        &self,
        instance: Uuid,
        host: &str,
        requests: &[PortRequest],
    ) -> Result<NetworkInfo, NetworkError> {
        flows::allocate(
            self,
            &self.config.device_owner,
            &self.config.ovs_bridge,
            instance,
            host,
            requests,
        )
        .await
    }

    async fn deallocate_for_instance(
        &self,
        instance: Uuid,
        network_info: &NetworkInfo,
    ) -> Result<Deallocation, NetworkError> {
        flows::deallocate(self, instance, network_info).await
    }

    async fn setup_networks_on_host(
        &self,
        instance: Uuid,
        host: &str,
        teardown: bool,
        migration: Option<&MigrationHosts>,
    ) -> Result<Vec<HostSetupChange>, NetworkError> {
        flows::setup_networks_on_host(self, instance, host, teardown, migration).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vireo_actors::network::PortStatus;

    #[test]
    fn config_defaults_and_unknown_fields() {
        let c: NeutronConfig = toml::from_str(r#"url = "http://127.0.0.1:9696""#).unwrap();
        assert_eq!(c, NeutronConfig::new("http://127.0.0.1:9696"));
        assert_eq!(c.auth, Auth::Noauth { project_id: None });
        assert!(toml::from_str::<NeutronConfig>("url = \"http://x\"\nretries = 3").is_err());
        let c: NeutronConfig = toml::from_str(
            r#"
            url = "https://neutron:9696"
            device_owner = "compute:az1"
            [auth]
            type = "keystone"
            auth_url = "http://keystone:5000"
            username = "vireo"
            password = "s3cret"
            project = "service"
            "#,
        )
        .unwrap();
        let Auth::Keystone { domain, .. } = &c.auth else {
            panic!("{c:?}")
        };
        assert_eq!(domain, "Default");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(toml::from_str::<NeutronConfig>(
            "url = \"http://x\"\n[auth]\ntype = \"noauth\"\nproject = \"p\""
        )
        .is_err());
    }

    #[test]
    fn bad_configs_are_refused() {
        for (url, owner, retries) in [
            ("not a url", "compute:nova", 3),
            ("ftp://x", "compute:nova", 3),
            ("http://x", "network:dhcp", 3),
            ("http://x", "compute:nova", 11),
        ] {
            let mut c = NeutronConfig::new(url);
            c.device_owner = owner.into();
            c.max_retries = retries;
            assert!(
                matches!(NeutronClient::new(c), Err(ClientError::Config(_))),
                "{url} {owner} {retries}"
            );
        }
        let mut c = NeutronConfig::new("http://x");
        c.request_timeout_ms = 0;
        assert!(NeutronClient::new(c).is_err());
        for bridge in ["", "br/ovn", "a-bridge-name-too-long"] {
            let mut c = NeutronConfig::new("http://x");
            c.ovs_bridge = bridge.into();
            assert!(
                matches!(NeutronClient::new(c), Err(ClientError::Config(ref m)) if m.contains("ovs_bridge")),
                "{bridge:?}"
            );
        }
        let c: NeutronConfig =
            toml::from_str("url = \"http://x\"\novs_bridge = \"br-ovn\"").unwrap();
        assert_eq!(c.ovs_bridge, "br-ovn");
        assert!(NeutronClient::new(c).is_ok());
        // No URL: only with Keystone, whose catalog names Neutron.
        assert!(NeutronClient::new(NeutronConfig::new("")).is_err());
        let mut c = NeutronConfig::new("");
        c.auth = Auth::ApplicationCredential {
            auth_url: "http://keystone:5000".into(),
            id: "ac".into(),
            secret: "s".into(),
        };
        assert!(NeutronClient::new(c.clone()).is_ok());
        c.valid_interfaces.clear();
        assert!(NeutronClient::new(c.clone()).is_err());
        c.valid_interfaces = vec![Interface::Public];
        // A PEM bundle (Debian's) is taken; a missing file is refused.
        c.cafile = Some("/etc/ssl/certs/ca-certificates.crt".into());
        assert!(NeutronClient::new(c.clone()).is_ok());
        c.cafile = Some("/nonexistent/ca.pem".into());
        assert!(matches!(
            NeutronClient::new(c),
            Err(ClientError::CaFile { .. })
        ));
    }

    #[test]
    fn urls_keep_a_base_path_and_encode_segments() {
        let base = |u: &str| {
            let c = NeutronClient::new(NeutronConfig::new(u)).unwrap();
            c.base.get().unwrap().clone()
        };
        let mut call = Call::new(Method::GET, &["ports", "p", "bindings", "host a/b"]);
        call.query.push(("device_id", "x y".into()));
        assert_eq!(
            NeutronClient::url(&base("http://h:9696/networking/"), &call).as_str(),
            "http://h:9696/networking/v2.0/ports/p/bindings/host%20a%2Fb?device_id=x+y"
        );
        assert_eq!(
            NeutronClient::url(
                &base("http://h:9696"),
                &Call::new(Method::GET, &["networks"])
            )
            .as_str(),
            "http://h:9696/v2.0/networks"
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let mut cfg = NeutronConfig::new("http://h");
        cfg.retry_backoff_ms = 100;
        cfg.max_backoff_ms = 350;
        let c = NeutronClient::new(cfg).unwrap();
        let ms: Vec<u128> = (0..4).map(|a| c.backoff(a).as_millis()).collect();
        assert_eq!(ms, vec![100, 200, 350, 350]);
    }

    #[test]
    fn only_get_put_delete_retry() {
        assert!(Call::new(Method::GET, &[]).retry);
        assert!(Call::new(Method::PUT, &[]).retry);
        assert!(Call::new(Method::DELETE, &[]).retry);
        assert!(!Call::new(Method::POST, &[]).retry);
        assert!(!Call::new(Method::PUT, &[]).no_retry().retry);
    }

    #[test]
    fn parses_neutron_port_and_error_bodies() {
        let v = json!({
            "id": "3b2c4d5e-0000-4000-8000-000000000001",
            "network_id": "n1",
            "mac_address": "fa:16:3e:aa:bb:cc",
            "device_id": "",
            "device_owner": "",
            "status": "DOWN",
            "admin_state_up": true,
            "binding:host_id": "",
            "binding:vif_type": "unbound",
            "binding:vnic_type": "normal",
            "binding:vif_details": {},
            "binding:profile": {},
            "fixed_ips": [{"subnet_id": "s", "ip_address": "10.0.0.3"}],
        });
        let p = parse_port(&v).unwrap();
        assert_eq!(p.status, PortStatus::Down);
        assert!(!p.is_bound());
        assert_eq!(p.fixed_ips.len(), 1);
        let mut bad = v.clone();
        bad["binding:vnic_type"] = json!("warp-drive");
        assert!(parse_port(&bad).is_err());
        let mut bad = v;
        bad["status"] = json!("UP");
        assert!(parse_port(&bad).is_err());

        let (kind, msg) = neutron_error(
            r#"{"NeutronError": {"type": "PortNotFound", "message": "Port x could not be found.", "detail": ""}}"#,
        );
        assert_eq!(kind, "PortNotFound");
        assert!(msg.contains("could not be found"));
        let (kind, msg) = neutron_error("<html>bad gateway</html>");
        assert_eq!(kind, "");
        assert_eq!(msg, "<html>bad gateway</html>");
        assert!(truncate(&"é".repeat(400)).len() <= 303);
    }

    #[test]
    fn update_body_sends_null_to_unbind() {
        let u = PortUpdate {
            host_id: Some(String::new()),
            device_id: Some(String::new()),
            ..PortUpdate::default()
        };
        assert_eq!(
            update_body(&u),
            json!({"port": {"binding:host_id": null, "device_id": ""}})
        );
    }
}
