//! A small OVSDB client (RFC 7047 JSON-RPC over ovsdb-server's unix socket or TCP, tokio) and
//! the Open_vSwitch operations the plugger and the watcher need.
//!
//! Where ovsdb-server is: [`OvsdbAddr`], written as OVS writes its remotes (`unix:PATH`,
//! `tcp:HOST:PORT`; os-vif's default `ovsdb_connection` is `tcp:127.0.0.1:6640`), or a bare
//! absolute path for a unix socket.
//!
//! [`OvsdbClient`] multiplexes concurrent requests on one connection, answers the server's
//! `echo`, and hands `update` notifications of monitors to a channel. [`Vswitch`] builds on it:
//! one transaction per plug (ensure bridge + add port + Interface `external_ids` +
//! `mtu_request` + `next_cfg` bump), one per unplug, and waits for ovs-vswitchd to apply a
//! configuration (`cur_cfg` reaching the transaction's `next_cfg`, as `ovs-vsctl` does).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// The database vireo talks to.
pub const DB: &str = "Open_vSwitch";

/// Where ovsdb-server listens (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OvsdbAddr {
    /// `unix:PATH` (or a bare absolute path).
    Unix(PathBuf),
    /// `tcp:HOST:PORT` (`tcp:[v6]:PORT` for an IPv6 address).
    Tcp {
        /// Host name or address (without brackets).
        host: String,
        /// Port.
        port: u16,
    },
}

/// An OVSDB address that is not `unix:PATH`, `tcp:HOST:PORT` or an absolute path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an OVSDB address (unix:PATH, tcp:HOST:PORT or an absolute path)")]
pub struct BadOvsdbAddr(pub String);

impl FromStr for OvsdbAddr {
    type Err = BadOvsdbAddr;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadOvsdbAddr(s.to_owned());
        if let Some(path) = s.strip_prefix("unix:") {
            return if path.starts_with('/') {
                Ok(OvsdbAddr::Unix(PathBuf::from(path)))
            } else {
                Err(bad())
            };
        }
        if let Some(rest) = s.strip_prefix("tcp:") {
            let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
            let host = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            let port: u16 = port.parse().map_err(|_| bad())?;
            if host.is_empty() || port == 0 || host.contains(char::is_whitespace) {
                return Err(bad());
            }
            return Ok(OvsdbAddr::Tcp {
                host: host.to_owned(),
                port,
            });
        }
        if s.starts_with('/') {
            return Ok(OvsdbAddr::Unix(PathBuf::from(s)));
        }
        Err(bad())
    }
}

impl fmt::Display for OvsdbAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OvsdbAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            OvsdbAddr::Tcp { host, port } if host.contains(':') => {
                write!(f, "tcp:[{host}]:{port}")
            }
            OvsdbAddr::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
        }
    }
}

impl<'de> Deserialize<'de> for OvsdbAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl OvsdbAddr {
    /// The unix socket's path, if it is one.
    pub fn unix_path(&self) -> Option<&std::path::Path> {
        match self {
            OvsdbAddr::Unix(p) => Some(p),
            OvsdbAddr::Tcp { .. } => None,
        }
    }
}

type Reader = Box<dyn AsyncRead + Send + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// Open a connection to `addr`, split in halves.
async fn open(addr: &OvsdbAddr) -> io::Result<(Reader, Writer)> {
    match addr {
        OvsdbAddr::Unix(path) => {
            let (r, w) = UnixStream::connect(path).await?.into_split();
            Ok((Box::new(r), Box::new(w)))
        }
        OvsdbAddr::Tcp { host, port } => {
            let stream = TcpStream::connect((host.as_str(), *port)).await?;
            // Small request/answer messages: no Nagle delay.
            stream.set_nodelay(true)?;
            let (r, w) = stream.into_split();
            Ok((Box::new(r), Box::new(w)))
        }
    }
}

/// A failed OVSDB exchange.
#[derive(Debug, thiserror::Error)]
pub enum OvsdbError {
    /// Connecting to ovsdb-server failed.
    #[error("connect to {0}")]
    Connect(OvsdbAddr, #[source] io::Error),
    /// Writing a request failed.
    #[error("write to ovsdb-server")]
    Write(#[source] io::Error),
    /// The connection closed before the answer came.
    #[error("ovsdb-server connection closed")]
    Closed,
    /// ovsdb-server sent something that is not JSON-RPC.
    #[error("malformed message from ovsdb-server")]
    Malformed(#[source] serde_json::Error),
    /// A JSON-RPC level error.
    #[error("ovsdb-server refused {method}: {error}")]
    Rpc {
        /// The method.
        method: String,
        /// The error object as text.
        error: String,
    },
    /// One operation of a transaction failed (the transaction was not committed).
    #[error("operation {index} failed: {error} ({details})")]
    Operation {
        /// Position of the operation (or of the commit result).
        index: usize,
        /// OVSDB's error name (`constraint violation`, `timed out`, ...).
        error: String,
        /// Its details.
        details: String,
    },
    /// An answer had an unexpected shape.
    #[error("unexpected answer: {0}")]
    Unexpected(String),
    /// Waited too long.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

impl OvsdbError {
    /// A transaction that lost a race (index constraint, failed `wait`, stale row): retry.
    pub fn is_conflict(&self) -> bool {
        matches!(self, OvsdbError::Operation { error, .. }
            if error == "constraint violation" || error == "timed out"
                || error == "referential integrity violation")
    }
}

type Reply = Result<Value, OvsdbError>;
type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

/// One JSON-RPC connection to ovsdb-server. Cheap to clone; the reader task ends when the
/// last clone is dropped or the server closes the socket.
#[derive(Clone)]
pub struct OvsdbClient {
    inner: Arc<Inner>,
}

struct Inner {
    writer: Arc<tokio::sync::Mutex<Writer>>,
    pending: Pending,
    next_id: AtomicU64,
    reader: JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl fmt::Debug for OvsdbClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OvsdbClient")
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

impl OvsdbClient {
    /// Connect to ovsdb-server at `addr`. `update` notifications go to `notify`.
    pub async fn connect(
        addr: &OvsdbAddr,
        notify: Option<mpsc::UnboundedSender<Value>>,
    ) -> Result<Self, OvsdbError> {
        let (read, write) = open(addr)
            .await
            .map_err(|e| OvsdbError::Connect(addr.clone(), e))?;
        let writer = Arc::new(tokio::sync::Mutex::new(write));
        let pending: Pending = Arc::default();
        let reader = tokio::spawn(read_loop(read, writer.clone(), pending.clone(), notify));
        Ok(OvsdbClient {
            inner: Arc::new(Inner {
                writer,
                pending,
                next_id: AtomicU64::new(1),
                reader,
            }),
        })
    }

    /// True once the reader saw the connection end.
    pub fn is_closed(&self) -> bool {
        self.inner.reader.is_finished()
    }

    /// Call `method` with `params`; the `result` on success.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, OvsdbError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.inner.pending).insert(id, tx);
        if self.is_closed() {
            lock(&self.inner.pending).remove(&id);
            return Err(OvsdbError::Closed);
        }
        let msg = json!({"id": id, "method": method, "params": params});
        let mut bytes = serde_json::to_vec(&msg).map_err(OvsdbError::Malformed)?;
        bytes.push(b'\n');
        let written = {
            let mut w = self.inner.writer.lock().await;
            w.write_all(&bytes).await
        };
        if let Err(e) = written {
            lock(&self.inner.pending).remove(&id);
            return Err(OvsdbError::Write(e));
        }
        match rx.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(OvsdbError::Rpc { error, .. })) => Err(OvsdbError::Rpc {
                method: method.to_owned(),
                error,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(OvsdbError::Closed),
        }
    }

    /// Run a transaction on [`DB`]; the per-operation results. Any failed operation (or a
    /// failed commit) is an [`OvsdbError::Operation`].
    pub async fn transact(&self, ops: Vec<Value>) -> Result<Vec<Value>, OvsdbError> {
        let mut params = Vec::with_capacity(ops.len() + 1);
        params.push(json!(DB));
        params.extend(ops);
        let result = self.call("transact", Value::Array(params)).await?;
        let Value::Array(results) = result else {
            return Err(OvsdbError::Unexpected(result.to_string()));
        };
        for (index, r) in results.iter().enumerate() {
            if let Some(error) = r.get("error").and_then(Value::as_str) {
                return Err(OvsdbError::Operation {
                    index,
                    error: error.to_owned(),
                    details: r
                        .get("details")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                });
            }
        }
        Ok(results)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn read_loop(
    mut read: Reader,
    writer: Arc<tokio::sync::Mutex<Writer>>,
    pending: Pending,
    notify: Option<mpsc::UnboundedSender<Value>>,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    'outer: loop {
        let n = match read.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut stream = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
        let mut messages = Vec::new();
        loop {
            match stream.next() {
                Some(Ok(v)) => messages.push(v),
                Some(Err(e)) if e.is_eof() => break,
                Some(Err(_)) => break 'outer,
                None => break,
            }
        }
        let used = stream.byte_offset();
        buf.drain(..used);
        for msg in messages {
            dispatch(msg, &writer, &pending, notify.as_ref()).await;
        }
    }
    // Fail everything still waiting.
    for (_, tx) in lock(&pending).drain() {
        let _ = tx.send(Err(OvsdbError::Closed));
    }
}

async fn dispatch(
    msg: Value,
    writer: &tokio::sync::Mutex<Writer>,
    pending: &Pending,
    notify: Option<&mpsc::UnboundedSender<Value>>,
) {
    match msg.get("method").and_then(Value::as_str) {
        Some("echo") => {
            let reply = json!({"id": msg.get("id").cloned().unwrap_or(Value::Null),
                "result": msg.get("params").cloned().unwrap_or(json!([])), "error": null});
            if let Ok(mut bytes) = serde_json::to_vec(&reply) {
                bytes.push(b'\n');
                let mut w = writer.lock().await;
                let _ = w.write_all(&bytes).await;
            }
        }
        Some(_) => {
            if let Some(tx) = notify {
                let _ = tx.send(msg);
            }
        }
        None => {
            let Some(id) = msg.get("id").and_then(Value::as_u64) else {
                return;
            };
            let Some(tx) = lock(pending).remove(&id) else {
                return;
            };
            let reply = match msg.get("error") {
                Some(e) if !e.is_null() => Err(OvsdbError::Rpc {
                    method: String::new(),
                    error: e.to_string(),
                }),
                _ => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
            };
            let _ = tx.send(reply);
        }
    }
}

/// `["uuid", u]`.
pub fn uuid_ref(u: &str) -> Value {
    json!(["uuid", u])
}

/// An OVSDB map value from pairs.
pub fn map(pairs: &BTreeMap<String, String>) -> Value {
    json!([
        "map",
        pairs.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>()
    ])
}

/// Read an OVSDB map value (`["map", [[k, v], ...]]`) as string pairs.
pub fn read_map(v: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(pairs) = v.get(1).and_then(Value::as_array) {
        for p in pairs {
            if let (Some(k), Some(v)) = (
                p.get(0).and_then(Value::as_str),
                p.get(1).and_then(Value::as_str),
            ) {
                out.insert(k.to_owned(), v.to_owned());
            }
        }
    }
    out
}

/// Read an optional integer column (`5` or `["set", []]`).
pub fn read_opt_int(v: &Value) -> Option<i64> {
    v.as_i64()
}

/// Read a set-of-uuids column (`["uuid", u]` or `["set", [["uuid", u], ...]]`).
pub fn read_uuid_set(v: &Value) -> Vec<String> {
    match v.get(0).and_then(Value::as_str) {
        Some("uuid") => v
            .get(1)
            .and_then(Value::as_str)
            .map(|s| vec![s.to_owned()])
            .unwrap_or_default(),
        Some("set") => v
            .get(1)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|u| u.get(1).and_then(Value::as_str).map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn rows(result: &Value) -> Vec<Value> {
    result
        .get("rows")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn row_uuid(row: &Value) -> Option<String> {
    row.get("_uuid")
        .and_then(|u| u.get(1))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// An OVS port to ensure on a bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// Bridge name.
    pub bridge: String,
    /// Datapath type used when the bridge has to be created.
    pub datapath_type: String,
    /// Port and Interface name. `None` ensures only the bridge.
    pub port: Option<String>,
    /// Interface `external_ids` vireo owns (set on every plug, other keys are kept).
    pub external_ids: BTreeMap<String, String>,
    /// Interface `mtu_request`.
    pub mtu: Option<u32>,
}

/// What an ensure transaction changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ensured {
    /// The bridge was created.
    pub bridge_created: bool,
    /// The port was created (or moved from another bridge).
    pub port_created: bool,
    /// The `next_cfg` to wait for.
    pub cfg: i64,
}

/// An Interface's state after ovs-vswitchd applied the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceState {
    /// `ofport` (-1 = failed; `None` = not assigned).
    pub ofport: Option<i64>,
    /// The `error` column.
    pub error: Option<String>,
}

/// The Open_vSwitch operations of the plugger, on one connection that also monitors
/// `cur_cfg`.
#[derive(Debug)]
pub struct Vswitch {
    client: OvsdbClient,
    cur_cfg: watch::Receiver<i64>,
    cfg_task: JoinHandle<()>,
}

impl Drop for Vswitch {
    fn drop(&mut self) {
        self.cfg_task.abort();
    }
}

/// How many times a transaction that lost a race is retried.
const RETRIES: usize = 5;

impl Vswitch {
    /// Connect and start following `cur_cfg`.
    pub async fn connect(addr: &OvsdbAddr) -> Result<Self, OvsdbError> {
        let (ntx, mut nrx) = mpsc::unbounded_channel();
        let client = OvsdbClient::connect(addr, Some(ntx)).await?;
        let initial = client
            .call(
                "monitor",
                json!([DB, "cfg", {"Open_vSwitch": {"columns": ["cur_cfg"]}}]),
            )
            .await?;
        let (tx, cur_cfg) = watch::channel(cfg_of(&initial).unwrap_or(0));
        let cfg_task = tokio::spawn(async move {
            while let Some(n) = nrx.recv().await {
                let upd = n.get("params").and_then(|p| p.get(1));
                if let Some(c) = upd.and_then(cfg_of) {
                    tx.send_replace(c);
                }
            }
        });
        Ok(Vswitch {
            client,
            cur_cfg,
            cfg_task,
        })
    }

    /// True once the connection is gone (the plugger then reconnects).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// The raw client.
    pub fn client(&self) -> &OvsdbClient {
        &self.client
    }

    /// Ensure the bridge (created with `datapath_type` when missing) and, when `spec.port`
    /// is set, the port with its Interface on it, in one transaction. Re-plug updates the
    /// Interface in place (no new ofport); a port found on another bridge is moved.
    pub async fn ensure(&self, spec: &PortSpec) -> Result<Ensured, OvsdbError> {
        let mut attempt = 0;
        loop {
            match self.ensure_once(spec).await {
                Err(e) if e.is_conflict() && attempt < RETRIES => attempt += 1,
                other => return other,
            }
        }
    }

    async fn ensure_once(&self, spec: &PortSpec) -> Result<Ensured, OvsdbError> {
        let mut reads = vec![json!({"op": "select", "table": "Bridge", "where": [],
            "columns": ["_uuid", "name", "ports"]})];
        if let Some(p) = &spec.port {
            reads.push(json!({"op": "select", "table": "Port",
                "where": [["name", "==", p]], "columns": ["_uuid", "interfaces"]}));
            reads.push(json!({"op": "select", "table": "Interface",
                "where": [["name", "==", p]], "columns": ["_uuid"]}));
        }
        let r = self.client.transact(reads).await?;
        let bridges = r.first().map(rows).unwrap_or_default();
        let bridge = bridges
            .iter()
            .find(|b| b.get("name").and_then(Value::as_str) == Some(spec.bridge.as_str()));
        let bridge_uuid = bridge.and_then(row_uuid);
        let port_row = r.get(1).map(rows).and_then(|v| v.into_iter().next());
        let port_uuid = port_row.as_ref().and_then(row_uuid);
        let iface_uuid = r
            .get(2)
            .map(rows)
            .and_then(|v| v.into_iter().next())
            .as_ref()
            .and_then(row_uuid);
        // Which bridge holds the existing port, if any.
        let holder = port_uuid.as_ref().and_then(|pu| {
            bridges.iter().find(|b| {
                b.get("ports")
                    .map(read_uuid_set)
                    .is_some_and(|ps| ps.contains(pu))
            })
        });
        let holder_uuid = holder.and_then(row_uuid);

        let mut ops = Vec::new();
        let mut out = Ensured::default();
        let mut new_bridge_ports: Vec<Value> = Vec::new();
        // Checks appended before the writes so a stale read fails the transaction.
        let mut counted: Vec<usize> = Vec::new();

        let port_ifaces = port_row
            .as_ref()
            .and_then(|r| r.get("interfaces"))
            .map(read_uuid_set)
            .unwrap_or_default();
        let port_in_place = port_uuid.is_some()
            && iface_uuid.as_ref().is_some_and(|i| port_ifaces.contains(i))
            && holder_uuid.is_some()
            && holder_uuid == bridge_uuid;

        if let (Some(_), Some(pu)) = (&spec.port, &port_uuid) {
            if !port_in_place {
                // Remove the stale or misplaced port explicitly (its name is indexed); a
                // fresh one is inserted below.
                if let Some(hu) = &holder_uuid {
                    counted.push(ops.len());
                    ops.push(json!({"op": "mutate", "table": "Bridge",
                        "where": [["_uuid", "==", uuid_ref(hu)]],
                        "mutations": [["ports", "delete", ["set", [uuid_ref(pu)]]]]}));
                }
                counted.push(ops.len());
                ops.push(json!({"op": "delete", "table": "Port",
                    "where": [["_uuid", "==", uuid_ref(pu)]]}));
                for iu in &port_ifaces {
                    counted.push(ops.len());
                    ops.push(json!({"op": "delete", "table": "Interface",
                        "where": [["_uuid", "==", uuid_ref(iu)]]}));
                }
            }
        }

        if let Some(p) = &spec.port {
            if port_in_place {
                let iu = iface_uuid.clone().unwrap_or_default();
                let keys: Vec<&String> = spec.external_ids.keys().collect();
                counted.push(ops.len());
                ops.push(json!({"op": "mutate", "table": "Interface",
                "where": [["_uuid", "==", uuid_ref(&iu)]],
                "mutations": [
                    ["external_ids", "delete", ["set", keys]],
                    ["external_ids", "insert", map(&spec.external_ids)]
                ]}));
                let mtu = spec.mtu.map_or(json!(["set", []]), |m| json!(m));
                ops.push(json!({"op": "update", "table": "Interface",
                    "where": [["_uuid", "==", uuid_ref(&iu)]],
                    "row": {"mtu_request": mtu}}));
            } else {
                let mut iface = json!({"name": p, "external_ids": map(&spec.external_ids)});
                if let Some(m) = spec.mtu {
                    iface["mtu_request"] = json!(m);
                }
                ops.push(json!({"op": "insert", "table": "Interface", "row": iface,
                    "uuid-name": "viface"}));
                ops.push(json!({"op": "insert", "table": "Port",
                    "row": {"name": p, "interfaces": ["named-uuid", "viface"]},
                    "uuid-name": "vport"}));
                out.port_created = true;
                match &bridge_uuid {
                    Some(bu) => {
                        counted.push(ops.len());
                        ops.push(json!({"op": "mutate", "table": "Bridge",
                            "where": [["_uuid", "==", uuid_ref(bu)]],
                            "mutations": [["ports", "insert",
                                ["set", [["named-uuid", "vport"]]]]]}));
                    }
                    None => new_bridge_ports.push(json!(["named-uuid", "vport"])),
                }
            }
        }

        if bridge_uuid.is_none() {
            let b = &spec.bridge;
            ops.push(json!({"op": "insert", "table": "Interface",
                "row": {"name": b, "type": "internal"}, "uuid-name": "vbriface"}));
            ops.push(json!({"op": "insert", "table": "Port",
                "row": {"name": b, "interfaces": ["named-uuid", "vbriface"]},
                "uuid-name": "vbrport"}));
            new_bridge_ports.push(json!(["named-uuid", "vbrport"]));
            ops.push(json!({"op": "insert", "table": "Bridge",
                "row": {"name": b, "datapath_type": spec.datapath_type,
                        "ports": ["set", new_bridge_ports]},
                "uuid-name": "vbridge"}));
            ops.push(json!({"op": "mutate", "table": "Open_vSwitch", "where": [],
                "mutations": [["bridges", "insert", ["set", [["named-uuid", "vbridge"]]]]]}));
            out.bridge_created = true;
        }

        if ops.is_empty() {
            // Bridge-only ensure of an existing bridge: nothing to change or wait for.
            out.cfg = *self.cur_cfg.borrow();
            return Ok(out);
        }
        let cfg_index = ops.len() + 1;
        ops.push(json!({"op": "mutate", "table": "Open_vSwitch", "where": [],
            "mutations": [["next_cfg", "+=", 1]]}));
        ops.push(json!({"op": "select", "table": "Open_vSwitch", "where": [],
            "columns": ["next_cfg"]}));
        let results = self.client.transact(ops).await?;
        for i in counted {
            if results
                .get(i)
                .and_then(|r| r.get("count"))
                .and_then(Value::as_u64)
                != Some(1)
            {
                // A row read above vanished: the transaction is committed but incomplete.
                // Re-run; ensure is idempotent and will redo what is missing.
                return Err(OvsdbError::Operation {
                    index: i,
                    error: "timed out".into(),
                    details: "row changed under the transaction".into(),
                });
            }
        }
        out.cfg = results
            .get(cfg_index)
            .map(rows)
            .and_then(|r| {
                r.first()
                    .and_then(|x| x.get("next_cfg"))
                    .and_then(Value::as_i64)
            })
            .ok_or_else(|| OvsdbError::Unexpected("no next_cfg".into()))?;
        Ok(out)
    }

    /// Remove the port `name` from whatever bridge holds it. `Ok(None)` when there was no
    /// such port; otherwise the `next_cfg` to wait for.
    pub async fn delete_port(&self, name: &str) -> Result<Option<i64>, OvsdbError> {
        let r = self
            .client
            .transact(vec![json!({"op": "select", "table": "Port",
                "where": [["name", "==", name]], "columns": ["_uuid"]})])
            .await?;
        let Some(pu) = r
            .first()
            .map(rows)
            .and_then(|v| v.into_iter().next())
            .as_ref()
            .and_then(row_uuid)
        else {
            return Ok(None);
        };
        let results = self
            .client
            .transact(vec![
                json!({"op": "mutate", "table": "Bridge",
                    "where": [["ports", "includes", uuid_ref(&pu)]],
                    "mutations": [["ports", "delete", ["set", [uuid_ref(&pu)]]]]}),
                json!({"op": "mutate", "table": "Open_vSwitch", "where": [],
                    "mutations": [["next_cfg", "+=", 1]]}),
                json!({"op": "select", "table": "Open_vSwitch", "where": [],
                    "columns": ["next_cfg"]}),
            ])
            .await?;
        let cfg = results
            .get(2)
            .map(rows)
            .and_then(|r| {
                r.first()
                    .and_then(|x| x.get("next_cfg"))
                    .and_then(Value::as_i64)
            })
            .ok_or_else(|| OvsdbError::Unexpected("no next_cfg".into()))?;
        Ok(Some(cfg))
    }

    /// Remove the bridge `name` (and its ports). `Ok(None)` when there was none.
    pub async fn delete_bridge(&self, name: &str) -> Result<Option<i64>, OvsdbError> {
        let r = self
            .client
            .transact(vec![json!({"op": "select", "table": "Bridge",
                "where": [["name", "==", name]], "columns": ["_uuid"]})])
            .await?;
        let Some(bu) = r
            .first()
            .map(rows)
            .and_then(|v| v.into_iter().next())
            .as_ref()
            .and_then(row_uuid)
        else {
            return Ok(None);
        };
        let results = self
            .client
            .transact(vec![
                json!({"op": "mutate", "table": "Open_vSwitch", "where": [],
                    "mutations": [["bridges", "delete", ["set", [uuid_ref(&bu)]]],
                                  ["next_cfg", "+=", 1]]}),
                json!({"op": "select", "table": "Open_vSwitch", "where": [],
                    "columns": ["next_cfg"]}),
            ])
            .await?;
        Ok(results.get(1).map(rows).and_then(|r| {
            r.first()
                .and_then(|x| x.get("next_cfg"))
                .and_then(Value::as_i64)
        }))
    }

    /// Wait until ovs-vswitchd applied configuration `cfg` (`cur_cfg >= cfg`).
    pub async fn wait_applied(&self, cfg: i64, timeout: Duration) -> Result<(), OvsdbError> {
        let mut rx = self.cur_cfg.clone();
        let waited = tokio::time::timeout(timeout, rx.wait_for(|c| *c >= cfg))
            .await
            .map(|r| r.is_ok());
        match waited {
            Ok(true) => Ok(()),
            Ok(false) => Err(OvsdbError::Closed),
            Err(_) => Err(OvsdbError::Timeout(timeout)),
        }
    }

    /// The Interface `name`'s `ofport` and `error`, or `None` when there is no such row.
    pub async fn interface(&self, name: &str) -> Result<Option<InterfaceState>, OvsdbError> {
        let r = self
            .client
            .transact(vec![json!({"op": "select", "table": "Interface",
                "where": [["name", "==", name]], "columns": ["ofport", "error"]})])
            .await?;
        Ok(r.first()
            .map(rows)
            .and_then(|v| v.into_iter().next())
            .map(|row| InterfaceState {
                ofport: row.get("ofport").and_then(read_opt_int),
                error: row.get("error").and_then(Value::as_str).map(str::to_owned),
            }))
    }
}

fn cfg_of(update: &Value) -> Option<i64> {
    let rows = update.get("Open_vSwitch")?.as_object()?;
    rows.values().find_map(|r| {
        r.get("new")
            .and_then(|n| n.get("cur_cfg"))
            .and_then(Value::as_i64)
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn addresses_parse_as_ovs_writes_its_remotes() {
        let ok = [
            (
                "unix:/var/run/openvswitch/db.sock",
                "unix:/var/run/openvswitch/db.sock",
            ),
            ("/run/ovs/db.sock", "unix:/run/ovs/db.sock"),
            ("tcp:127.0.0.1:6640", "tcp:127.0.0.1:6640"),
            ("tcp:ovsdb.example:6641", "tcp:ovsdb.example:6641"),
            ("tcp:[::1]:6640", "tcp:[::1]:6640"),
        ];
        for (text, shown) in ok {
            let a: OvsdbAddr = text.parse().unwrap();
            assert_eq!(a.to_string(), shown, "{text}");
            assert_eq!(a.to_string().parse::<OvsdbAddr>().unwrap(), a);
        }
        assert_eq!(
            "tcp:[::1]:6640".parse::<OvsdbAddr>().unwrap(),
            OvsdbAddr::Tcp {
                host: "::1".into(),
                port: 6640
            }
        );
        for bad in [
            "",
            "db.sock",
            "unix:db.sock",
            "tcp:127.0.0.1",
            "tcp::6640",
            "tcp:h:0",
            "tcp:h:99999",
            "ssl:127.0.0.1:6640",
            "ptcp:6640",
        ] {
            assert!(bad.parse::<OvsdbAddr>().is_err(), "{bad:?}");
        }
    }

    use super::*;

    #[test]
    fn reads_ovsdb_values() {
        let m = json!([
            "map",
            [["iface-id", "p1"], ["attached-mac", "fa:16:3e:00:00:01"]]
        ]);
        let r = read_map(&m);
        assert_eq!(r.get("iface-id").map(String::as_str), Some("p1"));
        assert_eq!(
            map(&r),
            json!([
                "map",
                [["attached-mac", "fa:16:3e:00:00:01"], ["iface-id", "p1"]]
            ])
        );
        assert_eq!(read_opt_int(&json!(["set", []])), None);
        assert_eq!(read_opt_int(&json!(-1)), Some(-1));
        assert_eq!(read_uuid_set(&json!(["uuid", "a"])), vec!["a"]);
        assert_eq!(
            read_uuid_set(&json!(["set", [["uuid", "a"], ["uuid", "b"]]])),
            vec!["a", "b"]
        );
        assert!(read_uuid_set(&json!(["set", []])).is_empty());
    }

    #[test]
    fn cfg_from_monitor_update() {
        let u = json!({"Open_vSwitch": {"0f": {"new": {"cur_cfg": 42}}}});
        assert_eq!(cfg_of(&u), Some(42));
        assert_eq!(cfg_of(&json!({})), None);
    }

    #[tokio::test]
    async fn a_dead_server_socket_is_a_connect_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = OvsdbClient::connect(&OvsdbAddr::Unix(dir.path().join("nope.sock")), None)
            .await
            .unwrap_err();
        assert!(matches!(err, OvsdbError::Connect(..)));
    }

    /// A fake server on a socketpair: checks framing of messages split across reads, echo
    /// answers, notification routing and concurrent replies out of order.
    #[tokio::test]
    async fn framing_echo_and_out_of_order_replies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let mut reqs = Vec::new();
            while reqs.len() < 2 {
                let n = s.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
                let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
                reqs.clear();
                for v in it.by_ref() {
                    match v {
                        Ok(v) => reqs.push(v),
                        Err(_) => break,
                    }
                }
            }
            // An echo request, a notification, then the replies in reverse order, split in
            // the middle of a message.
            let mut out = Vec::new();
            out.extend(br#"{"id":"echo","method":"echo","params":[]}"#);
            out.extend(br#"{"id":null,"method":"update","params":["x",{}]}"#);
            for r in reqs.iter().rev() {
                let id = r["id"].clone();
                out.extend(
                    serde_json::to_vec(&json!({"id": id, "result": [r["method"]], "error": null}))
                        .unwrap(),
                );
            }
            let (a, b) = out.split_at(out.len() / 2);
            s.write_all(a).await.unwrap();
            tokio::task::yield_now().await;
            s.write_all(b).await.unwrap();
            // The echo reply comes back.
            let n = s.read(&mut chunk).await.unwrap();
            let v: Value = serde_json::from_slice(&chunk[..n]).unwrap();
            assert_eq!(v["id"], "echo");
            s
        });
        let (ntx, mut nrx) = mpsc::unbounded_channel();
        let c = OvsdbClient::connect(&OvsdbAddr::Unix(path.clone()), Some(ntx))
            .await
            .unwrap();
        let (a, b) = tokio::join!(c.call("first", json!([])), c.call("second", json!([])));
        assert_eq!(a.unwrap(), json!(["first"]));
        assert_eq!(b.unwrap(), json!(["second"]));
        assert_eq!(nrx.recv().await.unwrap()["method"], "update");
        let s = server.await.unwrap();
        drop(s);
        // The server is gone: calls fail with Closed.
        let mut closed = false;
        for _ in 0..100 {
            if c.is_closed() {
                closed = true;
                break;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(closed);
        assert!(matches!(
            c.call("x", json!([])).await,
            Err(OvsdbError::Closed)
        ));
    }
}
