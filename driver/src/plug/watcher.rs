//! The host's [`WiringSource`]: what is wired, per port id, from OVSDB and netlink.
//!
//! - OVSDB: a monitor of the Interface table (`name`, `external_ids`, `ofport`). An
//!   Interface whose `external_ids:iface-id` is a port id is wired while its `ofport` is > 0;
//!   `ofport` -1 or empty, the row gone, or the iface-id removed is unwired. This covers OVS
//!   native (the tap) and hybrid (the `qvo`) on any bridge, whoever plugged them (vireo,
//!   libvirt's `<virtualport>`).
//! - netlink: RTM_NEWLINK/RTM_DELLINK of the taps of Linux-bridge VIFs, which the plugger
//!   registers by name ([`HostWiring::register_bridge_tap`]): wired while the tap is enslaved
//!   to a bridge (IFLA_MASTER set).
//!
//! A port is wired while any of its devices is. Each device's transition is one
//! [`WiringChange`]. The OVSDB monitor reconnects on its own (a fresh snapshot reconciles
//! what changed meanwhile).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use vireo_actors::vif::PortId;
use vireo_actors::wiring::{WiringChange, WiringSource};

use super::netlink::{LinkEvent, LinkMonitor, Netlink, NetlinkError};
use super::ovsdb::{read_map, read_opt_int, OvsdbAddr, OvsdbClient, DB};

/// Capacity of the change stream.
const CHANNEL: usize = 4096;

#[derive(Debug, Default)]
struct State {
    /// OVSDB Interface rows by row uuid: (port, interface name, wired).
    ovs: HashMap<String, (PortId, String, bool)>,
    /// Registered Linux-bridge taps: name → port.
    taps: HashMap<String, PortId>,
    /// Wired state of registered taps.
    tap_wired: HashMap<String, bool>,
    /// The OVSDB monitor has delivered at least one snapshot.
    ovs_synced: bool,
}

impl State {
    fn wired_ports(&self) -> BTreeSet<PortId> {
        let mut out: BTreeSet<PortId> = self
            .ovs
            .values()
            .filter(|(_, _, w)| *w)
            .map(|(p, _, _)| *p)
            .collect();
        for (tap, w) in &self.tap_wired {
            if *w {
                if let Some(p) = self.taps.get(tap) {
                    out.insert(*p);
                }
            }
        }
        out
    }
}

/// The host's wiring watcher. Dropping it stops its tasks.
#[derive(Debug)]
pub struct HostWiring {
    tx: broadcast::Sender<WiringChange>,
    state: Mutex<State>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    netlink: Arc<Netlink>,
    synced: tokio::sync::watch::Sender<bool>,
}

impl Drop for HostWiring {
    fn drop(&mut self) {
        for t in self
            .tasks
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

impl HostWiring {
    /// Start watching OVSDB at `ovsdb` and netlink link changes. The OVSDB side retries in
    /// the background when ovsdb-server cannot be reached (yet).
    pub fn start(ovsdb: OvsdbAddr, netlink: Arc<Netlink>) -> Result<Arc<Self>, NetlinkError> {
        let monitor = LinkMonitor::open()?;
        let me = Arc::new(HostWiring {
            tx: broadcast::channel(CHANNEL).0,
            state: Mutex::default(),
            tasks: Mutex::default(),
            netlink,
            synced: tokio::sync::watch::channel(false).0,
        });
        let ovs = tokio::spawn(ovs_loop(Arc::downgrade(&me), ovsdb));
        let nl = tokio::spawn(netlink_loop(Arc::downgrade(&me), monitor));
        lock(&me.tasks).extend([ovs, nl]);
        Ok(me)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn emit(&self, port: PortId, device: &str, wired: bool) {
        tracing::debug!(%port, device, wired, "wiring change");
        let _ = self.tx.send(WiringChange {
            port,
            device: device.to_owned(),
            wired,
        });
    }

    /// Wait until the OVSDB monitor delivered its first snapshot (or `timeout`). True when
    /// synced.
    pub async fn ovs_synced(&self, timeout: Duration) -> bool {
        let mut rx = self.synced.subscribe();
        let synced = tokio::time::timeout(timeout, rx.wait_for(|s| *s))
            .await
            .map(|r| r.is_ok());
        synced.unwrap_or(false)
    }

    /// Follow the Linux-bridge tap `tap` of `port` from now on, and read its state now.
    pub async fn register_bridge_tap(&self, tap: &str, port: PortId) {
        {
            let mut st = self.lock();
            st.taps.insert(tap.to_owned(), port);
            st.tap_wired.entry(tap.to_owned()).or_insert(false);
        }
        self.resync_tap(tap).await;
    }

    /// Read `tap`'s state through netlink and apply it (a registered tap only).
    pub async fn resync_tap(&self, tap: &str) {
        match self.netlink.link(tap).await {
            Ok(link) => {
                let wired = link.is_some_and(|l| l.master.is_some());
                self.apply_tap(tap, wired);
            }
            Err(e) => tracing::warn!(tap, error = %e, "wiring: tap lookup failed"),
        }
    }

    /// Stop following `tap`; an unwired change is reported if it was wired.
    pub fn forget_bridge_tap(&self, tap: &str) {
        let (port, was) = {
            let mut st = self.lock();
            let port = st.taps.remove(tap);
            let was = st.tap_wired.remove(tap).unwrap_or(false);
            (port, was)
        };
        if let (Some(p), true) = (port, was) {
            self.emit(p, tap, false);
        }
    }

    fn apply_tap(&self, tap: &str, wired: bool) {
        let port = {
            let mut st = self.lock();
            let Some(port) = st.taps.get(tap).copied() else {
                return;
            };
            let prev = st.tap_wired.insert(tap.to_owned(), wired);
            if prev == Some(wired) {
                return;
            }
            port
        };
        self.emit(port, tap, wired);
    }

    /// Apply one OVSDB Interface row (new state; `None` = deleted).
    fn apply_ovs_row(&self, uuid: &str, row: Option<&Value>) {
        let new = row.and_then(|r| {
            let ids = r.get("external_ids").map(read_map).unwrap_or_default();
            let port: PortId = ids.get("iface-id")?.parse().ok()?;
            let name = r.get("name").and_then(Value::as_str)?.to_owned();
            let ofport = r.get("ofport").and_then(read_opt_int);
            Some((port, name, ofport.is_some_and(|o| o > 0)))
        });
        let mut changes = Vec::new();
        {
            let mut st = self.lock();
            let old = match &new {
                Some(n) => st.ovs.insert(uuid.to_owned(), n.clone()),
                None => st.ovs.remove(uuid),
            };
            match (old, new) {
                (Some((op, on, true)), Some((np, nn, nw))) if op != np || on != nn || !nw => {
                    changes.push((op, on, false));
                    if nw {
                        changes.push((np, nn, true));
                    }
                }
                (Some((op, on, true)), None) => changes.push((op, on, false)),
                (Some((_, _, false)) | None, Some((np, nn, true))) => changes.push((np, nn, true)),
                _ => {}
            }
        }
        for (p, d, w) in changes {
            self.emit(p, &d, w);
        }
    }

    /// Reconcile with a full snapshot of the Interface table.
    fn apply_ovs_snapshot(&self, rows: &serde_json::Map<String, Value>) {
        let known: Vec<String> = self.lock().ovs.keys().cloned().collect();
        for uuid in known {
            if !rows.contains_key(&uuid) {
                self.apply_ovs_row(&uuid, None);
            }
        }
        for (uuid, upd) in rows {
            self.apply_ovs_row(uuid, upd.get("new"));
        }
        self.lock().ovs_synced = true;
        self.synced.send_replace(true);
    }

    fn apply_ovs_update(&self, update: &Value) {
        let Some(rows) = update.get("Interface").and_then(Value::as_object) else {
            return;
        };
        for (uuid, upd) in rows {
            self.apply_ovs_row(uuid, upd.get("new"));
        }
    }

    /// Devices currently wired, per port (for diagnostics and tests).
    pub fn wired_devices(&self) -> BTreeMap<PortId, Vec<String>> {
        let st = self.lock();
        let mut out: BTreeMap<PortId, Vec<String>> = BTreeMap::new();
        for (p, n, w) in st.ovs.values() {
            if *w {
                out.entry(*p).or_default().push(n.clone());
            }
        }
        for (tap, w) in &st.tap_wired {
            if let (true, Some(p)) = (*w, st.taps.get(tap)) {
                out.entry(*p).or_default().push(tap.clone());
            }
        }
        out
    }
}

impl WiringSource for HostWiring {
    fn subscribe(&self) -> broadcast::Receiver<WiringChange> {
        self.tx.subscribe()
    }

    fn wired(&self) -> Vec<PortId> {
        self.lock().wired_ports().into_iter().collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn ovs_loop(me: Weak<HostWiring>, socket: OvsdbAddr) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let (ntx, mut nrx) = mpsc::unbounded_channel();
        match OvsdbClient::connect(&socket, Some(ntx)).await {
            Ok(client) => {
                let initial = client
                    .call(
                        "monitor",
                        json!([DB, "wiring", {"Interface": {"columns": ["name", "external_ids", "ofport"]}}]),
                    )
                    .await;
                match initial {
                    Ok(v) => {
                        backoff = Duration::from_millis(100);
                        let Some(w) = me.upgrade() else { return };
                        let empty = serde_json::Map::new();
                        w.apply_ovs_snapshot(
                            v.get("Interface")
                                .and_then(Value::as_object)
                                .unwrap_or(&empty),
                        );
                        drop(w);
                        while let Some(n) = nrx.recv().await {
                            let Some(w) = me.upgrade() else { return };
                            if n.get("method").and_then(Value::as_str) == Some("update") {
                                if let Some(u) = n.get("params").and_then(|p| p.get(1)) {
                                    w.apply_ovs_update(u);
                                }
                            }
                        }
                        tracing::warn!("wiring: OVSDB monitor connection lost, reconnecting");
                    }
                    Err(e) => tracing::warn!(error = %e, "wiring: OVSDB monitor failed"),
                }
                drop(client);
            }
            Err(e) => tracing::debug!(error = %e, "wiring: OVSDB not reachable"),
        }
        if me.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn netlink_loop(me: Weak<HostWiring>, mut monitor: LinkMonitor) {
    while let Some(ev) = monitor.next().await {
        let Some(w) = me.upgrade() else { return };
        match ev {
            LinkEvent::New(l) => w.apply_tap(&l.name, l.master.is_some()),
            LinkEvent::Del(l) => w.apply_tap(&l.name, false),
        }
    }
    tracing::warn!("wiring: netlink link monitor closed");
}
