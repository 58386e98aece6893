//! Shared helpers of the plug tests: VIFs with random port ids, a plugger on a private netdev
//! OVS bridge, outside views of the host (`ovs-vsctl`, `ip -d -j link`, sysfs, `virsh`),
//! wiring waits and transient qemu:///system domains.
//!
//! These tests run as root against the real OVS (userspace datapath), kernel bridges and
//! libvirtd. They fail, never skip, when one is missing.

#![allow(dead_code)]
// Test support: a failed helper is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::broadcast;
use uuid::Uuid;
use vireo::plug::leak::{Fixture, LeakGuard};
use vireo::plug::sriov::SriovHost;
use vireo::plug::{DatapathType, HostPlugger, PlugConfig};
use vireo_actors::plug::{DomainForm, PlugContext};
use vireo_actors::vif::{NetworkInfo, PortId, Vif};
use vireo_actors::wiring::WiringChange;

/// 8 random hex characters.
pub fn uniq() -> String {
    Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// A random locally administered unicast MAC (fa:16:3e like Neutron).
pub fn mac() -> String {
    let b = Uuid::new_v4().into_bytes();
    format!("fa:16:3e:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2])
}

/// Parse one VIF dict.
pub fn vif(v: Value) -> Vif {
    NetworkInfo::from_value(&json!([v])).unwrap().vifs.remove(0)
}

/// The port-id fragment in device names of `v` (11 characters).
pub fn frag(v: &Vif) -> String {
    v.id.prefix(11)
}

/// An OVS VIF on `bridge`.
pub fn ovs_vif(bridge: &str, hybrid: bool, mtu: u32) -> Vif {
    vif(json!({
        "id": Uuid::new_v4().to_string(), "address": mac(), "type": "ovs",
        "details": {"ovs_hybrid_plug": hybrid, "port_filter": hybrid, "datapath_type": "netdev"},
        "network": {"id": Uuid::new_v4().to_string(), "bridge": bridge, "meta": {"mtu": mtu}}
    }))
}

/// A Linux-bridge VIF on `bridge`.
pub fn lb_vif(bridge: &str, mtu: u32) -> Vif {
    vif(json!({
        "id": Uuid::new_v4().to_string(), "address": mac(), "type": "bridge",
        "network": {"id": Uuid::new_v4().to_string(), "bridge": bridge, "meta": {"mtu": mtu}}
    }))
}

pub fn ctx(form: DomainForm) -> PlugContext {
    PlugContext {
        instance_uuid: Uuid::new_v4(),
        instance_name: format!("vplug-{}", uniq()),
        form,
    }
}

pub fn config() -> PlugConfig {
    PlugConfig {
        datapath_type: DatapathType::Netdev,
        ..PlugConfig::default()
    }
}

pub fn plugger() -> HostPlugger {
    HostPlugger::start(config()).unwrap()
}

pub fn plugger_with_sriov(sriov: Arc<dyn SriovHost>) -> HostPlugger {
    HostPlugger::start_with_sriov(config(), sriov).unwrap()
}

/// A test's names and leak guard: an OVS test bridge name `vpb<uniq>` (created by the
/// plugger, removed by the guard as a fixture) and the guard watching the unique fragment.
pub struct Scene {
    pub id: String,
    pub bridge: String,
    pub guard: LeakGuard,
}

impl Scene {
    pub fn new() -> Self {
        let id = uniq();
        let bridge = format!("vpb{id}");
        let mut guard = LeakGuard::new([id.clone()]);
        guard.fixture(Fixture::OvsBridge(bridge.clone()));
        Scene { id, bridge, guard }
    }

    /// Watch the device names of `v`.
    pub fn watch(&mut self, v: &Vif) {
        self.guard.watch(frag(v));
    }

    /// A Linux bridge name for this test (a fixture the guard removes).
    pub fn linux_bridge(&mut self) -> String {
        let b = format!("vpl{}", self.id);
        self.guard.fixture(Fixture::Link(b.clone()));
        b
    }

    /// A domain name for this test (a fixture the guard destroys).
    pub fn domain(&mut self) -> String {
        let d = format!("vplug-{}", self.id);
        self.guard.fixture(Fixture::Domain(d.clone()));
        d
    }
}

/// Run a program; stdout on success, panic with stderr otherwise.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Run a program; (success, stdout).
pub fn try_run(program: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(program).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

pub fn vsctl(args: &[&str]) -> String {
    let mut a = vec!["--timeout=10"];
    a.extend_from_slice(args);
    run("ovs-vsctl", &a)
}

/// `ovs-vsctl get Interface NAME external_ids:KEY` without quotes.
pub fn iface_ext(name: &str, key: &str) -> String {
    vsctl(&["get", "Interface", name, &format!("external_ids:{key}")])
        .trim_matches('"')
        .to_owned()
}

pub fn br_exists(b: &str) -> bool {
    try_run("ovs-vsctl", &["--timeout=10", "br-exists", b]).0
}

pub fn ports_of(b: &str) -> Vec<String> {
    vsctl(&["list-ports", b])
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect()
}

/// `ip -d -j link show dev NAME`, or None when absent.
pub fn ip_link(name: &str) -> Option<Value> {
    let (ok, out) = try_run("ip", &["-d", "-j", "link", "show", "dev", name]);
    if !ok {
        return None;
    }
    let v: Value = serde_json::from_str(&out).unwrap();
    v.get(0).cloned()
}

pub fn link_exists(name: &str) -> bool {
    PathBuf::from("/sys/class/net").join(name).exists()
}

/// The bridge a link is enslaved to, from sysfs.
pub fn master_of(name: &str) -> Option<String> {
    std::fs::read_link(PathBuf::from("/sys/class/net").join(name).join("master"))
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
}

pub fn sysfs(name: &str, attr: &str) -> String {
    std::fs::read_to_string(PathBuf::from("/sys/class/net").join(name).join(attr))
        .unwrap()
        .trim()
        .to_owned()
}

/// Wait for a change of `port` to `wired` (any device, or `device` when given).
pub async fn wait_wired(
    rx: &mut broadcast::Receiver<WiringChange>,
    port: PortId,
    wired: bool,
    device: Option<&str>,
) -> WiringChange {
    let fut = async {
        loop {
            match rx.recv().await {
                Ok(c) if c.port == port && c.wired == wired => {
                    if device.is_none_or(|d| d == c.device) {
                        return c;
                    }
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("wiring stream ended: {e}"),
            }
        }
    };
    match tokio::time::timeout(Duration::from_secs(20), fut).await {
        Ok(c) => c,
        Err(_) => panic!("no wiring change {port} wired={wired} within 20 s"),
    }
}

/// Start a transient KVM domain on qemu:///system with one NIC given as XML.
pub fn start_domain(name: &str, nic: &str) {
    let xml = format!(
        "<domain type='kvm'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='q35'>hvm</type></os>\
         <devices>{nic}</devices></domain>"
    );
    let path = std::env::temp_dir().join(format!("{name}.xml"));
    std::fs::write(&path, xml).unwrap();
    run(
        "virsh",
        &["-c", "qemu:///system", "create", path.to_str().unwrap()],
    );
    let _ = std::fs::remove_file(path);
    assert_eq!(
        run("virsh", &["-c", "qemu:///system", "domstate", name]),
        "running"
    );
}

pub fn destroy_domain(name: &str) {
    run("virsh", &["-c", "qemu:///system", "destroy", name]);
}
