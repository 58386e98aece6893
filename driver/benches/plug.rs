//! Plug + unplug latency per VIF kind on the real host (OVS userspace datapath, kernel
//! bridges), against a baseline of the same device operations done by `ip` and `ovs-vsctl`
//! commands run one by one (measured in the same run), and 50 VIFs plugged in parallel vs in
//! series. SR-IOV runs on a fabricated sysfs tree with the recording VF control (no baseline:
//! there is no hardware to run `ip link set PF vf N` against).
//!
//! Run as root: `cargo bench -p vireo --bench plug` (env `VIREO_PLUG_BENCH_ITERS`, default 40;
//! `VIREO_PLUG_BENCH_PARALLEL`, default 50). Creates only `vbb<random>`-named bridges and
//! port-id-named devices, and removes them (a leak guard checks at the end).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use uuid::Uuid;
use vireo::plug::leak::{Fixture, LeakGuard};
use vireo::plug::sriov::{fabricate_pf, RecordingVfControl, SysfsSriov, SysfsTopology};
use vireo::plug::{DatapathType, HostPlugger, PlugConfig};
use vireo_actors::plug::{DomainForm, PlugContext, VifPlugger};
use vireo_actors::vif::{NetworkInfo, Vif};

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn mac() -> String {
    let b = Uuid::new_v4().into_bytes();
    format!("fa:16:3e:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2])
}

fn vif(v: serde_json::Value) -> Vif {
    NetworkInfo::from_value(&json!([v])).unwrap().vifs.remove(0)
}

fn ovs_vif(bridge: &str, hybrid: bool) -> Vif {
    vif(
        json!({"id": Uuid::new_v4().to_string(), "address": mac(), "type": "ovs",
        "details": {"ovs_hybrid_plug": hybrid, "datapath_type": "netdev"},
        "network": {"id": "n", "bridge": bridge, "meta": {"mtu": 1450}}}),
    )
}

fn lb_vif(bridge: &str) -> Vif {
    vif(
        json!({"id": Uuid::new_v4().to_string(), "address": mac(), "type": "bridge",
        "network": {"id": "n", "bridge": bridge, "meta": {"mtu": 1450}}}),
    )
}

fn sriov_vif() -> Vif {
    vif(
        json!({"id": Uuid::new_v4().to_string(), "address": mac(), "type": "hw_veb",
        "vnic_type": "direct", "details": {"vlan": 100},
        "profile": {"pci_slot": "0000:81:10.0"}}),
    )
}

fn ctx(form: DomainForm) -> PlugContext {
    PlugContext {
        instance_uuid: Uuid::new_v4(),
        instance_name: "bench".into(),
        form,
    }
}

fn cmd(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn host_mac(v: &Vif) -> String {
    let mut m = v.address.octets();
    m[0] = 0xfe;
    vireo_xml::types::MacAddress(m).to_string()
}

fn ovs_add_port(bridge: &str, port: &str, v: &Vif, c: &PlugContext) {
    cmd(
        "ovs-vsctl",
        &[
            "--",
            "--may-exist",
            "add-br",
            bridge,
            "--",
            "set",
            "Bridge",
            bridge,
            "datapath_type=netdev",
            "--",
            "--may-exist",
            "add-port",
            bridge,
            port,
            "--",
            "set",
            "Interface",
            port,
            &format!("external_ids:iface-id={}", v.id),
            "external_ids:iface-status=active",
            &format!("external_ids:attached-mac={}", v.address),
            &format!("external_ids:vm-uuid={}", c.instance_uuid),
            "mtu_request=1450",
        ],
    );
}

fn tap_up(tap: &str, v: &Vif) {
    cmd("ip", &["tuntap", "add", "dev", tap, "mode", "tap"]);
    cmd(
        "ip",
        &[
            "link",
            "set",
            "dev",
            tap,
            "mtu",
            "1450",
            "address",
            &host_mac(v),
            "up",
        ],
    );
}

/// The same device operations as vireo, one command at a time.
fn baseline(kind: Kind, bridge: &str, lbr: &str, v: &Vif, c: &PlugContext) {
    let (tap, qbr, qvb, qvo) = (v.tap_name(), v.qbr_name(), v.qvb_name(), v.qvo_name());
    match kind {
        Kind::OvsPre => {
            tap_up(&tap, v);
            ovs_add_port(bridge, &tap, v, c);
            cmd("ovs-vsctl", &["--if-exists", "del-port", &tap]);
            cmd("ip", &["link", "del", "dev", &tap]);
        }
        Kind::OvsManaged => {
            cmd("ovs-vsctl", &["--may-exist", "add-br", bridge]);
            cmd("ovs-vsctl", &["--if-exists", "del-port", &tap]);
        }
        Kind::HybridManaged | Kind::HybridPre => {
            cmd(
                "ip",
                &[
                    "link",
                    "add",
                    &qbr,
                    "type",
                    "bridge",
                    "stp_state",
                    "0",
                    "forward_delay",
                    "0",
                ],
            );
            cmd("ip", &["link", "set", "dev", &qbr, "up"]);
            cmd(
                "ip",
                &[
                    "link", "add", &qvb, "mtu", "1450", "type", "veth", "peer", "name", &qvo,
                    "mtu", "1450",
                ],
            );
            cmd("ip", &["link", "set", "dev", &qvb, "up"]);
            cmd("ip", &["link", "set", "dev", &qvo, "up"]);
            cmd("ip", &["link", "set", "dev", &qvb, "master", &qbr]);
            ovs_add_port(bridge, &qvo, v, c);
            if kind == Kind::HybridPre {
                tap_up(&tap, v);
                cmd("ip", &["link", "set", "dev", &tap, "master", &qbr]);
                cmd("ip", &["link", "del", "dev", &tap]);
            }
            cmd("ovs-vsctl", &["--if-exists", "del-port", &qvo]);
            cmd("ip", &["link", "del", "dev", &qvb]);
            cmd("ip", &["link", "del", "dev", &qbr]);
        }
        Kind::LbPre => {
            cmd("ip", &["link", "show", "dev", lbr]);
            tap_up(&tap, v);
            cmd("ip", &["link", "set", "dev", &tap, "master", lbr]);
            cmd("ip", &["link", "del", "dev", &tap]);
        }
        Kind::LbManaged => cmd("ip", &["link", "show", "dev", lbr]),
        Kind::Sriov => {}
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    OvsPre,
    OvsManaged,
    HybridManaged,
    HybridPre,
    LbPre,
    LbManaged,
    Sriov,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::OvsPre,
        Kind::OvsManaged,
        Kind::HybridManaged,
        Kind::HybridPre,
        Kind::LbPre,
        Kind::LbManaged,
        Kind::Sriov,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::OvsPre => "ovs native, pre-created",
            Kind::OvsManaged => "ovs native, libvirt-managed",
            Kind::HybridManaged => "ovs hybrid, libvirt-managed",
            Kind::HybridPre => "ovs hybrid, pre-created",
            Kind::LbPre => "linux bridge, pre-created",
            Kind::LbManaged => "linux bridge, libvirt-managed",
            Kind::Sriov => "sr-iov vf (fabricated)",
        }
    }

    fn form(self) -> DomainForm {
        match self {
            Kind::OvsPre | Kind::HybridPre | Kind::LbPre => DomainForm::PreCreated,
            _ => DomainForm::LibvirtManaged,
        }
    }

    fn vif(self, bridge: &str, lbr: &str) -> Vif {
        match self {
            Kind::OvsPre | Kind::OvsManaged => ovs_vif(bridge, false),
            Kind::HybridManaged | Kind::HybridPre => ovs_vif(bridge, true),
            Kind::LbPre | Kind::LbManaged => lb_vif(lbr),
            Kind::Sriov => sriov_vif(),
        }
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:8.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let iters = env_usize("VIREO_PLUG_BENCH_ITERS", 40);
    let parallel = env_usize("VIREO_PLUG_BENCH_PARALLEL", 50);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let id = Uuid::new_v4().simple().to_string()[..8].to_owned();
    let bridge = format!("vbb{id}");
    let lbr = format!("vbl{id}");
    let mut guard = LeakGuard::new([id.clone()]);
    guard.fixture(Fixture::OvsBridge(bridge.clone()));
    guard.fixture(Fixture::Link(lbr.clone()));
    let sysfs = tempfile::tempdir().unwrap();

    rt.block_on(async {
        let pci = |s: &str| s.parse().unwrap();
        fabricate_pf(
            sysfs.path(),
            pci("0000:81:00.0"),
            "enp129s0f0",
            &[(pci("0000:81:10.0"), Some("enp129s0f0v0"))],
        )
        .unwrap();
        let cfg = PlugConfig {
            datapath_type: DatapathType::Netdev,
            ..PlugConfig::default()
        };
        let sriov = Arc::new(SysfsSriov {
            topology: SysfsTopology::new(sysfs.path()),
            control: Arc::new(RecordingVfControl::new()),
        });
        let p = Arc::new(HostPlugger::start_with_sriov(cfg, sriov).unwrap());
        // Warm up: the bridges exist, the OVSDB connection is open.
        let warm = ovs_vif(&bridge, false);
        p.plug(&ctx(DomainForm::LibvirtManaged), &warm).await.unwrap();
        cmd("ip", &["link", "add", &lbr, "type", "bridge"]);
        cmd("ip", &["link", "set", "dev", &lbr, "up"]);

        println!("plug+unplug latency, {iters} iterations per kind (new VIF each time)");
        println!(
            "{:<32} {:>11} {:>11}   {:>11} {:>11}   verdict",
            "kind", "vireo p50", "vireo p99", "ip/vsctl p50", "p99"
        );
        for kind in Kind::ALL {
            let mut ours = Vec::with_capacity(iters);
            let mut base = Vec::with_capacity(iters);
            for _ in 0..iters {
                let v = kind.vif(&bridge, &lbr);
                guard.watch(v.id.prefix(11));
                let c = ctx(kind.form());
                let t = Instant::now();
                p.plug(&c, &v).await.unwrap();
                p.unplug(&c, &v).await.unwrap();
                ours.push(t.elapsed());
                if kind != Kind::Sriov {
                    let v = kind.vif(&bridge, &lbr);
                    guard.watch(v.id.prefix(11));
                    let t = Instant::now();
                    baseline(kind, &bridge, &lbr, &v, &c);
                    base.push(t.elapsed());
                }
            }
            ours.sort();
            base.sort();
            let verdict = if base.is_empty() {
                "no baseline (no SR-IOV hardware)".to_owned()
            } else if pct(&ours, 0.5) <= pct(&base, 0.5) {
                format!("ok ({:.1}x faster)", pct(&base, 0.5).as_secs_f64() / pct(&ours, 0.5).as_secs_f64())
            } else {
                format!("SLOWER ({:.2}x)", pct(&ours, 0.5).as_secs_f64() / pct(&base, 0.5).as_secs_f64())
            };
            println!(
                "{:<32} {} {}   {} {}   {verdict}",
                kind.name(),
                ms(pct(&ours, 0.5)),
                ms(pct(&ours, 0.99)),
                ms(pct(&base, 0.5)),
                ms(pct(&base, 0.99)),
            );
        }

        for kind in [Kind::OvsPre, Kind::HybridManaged] {
            let vifs: Vec<Vif> = (0..parallel).map(|_| kind.vif(&bridge, &lbr)).collect();
            for v in &vifs {
                guard.watch(v.id.prefix(11));
            }
            let c = ctx(kind.form());
            let t = Instant::now();
            for v in &vifs {
                p.plug(&c, v).await.unwrap();
            }
            let serial_plug = t.elapsed();
            let t = Instant::now();
            for v in &vifs {
                p.unplug(&c, v).await.unwrap();
            }
            let serial_unplug = t.elapsed();

            let t = Instant::now();
            let tasks: Vec<_> = vifs
                .iter()
                .map(|v| {
                    let (p, c, v) = (p.clone(), c.clone(), v.clone());
                    tokio::spawn(async move { p.plug(&c, &v).await })
                })
                .collect();
            for task in tasks {
                task.await.unwrap().unwrap();
            }
            let par_plug = t.elapsed();
            let t = Instant::now();
            let tasks: Vec<_> = vifs
                .iter()
                .map(|v| {
                    let (p, c, v) = (p.clone(), c.clone(), v.clone());
                    tokio::spawn(async move { p.unplug(&c, &v).await })
                })
                .collect();
            for task in tasks {
                task.await.unwrap().unwrap();
            }
            let par_unplug = t.elapsed();
            let ratio = par_plug.as_secs_f64() / serial_plug.as_secs_f64();
            println!(
                "{parallel} x {}: plug serial {} parallel {} (ratio {ratio:.2}, target <= 0.5: {}); unplug serial {} parallel {} (ratio {:.2})",
                kind.name(),
                ms(serial_plug),
                ms(par_plug),
                if ratio <= 0.5 { "ok" } else { "MISSED" },
                ms(serial_unplug),
                ms(par_unplug),
                par_unplug.as_secs_f64() / serial_unplug.as_secs_f64(),
            );
        }
        p.unplug(&ctx(DomainForm::LibvirtManaged), &warm).await.unwrap();
    });
    drop(guard);
}
