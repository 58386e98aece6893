//! The Neutron client against a real Neutron (ML2/openvswitch, noauth), selected by
//! `VIREO_NEUTRON_URL` (default `http://127.0.0.1:9696`). These tests fail, not skip, when
//! Neutron is not reachable: CI starts it (`integration/host-setup.sh up --with-neutron`).
//!
//! They need two alive Open vSwitch agents: one on this machine's host name (the real agent,
//! owning br-int) and one other (a state-reporting second host). Every test makes its own
//! network and subnet with a unique name and deletes everything it created, also on failure
//! (a guard cleans up by network id). The wiring test adds an OVS internal port with a unique
//! name to br-int and removes it afterwards.

// The whole file is test code (clippy only exempts `#[test]` functions themselves).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use uuid::Uuid;
use vireo::network::neutron::{NeutronClient, NeutronConfig};
use vireo_actors::network::{
    unbind_update, BindingStatus, Failure, HostSetupChange, MigrationHosts, NetworkApi,
    NetworkError, NewBinding, PortRequest, PortStatus, PortUpdate, Removal, MIGRATING_TO,
};
use vireo_actors::vif::{PortId, VifType};

fn neutron_url() -> String {
    std::env::var("VIREO_NEUTRON_URL").unwrap_or_else(|_| "http://127.0.0.1:9696".to_owned())
}

/// Plain HTTP for what the client does not do (networks, subnets, agents, raw checks).
#[derive(Clone)]
struct Raw {
    http: reqwest::Client,
    base: String,
}

impl Raw {
    fn new() -> Raw {
        Raw {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            base: format!("{}/v2.0", neutron_url().trim_end_matches('/')),
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap_or_else(|e| {
            panic!(
                "Neutron at {} is not reachable ({method} {path}): {e}",
                neutron_url()
            )
        });
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let v = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, v)
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, None).await
    }
}

/// A network + subnet for one test; deletes every port on it, the subnet and the network on
/// drop.
struct Fixture {
    raw: Raw,
    network: String,
    name: String,
}

impl Fixture {
    async fn new() -> Fixture {
        let raw = Raw::new();
        let name = format!(
            "vireo-nettest-{}",
            &Uuid::new_v4().simple().to_string()[..10]
        );
        let (s, v) = raw
            .call(
                reqwest::Method::POST,
                "/networks",
                Some(json!({"network": {"name": name}})),
            )
            .await;
        assert_eq!(s, 201, "create network: {v}");
        let network = v["network"]["id"].as_str().unwrap().to_owned();
        let fixture = Fixture { raw, network, name };
        let (s, v) = fixture
            .raw
            .call(
                reqwest::Method::POST,
                "/subnets",
                Some(json!({"subnet": {
                    "network_id": fixture.network, "name": fixture.name, "ip_version": 4,
                    "cidr": "10.251.7.0/24", "enable_dhcp": false}})),
            )
            .await;
        assert_eq!(s, 201, "create subnet: {v}");
        fixture
    }

    fn client(&self) -> NeutronClient {
        NeutronClient::new(NeutronConfig::new(neutron_url())).unwrap()
    }

    async fn ports_on_network(&self) -> Vec<String> {
        let (s, v) = self
            .raw
            .get(&format!("/ports?network_id={}", self.network))
            .await;
        assert_eq!(s, 200);
        v["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["id"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// Delete every port on the network, its subnets and the network.
async fn cleanup(raw: Raw, network: String) -> Result<(), String> {
    let (s, v) = raw.get(&format!("/ports?network_id={network}")).await;
    if s != 200 {
        return Err(format!("list ports of {network}: {s} {v}"));
    }
    for p in v["ports"].as_array().cloned().unwrap_or_default() {
        let id = p["id"].as_str().unwrap_or_default().to_owned();
        let (s, v) = raw
            .call(reqwest::Method::DELETE, &format!("/ports/{id}"), None)
            .await;
        if s != 204 && s != 404 {
            return Err(format!("delete port {id}: {s} {v}"));
        }
    }
    let (_, v) = raw.get(&format!("/subnets?network_id={network}")).await;
    for sub in v["subnets"].as_array().cloned().unwrap_or_default() {
        let id = sub["id"].as_str().unwrap_or_default().to_owned();
        raw.call(reqwest::Method::DELETE, &format!("/subnets/{id}"), None)
            .await;
    }
    let (s, v) = raw
        .call(
            reqwest::Method::DELETE,
            &format!("/networks/{network}"),
            None,
        )
        .await;
    if s == 204 || s == 404 {
        Ok(())
    } else {
        Err(format!("delete network {network}: {s} {v}"))
    }
}

impl Fixture {
    /// Clean up now and fail the test if anything is left behind.
    async fn close(mut self) {
        let network = std::mem::take(&mut self.network);
        cleanup(self.raw.clone(), network).await.unwrap();
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self.network.is_empty() {
            return;
        }
        let raw = self.raw.clone();
        let network = self.network.clone();
        // A test that failed before `close`: Drop cannot await, so clean up on a thread
        // with its own runtime, and wait for it.
        let t = std::thread::Builder::new()
            .name("neutron-cleanup".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(cleanup(raw, network))
            })
            .unwrap();
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("cleanup after a failed test: {e}"),
            Err(_) => eprintln!("cleanup after a failed test panicked (Neutron unreachable?)"),
        }
    }
}

/// The two agent hosts: (this machine's, another alive OVS agent's).
async fn agent_hosts(raw: &Raw) -> (String, String) {
    let (s, v) = raw.get("/agents").await;
    assert_eq!(s, 200, "{v}");
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned();
    let hosts: Vec<String> = v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["agent_type"] == json!("Open vSwitch agent") && a["alive"] == json!(true))
        .map(|a| a["host"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        hosts.contains(&hostname),
        "no alive OVS agent on this host ({hostname}): {hosts:?}"
    );
    let other = hosts
        .iter()
        .find(|h| **h != hostname)
        .unwrap_or_else(|| panic!("need a second alive OVS agent host: {hosts:?}"))
        .clone();
    (hostname, other)
}

fn bind(host: &str, vm: Uuid) -> PortUpdate {
    PortUpdate {
        host_id: Some(host.into()),
        device_id: Some(vm.to_string()),
        device_owner: Some("compute:nova".into()),
        ..PortUpdate::default()
    }
}

fn no_agent_host() -> String {
    format!(
        "vireo-noagent-{}",
        &Uuid::new_v4().simple().to_string()[..8]
    )
}

#[tokio::test]
async fn port_crud_bind_update_unbind_delete() {
    let f = Fixture::new().await;
    let c = f.client();
    let (host_a, _) = agent_hosts(&f.raw).await;
    let vm = Uuid::new_v4();

    let p = c.create_port(&f.network).await.unwrap();
    assert_eq!(p.status, PortStatus::Down);
    assert_eq!(p.vif_type, "unbound");
    assert_eq!(p.fixed_ips.len(), 1, "{p:?}");
    assert!(p.device_id.is_empty(), "{p:?}");
    // Created for an instance: named for it at once, found by it before any binding.
    let named = c.create_port_with(&f.network, Some(vm)).await.unwrap();
    assert_eq!(
        (named.device_id.as_str(), named.vif_type.as_str()),
        (vm.to_string().as_str(), "unbound")
    );
    let found: Vec<PortId> = c
        .list_instance_ports(vm)
        .await
        .unwrap()
        .iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(found, vec![named.id]);
    assert_eq!(c.delete_port(named.id).await.unwrap(), Removal::Deleted);
    assert_eq!(c.get_port(p.id).await.unwrap().mac_address, p.mac_address);
    let net = c.get_network(&f.network).await.unwrap();
    assert_eq!(net.name, f.name);
    assert!(net.mtu.is_some());

    let bound = c.update_port(p.id, &bind(&host_a, vm)).await.unwrap();
    assert_eq!(bound.host_id, host_a);
    assert_eq!(bound.vif_type, "ovs");
    assert!(bound.is_bound() && bound.is_compute_port());
    assert_eq!(bound.status, PortStatus::Down, "nothing is wired for it");
    assert_eq!(bound.vif_details["datapath_type"], json!("netdev"));
    assert!(bound.vif_details.contains_key("ovs_hybrid_plug"));

    let mut profile = Map::new();
    profile.insert("pci_slot".into(), json!("0000:81:00.2"));
    profile.insert("physical_network".into(), json!("physnet1"));
    profile.insert("trusted".into(), json!(true));
    let upd = c
        .update_port(
            p.id,
            &PortUpdate {
                profile: Some(profile),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(upd.profile["trusted"], json!(true));
    assert!(upd.is_bound());

    let ports = c.list_instance_ports(vm).await.unwrap();
    assert_eq!(ports.iter().map(|p| p.id).collect::<Vec<_>>(), vec![p.id]);

    let unbound = c.update_port(p.id, &unbind_update(&upd)).await.unwrap();
    assert_eq!(unbound.host_id, "");
    assert_eq!(unbound.vif_type, "unbound");
    assert_eq!(unbound.device_id, "");
    assert_eq!(unbound.device_owner, "");
    assert_eq!(Value::Object(unbound.profile), json!({"trusted": true}));
    assert!(c.list_instance_ports(vm).await.unwrap().is_empty());

    // A host without an agent: Neutron leaves the port binding_failed (the embedded
    // service does the same).
    let failed = c
        .update_port(p.id, &bind(&no_agent_host(), vm))
        .await
        .unwrap();
    assert_eq!(failed.vif_type, "binding_failed");
    assert_eq!(failed.status, PortStatus::Down);

    assert_eq!(c.delete_port(p.id).await.unwrap(), Removal::Deleted);
    assert_eq!(c.delete_port(p.id).await.unwrap(), Removal::AlreadyGone);
    assert!(
        matches!(c.get_port(p.id).await, Err(NetworkError::PortNotFound { port }) if port == p.id)
    );
    assert!(matches!(
        c.update_port(p.id, &bind(&host_a, vm)).await,
        Err(NetworkError::PortNotFound { .. })
    ));
    assert!(matches!(
        c.get_network(&Uuid::new_v4().to_string()).await,
        Err(NetworkError::NetworkNotFound { .. })
    ));
    f.close().await;
}

#[tokio::test]
async fn multiple_bindings_create_activate_delete() {
    let f = Fixture::new().await;
    let c = f.client();
    let (host_a, host_b) = agent_hosts(&f.raw).await;
    let vm = Uuid::new_v4();
    let p = c.create_port(&f.network).await.unwrap();

    // Not a compute port yet: the bindings API answers 400.
    let err = c
        .create_binding(
            p.id,
            &NewBinding {
                host: host_b.clone(),
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

    c.update_port(p.id, &bind(&host_a, vm)).await.unwrap();
    let b = c
        .create_binding(
            p.id,
            &NewBinding {
                host: host_b.clone(),
                ..NewBinding::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(b.status, BindingStatus::Inactive);
    assert_eq!(b.vif_type, "ovs");
    for host in [&host_b, &host_a] {
        let err = c
            .create_binding(
                p.id,
                &NewBinding {
                    host: host.clone(),
                    ..NewBinding::default()
                },
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&err, NetworkError::BindingExists { host: h, .. } if h == host),
            "{err:?}"
        );
    }
    let err = c
        .create_binding(
            p.id,
            &NewBinding {
                host: no_agent_host(),
                ..NewBinding::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, NetworkError::BindingFailed { .. }), "{err:?}");

    let bindings = c.show_bindings(p.id).await.unwrap();
    assert_eq!(bindings.len(), 2);

    let a = c.activate_binding(p.id, &host_b).await.unwrap();
    assert_eq!(a.status, BindingStatus::Active);
    let port = c.get_port(p.id).await.unwrap();
    assert_eq!(port.host_id, host_b);
    assert_eq!(port.status, PortStatus::Down);
    let bindings = c.show_bindings(p.id).await.unwrap();
    let old = bindings.iter().find(|b| b.host == host_a).unwrap();
    assert_eq!(old.status, BindingStatus::Inactive);
    assert_eq!(
        old.vif_type, "unbound",
        "the deactivated binding is cleared (the embedded service models this)"
    );

    let err = c.activate_binding(p.id, &host_b).await.unwrap_err();
    assert!(
        matches!(err, NetworkError::BindingAlreadyActive { .. }),
        "{err:?}"
    );
    let err = c.activate_binding(p.id, "vireo-nosuch").await.unwrap_err();
    assert!(
        matches!(err, NetworkError::BindingNotFound { .. }),
        "{err:?}"
    );

    let err = c.delete_binding(p.id, &host_b).await.unwrap_err();
    assert!(
        matches!(err, NetworkError::DeleteActiveBinding { .. }),
        "{err:?}"
    );
    assert_eq!(
        c.delete_binding(p.id, &host_a).await.unwrap(),
        Removal::Deleted
    );
    assert_eq!(
        c.delete_binding(p.id, &host_a).await.unwrap(),
        Removal::AlreadyGone
    );
    let hosts: Vec<String> = c
        .show_bindings(p.id)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.host)
        .collect();
    assert_eq!(hosts, vec![host_b.clone()]);
    c.delete_port(p.id).await.unwrap();
    assert_eq!(
        c.delete_binding(p.id, &host_b).await.unwrap(),
        Removal::AlreadyGone
    );
    assert!(matches!(
        c.activate_binding(p.id, &host_a).await,
        Err(NetworkError::PortNotFound { .. })
    ));
    f.close().await;
}

#[tokio::test]
async fn allocate_list_by_device_id_and_deallocate() {
    let f = Fixture::new().await;
    let c = f.client();
    let (host_a, _) = agent_hosts(&f.raw).await;
    let vm = Uuid::new_v4();

    let user = c.create_port(&f.network).await.unwrap();
    let mut profile = Map::new();
    profile.insert("pci_vendor_info".into(), json!("8086:10ed"));
    profile.insert("trusted".into(), json!(true));
    c.update_port(
        user.id,
        &PortUpdate {
            profile: Some(profile),
            ..PortUpdate::default()
        },
    )
    .await
    .unwrap();

    let ni = c
        .allocate_for_instance(
            vm,
            &host_a,
            &[
                PortRequest::Network {
                    network_id: f.network.clone(),
                },
                PortRequest::Port { port_id: user.id },
            ],
        )
        .await
        .unwrap();
    assert_eq!(ni.vifs.len(), 2);
    assert!(!ni.vifs[0].preserve_on_delete);
    assert!(ni.vifs[1].preserve_on_delete);
    assert_eq!(ni.vifs[1].id, user.id);
    for v in &ni.vifs {
        assert_eq!(v.vif_type, VifType::Ovs);
        assert_eq!(v.ovs_bridge(), "br-int");
        assert_eq!(v.network.label.as_deref(), Some(f.name.as_str()));
        assert!(v.network.mtu.is_some());
        assert_eq!(
            v.raw_value()["network"]["subnets"][0]["ips"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }
    let listed = c.list_instance_ports(vm).await.unwrap();
    assert_eq!(listed.len(), 2);
    for p in &listed {
        assert_eq!(p.host_id, host_a);
        assert_eq!(p.device_owner, "compute:nova");
    }

    // A user port used by another instance is refused, and nothing leaks.
    let before = f.ports_on_network().await.len();
    let other = Uuid::new_v4();
    let err = c
        .allocate_for_instance(
            other,
            &host_a,
            &[
                PortRequest::Network {
                    network_id: f.network.clone(),
                },
                PortRequest::Port { port_id: user.id },
            ],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, NetworkError::PortInUse { .. }), "{err:?}");
    assert_eq!(f.ports_on_network().await.len(), before);

    // A port with the instance's device id that the cache does not list.
    let stray = c.create_port(&f.network).await.unwrap();
    c.update_port(stray.id, &bind(&host_a, vm)).await.unwrap();

    let done = c.deallocate_for_instance(vm, &ni).await.unwrap();
    let mut deleted = done.deleted.clone();
    deleted.sort();
    let mut want = vec![ni.vifs[0].id, stray.id];
    want.sort();
    assert_eq!(deleted, want);
    assert_eq!(done.unbound, vec![user.id]);
    let u = c.get_port(user.id).await.unwrap();
    assert_eq!((u.host_id.as_str(), u.device_id.as_str()), ("", ""));
    assert_eq!(u.device_owner, "");
    assert_eq!(Value::Object(u.profile), json!({"trusted": true}));
    assert!(c.list_instance_ports(vm).await.unwrap().is_empty());
    let left = f.ports_on_network().await;
    assert_eq!(left, vec![user.id.to_string()]);

    let again = c.deallocate_for_instance(vm, &ni).await.unwrap();
    assert_eq!(again.already_gone, vec![ni.vifs[0].id]);
    f.close().await;
}

#[tokio::test]
async fn allocate_failure_on_a_host_without_agent_cleans_up() {
    let f = Fixture::new().await;
    let c = f.client();
    let vm = Uuid::new_v4();
    let user = c.create_port(&f.network).await.unwrap();
    let host = no_agent_host();
    let err = c
        .allocate_for_instance(
            vm,
            &host,
            &[
                PortRequest::Port { port_id: user.id },
                PortRequest::Network {
                    network_id: f.network.clone(),
                },
            ],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, NetworkError::BindingFailed { port, host: h, .. } if *port == user.id && *h == host),
        "{err:?}"
    );
    assert_eq!(f.ports_on_network().await, vec![user.id.to_string()]);
    let u = c.get_port(user.id).await.unwrap();
    assert_eq!((u.host_id.as_str(), u.device_id.as_str()), ("", ""));
    f.close().await;
}

#[tokio::test]
async fn migrating_to_set_and_clear_with_destination_bindings() {
    let f = Fixture::new().await;
    let c = f.client();
    let (host_a, host_b) = agent_hosts(&f.raw).await;
    let vm = Uuid::new_v4();
    let ni = c
        .allocate_for_instance(
            vm,
            &host_a,
            &[
                PortRequest::Network {
                    network_id: f.network.clone(),
                },
                PortRequest::Network {
                    network_id: f.network.clone(),
                },
            ],
        )
        .await
        .unwrap();
    let mut ports: Vec<PortId> = ni.vifs.iter().map(|v| v.id).collect();
    ports.sort();
    for p in &ports {
        c.create_binding(
            *p,
            &NewBinding {
                host: host_b.clone(),
                ..NewBinding::default()
            },
        )
        .await
        .unwrap();
    }
    let dest = MigrationHosts {
        dest: host_b.clone(),
    };
    let set = c
        .setup_networks_on_host(vm, &host_a, false, Some(&dest))
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
        let port = c.get_port(*p).await.unwrap();
        assert_eq!(port.migrating_to(), Some(host_b.as_str()));
        assert_eq!(
            port.host_id, host_a,
            "the active binding stays on the source"
        );
    }
    assert!(c
        .setup_networks_on_host(vm, &host_a, false, Some(&dest))
        .await
        .unwrap()
        .is_empty());

    let torn = c
        .setup_networks_on_host(vm, &host_a, true, Some(&dest))
        .await
        .unwrap();
    let mut want = Vec::new();
    for p in &ports {
        want.push(HostSetupChange::MigratingToCleared { port: *p });
        want.push(HostSetupChange::DestBindingDeleted { port: *p });
    }
    assert_eq!(torn, want);
    for p in &ports {
        let port = c.get_port(*p).await.unwrap();
        assert!(!port.profile.contains_key(MIGRATING_TO));
        let hosts: Vec<String> = c
            .show_bindings(*p)
            .await
            .unwrap()
            .into_iter()
            .map(|b| b.host)
            .collect();
        assert_eq!(hosts, vec![host_a.clone()]);
    }
    assert!(c
        .setup_networks_on_host(vm, &host_a, true, Some(&dest))
        .await
        .unwrap()
        .is_empty());
    c.deallocate_for_instance(vm, &ni).await.unwrap();
    f.close().await;
}

/// An OVS internal port in br-int standing for the port's tap; removed on drop.
struct OvsDevice {
    name: String,
}

impl OvsDevice {
    fn plug(port: PortId, mac: &str) -> OvsDevice {
        let name = format!("vnt{}", &Uuid::new_v4().simple().to_string()[..10]);
        let dev = OvsDevice { name };
        let out = Command::new("ovs-vsctl")
            .args([
                "--timeout=10",
                "add-port",
                "br-int",
                &dev.name,
                "--",
                "set",
                "Interface",
                &dev.name,
                "type=internal",
                &format!("external_ids:iface-id={port}"),
                &format!("external_ids:attached-mac={mac}"),
                "external_ids:iface-status=active",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ovs-vsctl add-port: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dev
    }

    fn present(&self) -> bool {
        Command::new("ovs-vsctl")
            .args(["--timeout=10", "port-to-br", &self.name])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    fn unplug(&self) {
        let out = Command::new("ovs-vsctl")
            .args([
                "--timeout=10",
                "--if-exists",
                "del-port",
                "br-int",
                &self.name,
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
    }
}

impl Drop for OvsDevice {
    fn drop(&mut self) {
        let _ = Command::new("ovs-vsctl")
            .args([
                "--timeout=10",
                "--if-exists",
                "del-port",
                "br-int",
                &self.name,
            ])
            .output();
    }
}

async fn wait_status(c: &NeutronClient, port: PortId, want: PortStatus, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let p = c.get_port(port).await.unwrap();
        if p.status == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: port {port} still {} (wanted {want})",
            p.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The status rules the embedded service implements, on the real thing: ACTIVE when wired
/// on the bound host; DOWN on a host change; ACTIVE again at bind time when the device is
/// still in br-int; a profile change rebinds a plugged port back to ACTIVE; unplug → DOWN;
/// activating another host's binding → DOWN, the old binding cleared.
#[tokio::test]
async fn port_status_follows_wiring_and_bindings() {
    let f = Fixture::new().await;
    let c = f.client();
    let (host_a, host_b) = agent_hosts(&f.raw).await;
    let vm = Uuid::new_v4();
    let p = c.create_port(&f.network).await.unwrap();
    let bound = c.update_port(p.id, &bind(&host_a, vm)).await.unwrap();
    assert_eq!(bound.status, PortStatus::Down);

    let dev = OvsDevice::plug(p.id, &p.mac_address.to_string());
    wait_status(&c, p.id, PortStatus::Active, "plug on the bound host").await;

    // Same host, nothing changed: stays ACTIVE.
    let same = c.update_port(p.id, &bind(&host_a, vm)).await.unwrap();
    assert_eq!(same.status, PortStatus::Active);

    // Host change: DOWN in the answer itself.
    let moved = c
        .update_port(
            p.id,
            &PortUpdate {
                host_id: Some(host_b.clone()),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(moved.status, PortStatus::Down);
    // Back while the device stayed in br-int: ACTIVE with no re-plug (bind time).
    let back = c
        .update_port(
            p.id,
            &PortUpdate {
                host_id: Some(host_a.clone()),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(back.status, PortStatus::Down);
    wait_status(
        &c,
        p.id,
        PortStatus::Active,
        "rebind with the device present",
    )
    .await;

    // Profile change on the plugged port: DOWN, then ACTIVE again by itself.
    let mut profile = Map::new();
    profile.insert(MIGRATING_TO.into(), json!(host_b));
    let upd = c
        .update_port(
            p.id,
            &PortUpdate {
                profile: Some(profile),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(upd.status, PortStatus::Down);
    wait_status(&c, p.id, PortStatus::Active, "profile rebind").await;
    c.update_port(
        p.id,
        &PortUpdate {
            profile: Some(Map::new()),
            ..PortUpdate::default()
        },
    )
    .await
    .unwrap();
    wait_status(&c, p.id, PortStatus::Active, "profile cleared").await;

    // Unplug: DOWN.
    dev.unplug();
    wait_status(&c, p.id, PortStatus::Down, "unplug").await;
    let dev = OvsDevice::plug(p.id, &p.mac_address.to_string());
    wait_status(&c, p.id, PortStatus::Active, "re-plug").await;

    // Activate the destination binding: DOWN; the old binding is kept inactive and cleared;
    // the source agent takes the device out of br-int.
    c.create_binding(
        p.id,
        &NewBinding {
            host: host_b.clone(),
            ..NewBinding::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        c.get_port(p.id).await.unwrap().status,
        PortStatus::Active,
        "an inactive binding changes nothing"
    );
    c.activate_binding(p.id, &host_b).await.unwrap();
    assert_eq!(c.get_port(p.id).await.unwrap().status, PortStatus::Down);
    let old = c
        .show_bindings(p.id)
        .await
        .unwrap()
        .into_iter()
        .find(|b| b.host == host_a)
        .unwrap();
    assert_eq!(
        (old.status, old.vif_type.as_str()),
        (BindingStatus::Inactive, "unbound")
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while dev.present() {
        assert!(
            Instant::now() < deadline,
            "the source agent did not remove {} from br-int",
            dev.name
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(dev);
    assert_eq!(c.delete_port(p.id).await.unwrap(), Removal::Deleted);
    f.close().await;
}

// ---------------------------------------------------------------------------------------
// Event parity: the same scenario against the real Neutron (its Nova notifier POSTs to the
// endpoint configured in neutron.conf, `VIREO_NEUTRON_EVENTS_ADDR`, default
// 127.0.0.1:8774) and against the embedded service; every step must bring the same events.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::broadcast;
use vireo::network::embedded::{EmbeddedConfig, EmbeddedNetwork, EmbeddedNetworkDef, Mechanism};
use vireo_actors::external::{EventSink, ExternalEvent};
use vireo_actors::wiring::{WiringChange, WiringSource};

fn events_addr() -> String {
    std::env::var("VIREO_NEUTRON_EVENTS_ADDR").unwrap_or_else(|_| "127.0.0.1:8774".to_owned())
}

/// Answers Neutron's `POST .../os-server-external-events` as Nova does and records the
/// events.
struct EventListener {
    events: Arc<Mutex<Vec<ExternalEvent>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EventListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EventListener {
    async fn start() -> EventListener {
        let addr = events_addr();
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .unwrap_or_else(|e| {
                panic!("cannot listen on {addr} for Neutron's Nova notifier (in use?): {e}")
            });
        let events: Arc<Mutex<Vec<ExternalEvent>>> = Arc::default();
        let ev2 = events.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_events(stream, ev2.clone()));
            }
        });
        EventListener { events, task }
    }

    /// Events for `vm` so far, emptying them.
    fn take(&self, vm: Uuid) -> Vec<(String, String)> {
        let mut all = self.events.lock().unwrap();
        let (mine, rest): (Vec<_>, Vec<_>) = all.drain(..).partition(|e| e.server_uuid == vm);
        *all = rest;
        mine.into_iter()
            .map(|e| (e.name.to_string(), format!("{:?}", e.status)))
            .collect()
    }
}

async fn serve_events(stream: tokio::net::TcpStream, events: Arc<Mutex<Vec<ExternalEvent>>>) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).await.unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end().to_ascii_lowercase();
            if h.is_empty() {
                break;
            }
            if let Some(v) = h.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; len];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        let answer = if line.starts_with("POST") && line.contains("/os-server-external-events") {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let list = v["events"].as_array().cloned().unwrap_or_default();
            let mut echoed = Vec::new();
            for e in list {
                if let Ok(ev) = serde_json::from_value::<ExternalEvent>(e.clone()) {
                    events.lock().unwrap().push(ev);
                }
                let mut e = e;
                e["code"] = json!(200);
                echoed.push(e);
            }
            json!({ "events": echoed }).to_string()
        } else {
            "{}".to_owned()
        };
        let out = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if reader.get_mut().write_all(out.as_bytes()).await.is_err() {
            return;
        }
    }
}

#[derive(Debug)]
struct TestWiring {
    tx: broadcast::Sender<WiringChange>,
    wired: Mutex<HashSet<PortId>>,
}

impl WiringSource for TestWiring {
    fn subscribe(&self) -> broadcast::Receiver<WiringChange> {
        self.tx.subscribe()
    }
    fn wired(&self) -> Vec<PortId> {
        self.wired.lock().unwrap().iter().copied().collect()
    }
}

impl TestWiring {
    fn set(&self, port: PortId, wired: bool) {
        if wired {
            self.wired.lock().unwrap().insert(port);
        } else {
            self.wired.lock().unwrap().remove(&port);
        }
        let _ = self.tx.send(WiringChange {
            port,
            device: "tap".into(),
            wired,
        });
    }
}

#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<ExternalEvent>>);

impl EventSink for Recorder {
    fn deliver(&self, event: ExternalEvent) {
        self.0.lock().unwrap().push(event);
    }
}

/// One step of the scenario.
#[derive(Debug, Clone, Copy)]
enum Step {
    Bind,
    Plug,
    RebindSameHost,
    MoveToB,
    MoveBackToA,
    SetMigratingTo,
    ClearMigratingTo,
    Unplug,
    CreateBindingB,
    ActivateB,
    Delete,
}

const SCENARIO: [Step; 12] = [
    Step::Bind,
    Step::Plug,
    Step::RebindSameHost,
    Step::MoveToB,
    Step::MoveBackToA,
    Step::SetMigratingTo,
    Step::ClearMigratingTo,
    Step::Unplug,
    Step::Plug,
    Step::CreateBindingB,
    Step::ActivateB,
    Step::Delete,
];

async fn do_step(
    api: &dyn NetworkApi,
    step: Step,
    port: PortId,
    vm: Uuid,
    (host_a, host_b): (&str, &str),
    plug: &mut dyn FnMut(bool),
) {
    let profile = |v: Option<&str>| {
        let mut m = Map::new();
        if let Some(h) = v {
            m.insert(MIGRATING_TO.into(), json!(h));
        }
        PortUpdate {
            profile: Some(m),
            ..PortUpdate::default()
        }
    };
    let host = |h: &str| PortUpdate {
        host_id: Some(h.into()),
        ..PortUpdate::default()
    };
    match step {
        Step::Bind | Step::RebindSameHost => {
            api.update_port(port, &bind(host_a, vm)).await.unwrap();
        }
        Step::Plug => plug(true),
        Step::Unplug => plug(false),
        Step::MoveToB => {
            api.update_port(port, &host(host_b)).await.unwrap();
        }
        Step::MoveBackToA => {
            api.update_port(port, &host(host_a)).await.unwrap();
        }
        Step::SetMigratingTo => {
            api.update_port(port, &profile(Some(host_b))).await.unwrap();
        }
        Step::ClearMigratingTo => {
            api.update_port(port, &profile(None)).await.unwrap();
        }
        Step::CreateBindingB => {
            let b = NewBinding {
                host: host_b.into(),
                ..NewBinding::default()
            };
            api.create_binding(port, &b).await.unwrap();
        }
        Step::ActivateB => {
            api.activate_binding(port, host_b).await.unwrap();
            // Neutron's agent on the old host takes the device out of br-int; the embedded
            // service has no hands on the host, so the harness does the same there.
            plug(false);
        }
        Step::Delete => {
            api.delete_port(port).await.unwrap();
        }
    }
}

fn sorted(mut v: Vec<(String, String)>) -> Vec<(String, String)> {
    v.sort();
    v
}

#[tokio::test]
async fn embedded_service_sends_the_events_neutron_sends() {
    let listener = EventListener::start().await;
    let f = Fixture::new().await;
    let c = f.client();
    let (host_a, host_b) = agent_hosts(&f.raw).await;
    let hosts = (host_a.as_str(), host_b.as_str());

    // The embedded twin: one network like the fixture's (OVS, hybrid plug as the real agent
    // reports), both hosts attached.
    let real_net = c.get_network(&f.network).await.unwrap();
    let probe = c.create_port(&f.network).await.unwrap();
    let probe_bound = c
        .update_port(probe.id, &bind(&host_a, Uuid::new_v4()))
        .await
        .unwrap();
    let hybrid = probe_bound.vif_details["ovs_hybrid_plug"] == json!(true);
    c.delete_port(probe.id).await.unwrap();
    let rec = Arc::new(Recorder::default());
    let emb = EmbeddedNetwork::new(
        EmbeddedConfig {
            networks: vec![EmbeddedNetworkDef {
                id: f.network.clone(),
                name: real_net.name.clone(),
                mtu: real_net.mtu,
                mechanism: Mechanism::Openvswitch,
                ovs_hybrid_plug: hybrid,
                bridge_name: None,
                datapath_type: Some("netdev".into()),
                physical_network: None,
                vlan: None,
            }],
            ..EmbeddedConfig::default()
        },
        rec.clone(),
    )
    .unwrap();
    let wiring_a = Arc::new(TestWiring {
        tx: broadcast::channel(16).0,
        wired: Mutex::default(),
    });
    let wiring_b = Arc::new(TestWiring {
        tx: broadcast::channel(16).0,
        wired: Mutex::default(),
    });
    emb.attach_host(&host_a, wiring_a.clone()).unwrap();
    emb.attach_host(&host_b, wiring_b).unwrap();

    let vm_real = Uuid::new_v4();
    let vm_emb = Uuid::new_v4();
    let real_port = c.create_port(&f.network).await.unwrap();
    let emb_port = emb.create_port(&f.network).await.unwrap();
    let mut device: Option<OvsDevice> = None;
    let mac = real_port.mac_address.to_string();

    for step in SCENARIO {
        // Embedded first: its events are the expectation.
        let w = wiring_a.clone();
        let ep = emb_port.id;
        do_step(&*emb, step, ep, vm_emb, hosts, &mut |on| w.set(ep, on)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let want: Vec<(String, String)> = std::mem::take(&mut *rec.0.lock().unwrap())
            .into_iter()
            .map(|e| (e.name.to_string(), format!("{:?}", e.status)))
            .collect();

        let rp = real_port.id;
        do_step(&c, step, rp, vm_real, hosts, &mut |on| {
            if on {
                device = Some(OvsDevice::plug(rp, &mac));
            } else if let Some(d) = device.take() {
                d.unplug();
            }
        })
        .await;
        // Neutron sends within ~2 s (0.3-1.6 s + a 2 s batching window): collect until the
        // expected events are there, then 4 s more to catch extra ones.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut got = Vec::new();
        loop {
            got.extend(listener.take(vm_real));
            if sorted(got.clone()) == sorted(want.clone()) || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(4)).await;
        got.extend(listener.take(vm_real));
        assert_eq!(
            sorted(got.clone()),
            sorted(want.clone()),
            "step {step:?}: Neutron sent {got:?}, the embedded service {want:?}"
        );
        eprintln!("step {step:?}: {want:?}");
    }
    drop(device);
    f.close().await;
}
