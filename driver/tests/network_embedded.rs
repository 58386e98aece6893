//! The embedded network service against Neutron's rules: each rule driven through a test
//! `WiringSource` (a broadcast channel), asserting the exact event sequence; plus Neutron's
//! 404/409 answers and the shared allocate/deallocate/migration flows.

// The whole file is test code (clippy only exempts `#[test]` functions themselves).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::broadcast;
use uuid::Uuid;
use vireo::network::embedded::{
    EmbeddedConfig, EmbeddedError, EmbeddedNetwork, EmbeddedNetworkDef, Mechanism,
};
use vireo::network::nova_owned::NovaOwnedPorts;
use vireo_actors::external::{EventSink, EventStatus, ExternalEvent};
use vireo_actors::network::{
    BindingStatus, Failure, HostSetupChange, MigrationHosts, NetworkApi, NetworkError, NewBinding,
    PortRequest, PortStatus, PortUpdate, Removal, MIGRATING_TO,
};
use vireo_actors::vif::{PortId, VnicType};
use vireo_actors::wiring::{WiringChange, WiringSource};

const NET: &str = "5f0c7e2a-0000-4000-8000-000000000001";
const PHYS_NET: &str = "5f0c7e2a-0000-4000-8000-000000000002";

/// A wiring source driven by the test.
#[derive(Debug)]
struct TestWiring {
    tx: broadcast::Sender<WiringChange>,
    wired: Mutex<HashSet<PortId>>,
}

impl TestWiring {
    fn new(capacity: usize) -> Arc<Self> {
        let (tx, _) = broadcast::channel(capacity);
        Arc::new(TestWiring {
            tx,
            wired: Mutex::new(HashSet::new()),
        })
    }

    fn set(&self, port: PortId, device: &str, wired: bool) {
        if wired {
            self.wired.lock().unwrap().insert(port);
        } else {
            self.wired.lock().unwrap().remove(&port);
        }
        // No receiver yet is fine: the service reads `wired()` when it attaches.
        let _ = self.tx.send(WiringChange {
            port,
            device: device.to_owned(),
            wired,
        });
    }

    fn wire(&self, port: PortId) {
        self.set(port, &tap(port), true);
    }

    fn unwire(&self, port: PortId) {
        self.set(port, &tap(port), false);
    }
}

impl WiringSource for TestWiring {
    fn subscribe(&self) -> broadcast::Receiver<WiringChange> {
        self.tx.subscribe()
    }

    fn wired(&self) -> Vec<PortId> {
        self.wired.lock().unwrap().iter().copied().collect()
    }
}

fn tap(port: PortId) -> String {
    format!("tap{}", port.prefix(11))
}

/// An event sink recording what it gets.
#[derive(Debug, Default)]
struct Recorder {
    events: Mutex<Vec<ExternalEvent>>,
}

impl EventSink for Recorder {
    fn deliver(&self, event: ExternalEvent) {
        self.events.lock().unwrap().push(event);
    }
}

type Ev = (&'static str, PortId, EventStatus);

impl Recorder {
    /// The events so far as (name, port, status), emptying the record; checks every event
    /// names `instance`.
    fn take(&self, instance: Uuid) -> Vec<Ev> {
        let events = std::mem::take(&mut *self.events.lock().unwrap());
        events
            .into_iter()
            .map(|e| {
                assert_eq!(e.server_uuid, instance, "{e:?}");
                let port: PortId = e.tag.as_deref().unwrap().parse().unwrap();
                (e.name.as_str(), port, e.status)
            })
            .collect()
    }
}

const PLUGGED: &str = "network-vif-plugged";
const UNPLUGGED: &str = "network-vif-unplugged";
const CHANGED: &str = "network-changed";
const DELETED: &str = "network-vif-deleted";
const OK: EventStatus = EventStatus::Completed;

fn net_def(id: &str) -> EmbeddedNetworkDef {
    EmbeddedNetworkDef {
        id: id.into(),
        name: "private".into(),
        mtu: Some(1450),
        mechanism: Mechanism::Openvswitch,
        ovs_hybrid_plug: true,
        bridge_name: None,
        datapath_type: Some("netdev".into()),
        physical_network: None,
        vlan: None,
    }
}

struct World {
    net: Arc<EmbeddedNetwork>,
    rec: Arc<Recorder>,
    h1: Arc<TestWiring>,
    h2: Arc<TestWiring>,
    vm: Uuid,
}

fn world_with(config: EmbeddedConfig) -> World {
    let rec = Arc::new(Recorder::default());
    let net = EmbeddedNetwork::new(config, rec.clone()).unwrap();
    let h1 = TestWiring::new(64);
    let h2 = TestWiring::new(64);
    net.attach_host("h1", h1.clone()).unwrap();
    net.attach_host("h2", h2.clone()).unwrap();
    World {
        net,
        rec,
        h1,
        h2,
        vm: Uuid::new_v4(),
    }
}

fn world() -> World {
    let mut phys = net_def(PHYS_NET);
    phys.physical_network = Some("physnet1".into());
    phys.vlan = Some(120);
    phys.ovs_hybrid_plug = false;
    world_with(EmbeddedConfig {
        networks: vec![net_def(NET), phys],
        ..EmbeddedConfig::default()
    })
}

/// Let the wiring watchers run (time is paused: this returns once every task is idle).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

fn bind_to(host: &str, vm: Uuid) -> PortUpdate {
    PortUpdate {
        host_id: Some(host.into()),
        device_id: Some(vm.to_string()),
        device_owner: Some("compute:nova".into()),
        ..PortUpdate::default()
    }
}

fn host_only(host: &str) -> PortUpdate {
    PortUpdate {
        host_id: Some(host.into()),
        ..PortUpdate::default()
    }
}

impl World {
    /// A port created on `network`, bound to `host` for the instance; events taken.
    async fn bound_port(&self, network: &str, host: &str) -> PortId {
        let p = self.net.create_port(network).await.unwrap();
        self.net
            .update_port(p.id, &bind_to(host, self.vm))
            .await
            .unwrap();
        self.rec.take(self.vm);
        p.id
    }

    /// A port bound to h1, wired there and ACTIVE; events taken.
    async fn active_on_h1(&self) -> PortId {
        let p = self.bound_port(NET, "h1").await;
        self.h1.wire(p);
        settle().await;
        assert_eq!(self.rec.take(self.vm), vec![(PLUGGED, p, OK)]);
        assert_eq!(self.net.port_status(p), Some(PortStatus::Active));
        p
    }

    fn status(&self, p: PortId) -> PortStatus {
        self.net.port_status(p).unwrap()
    }
}

/// A port created for an instance names it at once (unbound, no owner), so the instance's
/// ports are found by instance before they are bound; a plain port names nothing.
#[tokio::test(start_paused = true)]
async fn a_port_created_for_an_instance_is_found_by_it_before_its_binding() {
    let w = world();
    let p = w.net.create_port_with(NET, Some(w.vm)).await.unwrap();
    assert_eq!(p.device_id, w.vm.to_string());
    assert!(p.host_id.is_empty() && p.device_owner.is_empty(), "{p:?}");
    let plain = w.net.create_port(NET).await.unwrap();
    assert!(plain.device_id.is_empty());
    let found: Vec<PortId> = w
        .net
        .list_instance_ports(w.vm)
        .await
        .unwrap()
        .iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(found, vec![p.id]);
    assert!(w.rec.take(w.vm).is_empty(), "creating a port sends nothing");
}

#[tokio::test(start_paused = true)]
async fn spawn_bind_then_plug_fires_at_plug_time() {
    let w = world();
    let p = w.net.create_port(NET).await.unwrap();
    assert_eq!(p.status, PortStatus::Down);
    assert!(w.rec.take(w.vm).is_empty(), "creating a port sends nothing");

    let bound = w.net.update_port(p.id, &bind_to("h1", w.vm)).await.unwrap();
    assert_eq!(bound.vif_type, "ovs");
    assert_eq!(bound.vif_details["ovs_hybrid_plug"], json!(true));
    assert_eq!(bound.status, PortStatus::Down);
    assert_eq!(w.rec.take(w.vm), vec![(CHANGED, p.id, OK)]);

    w.h1.wire(p.id);
    settle().await;
    assert_eq!(w.rec.take(w.vm), vec![(PLUGGED, p.id, OK)]);
    assert_eq!(w.status(p.id), PortStatus::Active);

    // A second device of the same port (hybrid plug: tap and qvo) adds nothing.
    w.h1.set(p.id, "qvo-extra", true);
    settle().await;
    assert!(w.rec.take(w.vm).is_empty());
}

#[tokio::test(start_paused = true)]
async fn host_change_goes_down_then_active_when_wired_on_the_new_host() {
    let w = world();
    let p = w.active_on_h1().await;
    // Not wired on h2: DOWN, and ACTIVE only at plug time there.
    w.net.update_port(p, &host_only("h2")).await.unwrap();
    assert_eq!(w.rec.take(w.vm), vec![(UNPLUGGED, p, OK), (CHANGED, p, OK)]);
    assert_eq!(w.status(p), PortStatus::Down);
    // The device still wired on h1 does not count: the port is not bound there.
    w.h1.unwire(p);
    w.h1.wire(p);
    settle().await;
    assert!(w.rec.take(w.vm).is_empty());
    w.h2.wire(p);
    settle().await;
    assert_eq!(w.rec.take(w.vm), vec![(PLUGGED, p, OK)]);
    assert_eq!(w.status(p), PortStatus::Active);
}

#[tokio::test(start_paused = true)]
async fn bind_time_event_when_the_device_is_already_wired_on_the_new_host() {
    let w = world();
    let p = w.active_on_h1().await;
    w.net.update_port(p, &host_only("h2")).await.unwrap();
    w.rec.take(w.vm);
    // Back to h1 while its device stayed in br-int: the binding update itself brings
    // network-vif-plugged (NEUTRON.md's bind-time event).
    let port = w.net.update_port(p, &host_only("h1")).await.unwrap();
    assert_eq!(port.status, PortStatus::Active);
    assert_eq!(w.rec.take(w.vm), vec![(CHANGED, p, OK), (PLUGGED, p, OK)]);
}

#[tokio::test(start_paused = true)]
async fn same_host_update_without_binding_change_sends_no_status_event() {
    let w = world();
    let p = w.active_on_h1().await;
    let port = w.net.update_port(p, &bind_to("h1", w.vm)).await.unwrap();
    assert_eq!(port.status, PortStatus::Active);
    assert_eq!(w.rec.take(w.vm), vec![(CHANGED, p, OK)]);
    // Same profile, same vnic type: still nothing but network-changed.
    let same = PortUpdate {
        profile: Some(Map::new()),
        vnic_type: Some(VnicType::Normal),
        ..PortUpdate::default()
    };
    w.net.update_port(p, &same).await.unwrap();
    assert_eq!(w.rec.take(w.vm), vec![(CHANGED, p, OK)]);
    assert_eq!(w.status(p), PortStatus::Active);
}

#[tokio::test(start_paused = true)]
async fn profile_change_on_a_plugged_port_unplugs_and_replugs() {
    let w = world();
    let p = w.active_on_h1().await;
    let mut profile = Map::new();
    profile.insert(MIGRATING_TO.into(), json!("h2"));
    let update = PortUpdate {
        profile: Some(profile),
        ..PortUpdate::default()
    };
    w.net.update_port(p, &update).await.unwrap();
    assert_eq!(
        w.rec.take(w.vm),
        vec![(UNPLUGGED, p, OK), (CHANGED, p, OK), (PLUGGED, p, OK)]
    );
    assert_eq!(w.status(p), PortStatus::Active);

    // On a bound port that is not wired: DOWN stays DOWN, only network-changed.
    let q = w.bound_port(NET, "h1").await;
    w.net.update_port(q, &update).await.unwrap();
    assert_eq!(w.rec.take(w.vm), vec![(CHANGED, q, OK)]);
    assert_eq!(w.status(q), PortStatus::Down);
}

#[tokio::test(start_paused = true)]
async fn unwired_on_the_bound_host_goes_down_elsewhere_nothing() {
    let w = world();
    let p = w.active_on_h1().await;
    w.h2.wire(p);
    w.h2.unwire(p);
    settle().await;
    assert!(w.rec.take(w.vm).is_empty(), "h2 is not the bound host");
    w.h1.unwire(p);
    settle().await;
    assert_eq!(w.rec.take(w.vm), vec![(UNPLUGGED, p, OK)]);
    assert_eq!(w.status(p), PortStatus::Down);
    // Unwired again (already DOWN): nothing.
    w.h1.unwire(p);
    settle().await;
    assert!(w.rec.take(w.vm).is_empty());
}

#[tokio::test(start_paused = true)]
async fn hybrid_plug_stays_wired_while_any_device_is() {
    let w = world();
    let p = w.bound_port(NET, "h1").await;
    w.h1.set(p, "qvb-x", true);
    w.h1.set(p, "qvo-x", true);
    settle().await;
    assert_eq!(w.rec.take(w.vm), vec![(PLUGGED, p, OK)]);
    w.h1.set(p, "qvb-x", false);
    settle().await;
    assert!(w.rec.take(w.vm).is_empty());
    w.h1.set(p, "qvo-x", false);
    settle().await;
    assert_eq!(w.rec.take(w.vm), vec![(UNPLUGGED, p, OK)]);
}

#[tokio::test(start_paused = true)]
async fn delete_sends_vif_deleted_once() {
    let w = world();
    let p = w.active_on_h1().await;
    assert_eq!(w.net.delete_port(p).await.unwrap(), Removal::Deleted);
    assert_eq!(w.rec.take(w.vm), vec![(DELETED, p, OK)]);
    assert_eq!(w.net.delete_port(p).await.unwrap(), Removal::AlreadyGone);
    assert!(w.rec.take(w.vm).is_empty());
    // Unwiring a deleted port's device: nothing.
    w.h1.unwire(p);
    settle().await;
    assert!(w.rec.take(w.vm).is_empty());
}

#[tokio::test(start_paused = true)]
async fn multiple_bindings_create_conflict_activate_delete() {
    let w = world();
    let p = w.active_on_h1().await;

    let b = w
        .net
        .create_binding(
            p,
            &NewBinding {
                host: "h2".into(),
                ..NewBinding::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(b.status, BindingStatus::Inactive);
    assert_eq!(b.vif_type, "ovs");
    assert!(
        w.rec.take(w.vm).is_empty(),
        "creating a binding sends nothing"
    );
    for host in ["h2", "h1"] {
        let err = w
            .net
            .create_binding(
                p,
                &NewBinding {
                    host: host.into(),
                    ..NewBinding::default()
                },
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&err, NetworkError::BindingExists { port, host: h } if *port == p && h == host),
            "{err:?}"
        );
        assert_eq!(err.http_status(), Some(409));
    }
    // A binding for a host with no agent fails (agent-served vnic type).
    let err = w
        .net
        .create_binding(
            p,
            &NewBinding {
                host: "h9".into(),
                ..NewBinding::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, NetworkError::BindingFailed { .. }), "{err:?}");

    // Activate h2 while the device is not wired there: DOWN + unplugged, no plugged.
    let a = w.net.activate_binding(p, "h2").await.unwrap();
    assert_eq!(a.status, BindingStatus::Active);
    assert_eq!(w.rec.take(w.vm), vec![(UNPLUGGED, p, OK)]);
    assert_eq!(w.status(p), PortStatus::Down);
    let bindings = w.net.show_bindings(p).await.unwrap();
    let h1 = bindings.iter().find(|b| b.host == "h1").unwrap();
    assert_eq!(h1.status, BindingStatus::Inactive);
    assert_eq!(h1.vif_type, "unbound", "the old active binding is cleared");
    assert_eq!(w.net.get_port(p).await.unwrap().host_id, "h2");
    w.h2.wire(p);
    settle().await;
    assert_eq!(w.rec.take(w.vm), vec![(PLUGGED, p, OK)]);

    let err = w.net.activate_binding(p, "h2").await.unwrap_err();
    assert!(
        matches!(err, NetworkError::BindingAlreadyActive { .. }),
        "{err:?}"
    );
    let err = w.net.activate_binding(p, "h3").await.unwrap_err();
    assert!(
        matches!(err, NetworkError::BindingNotFound { .. }),
        "{err:?}"
    );
    assert_eq!(err.http_status(), Some(404));

    // Re-activating the old binding: DOWN, and its cleared vif_type keeps it DOWN even with
    // the device wired on h1 (as NEUTRON.md measured) ...
    w.net.activate_binding(p, "h1").await.unwrap();
    assert_eq!(w.rec.take(w.vm), vec![(UNPLUGGED, p, OK)]);
    w.h1.unwire(p);
    w.h1.wire(p);
    settle().await;
    assert!(w.rec.take(w.vm).is_empty());
    assert_eq!(w.net.get_port(p).await.unwrap().vif_type, "unbound");
    // ... until a plain port update binds it again (device wired on h1 → ACTIVE).
    w.net.update_port(p, &host_only("h1")).await.unwrap();
    assert_eq!(w.rec.take(w.vm), vec![(CHANGED, p, OK), (PLUGGED, p, OK)]);

    // Delete: inactive h2 binding goes, the active one is refused, missing ones are gone.
    assert_eq!(
        w.net.delete_binding(p, "h2").await.unwrap(),
        Removal::Deleted
    );
    assert_eq!(
        w.net.delete_binding(p, "h2").await.unwrap(),
        Removal::AlreadyGone
    );
    let err = w.net.delete_binding(p, "h1").await.unwrap_err();
    assert!(
        matches!(err, NetworkError::DeleteActiveBinding { .. }),
        "{err:?}"
    );
    assert!(
        w.rec.take(w.vm).is_empty(),
        "deleting bindings sends nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn activation_with_the_device_already_wired_on_the_destination() {
    let w = world();
    let p = w.active_on_h1().await;
    w.net
        .create_binding(
            p,
            &NewBinding {
                host: "h2".into(),
                ..NewBinding::default()
            },
        )
        .await
        .unwrap();
    // Pre-created on the destination: no active binding there, so nothing yet.
    w.h2.wire(p);
    settle().await;
    assert!(w.rec.take(w.vm).is_empty());
    w.net.activate_binding(p, "h2").await.unwrap();
    assert_eq!(w.rec.take(w.vm), vec![(UNPLUGGED, p, OK), (PLUGGED, p, OK)]);
    assert_eq!(w.status(p), PortStatus::Active);
}

#[tokio::test(start_paused = true)]
async fn migrating_to_makes_a_destination_plug_report_plugged_without_status_change() {
    let w = world();
    let p = w.active_on_h1().await;
    // Without migrating_to a device on h2 is ignored.
    w.h2.wire(p);
    settle().await;
    assert!(w.rec.take(w.vm).is_empty());
    w.h2.unwire(p);
    settle().await;

    let changes = w
        .net
        .setup_networks_on_host(
            w.vm,
            "h1",
            false,
            Some(&MigrationHosts { dest: "h2".into() }),
        )
        .await
        .unwrap();
    assert_eq!(changes, vec![HostSetupChange::MigratingToSet { port: p }]);
    assert_eq!(
        w.rec.take(w.vm),
        vec![(UNPLUGGED, p, OK), (CHANGED, p, OK), (PLUGGED, p, OK)]
    );
    w.h2.wire(p);
    settle().await;
    assert_eq!(w.rec.take(w.vm), vec![(PLUGGED, p, OK)]);
    assert_eq!(w.status(p), PortStatus::Active);
    assert_eq!(w.net.get_port(p).await.unwrap().host_id, "h1");
}

#[tokio::test(start_paused = true)]
async fn agentless_ports_are_active_at_bind_anywhere() {
    let w = world();
    let p = w.net.create_port(PHYS_NET).await.unwrap();
    let update = PortUpdate {
        vnic_type: Some(VnicType::DirectPhysical),
        ..bind_to("h9", w.vm)
    };
    let port = w.net.update_port(p.id, &update).await.unwrap();
    assert_eq!(port.vif_type, "hostdev_physical");
    assert_eq!(port.vif_details["vlan"], json!("120"));
    assert_eq!(port.status, PortStatus::Active);
    assert_eq!(
        w.rec.take(w.vm),
        vec![(PLUGGED, p.id, OK), (CHANGED, p.id, OK)]
    );
    // Wiring has no say over an agentless port.
    w.h1.wire(p.id);
    w.h1.unwire(p.id);
    settle().await;
    assert!(w.rec.take(w.vm).is_empty());

    // SR-IOV `direct` is served by the SR-IOV agent: bound on an attached host, ACTIVE when
    // wired.
    let q = w.net.create_port(PHYS_NET).await.unwrap();
    let update = PortUpdate {
        vnic_type: Some(VnicType::Direct),
        ..bind_to("h1", w.vm)
    };
    let port = w.net.update_port(q.id, &update).await.unwrap();
    assert_eq!(port.vif_type, "hw_veb");
    assert_eq!(port.status, PortStatus::Down);
    assert_eq!(w.rec.take(w.vm), vec![(CHANGED, q.id, OK)]);
    w.h1.wire(q.id);
    settle().await;
    assert_eq!(w.rec.take(w.vm), vec![(PLUGGED, q.id, OK)]);
}

#[tokio::test(start_paused = true)]
async fn agent_served_port_on_a_host_without_agent_fails_to_bind() {
    let w = world();
    let p = w.net.create_port(NET).await.unwrap();
    let port = w.net.update_port(p.id, &bind_to("h9", w.vm)).await.unwrap();
    assert_eq!(port.vif_type, "binding_failed");
    assert_eq!(port.status, PortStatus::Down);
    // Once h9 has an agent, any update binds the port again.
    let h9 = TestWiring::new(8);
    h9.wire(p.id);
    w.net.attach_host("h9", h9.clone()).unwrap();
    w.rec.take(w.vm);
    let port = w
        .net
        .update_port(
            p.id,
            &PortUpdate {
                device_owner: Some("compute:nova".into()),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(port.vif_type, "ovs");
    assert_eq!(
        w.rec.take(w.vm),
        vec![(CHANGED, p.id, OK), (PLUGGED, p.id, OK)]
    );
    // Detached: the host has no agent again.
    assert!(w.net.detach_host("h9"));
    assert!(!w.net.detach_host("h9"));
    let q = w.net.create_port(NET).await.unwrap();
    let port = w.net.update_port(q.id, &bind_to("h9", w.vm)).await.unwrap();
    assert_eq!(port.vif_type, "binding_failed");
}

#[tokio::test(start_paused = true)]
async fn error_injection_sends_plugged_failed() {
    let w = world();
    let p = w.bound_port(NET, "h1").await;
    w.net.set_port_error(p).unwrap();
    assert_eq!(w.rec.take(w.vm), vec![(PLUGGED, p, EventStatus::Failed)]);
    assert_eq!(w.status(p), PortStatus::Error);
    // ERROR → ACTIVE is not reported (Neutron reports only from DOWN/BUILD).
    w.h1.wire(p);
    settle().await;
    assert!(w.rec.take(w.vm).is_empty());
    assert_eq!(w.status(p), PortStatus::Active);
    let missing = PortId(Uuid::new_v4());
    assert!(matches!(
        w.net.set_port_error(missing),
        Err(NetworkError::PortNotFound { port }) if port == missing
    ));
}

#[tokio::test(start_paused = true)]
async fn ports_that_are_not_compute_ports_emit_nothing() {
    let w = world();
    let p = w.net.create_port(NET).await.unwrap();
    // Bound but no device: no network-changed, no status events.
    w.net.update_port(p.id, &host_only("h1")).await.unwrap();
    w.h1.wire(p.id);
    settle().await;
    assert_eq!(w.status(p.id), PortStatus::Active);
    // A non-compute owner with a UUID device id: still nothing.
    let dhcp = PortUpdate {
        device_id: Some(w.vm.to_string()),
        device_owner: Some("network:dhcp".into()),
        ..PortUpdate::default()
    };
    w.net.update_port(p.id, &dhcp).await.unwrap();
    w.h1.unwire(p.id);
    settle().await;
    w.net.delete_port(p.id).await.unwrap();
    assert!(w.rec.take(w.vm).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_lagging_watcher_resyncs_from_the_wired_set() {
    let rec = Arc::new(Recorder::default());
    let net = EmbeddedNetwork::new(
        EmbeddedConfig {
            networks: vec![net_def(NET)],
            ..EmbeddedConfig::default()
        },
        rec.clone(),
    )
    .unwrap();
    let h1 = TestWiring::new(2);
    net.attach_host("h1", h1.clone()).unwrap();
    let vm = Uuid::new_v4();
    let mut ports = Vec::new();
    for _ in 0..6 {
        let p = net.create_port(NET).await.unwrap();
        net.update_port(p.id, &bind_to("h1", vm)).await.unwrap();
        ports.push(p.id);
    }
    rec.take(vm);
    // Six changes into a channel of two before the watcher runs: it lags and re-reads.
    for p in &ports {
        h1.wire(*p);
    }
    settle().await;
    let got: HashSet<PortId> = rec
        .take(vm)
        .into_iter()
        .map(|(n, p, _)| {
            assert_eq!(n, PLUGGED);
            p
        })
        .collect();
    assert_eq!(got, ports.iter().copied().collect::<HashSet<_>>());
    for p in &ports {
        assert!(net.is_wired("h1", *p));
        assert_eq!(net.port_status(*p), Some(PortStatus::Active));
    }
    // And it keeps following changes afterwards.
    h1.unwire(ports[0]);
    settle().await;
    assert_eq!(rec.take(vm), vec![(UNPLUGGED, ports[0], OK)]);
}

#[tokio::test(start_paused = true)]
async fn attaching_a_host_takes_its_current_wired_set() {
    let rec = Arc::new(Recorder::default());
    let net = EmbeddedNetwork::new(
        EmbeddedConfig {
            networks: vec![net_def(NET)],
            ..EmbeddedConfig::default()
        },
        rec.clone(),
    )
    .unwrap();
    let h1 = TestWiring::new(8);
    net.attach_host("h1", h1.clone()).unwrap();
    let vm = Uuid::new_v4();
    let p = net.create_port(NET).await.unwrap();
    net.update_port(p.id, &bind_to("h1", vm)).await.unwrap();
    rec.take(vm);
    // A new source for h1 (agent restart) that already has the device wired.
    let again = TestWiring::new(8);
    again.wire(p.id);
    net.attach_host("h1", again.clone()).unwrap();
    assert_eq!(rec.take(vm), vec![(PLUGGED, p.id, OK)]);
    // The old source is no longer followed.
    h1.unwire(p.id);
    settle().await;
    assert!(rec.take(vm).is_empty());
    again.unwire(p.id);
    settle().await;
    assert_eq!(rec.take(vm), vec![(UNPLUGGED, p.id, OK)]);
    assert!(matches!(
        net.attach_host("", again),
        Err(EmbeddedError::EmptyHost)
    ));
}

#[tokio::test(start_paused = true)]
async fn event_delay_keeps_order_and_follows_tokio_time() {
    let w = world_with(EmbeddedConfig {
        networks: vec![net_def(NET)],
        event_delay_ms: 500,
        ..EmbeddedConfig::default()
    });
    let p = w.net.create_port(NET).await.unwrap();
    w.net.update_port(p.id, &bind_to("h1", w.vm)).await.unwrap();
    w.h1.wire(p.id);
    tokio::time::sleep(Duration::from_millis(499)).await;
    assert!(w.rec.take(w.vm).is_empty(), "nothing before the delay");
    tokio::time::sleep(Duration::from_millis(2)).await;
    assert_eq!(
        w.rec.take(w.vm),
        vec![(CHANGED, p.id, OK), (PLUGGED, p.id, OK)]
    );
}

#[test]
fn event_delay_needs_a_runtime() {
    let err = EmbeddedNetwork::new(
        EmbeddedConfig {
            event_delay_ms: 10,
            ..EmbeddedConfig::default()
        },
        Arc::new(Recorder::default()),
    )
    .unwrap_err();
    assert_eq!(err, EmbeddedError::NoRuntime);
}

#[tokio::test(start_paused = true)]
async fn not_found_and_bad_request_answers() {
    let w = world();
    let missing = PortId(Uuid::new_v4());
    assert!(matches!(
        w.net.get_port(missing).await,
        Err(NetworkError::PortNotFound { port }) if port == missing
    ));
    let err = w
        .net
        .update_port(missing, &host_only("h1"))
        .await
        .unwrap_err();
    assert!(matches!(err, NetworkError::PortNotFound { port } if port == missing));
    assert_eq!(err.http_status(), Some(404));
    assert!(matches!(
        w.net.show_bindings(missing).await,
        Err(NetworkError::PortNotFound { .. })
    ));
    assert!(matches!(
        w.net.activate_binding(missing, "h1").await,
        Err(NetworkError::PortNotFound { .. })
    ));
    assert_eq!(
        w.net.delete_binding(missing, "h1").await.unwrap(),
        Removal::AlreadyGone
    );
    assert!(matches!(
        w.net.create_port("nope").await,
        Err(NetworkError::NetworkNotFound { .. })
    ));
    assert!(matches!(
        w.net.get_network("nope").await,
        Err(NetworkError::NetworkNotFound { .. })
    ));
    // Bindings API on a port that is not a compute port: 400, as Neutron.
    let p = w.net.create_port(NET).await.unwrap();
    let err = w.net.show_bindings(p.id).await.unwrap_err();
    assert!(
        matches!(
            &err,
            NetworkError::ShowBindings {
                failure: Failure::Status(400),
                ..
            }
        ),
        "{err:?}"
    );
    let err = w
        .net
        .create_binding(
            p.id,
            &NewBinding {
                host: "h1".into(),
                ..NewBinding::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            NetworkError::CreateBinding {
                failure: Failure::Status(400),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.is_retryable());
}

#[tokio::test(start_paused = true)]
async fn allocate_creates_and_takes_ports_and_deallocate_undoes_it() {
    let w = world();
    // A user-supplied port with PCI keys and a trusted flag in its profile.
    let user = w.net.create_port(NET).await.unwrap();
    let mut profile = Map::new();
    profile.insert("pci_slot".into(), json!("0000:81:00.2"));
    profile.insert("physical_network".into(), json!("physnet1"));
    profile.insert("trusted".into(), json!(true));
    w.net
        .update_port(
            user.id,
            &PortUpdate {
                profile: Some(profile),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();

    let ni = w
        .net
        .allocate_for_instance(
            w.vm,
            "h1",
            &[
                PortRequest::Network {
                    network_id: NET.into(),
                },
                PortRequest::Port { port_id: user.id },
            ],
        )
        .await
        .unwrap();
    assert_eq!(ni.vifs.len(), 2);
    let created = &ni.vifs[0];
    assert!(!created.preserve_on_delete);
    assert!(ni.vifs[1].preserve_on_delete);
    assert_eq!(ni.vifs[1].id, user.id);
    assert!(created.details.ovs_hybrid_plug);
    assert_eq!(created.network.mtu, Some(1450));
    assert_eq!(created.network.label.as_deref(), Some("private"));
    assert!(!created.active);
    for v in &ni.vifs {
        let p = w.net.get_port(v.id).await.unwrap();
        assert_eq!(p.host_id, "h1");
        assert_eq!(p.device_id, w.vm.to_string());
        assert_eq!(p.device_owner, "compute:nova");
    }
    let ports = w.net.list_instance_ports(w.vm).await.unwrap();
    assert_eq!(ports.len(), 2);
    w.rec.take(w.vm);

    // A port vireo created that the cache lost: deallocate finds it by device_id.
    let stray = w.net.create_port(NET).await.unwrap();
    w.net
        .update_port(stray.id, &bind_to("h1", w.vm))
        .await
        .unwrap();
    w.rec.take(w.vm);

    let done = w.net.deallocate_for_instance(w.vm, &ni).await.unwrap();
    let mut deleted = done.deleted.clone();
    deleted.sort();
    let mut want = vec![created.id, stray.id];
    want.sort();
    assert_eq!(deleted, want);
    assert_eq!(done.unbound, vec![user.id]);
    assert!(done.already_gone.is_empty() && done.skipped.is_empty());
    let u = w.net.get_port(user.id).await.unwrap();
    assert_eq!(u.host_id, "");
    assert_eq!(u.device_id, "");
    assert_eq!(u.device_owner, "");
    assert_eq!(u.vif_type, "unbound");
    assert_eq!(Value::Object(u.profile), json!({"trusted": true}));
    assert!(w.net.list_instance_ports(w.vm).await.unwrap().is_empty());
    let events = w.rec.take(w.vm);
    assert!(events.contains(&(DELETED, created.id, OK)), "{events:?}");
    assert!(events.contains(&(DELETED, stray.id, OK)), "{events:?}");

    // Again: the created port is already gone, the user port (no device any more) is
    // unbound again, harmlessly; nothing fails.
    let again = w.net.deallocate_for_instance(w.vm, &ni).await.unwrap();
    assert_eq!(again.already_gone, vec![created.id]);
    assert!(again.deleted.is_empty() && again.skipped.is_empty());
    assert_eq!(again.unbound, vec![user.id]);
}

#[tokio::test(start_paused = true)]
async fn deallocate_leaves_a_user_port_another_instance_took() {
    let w = world();
    let user = w.net.create_port(NET).await.unwrap();
    let ni = w
        .net
        .allocate_for_instance(w.vm, "h1", &[PortRequest::Port { port_id: user.id }])
        .await
        .unwrap();
    let other = Uuid::new_v4();
    w.net
        .update_port(user.id, &bind_to("h2", other))
        .await
        .unwrap();
    let done = w.net.deallocate_for_instance(w.vm, &ni).await.unwrap();
    assert_eq!(done.skipped, vec![user.id]);
    assert_eq!(w.net.get_port(user.id).await.unwrap().host_id, "h2");
}

#[tokio::test(start_paused = true)]
async fn allocate_failure_cleans_up_what_it_did() {
    let w = world();
    let other = Uuid::new_v4();
    let busy = w.bound_port(NET, "h1").await;
    w.net
        .update_port(busy, &bind_to("h1", other))
        .await
        .unwrap();
    let free = w.net.create_port(NET).await.unwrap();

    // A port in use by another instance: refused before anything is created.
    let err = w
        .net
        .allocate_for_instance(
            w.vm,
            "h1",
            &[
                PortRequest::Port { port_id: free.id },
                PortRequest::Port { port_id: busy },
            ],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, NetworkError::PortInUse { port, device_id } if *port == busy && *device_id == other.to_string()),
        "{err:?}"
    );
    assert_eq!(w.net.get_port(free.id).await.unwrap().device_id, "");

    // Binding fails on a host without agent: the created port is deleted, the user port
    // unbound again.
    let before: usize = count_ports(&w).await;
    let err = w
        .net
        .allocate_for_instance(
            w.vm,
            "h9",
            &[
                PortRequest::Port { port_id: free.id },
                PortRequest::Network {
                    network_id: NET.into(),
                },
            ],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, NetworkError::BindingFailed { port, host, vif_type } if *port == free.id && host == "h9" && vif_type == "binding_failed"),
        "{err:?}"
    );
    assert_eq!(count_ports(&w).await, before, "the created port is gone");
    let f = w.net.get_port(free.id).await.unwrap();
    assert_eq!((f.host_id.as_str(), f.device_id.as_str()), ("", ""));
    assert!(w.net.list_instance_ports(w.vm).await.unwrap().is_empty());

    // A missing network: NetworkNotFound, nothing left behind.
    let err = w
        .net
        .allocate_for_instance(
            w.vm,
            "h1",
            &[
                PortRequest::Network {
                    network_id: NET.into(),
                },
                PortRequest::Network {
                    network_id: "missing".into(),
                },
            ],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, NetworkError::NetworkNotFound { .. }),
        "{err:?}"
    );
    assert_eq!(count_ports(&w).await, before);
}

async fn count_ports(w: &World) -> usize {
    w.net.ports().len()
}

#[tokio::test(start_paused = true)]
async fn setup_and_teardown_around_a_live_migration() {
    let w = world();
    let a = w.active_on_h1().await;
    let b = w.bound_port(NET, "h1").await;
    let dest = MigrationHosts { dest: "h2".into() };
    for p in [a, b] {
        w.net
            .create_binding(
                p,
                &NewBinding {
                    host: "h2".into(),
                    ..NewBinding::default()
                },
            )
            .await
            .unwrap();
    }
    let mut ports = vec![a, b];
    ports.sort();

    let set = w
        .net
        .setup_networks_on_host(w.vm, "h1", false, Some(&dest))
        .await
        .unwrap();
    assert_eq!(
        set,
        ports
            .iter()
            .map(|p| HostSetupChange::MigratingToSet { port: *p })
            .collect::<Vec<_>>()
    );
    for p in &ports {
        let port = w.net.get_port(*p).await.unwrap();
        assert_eq!(port.migrating_to(), Some("h2"));
    }
    // Idempotent.
    let again = w
        .net
        .setup_networks_on_host(w.vm, "h1", false, Some(&dest))
        .await
        .unwrap();
    assert!(again.is_empty());
    // Nothing to do without a migration.
    assert!(w
        .net
        .setup_networks_on_host(w.vm, "h1", false, None)
        .await
        .unwrap()
        .is_empty());
    w.rec.take(w.vm);

    // Rollback from the source: clear migrating_to, delete the inactive h2 bindings.
    let torn = w
        .net
        .setup_networks_on_host(w.vm, "h1", true, Some(&dest))
        .await
        .unwrap();
    let mut want = Vec::new();
    for p in &ports {
        want.push(HostSetupChange::MigratingToCleared { port: *p });
        want.push(HostSetupChange::DestBindingDeleted { port: *p });
    }
    assert_eq!(torn, want);
    for p in &ports {
        let port = w.net.get_port(*p).await.unwrap();
        assert_eq!(port.migrating_to(), None);
        assert_eq!(port.host_id, "h1");
        let hosts: Vec<String> = w
            .net
            .show_bindings(*p)
            .await
            .unwrap()
            .into_iter()
            .map(|b| b.host)
            .collect();
        assert_eq!(hosts, vec!["h1".to_owned()]);
    }
    // Clearing the profile of the plugged port rebinds it: unplugged then plugged again.
    let events = w.rec.take(w.vm);
    let of_a: Vec<&str> = events
        .iter()
        .filter(|(_, p, _)| *p == a)
        .map(|(n, _, _)| *n)
        .collect();
    assert_eq!(of_a, vec![UNPLUGGED, CHANGED, PLUGGED]);
    // Idempotent: a second rollback changes nothing and does not fail.
    let again = w
        .net
        .setup_networks_on_host(w.vm, "h1", true, Some(&dest))
        .await
        .unwrap();
    assert!(again.is_empty());

    // A port whose active binding already moved to the destination keeps it.
    w.net
        .create_binding(
            b,
            &NewBinding {
                host: "h2".into(),
                ..NewBinding::default()
            },
        )
        .await
        .unwrap();
    w.net.activate_binding(b, "h2").await.unwrap();
    let torn = w
        .net
        .setup_networks_on_host(w.vm, "h1", true, Some(&dest))
        .await
        .unwrap();
    assert!(torn.is_empty(), "{torn:?}");
    assert_eq!(w.net.get_port(b).await.unwrap().host_id, "h2");
}

/// Nova network mode over the same service: reads pass, a release is Nova's (nothing
/// changes), and every write is refused with an error that names Nova.
#[tokio::test(start_paused = true)]
async fn nova_owned_ports_are_read_never_changed() {
    let w = world();
    let ni = w
        .net
        .allocate_for_instance(
            w.vm,
            "h1",
            &[PortRequest::Network {
                network_id: NET.into(),
            }],
        )
        .await
        .unwrap();
    let port = ni.vifs[0].id;
    w.rec.take(w.vm);
    let nova = NovaOwnedPorts::new(w.net.clone());

    assert_eq!(nova.get_port(port).await.unwrap().host_id, "h1");
    assert_eq!(nova.list_instance_ports(w.vm).await.unwrap().len(), 1);
    assert_eq!(nova.get_network(NET).await.unwrap().id, NET);
    assert_eq!(nova.show_bindings(port).await.unwrap().len(), 1);

    let released = nova.deallocate_for_instance(w.vm, &ni).await.unwrap();
    assert_eq!(released, Default::default());
    let kept = w.net.get_port(port).await.unwrap();
    assert_eq!(
        (kept.host_id.as_str(), kept.device_id),
        ("h1", w.vm.to_string())
    );

    let owned = |e: NetworkError| {
        assert!(matches!(e, NetworkError::OwnedByNova { .. }), "{e:?}");
        assert!(e.to_string().contains("Nova owns"), "{e}");
    };
    owned(nova.create_port(NET).await.unwrap_err());
    owned(
        nova.update_port(port, &bind_to("h2", w.vm))
            .await
            .unwrap_err(),
    );
    owned(nova.delete_port(port).await.unwrap_err());
    let binding = NewBinding {
        host: "h2".into(),
        ..NewBinding::default()
    };
    owned(nova.create_binding(port, &binding).await.unwrap_err());
    owned(nova.activate_binding(port, "h2").await.unwrap_err());
    owned(nova.delete_binding(port, "h2").await.unwrap_err());
    owned(
        nova.allocate_for_instance(Uuid::new_v4(), "h1", &[])
            .await
            .unwrap_err(),
    );
    owned(
        nova.setup_networks_on_host(w.vm, "h1", false, None)
            .await
            .unwrap_err(),
    );
    // Nothing moved: the port is as Nova left it, and no event was sent.
    let after = w.net.get_port(port).await.unwrap();
    assert_eq!(after.host_id, "h1");
    assert_eq!(w.net.list_instance_ports(w.vm).await.unwrap().len(), 1);
    assert!(w.rec.take(w.vm).is_empty());
}
