//! The HTTP client of the agent's API: what `vireo instance ...` and `vireo events send` use
//! (Nova's driver package has its own, in Python).
//!
//! Every call sends the token in the configured header (default `X-Auth-Token`), decodes the
//! agent's JSON, and turns an error answer into [`ClientError::Api`] with the HTTP status and
//! the agent's stable code. [`AgentClient::wait`] polls an operation until it ends, reporting
//! progress (the instance's step and the events it waits for) through a callback.

use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;
use vireo_actors::external::ExternalEvent;
use vireo_actors::instance::Operation;

use crate::agent::auth::Token;
use crate::agent::model::{
    Accepted, CreateInstance, ErrorBody, EventAnswer, EventsAnswer, HalfReply, Health, Instance,
    InstanceList, OpState, OpStatus, OperationList,
};

const DEFAULT_HEADER_LOWER: &str = "x-auth-token";

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The base URL is not an http(s) URL.
    #[error("invalid agent URL {0:?}")]
    Url(String),
    /// The token cannot be sent in a header.
    #[error("the token is not a valid header value")]
    Token,
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client")]
    Build(#[source] reqwest::Error),
    /// The request could not be sent or its answer read.
    #[error("{method} {path}")]
    Send {
        /// Method.
        method: Method,
        /// Path.
        path: String,
        /// Transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The agent answered with an error.
    #[error("{method} {path}: HTTP {status} {code}: {message}")]
    Api {
        /// Method.
        method: Method,
        /// Path.
        path: String,
        /// HTTP status.
        status: u16,
        /// The agent's stable code.
        code: String,
        /// The agent's message.
        message: String,
    },
    /// The answer is not what the agent sends.
    #[error("{method} {path}: unexpected answer (HTTP {status})")]
    Decode {
        /// Method.
        method: Method,
        /// Path.
        path: String,
        /// HTTP status.
        status: u16,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
}

impl ClientError {
    /// The HTTP status of an error answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } | ClientError::Decode { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The agent's error code of an error answer.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// The answer to an external-events POST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventsReply {
    /// 200 (all accepted) or 207 (some not).
    pub status: u16,
    /// Per-event answers.
    pub events: Vec<EventAnswer>,
}

/// A client of one agent.
#[derive(Debug, Clone)]
pub struct AgentClient {
    http: reqwest::Client,
    base: Url,
    header: HeaderName,
    token: HeaderValue,
}

impl AgentClient {
    /// A client of the agent at `base` (e.g. `http://127.0.0.1:8774`) sending `token` in
    /// [`crate::config::DEFAULT_TOKEN_HEADER`].
    pub fn new(base: &str, token: &Token) -> Result<AgentClient, ClientError> {
        let base = Url::parse(base.trim_end_matches('/'))
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .ok_or_else(|| ClientError::Url(base.to_owned()))?;
        let mut token = HeaderValue::from_bytes(token.expose()).map_err(|_| ClientError::Token)?;
        token.set_sensitive(true);
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(ClientError::Build)?;
        Ok(AgentClient {
            http,
            base,
            header: HeaderName::from_static(DEFAULT_HEADER_LOWER),
            token,
        })
    }

    /// Send the token in `header` instead of [`crate::config::DEFAULT_TOKEN_HEADER`].
    pub fn with_header(mut self, header: &str) -> Result<AgentClient, ClientError> {
        self.header = HeaderName::from_bytes(header.as_bytes()).map_err(|_| ClientError::Token)?;
        Ok(self)
    }

    /// Send the token as `Authorization: Bearer <token>`, which every agent accepts whatever
    /// its `token_header` (what one agent uses to call another).
    pub fn bearer(mut self) -> Result<AgentClient, ClientError> {
        let mut v = b"Bearer ".to_vec();
        v.extend_from_slice(self.token.as_bytes());
        let mut token = HeaderValue::from_bytes(&v).map_err(|_| ClientError::Token)?;
        token.set_sensitive(true);
        self.header = AUTHORIZATION;
        self.token = token;
        Ok(self)
    }

    /// The header the token goes in.
    pub fn header(&self) -> &str {
        self.header.as_str()
    }

    /// The agent's base URL.
    pub fn base(&self) -> &str {
        self.base.as_str()
    }

    fn url(&self, path: &str) -> Url {
        let mut u = self.base.clone();
        let joined = format!("{}{}", self.base.path().trim_end_matches('/'), path);
        u.set_path(&joined);
        u
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        query: Option<(&str, String)>,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, actix_web::web::Bytes), ClientError> {
        self.send_with(method, path, query, body, None).await
    }

    async fn send_with(
        &self,
        method: Method,
        path: &str,
        query: Option<(&str, String)>,
        body: Option<Vec<u8>>,
        timeout: Option<Duration>,
    ) -> Result<(StatusCode, actix_web::web::Bytes), ClientError> {
        let mut req = self
            .http
            .request(method.clone(), self.url(path))
            .header(self.header.clone(), self.token.clone());
        if let Some(q) = query {
            req = req.query(&[q]);
        }
        // Overrides the client's 60 s bound.
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        if let Some(b) = body {
            req = req.header(CONTENT_TYPE, "application/json").body(b);
        }
        let send_err = |source| ClientError::Send {
            method: method.clone(),
            path: path.to_owned(),
            source,
        };
        let resp = req.send().await.map_err(send_err)?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(send_err)?;
        Ok((status, bytes))
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: Option<(&str, String)>,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        let body = body.map(|b| serde_json::to_vec(b).unwrap_or_default());
        let (status, bytes) = self.send(method.clone(), path, query, body).await?;
        decode(&method, path, status, &bytes)
    }

    /// `GET /healthz`.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.call(Method::GET, "/healthz", None, None::<&()>).await
    }

    /// `GET /metrics` (Prometheus text).
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let (status, bytes) = self.send(Method::GET, "/metrics", None, None).await?;
        if !status.is_success() {
            return Err(api_error(&Method::GET, "/metrics", status, &bytes));
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// `GET /v1/instances`.
    pub async fn list_instances(&self) -> Result<Vec<Instance>, ClientError> {
        let l: InstanceList = self
            .call(Method::GET, "/v1/instances", None, None::<&()>)
            .await?;
        Ok(l.instances)
    }

    /// `GET /v1/instances/{uuid}`.
    pub async fn show_instance(&self, uuid: Uuid) -> Result<Instance, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/instances/{uuid}"),
            None,
            None::<&()>,
        )
        .await
    }

    /// `POST /v1/instances`: the operation to poll.
    pub async fn create_instance(&self, req: &CreateInstance) -> Result<OpStatus, ClientError> {
        let a: Accepted = self
            .call(Method::POST, "/v1/instances", None, Some(req))
            .await?;
        Ok(a.operation)
    }

    /// `DELETE /v1/instances/{uuid}`; `deallocate_network` false keeps the ports.
    pub async fn delete_instance(
        &self,
        uuid: Uuid,
        deallocate_network: bool,
    ) -> Result<OpStatus, ClientError> {
        let q = (!deallocate_network).then(|| ("deallocate_network", "false".to_owned()));
        let a: Accepted = self
            .call(
                Method::DELETE,
                &format!("/v1/instances/{uuid}"),
                q,
                None::<&()>,
            )
            .await?;
        Ok(a.operation)
    }

    /// `POST /v1/instances/{uuid}/action`.
    pub async fn action(&self, uuid: Uuid, action: &Operation) -> Result<OpStatus, ClientError> {
        let a: Accepted = self
            .call(
                Method::POST,
                &format!("/v1/instances/{uuid}/action"),
                None,
                Some(action),
            )
            .await?;
        Ok(a.operation)
    }

    /// `GET /v1/operations/{id}`.
    pub async fn operation(&self, id: Uuid) -> Result<OpStatus, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/operations/{id}"),
            None,
            None::<&()>,
        )
        .await
    }

    /// `GET /v1/operations[?instance=UUID]`.
    pub async fn operations(&self, instance: Option<Uuid>) -> Result<Vec<OpStatus>, ClientError> {
        let q = instance.map(|u| ("instance", u.to_string()));
        let l: OperationList = self
            .call(Method::GET, "/v1/operations", q, None::<&()>)
            .await?;
        Ok(l.operations)
    }

    /// `POST /v2.1/os-server-external-events` with `events`.
    pub async fn send_events(&self, events: &[ExternalEvent]) -> Result<EventsReply, ClientError> {
        let body = serde_json::json!({ "events": events });
        self.send_events_raw(serde_json::to_vec(&body).unwrap_or_default())
            .await
    }

    /// `POST /v2.1/os-server-external-events` with a body as given.
    pub async fn send_events_raw(&self, body: Vec<u8>) -> Result<EventsReply, ClientError> {
        let path = "/v2.1/os-server-external-events";
        let (status, bytes) = self.send(Method::POST, path, None, Some(body)).await?;
        let answer: EventsAnswer = decode(&Method::POST, path, status, &bytes)?;
        Ok(EventsReply {
            status: status.as_u16(),
            events: answer.events,
        })
    }

    /// `POST /v1/instances/{uuid}/half`: run one host's half of a move on the agent's host
    /// and wait for it, at most `timeout` (the request then fails with
    /// [`ClientError::Send`]).
    pub async fn host_half(
        &self,
        uuid: Uuid,
        request: &Operation,
        timeout: Duration,
    ) -> Result<HalfReply, ClientError> {
        let path = format!("/v1/instances/{uuid}/half");
        let body = serde_json::to_vec(request).unwrap_or_default();
        let (status, bytes) = self
            .send_with(Method::POST, &path, None, Some(body), Some(timeout))
            .await?;
        decode(&Method::POST, &path, status, &bytes)
    }

    /// Poll operation `id` every `every` until it is no longer running. `progress` is called
    /// with the operation and, while it runs, the instance (its step and awaited events)
    /// after every poll.
    pub async fn wait(
        &self,
        id: Uuid,
        every: Duration,
        mut progress: impl FnMut(&OpStatus, Option<&Instance>),
    ) -> Result<OpStatus, ClientError> {
        loop {
            let op = self.operation(id).await?;
            if op.state != OpState::Running {
                progress(&op, None);
                return Ok(op);
            }
            let inst = self.show_instance(op.instance).await.ok();
            progress(&op, inst.as_ref());
            tokio::time::sleep(every).await;
        }
    }
}

/// A Nova fault body's name and message.
fn nova_fault(bytes: &[u8]) -> Option<(String, String)> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let obj = v.as_object().filter(|o| o.len() == 1)?;
    let (name, detail) = obj.iter().next()?;
    let message = detail.get("message")?.as_str()?.to_owned();
    Some((name.clone(), message))
}

fn api_error(method: &Method, path: &str, status: StatusCode, bytes: &[u8]) -> ClientError {
    let (code, message) = match serde_json::from_slice::<ErrorBody>(bytes) {
        Ok(b) => (b.error.code, b.error.message),
        // The events endpoint answers as Nova: `{"badRequest": {"code": 400, "message"}}`.
        Err(_) => match nova_fault(bytes) {
            Some(fault) => fault,
            None => (
                "unknown".to_owned(),
                String::from_utf8_lossy(bytes).chars().take(200).collect(),
            ),
        },
    };
    ClientError::Api {
        method: method.clone(),
        path: path.to_owned(),
        status: status.as_u16(),
        code,
        message,
    }
}

fn decode<T: DeserializeOwned>(
    method: &Method,
    path: &str,
    status: StatusCode,
    bytes: &[u8],
) -> Result<T, ClientError> {
    if !status.is_success() {
        return Err(api_error(method, path, status, bytes));
    }
    serde_json::from_slice(bytes).map_err(|source| ClientError::Decode {
        method: method.clone(),
        path: path.to_owned(),
        status: status.as_u16(),
        source,
    })
}

/// Pretty JSON of any answer (for `--json`).
pub fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| Value::Null.to_string())
}
