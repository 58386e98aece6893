//! The Neutron client's HTTP behaviour against a small scripted HTTP server on loopback
//! (port 0): 404/409 mapping, retries (which methods, which failures, how many), timeouts,
//! connection failures, noauth and Keystone auth with one re-authentication on 401, request
//! shapes, and allocate's cleanup over HTTP.

// The whole file is test code (clippy only exempts `#[test]` functions themselves).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;
use vireo::network::neutron::{Auth, Interface, NeutronClient, NeutronConfig};
use vireo_actors::network::{
    Failure, NetworkApi, NetworkError, NewBinding, PortRequest, PortUpdate, Removal,
};
use vireo_actors::vif::PortId;

/// One request the server got.
#[derive(Debug, Clone)]
struct Req {
    method: String,
    /// Path and query.
    target: String,
    headers: HashMap<String, String>,
    body: Value,
}

impl Req {
    fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }
}

/// What the server answers.
enum Reply {
    Json(u16, Value),
    JsonWithHeader(u16, Value, &'static str, String),
    Raw(u16, String),
    Empty(u16),
    /// Never answer.
    Hang,
    /// Close the connection without answering.
    Close,
}

type Handler = Arc<dyn Fn(&Req, usize) -> Reply + Send + Sync>;

/// A scripted HTTP/1.1 server. The handler gets the request and how many requests with the
/// same method and path came before it.
struct Mock {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Req>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Mock {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Mock {
    async fn start(handler: impl Fn(&Req, usize) -> Reply + Send + Sync + 'static) -> Mock {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log: Arc<Mutex<Vec<Req>>> = Arc::default();
        let handler: Handler = Arc::new(handler);
        let log2 = log.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(stream, handler.clone(), log2.clone()));
            }
        });
        Mock { addr, log, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> Vec<Req> {
        self.log.lock().unwrap().clone()
    }

    fn count(&self, method: &str, path: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.method == method && r.path() == path)
            .count()
    }
}

async fn serve(stream: TcpStream, handler: Handler, log: Arc<Mutex<Vec<Req>>>) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_owned();
        let target = parts.next().unwrap_or_default().to_owned();
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).await.unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
            }
        }
        let len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        let body = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body)
                .unwrap_or(Value::String(String::from_utf8_lossy(&body).into_owned()))
        };
        let req = Req {
            method,
            target,
            headers,
            body,
        };
        let nth = {
            let mut log = log.lock().unwrap();
            let n = log
                .iter()
                .filter(|r| r.method == req.method && r.path() == req.path())
                .count();
            log.push(req.clone());
            n
        };
        let (status, extra, text) = match handler(&req, nth) {
            Reply::Json(s, v) => (s, None, v.to_string()),
            Reply::JsonWithHeader(s, v, k, hv) => (s, Some((k, hv)), v.to_string()),
            Reply::Raw(s, t) => (s, None, t),
            Reply::Empty(s) => (s, None, String::new()),
            Reply::Hang => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            }
            Reply::Close => return,
        };
        let mut out = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            text.len()
        );
        if let Some((k, v)) = extra {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.push_str(&text);
        if reader.get_mut().write_all(out.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn neutron_error(status: u16, kind: &str) -> Reply {
    Reply::Json(
        status,
        json!({"NeutronError": {"type": kind, "message": format!("{kind} happened"), "detail": ""}}),
    )
}

const PORT: &str = "3b2c4d5e-0000-4000-8000-000000000001";
const NET: &str = "5f0c7e2a-0000-4000-8000-000000000001";

fn pid() -> PortId {
    PORT.parse().unwrap()
}

fn port_json(id: &str, host: &str, vif_type: &str) -> Value {
    json!({
        "id": id,
        "network_id": NET,
        "mac_address": "fa:16:3e:11:22:33",
        "device_id": "",
        "device_owner": "",
        "status": "DOWN",
        "admin_state_up": true,
        "binding:host_id": host,
        "binding:vif_type": vif_type,
        "binding:vnic_type": "normal",
        "binding:vif_details": {},
        "binding:profile": {},
        "fixed_ips": [],
    })
}

fn config(mock: &Mock) -> NeutronConfig {
    let mut c = NeutronConfig::new(mock.url());
    c.retry_backoff_ms = 5;
    c.max_backoff_ms = 20;
    c.max_retries = 2;
    c.request_timeout_ms = 2_000;
    c
}

fn client(mock: &Mock) -> NeutronClient {
    NeutronClient::new(config(mock)).unwrap()
}

fn port_path() -> String {
    format!("/v2.0/ports/{PORT}")
}

#[tokio::test]
async fn not_found_and_conflict_map_to_typed_errors() {
    let mock = Mock::start(|req, _| {
        let p = req.path();
        match (req.method.as_str(), p) {
            ("POST", p) if p.ends_with("/bindings") => {
                neutron_error(409, "PortBindingAlreadyExists")
            }
            ("PUT", p) if p.ends_with("/h1/activate") => {
                neutron_error(409, "PortBindingAlreadyActive")
            }
            ("PUT", p) if p.ends_with("/activate") => neutron_error(404, "PortBindingNotFound"),
            ("GET", "/v2.0/networks/missing") => neutron_error(404, "NetworkNotFound"),
            _ => neutron_error(404, "PortNotFound"),
        }
    })
    .await;
    let c = client(&mock);
    let p = pid();
    assert!(matches!(c.get_port(p).await, Err(NetworkError::PortNotFound { port }) if port == p));
    assert!(matches!(
        c.update_port(p, &PortUpdate::default()).await,
        Err(NetworkError::PortNotFound { .. })
    ));
    assert_eq!(c.delete_port(p).await.unwrap(), Removal::AlreadyGone);
    assert!(matches!(
        c.show_bindings(p).await,
        Err(NetworkError::PortNotFound { .. })
    ));
    assert_eq!(
        c.delete_binding(p, "h2").await.unwrap(),
        Removal::AlreadyGone
    );
    let err = c
        .create_binding(
            p,
            &NewBinding {
                host: "h2".into(),
                ..NewBinding::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, NetworkError::BindingExists { port, host } if *port == p && host == "h2"),
        "{err:?}"
    );
    let err = c.activate_binding(p, "h1").await.unwrap_err();
    assert!(
        matches!(err, NetworkError::BindingAlreadyActive { .. }),
        "{err:?}"
    );
    let err = c.activate_binding(p, "h3").await.unwrap_err();
    assert!(
        matches!(&err, NetworkError::BindingNotFound { host, .. } if host == "h3"),
        "{err:?}"
    );
    assert!(matches!(
        c.get_network("missing").await,
        Err(NetworkError::NetworkNotFound { network }) if network == "missing"
    ));
    // None of these is retried.
    assert_eq!(mock.count("GET", &port_path()), 1);
    assert_eq!(mock.count("DELETE", &port_path()), 1);
}

#[tokio::test]
async fn idempotent_requests_are_retried_on_5xx_then_succeed() {
    let mock = Mock::start(|req, nth| match req.method.as_str() {
        "GET" | "PUT" if nth < 2 => neutron_error(503, "ServiceUnavailable"),
        "GET" | "PUT" => Reply::Json(200, json!({"port": port_json(PORT, "h1", "ovs")})),
        "DELETE" if nth < 1 => Reply::Raw(502, "<html>bad gateway</html>".into()),
        "DELETE" => Reply::Empty(204),
        _ => Reply::Empty(500),
    })
    .await;
    let c = client(&mock);
    let port = c.get_port(pid()).await.unwrap();
    assert_eq!(port.host_id, "h1");
    assert_eq!(mock.count("GET", &port_path()), 3);
    c.update_port(
        pid(),
        &PortUpdate {
            host_id: Some("h1".into()),
            ..PortUpdate::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(mock.count("PUT", &port_path()), 3);
    assert_eq!(c.delete_port(pid()).await.unwrap(), Removal::Deleted);
    assert_eq!(mock.count("DELETE", &port_path()), 2);
}

#[tokio::test]
async fn retries_are_bounded_and_the_error_carries_port_and_status() {
    let mock = Mock::start(|_, _| neutron_error(500, "InternalError")).await;
    let c = client(&mock);
    let err = c
        .update_port(pid(), &PortUpdate::default())
        .await
        .unwrap_err();
    let NetworkError::UpdatePort { port, failure, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*port, pid());
    assert_eq!(*failure, Failure::Status(500));
    assert!(err.is_retryable());
    assert_eq!(err.http_status(), Some(500));
    let text = err.to_string();
    assert!(text.contains(PORT) && text.contains("HTTP 500"), "{text}");
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert!(source.contains("InternalError happened"), "{source}");
    assert_eq!(mock.count("PUT", &port_path()), 3, "1 try + max_retries 2");
}

#[tokio::test]
async fn post_and_activation_are_never_retried_and_4xx_never() {
    let mock = Mock::start(|req, _| match req.method.as_str() {
        "POST" => neutron_error(503, "ServiceUnavailable"),
        "PUT" if req.path().ends_with("/activate") => neutron_error(500, "InternalError"),
        _ => neutron_error(400, "BadRequest"),
    })
    .await;
    let c = client(&mock);
    let err = c.create_port(NET).await.unwrap_err();
    assert!(
        matches!(&err, NetworkError::CreatePort { network, failure: Failure::Status(503), .. } if network == NET),
        "{err:?}"
    );
    assert_eq!(mock.count("POST", "/v2.0/ports"), 1);
    let err = c
        .create_binding(
            pid(),
            &NewBinding {
                host: "h2".into(),
                ..NewBinding::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            NetworkError::CreateBinding {
                failure: Failure::Status(503),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(mock.count("POST", &format!("{}/bindings", port_path())), 1);
    let err = c.activate_binding(pid(), "h2").await.unwrap_err();
    assert!(
        matches!(&err, NetworkError::ActivateBinding { failure: Failure::Status(500), host, .. } if host == "h2"),
        "{err:?}"
    );
    assert_eq!(
        mock.count("PUT", &format!("{}/bindings/h2/activate", port_path())),
        1
    );
    let err = c.get_port(pid()).await.unwrap_err();
    assert!(
        matches!(
            &err,
            NetworkError::GetPort {
                failure: Failure::Status(400),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    assert_eq!(mock.count("GET", &port_path()), 1);
}

#[tokio::test]
async fn binding_error_from_neutron_is_binding_failed() {
    let mock = Mock::start(|_, _| neutron_error(500, "PortBindingError")).await;
    let c = client(&mock);
    let err = c
        .create_binding(
            pid(),
            &NewBinding {
                host: "h9".into(),
                ..NewBinding::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, NetworkError::BindingFailed { host, vif_type, .. } if host == "h9" && vif_type == "binding_failed"),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_request_that_hangs_times_out_and_is_retried() {
    let mock = Mock::start(|_, _| Reply::Hang).await;
    let mut cfg = config(&mock);
    cfg.request_timeout_ms = 150;
    cfg.max_retries = 1;
    let c = NeutronClient::new(cfg).unwrap();
    let err = c.get_port(pid()).await.unwrap_err();
    assert!(
        matches!(
            &err,
            NetworkError::GetPort {
                failure: Failure::Timeout,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(err.http_status(), None);
    assert_eq!(mock.count("GET", &port_path()), 2);
}

#[tokio::test]
async fn a_dropped_connection_is_retried_for_idempotent_requests() {
    let mock = Mock::start(|_, nth| {
        if nth == 0 {
            Reply::Close
        } else {
            Reply::Json(200, json!({"port": port_json(PORT, "", "unbound")}))
        }
    })
    .await;
    let c = client(&mock);
    c.get_port(pid()).await.unwrap();
    assert_eq!(mock.count("GET", &port_path()), 2);
}

#[tokio::test]
async fn connection_refused_is_a_connect_failure() {
    // A port that was free a moment ago and has no listener now.
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = NeutronConfig::new(format!("http://{addr}"));
    cfg.retry_backoff_ms = 1;
    cfg.max_retries = 1;
    let c = NeutronClient::new(cfg).unwrap();
    let err = c.list_instance_ports(Uuid::nil()).await.unwrap_err();
    assert!(
        matches!(
            &err,
            NetworkError::ListPorts {
                failure: Failure::Connect,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_retryable());
}

#[tokio::test]
async fn a_bad_answer_is_a_bad_response() {
    let mock = Mock::start(|req, _| {
        if req.path().starts_with("/v2.0/networks") {
            Reply::Raw(200, "not json".into())
        } else {
            Reply::Json(200, json!({"port": {"id": PORT}}))
        }
    })
    .await;
    let c = client(&mock);
    let err = c.get_port(pid()).await.unwrap_err();
    assert!(
        matches!(
            &err,
            NetworkError::GetPort {
                failure: Failure::BadResponse,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    let err = c.get_network(NET).await.unwrap_err();
    assert!(
        matches!(
            &err,
            NetworkError::GetNetwork {
                failure: Failure::BadResponse,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn noauth_sends_no_token_nor_project_header_and_puts_the_project_in_the_body() {
    let mock = Mock::start(|req, _| match req.method.as_str() {
        "POST" => Reply::Json(201, json!({"port": port_json(PORT, "", "unbound")})),
        _ => Reply::Json(200, json!({"ports": []})),
    })
    .await;
    let mut cfg = config(&mock);
    cfg.auth = Auth::Noauth {
        project_id: Some("proj-1".into()),
    };
    let c = NeutronClient::new(cfg).unwrap();
    c.create_port(NET).await.unwrap();
    let vm = Uuid::new_v4();
    assert!(c.list_instance_ports(vm).await.unwrap().is_empty());
    let reqs = mock.requests();
    for r in &reqs {
        assert!(!r.headers.contains_key("x-auth-token"), "{r:?}");
        assert!(!r.headers.contains_key("x-project-id"), "{r:?}");
    }
    assert_eq!(
        reqs[0].body,
        json!({"port": {"network_id": NET, "admin_state_up": true, "project_id": "proj-1"}})
    );
    assert_eq!(reqs[1].target, format!("/v2.0/ports?device_id={vm}"));
}

#[tokio::test]
async fn request_shapes_for_updates_and_bindings() {
    let mock = Mock::start(|req, _| {
        let p = req.path().to_owned();
        match req.method.as_str() {
            // Neutron answers the activate member action with the bare binding.
            "PUT" if p.ends_with("/activate") => Reply::Json(
                200,
                json!({"host": "h2", "vif_type": "ovs", "vnic_type": "normal",
                    "vif_details": {}, "profile": {}, "status": "ACTIVE"}),
            ),
            "PUT" => Reply::Json(200, json!({"port": port_json(PORT, "h1", "ovs")})),
            "POST" => Reply::Json(
                201,
                json!({"binding": {"host": "h2", "vif_type": "ovs", "vnic_type": "direct",
                    "vif_details": {"port_filter": true}, "profile": {"a": 1}, "status": "INACTIVE"}}),
            ),
            "GET" => Reply::Json(
                200,
                json!({"bindings": [
                    {"host": "h1", "vif_type": "ovs", "vnic_type": "normal", "vif_details": {},
                     "profile": {}, "status": "ACTIVE"},
                    {"host": "h2", "vif_type": "ovs", "vnic_type": "normal", "vif_details": {},
                     "profile": {}, "status": "INACTIVE"}]}),
            ),
            "DELETE" => Reply::Empty(204),
            _ => Reply::Empty(500),
        }
    })
    .await;
    let c = client(&mock);
    let mut profile = serde_json::Map::new();
    profile.insert("migrating_to".into(), json!("h2"));
    c.update_port(
        pid(),
        &PortUpdate {
            host_id: Some("h1".into()),
            profile: Some(profile.clone()),
            device_id: Some("vm".into()),
            device_owner: Some("compute:nova".into()),
            vnic_type: None,
        },
    )
    .await
    .unwrap();
    let b = c
        .create_binding(
            pid(),
            &NewBinding {
                host: "h2".into(),
                vnic_type: Some(vireo_actors::vif::VnicType::Direct),
                profile: Some(profile),
            },
        )
        .await
        .unwrap();
    assert_eq!(b.vnic_type, vireo_actors::vif::VnicType::Direct);
    c.activate_binding(pid(), "h2").await.unwrap();
    assert_eq!(
        c.delete_binding(pid(), "h2").await.unwrap(),
        Removal::Deleted
    );
    // The active binding is refused without a DELETE.
    let err = c.delete_binding(pid(), "h1").await.unwrap_err();
    assert!(
        matches!(err, NetworkError::DeleteActiveBinding { .. }),
        "{err:?}"
    );

    let reqs = mock.requests();
    let shape: Vec<(String, String)> = reqs
        .iter()
        .map(|r| (r.method.clone(), r.target.clone()))
        .collect();
    let base = port_path();
    assert_eq!(
        shape,
        vec![
            ("PUT".into(), base.clone()),
            ("POST".into(), format!("{base}/bindings")),
            ("PUT".into(), format!("{base}/bindings/h2/activate")),
            ("GET".into(), format!("{base}/bindings")),
            ("DELETE".into(), format!("{base}/bindings/h2")),
            ("GET".into(), format!("{base}/bindings")),
        ]
    );
    assert_eq!(
        reqs[0].body,
        json!({"port": {"binding:host_id": "h1", "binding:profile": {"migrating_to": "h2"},
            "device_id": "vm", "device_owner": "compute:nova"}})
    );
    assert_eq!(
        reqs[1].body,
        json!({"binding": {"host": "h2", "vnic_type": "direct", "profile": {"migrating_to": "h2"}}})
    );
    assert_eq!(reqs[2].body, Value::Null);
}

fn keystone_token_reply(token: String) -> Reply {
    Reply::JsonWithHeader(
        201,
        json!({"token": {"expires_at": "2099-01-01T00:00:00.000000Z", "catalog": []}}),
        "X-Subject-Token",
        token,
    )
}

#[tokio::test]
async fn keystone_token_is_cached_and_renewed_once_on_401() {
    // Tokens tok-0, tok-1, ...; Neutron accepts only the newest one.
    let issued = Arc::new(Mutex::new(0usize));
    let issued2 = issued.clone();
    let mock = Mock::start(move |req, nth| {
        if req.path() == "/identity/v3/auth/tokens" {
            *issued2.lock().unwrap() = nth + 1;
            return keystone_token_reply(format!("tok-{nth}"));
        }
        let current = format!("tok-{}", issued2.lock().unwrap().saturating_sub(1));
        match req.headers.get("x-auth-token") {
            Some(t) if *t == current => {
                Reply::Json(200, json!({"port": port_json(PORT, "h1", "ovs")}))
            }
            _ => Reply::Json(401, json!({"error": "unauthorized"})),
        }
    })
    .await;
    let mut cfg = config(&mock);
    cfg.auth = Auth::Keystone {
        auth_url: format!("{}/identity", mock.url()),
        username: "vireo".into(),
        password: "pw".into(),
        project: "service".into(),
        domain: "Default".into(),
    };
    let c = NeutronClient::new(cfg).unwrap();
    c.get_port(pid()).await.unwrap();
    c.get_port(pid()).await.unwrap();
    assert_eq!(
        mock.count("POST", "/identity/v3/auth/tokens"),
        1,
        "token cached"
    );
    let auth = &mock.requests()[0];
    assert_eq!(
        auth.body["auth"]["identity"]["password"]["user"],
        json!({"name": "vireo", "domain": {"name": "Default"}, "password": "pw"})
    );
    assert_eq!(
        auth.body["auth"]["scope"]["project"],
        json!({"name": "service", "domain": {"name": "Default"}})
    );

    // The token expires (Keystone issued a newer one elsewhere): one 401, one new token.
    *issued.lock().unwrap() += 1;
    c.get_port(pid()).await.unwrap();
    assert_eq!(mock.count("POST", "/identity/v3/auth/tokens"), 2);
    assert_eq!(mock.count("GET", &port_path()), 4);
}

#[tokio::test]
async fn keystone_persistent_401_and_refused_credentials() {
    let mock = Mock::start(|req, nth| {
        if req.path() == "/v3/auth/tokens" {
            if req.body["auth"]["identity"]["password"]["user"]["password"] == json!("bad") {
                return Reply::Json(401, json!({"error": {"message": "The request you have made requires authentication."}}));
            }
            return keystone_token_reply(format!("tok-{nth}"));
        }
        Reply::Json(401, json!({"error": "unauthorized"}))
    })
    .await;
    let keystone = |password: &str| {
        let mut cfg = config(&mock);
        cfg.auth = Auth::Keystone {
            auth_url: mock.url(),
            username: "vireo".into(),
            password: password.into(),
            project: "service".into(),
            domain: "Default".into(),
        };
        NeutronClient::new(cfg).unwrap()
    };
    let c = keystone("good");
    let err = c.get_port(pid()).await.unwrap_err();
    assert!(
        matches!(
            &err,
            NetworkError::GetPort {
                failure: Failure::Status(401),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        mock.count("POST", "/v3/auth/tokens"),
        2,
        "one re-authentication"
    );
    assert_eq!(mock.count("GET", &port_path()), 2);

    let c = keystone("bad");
    let err = c.delete_port(pid()).await.unwrap_err();
    assert!(
        matches!(
            &err,
            NetworkError::Authenticate {
                failure: Failure::Status(401),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(mock.count("DELETE", &port_path()), 0);
}

/// Without `url`, Neutron comes from Keystone's catalog: the configured region, the first of
/// `valid_interfaces` the catalog has; an application credential authenticates.
#[tokio::test]
async fn neutron_is_found_in_the_catalog_by_region_and_interface() {
    let base = Arc::new(Mutex::new(String::new()));
    let base2 = base.clone();
    let mock = Mock::start(move |req, _| {
        if req.path() == "/v3/auth/tokens" {
            let b = base2.lock().unwrap().clone();
            let ep = |region: &str, interface: &str| {
                json!({"region_id": region, "region": region, "interface": interface,
                       "url": format!("{b}/{interface}-{region}")})
            };
            return Reply::JsonWithHeader(
                201,
                json!({"token": {"expires_at": "2099-01-01T00:00:00.000000Z", "catalog": [
                    {"type": "identity", "name": "keystone", "endpoints": [ep("r1", "public")]},
                    {"type": "network", "name": "neutron", "endpoints": [
                        ep("r1", "public"), ep("r2", "internal"), ep("r2", "public"),
                        ep("r1", "internal"), ep("r1", "admin")]},
                ]}}),
                "X-Subject-Token",
                "tok".into(),
            );
        }
        match req.headers.get("x-auth-token").map(String::as_str) {
            Some("tok") => Reply::Json(200, json!({"port": port_json(PORT, "h1", "ovs")})),
            _ => Reply::Json(401, json!({"error": "unauthorized"})),
        }
    })
    .await;
    *base.lock().unwrap() = mock.url();
    let client = |region: &str, interfaces: Vec<Interface>| {
        let mut cfg = config(&mock);
        cfg.url = String::new();
        cfg.region_name = Some(region.to_owned());
        cfg.valid_interfaces = interfaces;
        cfg.auth = Auth::ApplicationCredential {
            auth_url: mock.url(),
            id: "app-cred-id".into(),
            secret: "app-cred-secret".into(),
        };
        NeutronClient::new(cfg).unwrap()
    };
    // Nova's default order: internal, then public.
    client("r1", vec![Interface::Internal, Interface::Public])
        .get_port(pid())
        .await
        .unwrap();
    assert_eq!(
        mock.count("GET", &format!("/internal-r1{}", port_path())),
        1
    );
    client("r2", vec![Interface::Public])
        .get_port(pid())
        .await
        .unwrap();
    assert_eq!(mock.count("GET", &format!("/public-r2{}", port_path())), 1);
    client("r1", vec![Interface::Admin, Interface::Internal])
        .get_port(pid())
        .await
        .unwrap();
    assert_eq!(mock.count("GET", &format!("/admin-r1{}", port_path())), 1);
    let auth = mock
        .requests()
        .into_iter()
        .find(|r| r.path() == "/v3/auth/tokens")
        .unwrap();
    assert_eq!(
        auth.body["auth"]["identity"],
        json!({"methods": ["application_credential"],
               "application_credential": {"id": "app-cred-id", "secret": "app-cred-secret"}})
    );
    // A region with no Neutron: the operation fails as an authentication failure, named.
    let err = client("r3", vec![Interface::Public])
        .get_port(pid())
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            NetworkError::Authenticate {
                failure: Failure::Status(404),
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn allocate_over_http_deletes_the_port_it_created_when_binding_fails() {
    let created = "3b2c4d5e-0000-4000-8000-0000000000aa";
    let mock = Mock::start(move |req, _| {
        let p = req.path();
        match req.method.as_str() {
            "GET" if p.starts_with("/v2.0/networks/") => Reply::Json(
                200,
                json!({"network": {"id": NET, "name": "n", "mtu": 1450, "project_id": "p"}}),
            ),
            "POST" => Reply::Json(201, json!({"port": port_json(created, "", "unbound")})),
            "PUT" => Reply::Json(
                200,
                json!({"port": port_json(created, "h9", "binding_failed")}),
            ),
            "DELETE" => Reply::Empty(204),
            _ => Reply::Empty(500),
        }
    })
    .await;
    let c = client(&mock);
    let err = c
        .allocate_for_instance(
            Uuid::new_v4(),
            "h9",
            &[PortRequest::Network {
                network_id: NET.into(),
            }],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, NetworkError::BindingFailed { vif_type, .. } if vif_type == "binding_failed"),
        "{err:?}"
    );
    assert_eq!(mock.count("DELETE", &format!("/v2.0/ports/{created}")), 1);
}
