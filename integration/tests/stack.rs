//! vireo end to end on the real stack: `qemu:///system`, this machine's Open vSwitch and
//! kernel bridges, the real Neutron (ML2/OVS, noauth) whose Nova notifier posts to the
//! vireo agent's events endpoint on 127.0.0.1:8774, and the embedded network service for
//! Linux-bridge ports (Neutron here runs no Linux bridge agent).
//!
//! Its own harness (`harness = false`, see `vireo_integration::runner`): the scenarios run
//! one at a time — hybrid ones with the `iptables_hybrid` firewall, Linux-bridge ones, then
//! the firewall is switched to `openvswitch` once for the native ones and switched back —
//! and the timing table is printed at the end and written to
//! `target/integration-timings.txt`. Needs root and `integration/host-setup.sh up
//! --with-neutron`; fails (never skips) when a daemon is missing.

// The whole file is test code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use uuid::Uuid;
use vireo::compute::{ComputeDriver, ComputeOps};
use vireo::network::embedded::{EmbeddedConfig, EmbeddedNetworkDef, Mechanism};
use vireo::plug::leak::Fixture;
use vireo_actors::instance::SpawnStorage;
use vireo_actors::instance::{
    BootSource, DestroyArgs, InstanceError, LiveMigrateArgs, Migration, NetworkRequest, OpReport,
    RebootKind, ResizeArgs,
};
use vireo_actors::lifecycle::InstanceState;
use vireo_actors::network::{MigrationHosts, NetworkApi, PortRequest};
use vireo_actors::plug::DomainForm;
use vireo_actors::predict::{predict, EventOp, Timing, Wiring};
use vireo_actors::storage::{Checksum, ConfigDrive, ImageFormat, ImageId, ImageRef};
use vireo_actors::vif::{NetworkInfo, PortId, Vif, VifType};
use vireo_integration::endpoint::EndpointOptions;
use vireo_integration::firewall::{Firewall, FirewallGuard};
use vireo_integration::guest::{open_dir, wait_ready};
use vireo_integration::host::{Host, HostOptions, NetChoice, Plugging};
use vireo_integration::runner::Runner;
use vireo_integration::scene::{bind_port, flavor, Run, Scene};
use vireo_integration::timing::timings_file;
use vireo_integration::HarnessError;
use vireo_xml::domain::DomainType;

type R = Result<(), HarnessError>;

// ----------------------------------------------------------------------------------------
// Checks

fn waited(report: &OpReport, t: Timing) -> BTreeSet<PortId> {
    report
        .waits
        .iter()
        .filter(|w| w.timing == t)
        .flat_map(|w| w.expected.iter().map(|e| e.tag))
        .collect()
}

fn set(ports: &[PortId]) -> BTreeSet<PortId> {
    ports.iter().copied().collect()
}

/// Every wait of `report` completed (never a timeout), and together they awaited exactly
/// `bind` at bind time and `plug` at plug time.
fn assert_waited(what: &str, report: &OpReport, bind: &[PortId], plug: &[PortId]) {
    for w in &report.waits {
        assert!(
            w.complete,
            "{what}: wait {:?} did not complete: {} (missing {:?})",
            w.timing, w.outcome, w.missing
        );
    }
    assert_eq!(
        waited(report, Timing::BindTime),
        set(bind),
        "{what}: bind-time wait"
    );
    assert_eq!(
        waited(report, Timing::PlugTime),
        set(plug),
        "{what}: plug-time wait"
    );
}

/// The operation waited for exactly these events, every wait completed (never a timeout),
/// and every awaited event was seen arriving at the endpoint during the operation.
fn assert_waits(s: &Scene<'_>, what: &str, report: &OpReport, bind: &[PortId], plug: &[PortId]) {
    assert_waited(what, report, bind, plug);
    let row = s.run.timings.rows().pop().expect("a timing row");
    for w in row.waits.iter().filter(|w| w.expected > 0) {
        assert!(
            w.last_arrival_at.is_some(),
            "{what}: a {:?} wait ended but not every awaited event was seen arriving",
            w.timing
        );
    }
}

async fn state(h: &Host, id: Uuid) -> InstanceState {
    h.driver
        .show(id)
        .await
        .unwrap_or_else(|e| panic!("show {id}: {}", vireo_integration::chain(&e)))
        .state
}

async fn assert_state(h: &Host, id: Uuid, want: InstanceState) {
    let got = state(h, id).await;
    assert_eq!(got, want, "instance {id} on {}", h.name);
}

fn link_exists(name: &str) -> bool {
    std::path::Path::new("/sys/class/net").join(name).exists()
}

fn master_of(name: &str) -> Option<String> {
    std::fs::read_link(
        std::path::Path::new("/sys/class/net")
            .join(name)
            .join("master"),
    )
    .ok()
    .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
}

fn ovs_bridge_of(port: &str) -> Option<String> {
    let out = Command::new("ovs-vsctl")
        .args(["--timeout=10", "port-to-br", port])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn run_cmd(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The host devices of a VIF are there (wired) or all gone.
fn assert_devices(v: &Vif, form: DomainForm, present: bool) {
    let want = |name: &str, ok: bool, what: &str| {
        assert_eq!(
            ok, present,
            "{what} {name} of {} (present: {present})",
            v.id
        );
    };
    match (v.vif_type, v.details.ovs_hybrid_plug) {
        (VifType::Ovs, true) => {
            let (qbr, qvb, qvo) = (v.qbr_name(), v.qvb_name(), v.qvo_name());
            want(&qbr, link_exists(&qbr), "qbr");
            want(
                &qvb,
                master_of(&qvb).as_deref() == Some(qbr.as_str()),
                "qvb in qbr",
            );
            want(
                &qvo,
                ovs_bridge_of(&qvo).as_deref() == Some("br-int"),
                "qvo in br-int",
            );
        }
        (VifType::Ovs, false) => {
            let tap = v.tap_name();
            if present || form == DomainForm::PreCreated {
                want(
                    &tap,
                    ovs_bridge_of(&tap).as_deref() == Some(v.ovs_bridge()),
                    "tap in its OVS bridge",
                );
            }
        }
        (VifType::Bridge, _) => {
            let tap = v.tap_name();
            let br = v.linux_bridge_name().unwrap();
            want(
                &tap,
                master_of(&tap).as_deref() == Some(br.as_str()),
                "tap in its bridge",
            );
        }
        other => panic!("unexpected VIF kind {other:?}"),
    }
}

async fn vifs_of(h: &Host, id: Uuid) -> Vec<Vif> {
    let view = h.driver.show(id).await.unwrap();
    let mut out = Vec::new();
    for v in view.vifs {
        let port = h.network.get_port(v.port).await.unwrap();
        let net = h.network.get_network(&port.network_id).await.unwrap();
        let dict = vireo::network::vif_dict(&port, &net, false, &h.ovs_bridge);
        out.push(
            NetworkInfo::from_value(&serde_json::Value::Array(vec![dict]))
                .unwrap()
                .vifs
                .remove(0),
        );
    }
    out
}

fn ids(vifs: &[Vif]) -> Vec<PortId> {
    vifs.iter().map(|v| v.id).collect()
}

// ----------------------------------------------------------------------------------------
// Building blocks

/// Spawn a diskless guest with `n` ports vireo allocates on `network`.
async fn spawn_allocated(
    s: &mut Scene<'_>,
    h: usize,
    network: &str,
    n: usize,
) -> (Uuid, Vec<Vif>, OpReport) {
    let id = s.instance();
    let args = s.spawn_args(NetworkRequest::Allocate(
        (0..n)
            .map(|_| PortRequest::Network {
                network_id: network.to_owned(),
            })
            .collect(),
    ));
    let host = &s.hosts[h];
    let report = s.ok(host, "spawn", id, host.driver.spawn(id, args)).await;
    let vifs = vifs_of(host, id).await;
    for v in &vifs {
        s.book.vireo(v.id);
        s.watch(v.id.prefix(11));
    }
    (id, vifs, report)
}

async fn destroy(s: &Scene<'_>, h: &Host, id: Uuid) {
    let r = s
        .ok(
            h,
            "destroy",
            id,
            h.driver.destroy(
                id,
                DestroyArgs {
                    deallocate_network: true,
                },
            ),
        )
        .await;
    assert!(r.released.is_some(), "destroy released the networking");
}

/// Soft and hard reboot, pause/unpause, power off/on, suspend/resume: each checked against
/// libvirt's state and the waits the model predicts (`recreated`: ports whose device is
/// recreated with the domain and therefore reported again).
async fn lifecycle(
    s: &Scene<'_>,
    h: &Host,
    id: Uuid,
    vifs: &[Vif],
    form: DomainForm,
    recreated: &[PortId],
) {
    let api = &h.driver;
    // A soft reboot asks the guest to shut down; these guests have no OS and ignore ACPI, so
    // after the host's soft_reboot_timeout the domain is rebooted hard, which the report
    // says; either way the domain is recreated: the waits of a hard reboot.
    let r = s
        .ok(h, "reboot soft", id, api.reboot(id, RebootKind::Soft))
        .await;
    assert_waits(s, "soft reboot", &r, &[], recreated);
    assert!(
        r.steps.iter().any(|st| st
            .name
            .starts_with("soft reboot: the guest did not shut down")),
        "no hard-reboot fallback in {r:?}"
    );
    assert_state(h, id, InstanceState::Running).await;

    let r = s
        .ok(h, "reboot hard", id, api.reboot(id, RebootKind::Hard))
        .await;
    assert_waits(s, "hard reboot", &r, &[], recreated);
    assert_state(h, id, InstanceState::Running).await;
    for v in vifs {
        assert_devices(v, form, true);
    }

    s.ok(h, "pause", id, api.pause(id)).await;
    assert_state(h, id, InstanceState::Paused).await;
    s.ok(h, "unpause", id, api.unpause(id)).await;
    assert_state(h, id, InstanceState::Running).await;

    s.ok(
        h,
        "power off",
        id,
        api.power_off(id, Some(Duration::from_secs(1))),
    )
    .await;
    assert_state(h, id, InstanceState::Stopped).await;
    // Devices vireo made stay wired while the guest is off (the model's premise).
    for v in vifs {
        if v.details.ovs_hybrid_plug || form == DomainForm::PreCreated {
            assert_devices(v, form, true);
        }
    }
    let r = s.ok(h, "power on", id, api.power_on(id)).await;
    assert_waits(s, "power on", &r, &[], recreated);
    assert_state(h, id, InstanceState::Running).await;

    s.ok(h, "suspend", id, api.suspend(id)).await;
    assert_state(h, id, InstanceState::Suspended).await;
    let r = s.ok(h, "resume", id, api.resume(id)).await;
    assert_waits(s, "resume", &r, &[], recreated);
    assert_state(h, id, InstanceState::Running).await;
    for v in vifs {
        assert_devices(v, form, true);
    }
}

/// Same-host resize and revert (no bind-time wait anywhere; both wait for the taps libvirt
/// recreates, the devices vireo keeps wired report nothing).
async fn resize_revert(s: &Scene<'_>, h: &Host, id: Uuid, vifs: &[Vif], finish_plug: &[PortId]) {
    let migration = Migration {
        id: Uuid::new_v4(),
        source_host: h.name.clone(),
        dest_host: h.name.clone(),
    };
    let r = s
        .ok(
            h,
            "resize (same host)",
            id,
            h.driver
                .resize(id, ResizeArgs::of(&migration, flavor("m1.small", 1, 192))),
        )
        .await;
    assert_waits(s, "resize", &r, &[], finish_plug);
    assert_state(h, id, InstanceState::ResizeTarget).await;
    assert_eq!(
        h.driver.show(id).await.unwrap().flavor.as_deref(),
        Some("m1.small")
    );
    let r = s
        .ok(h, "revert (same host)", id, h.driver.revert_resize(id))
        .await;
    assert_waits(s, "revert", &r, &[], finish_plug);
    assert_state(h, id, InstanceState::Running).await;
    assert_eq!(
        h.driver.show(id).await.unwrap().flavor.as_deref(),
        Some("m1.tiny")
    );
    for v in vifs {
        assert_devices(v, DomainForm::LibvirtManaged, true);
    }
}

fn lb_network() -> (String, EmbeddedConfig) {
    let id = Uuid::new_v4().to_string();
    let cfg = EmbeddedConfig {
        networks: vec![EmbeddedNetworkDef {
            id: id.clone(),
            name: format!("vit-lb-{}", &id[..8]),
            mtu: Some(1500),
            mechanism: Mechanism::Linuxbridge,
            ovs_hybrid_plug: false,
            bridge_name: None,
            datapath_type: None,
            physical_network: None,
            vlan: None,
        }],
        ..EmbeddedConfig::default()
    };
    (id, cfg)
}

fn brq(network: &str) -> String {
    format!("brq{network}").chars().take(14).collect()
}

// ----------------------------------------------------------------------------------------
// Scenarios: OVS hybrid (iptables_hybrid)

async fn hybrid_spawn_lifecycle(run: &Run) -> R {
    let mut s = Scene::new(run, "hybrid: spawn+lifecycle");
    let opts = s.system_host();
    s.host(opts).await?;
    let net = run.env.network_id.clone();
    let (id, vifs, report) = spawn_allocated(&mut s, 0, &net, 2).await;
    for v in &vifs {
        assert!(v.details.ovs_hybrid_plug, "Neutron bound {} hybrid", v.id);
        assert_devices(v, DomainForm::LibvirtManaged, true);
    }
    assert_waits(&s, "spawn", &report, &[], &ids(&vifs));
    let h = s.a();
    lifecycle(&s, h, id, &vifs, DomainForm::LibvirtManaged, &[]).await;
    destroy(&s, h, id).await;
    for v in &vifs {
        assert_devices(v, DomainForm::LibvirtManaged, false);
    }
    s.finish().await
}

async fn hybrid_resize_revert(run: &Run) -> R {
    let mut s = Scene::new(run, "hybrid: resize+revert");
    let opts = s.system_host();
    s.host(opts).await?;
    let net = run.env.network_id.clone();
    let (id, vifs, _) = spawn_allocated(&mut s, 0, &net, 1).await;
    let h = s.a();
    resize_revert(&s, h, id, &vifs, &[]).await;
    destroy(&s, h, id).await;
    s.finish().await
}

/// A port whose `network-vif-plugged` can never come (bound to the second host, where
/// nothing wires it, after Nova read its `network_info`): the build times out, is rolled
/// back and may be rescheduled; the user port is unbound.
async fn build_fails_port_never_active(run: &Run) -> R {
    let mut s = Scene::new(run, "build fails: silent port");
    let mut opts = s.system_host();
    opts.wait_timeout = Duration::from_secs(6);
    s.host(opts).await?;
    let id = s.instance();
    let net = s.a().network.clone();
    let p = s.user_port(&*net, &run.env.network_id).await;
    let vif = s.bind_user_port(&*net, p, &run.env.second_host, id).await;
    let args = s.spawn_args(NetworkRequest::Allocated(NetworkInfo { vifs: vec![vif] }));
    let h = s.a();
    let e = s
        .op(h, "spawn (silent port)", id, h.driver.spawn(id, args))
        .await
        .expect_err("a build whose port never goes ACTIVE fails");
    match &e {
        InstanceError::BuildFailed {
            reschedule,
            released,
            cause,
        } => {
            assert!(*reschedule, "{e:?}");
            assert_eq!(released.unbound, vec![p], "{e:?}");
            assert!(
                matches!(**cause, InstanceError::EventWait { .. }),
                "cause: {}",
                vireo_integration::chain(&e)
            );
        }
        other => panic!("want BuildFailed, got {}", vireo_integration::chain(other)),
    }
    assert!(h.driver.show(id).await.is_err(), "no instance left");
    s.finish().await
}

/// A plug that fails (the user port's `qbr` name is taken by a non-bridge link): the build
/// is rolled back — the port vireo created is deleted, the user port unbound, nothing left
/// on the host — and may be rescheduled.
async fn build_fails_bad_bridge(run: &Run) -> R {
    let mut s = Scene::new(run, "build fails: bad bridge");
    let opts = s.system_host();
    s.host(opts).await?;
    let id = s.instance();
    let net = s.a().network.clone();
    let p = s.user_port(&*net, &run.env.network_id).await;
    let qbr: String = format!("qbr{p}").chars().take(14).collect();
    // A tap: no dummy/veth kernel modules are needed for it.
    run_cmd("ip", &["tuntap", "add", "dev", &qbr, "mode", "tap"]);
    s.fixture(Fixture::Link(qbr.clone()));
    let args = s.spawn_args(NetworkRequest::Allocate(vec![
        PortRequest::Network {
            network_id: run.env.network_id.clone(),
        },
        PortRequest::Port { port_id: p },
    ]));
    let h = s.a();
    let e = s
        .op(h, "spawn (bad bridge)", id, h.driver.spawn(id, args))
        .await
        .expect_err("a build whose plug fails fails");
    match &e {
        InstanceError::BuildFailed {
            reschedule,
            released,
            cause,
        } => {
            assert!(*reschedule, "{e:?}");
            assert_eq!(released.unbound, vec![p], "{e:?}");
            assert_eq!(released.deleted.len(), 1, "{e:?}");
            assert!(
                matches!(**cause, InstanceError::Plug { .. }),
                "cause: {}",
                vireo_integration::chain(&e)
            );
            for d in &released.deleted {
                s.book.vireo(*d);
            }
        }
        other => panic!("want BuildFailed, got {}", vireo_integration::chain(other)),
    }
    run_cmd("ip", &["link", "del", "dev", &qbr]);
    s.finish().await
}

/// Hot-plug a port into a running guest (plug-time wait for its event), then unplug it.
/// Attach an interface to a running diskless guest, then detach it. The guest runs no OS, so
/// it never releases the device: the detach asks it `attempts` times, waiting each time for
/// libvirt's device-removed event, then fails with the interface still attached and its host
/// side still plugged (a detach used to report success and unplug a device QEMU still had).
/// The booted-guest scenario shows the other half: a guest that releases the device.
async fn hybrid_attach_detach(run: &Run) -> R {
    let mut s = Scene::new(run, "hybrid: attach+detach");
    let mut opts = s.system_host();
    opts.device_detach = vireo_actors::instance::DetachPolicy {
        timeout: Duration::from_secs(1),
        attempts: 2,
    };
    s.host(opts).await?;
    let net_id = run.env.network_id.clone();
    let (id, vifs, _) = spawn_allocated(&mut s, 0, &net_id, 1).await;
    let (p, vif) =
        attach_user_port(&s, id, &net_id, &run.env.host, DomainForm::LibvirtManaged).await;
    let net = s.a().network.clone();
    let h = s.a();
    let xml = h.driver.libvirt().xml_desc(id, false).await.unwrap();
    assert!(
        xml.contains(&format!("ua-{p}")),
        "live XML has the interface"
    );
    // A running domain with no job: QEMU's driver answers with no job parameters at all (a
    // null array, which virt 0.5's job_stats turned into a Vec and aborted the process on).
    let job = h.driver.libvirt().job_progress(id).await.unwrap();
    assert!(!job.active, "no job runs: {job:?}");
    let view = h.driver.show(id).await.unwrap();
    assert_eq!(view.vifs.len(), 2);
    let started = Instant::now();
    let err = h.driver.detach_interface(id, p).await.unwrap_err();
    assert!(
        matches!(&err, InstanceError::DeviceNotReleased { attempts: 2, .. }),
        "{err:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "waited for the event each attempt"
    );
    // Nothing was taken from under QEMU: the device is still in the live domain, its host
    // side still plugged, the instance still has the interface.
    assert!(h
        .driver
        .libvirt()
        .xml_desc(id, false)
        .await
        .unwrap()
        .contains(&format!("ua-{p}")));
    assert_devices(&vif, DomainForm::LibvirtManaged, true);
    assert_eq!(h.driver.show(id).await.unwrap().vifs.len(), 2);
    assert_devices(&vifs[0], DomainForm::LibvirtManaged, true);
    destroy(&s, h, id).await;
    assert_devices(&vif, DomainForm::LibvirtManaged, false);
    // Nova's part when it gives the port up: it leaves the instance.
    unbind(&*net, p).await;
    s.finish().await
}

/// attach-interface of a user's port on `network`, bound to `host` for instance `id` by the
/// caller (as Nova does): the attach awaits that port's plug-time event, and its device is
/// wired. Returns the port and its VIF.
async fn attach_user_port(
    s: &Scene<'_>,
    id: Uuid,
    network: &str,
    host: &str,
    form: DomainForm,
) -> (PortId, Vif) {
    let net = s.a().network.clone();
    let p = s.user_port(&*net, network).await;
    let vif = s.bind_user_port(&*net, p, host, id).await;
    let h = s.a();
    let r = s
        .ok(
            h,
            "attach interface",
            id,
            h.driver.attach_interface(id, vif.clone()),
        )
        .await;
    assert_waits(s, "attach", &r, &[], &[p]);
    assert_devices(&vif, form, true);
    (p, vif)
}

/// Unbind a user's port from its instance (the caller's part once the instance is gone).
async fn unbind(net: &dyn NetworkApi, p: PortId) {
    net.update_port(
        p,
        &vireo_actors::network::unbind_update(&net.get_port(p).await.unwrap()),
    )
    .await
    .unwrap();
}

/// A live migration to a host whose libvirt cannot be reached fails and is rolled back from
/// the source, whatever the storage flags: no `migrating_to`, no inactive destination
/// binding, the guest still running here, nothing left on the destination.
async fn live_migration_rollback(run: &Run) -> R {
    let mut s = Scene::new(run, "live migration rollback");
    let opts = s.system_host();
    s.host(opts).await?;
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("h2.xml");
    std::fs::write(&node, "<node/>\n").unwrap();
    let dest = run.env.second_host.clone();
    let mut b = HostOptions::system(&dest);
    b.uri = format!("test://{}", node.display());
    b.plugging = Plugging::Recording;
    b.domain_type = DomainType::Test;
    b.migration_uri = Some("qemu+tcp://127.0.0.1:1/system".into());
    s.host(b).await?;
    let net = run.env.network_id.clone();
    let (id, vifs, _) = spawn_allocated(&mut s, 0, &net, 1).await;
    let (a, bh) = (&s.hosts[0], &s.hosts[1]);
    // Twice: a rollback leaves the instance ready for the next attempt.
    for attempt in 1..=2 {
        let label = format!("live-migrate fails #{attempt}");
        let e = s
            .op(
                a,
                &label,
                id,
                a.driver.live_migrate(
                    id,
                    LiveMigrateArgs::of(&Migration {
                        id: Uuid::new_v4(),
                        source_host: a.name.clone(),
                        dest_host: dest.clone(),
                    }),
                ),
            )
            .await
            .expect_err("migration to an unreachable libvirt fails");
        assert!(
            matches!(e, InstanceError::RolledBack { .. }),
            "{label}: {}",
            vireo_integration::chain(&e)
        );
        assert_state(a, id, InstanceState::Running).await;
        for v in &vifs {
            let port = a.network.get_port(v.id).await.unwrap();
            assert_eq!(port.host_id, a.name, "{label}: still bound here");
            assert!(port.migrating_to().is_none(), "{label}: migrating_to left");
            let bindings = a.network.show_bindings(v.id).await.unwrap();
            assert_eq!(
                bindings.len(),
                1,
                "{label}: only the active binding: {bindings:?}"
            );
            assert_devices(v, DomainForm::LibvirtManaged, true);
        }
        assert!(
            bh.driver.list().await.is_empty(),
            "{label}: destination holds nothing"
        );
        assert!(bh.recording.as_ref().unwrap().plugged().is_empty());
    }
    destroy(&s, a, id).await;
    s.finish().await
}

// ----------------------------------------------------------------------------------------
// Scenarios: Linux bridge through the embedded service

/// Bytes of a file, hex sha256 (the image and its base must never change).
fn sha256_file(path: &std::path::Path) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// `qemu-io` reads `len` bytes at `offset` of a qcow2 file while its domain may run (shared
/// lock) and checks them against `pattern`.
fn overlay_holds(path: &std::path::Path, offset: u64, len: u64, pattern: u8) -> bool {
    let out = Command::new("qemu-io")
        .args(["-r", "-U", "-f", "qcow2", "-c"])
        .arg(format!("read -P {pattern:#x} {offset} {len}"))
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    out.status.success()
        && text.contains(&format!("read {len}/{len} bytes"))
        && !text.contains("Pattern verification failed")
}

/// Two guests from one image on `qemu:///system` (TCG, direct kernel boot): each boots with
/// its own overlay as `vda`, grown to the flavor's root disk, and mounts its config drive;
/// the first writes its disk, the second still reads the image, the image and the cached
/// base never change, and destroy leaves no disk behind.
async fn boot_with_disks(run: &Run) -> R {
    let mut s = Scene::new(run, "booted guest: disks");
    let guest = run.guest().await?;
    let consoles = open_dir("vireo-it-console-")?;
    let state = open_dir("vireo-it-state-")?;
    let images = open_dir("vireo-it-images-")?;
    let mut opts = s.system_host();
    opts.domain_type = DomainType::Qemu;
    opts.console_dir = Some(consoles.path().display().to_string());
    opts.state_dir = state.path().to_owned();
    s.host(opts).await?;
    // A 16 MiB raw image: "VIREODSK" at 0, 0xab from 1 MiB on.
    let image = images.path().join("disk.raw");
    let mut bytes = vec![0u8; 16 << 20];
    bytes[..8].copy_from_slice(b"VIREODSK");
    bytes[1 << 20..].fill(0xab);
    std::fs::write(&image, &bytes).unwrap();
    let sum = sha256_file(&image);
    let mut ids = Vec::new();
    for (n, write) in [(0, true), (1, false)] {
        let id = s.instance();
        let dir = consoles.path().join(id.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let mut args = s.spawn_args(NetworkRequest::Allocated(NetworkInfo::default()));
        args.flavor = flavor("m1.disk", 1, 256);
        args.flavor.root_gb = 1;
        args.boot = BootSource::Kernel {
            kernel: guest.kernel.display().to_string(),
            initrd: Some(guest.initrd.display().to_string()),
            cmdline: Some(format!(
                "{} vireo.nics=0 vireo.disks=1 vireo.cd=1{}",
                guest.cmdline,
                if write { " vireo.write" } else { "" }
            )),
        };
        args.storage = SpawnStorage {
            image: Some(ImageRef {
                id: ImageId::new("it-disk").unwrap(),
                source: image.display().to_string(),
                checksum: Some(Checksum::Sha256(sum.clone())),
                format: ImageFormat::Raw,
            }),
            image_token: None,
            config_drive: Some(ConfigDrive {
                user_data: Some(format!("vireo-user-data-{n}")),
                ..ConfigDrive::default()
            }),
        };
        let h = s.a();
        s.ok(h, "spawn (guest with disks)", id, h.driver.spawn(id, args))
            .await;
        let boot = wait_ready(&dir.join("console.log"), 1, Duration::from_secs(180)).await?;
        println!(
            "guest {n} READY at uptime {} s: {:?}",
            boot.uptime, boot.disks
        );
        // The driver's console output is the end of the same log (what Nova's
        // `get_console_output` shows an operator).
        let out = h
            .driver
            .console_output(id, vireo::agent::server::MAX_CONSOLE_BYTES)
            .await
            .unwrap();
        assert!(
            out.lines()
                .any(|l| l.trim().starts_with("VIREO-GUEST-READY")),
            "console output: {:?}",
            &out[out.len().saturating_sub(400)..]
        );
        let vda = boot
            .disks
            .iter()
            .find(|d| d.name == "vda")
            .unwrap_or_else(|| panic!("the guest sees no vda: {boot:?}"));
        assert_eq!(
            vda.bytes,
            1 << 30,
            "vda is the flavor's root disk, grown: {boot:?}"
        );
        assert_eq!(
            vda.head,
            hex(b"VIREODSK"),
            "vda starts with the image: {boot:?}"
        );
        assert_eq!(
            boot.config_drive,
            Some((id.to_string(), format!("vireo-user-data-{n}"))),
            "the guest mounts its config drive: {boot:?}"
        );
        assert_eq!(boot.wrote, write, "{boot:?}");
        ids.push(id);
    }
    // The first guest's write is in its overlay only.
    let disk = |id: Uuid| state.path().join(format!("instances/{id}/disk"));
    assert!(overlay_holds(&disk(ids[0]), 1 << 20, 512, b'X'));
    assert!(overlay_holds(&disk(ids[1]), 1 << 20, 512, 0xab));
    let base = state.path().join("_base/it-disk");
    assert_eq!(sha256_file(&base), sum, "the cached base is never written");
    assert_eq!(sha256_file(&image), sum);
    let h = s.a();
    for id in &ids {
        s.ok(
            h,
            "destroy",
            *id,
            h.driver.destroy(
                *id,
                DestroyArgs {
                    deallocate_network: true,
                },
            ),
        )
        .await;
        assert!(!state.path().join(format!("instances/{id}")).exists());
    }
    assert_eq!(sha256_file(&base), sum);
    s.finish().await
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Linux bridge ports with Neutron's own Linux bridge agent: host-setup runs one as a host of
/// its own (`VIREO_NEUTRON_LB_HOST`) in this namespace, serving a flat network; vireo runs as
/// that host here, so Neutron binds the ports `bridge` and every event a wait counts comes from
/// that agent (no stand-in).
async fn linuxbridge_spawn_lifecycle(run: &Run) -> R {
    let mut s = Scene::new(run, "linux bridge (Neutron's agent): spawn+lifecycle");
    let net = run.env.lb_network_id.clone();
    let mut opts = s.system_host();
    opts.name = run.env.lb_host.clone();
    s.host(opts).await?;
    let (id, vifs, report) = spawn_allocated(&mut s, 0, &net, 1).await;
    assert_eq!(vifs[0].vif_type, VifType::Bridge);
    assert_devices(&vifs[0], DomainForm::LibvirtManaged, true);
    assert_waits(&s, "spawn", &report, &[], &ids(&vifs));
    let h = s.a();
    lifecycle(&s, h, id, &vifs, DomainForm::LibvirtManaged, &ids(&vifs)).await;
    resize_revert(&s, h, id, &vifs, &ids(&vifs)).await;
    profile_changes(&s, id, &vifs).await;
    // attach-interface: a user's port on the agent's network, bound here by the caller.
    let (p, vif) =
        attach_user_port(&s, id, &net, &run.env.lb_host, DomainForm::LibvirtManaged).await;
    destroy(&s, h, id).await;
    assert_devices(&vif, DomainForm::LibvirtManaged, false);
    unbind(&*s.a().network, p).await;
    s.finish().await
}

/// ML2/OVN: the second Neutron (`VIREO_OVN_NEUTRON_URL`), whose one chassis is an
/// ovn-controller on this machine's Open vSwitch as host `VIREO_OVN_HOST`, with its own
/// integration bridge. vireo runs as that host, plugs into that bridge (ML2/OVN's bindings
/// name none: `[network.neutron] ovs_bridge`), and every event a wait counts comes from
/// ML2/OVN (the logical port going up once ovn-controller claimed it).
async fn ovn_spawn_lifecycle(run: &Run, form: DomainForm) -> R {
    let name = match form {
        DomainForm::LibvirtManaged => OVN[0],
        DomainForm::PreCreated => OVN[1],
    };
    let env = &run.env;
    let mut s = Scene::on_neutron(run, name, &env.ovn_neutron_url, &env.ovn_bridge)?;
    let mut opts = s.system_host();
    opts.name = env.ovn_host.clone();
    opts.ovs_native_form = form;
    s.host(opts).await?;
    let net = env.ovn_network_id.clone();
    let (id, vifs, report) = spawn_allocated(&mut s, 0, &net, 1).await;
    assert!(
        !vifs[0].details.ovs_hybrid_plug,
        "ML2/OVN has no hybrid plug"
    );
    assert_eq!(vifs[0].ovs_bridge(), env.ovn_bridge);
    // vireo's own record knows the port as ML2/OVN's (read back after the binding).
    let view = s.a().driver.show(id).await.unwrap();
    assert_eq!(view.vifs[0].bound_by.as_deref(), Some("ovn"), "{view:?}");
    let recreated = native_spawned_then_lifecycle(&s, id, &vifs, &report, form).await;
    let h = s.a();
    resize_revert(&s, h, id, &vifs, &recreated).await;
    profile_changes(&s, id, &vifs).await;
    let (p, vif) = attach_user_port(&s, id, &net, &env.ovn_host, form).await;
    destroy(&s, h, id).await;
    assert_devices(&vif, form, false);
    unbind(&*s.a().network, p).await;
    s.finish().await
}

/// A native OVS port (the OVS agent's or ML2/OVN's) after its spawn: its device and the
/// spawn's plug-time wait, then [`lifecycle`]; returns the ports whose device libvirt
/// recreates with the domain (and which therefore report again).
async fn native_spawned_then_lifecycle(
    s: &Scene<'_>,
    id: Uuid,
    vifs: &[Vif],
    report: &OpReport,
    form: DomainForm,
) -> Vec<PortId> {
    assert_devices(&vifs[0], form, true);
    assert_waits(s, "spawn", report, &[], &ids(vifs));
    let recreated = match form {
        DomainForm::LibvirtManaged => ids(vifs),
        DomainForm::PreCreated => vec![],
    };
    lifecycle(s, s.a(), id, vifs, form, &recreated).await;
    recreated
}

/// `binding:profile.migrating_to` set and cleared on plugged ports (what a live migration
/// without multiple port bindings does, and its rollback): each change is checked against the
/// prediction vireo's flow waits with (`update_profiles`): where it predicts an event,
/// `vif-plugged` arrives; where it predicts none (ML2/OVN leaves a cleared port DOWN), none
/// arrives within 8 s. Run on ML2/OVN's ports and on the Linux bridge agent's.
async fn profile_changes(s: &Scene<'_>, id: Uuid, vifs: &[Vif]) {
    let h = s.a();
    let dest = MigrationHosts {
        dest: s.run.env.second_host.clone(),
    };
    for (op, migration) in [
        (EventOp::UpdateBindingProfile, Some(&dest)),
        (EventOp::ClearBindingProfile, None),
    ] {
        let prediction = predict(&op, vifs, &Wiring::default()).unwrap();
        // ML2/OVN sends each vif-plugged more than once (the status hook and a direct
        // notification); Neutron's notifier batches them per 2 s (`send_events_interval`). A
        // copy of the previous change's event in a later batch must not be taken for this
        // change's: let a whole window pass first.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let since = Instant::now();
        h.network
            .setup_networks_on_host(id, &h.name, migration.is_none(), migration)
            .await
            .unwrap_or_else(|e| panic!("{}: {}", op.name(), vireo_integration::chain(&e)));
        for v in &prediction.vifs {
            let arrived = s
                .run
                .endpoint
                .log()
                .wait_for(
                    id,
                    vireo_actors::external::EventName::NetworkVifPlugged,
                    &v.port.to_string(),
                    since,
                    Duration::from_secs(8),
                )
                .await;
            let after = arrived.as_ref().map(|a| a.at - since);
            println!(
                "{}: port {} predicted {:?}, vif-plugged after {after:?}",
                op.name(),
                v.port,
                v.timing
            );
            match v.timing {
                Timing::BindTime => assert!(
                    arrived.is_some(),
                    "{}: no vif-plugged for {}",
                    op.name(),
                    v.port
                ),
                Timing::None => assert!(
                    arrived.is_none(),
                    "{}: vif-plugged for {} predicted none: {arrived:?}",
                    op.name(),
                    v.port
                ),
                Timing::PlugTime => panic!("{}: nothing is plugged here: {}", op.name(), v.reason),
            }
        }
    }
}

// ----------------------------------------------------------------------------------------
// Scenarios: OVS native (openvswitch firewall)

async fn native_spawn_lifecycle(run: &Run, form: DomainForm) -> R {
    let name = match form {
        DomainForm::LibvirtManaged => "native libvirt-managed: spawn+lifecycle",
        DomainForm::PreCreated => "native pre-created: spawn+lifecycle",
    };
    let mut s = Scene::new(run, name);
    let mut opts = s.system_host();
    opts.ovs_native_form = form;
    s.host(opts).await?;
    let net = run.env.network_id.clone();
    let (id, vifs, report) = spawn_allocated(&mut s, 0, &net, 1).await;
    assert!(!vifs[0].details.ovs_hybrid_plug, "Neutron bound it native");
    native_spawned_then_lifecycle(&s, id, &vifs, &report, form).await;
    let h = s.a();
    if form == DomainForm::LibvirtManaged {
        resize_revert(&s, h, id, &vifs, &ids(&vifs)).await;
    }
    destroy(&s, h, id).await;
    s.finish().await
}

/// The hybrid port of the booted guest, bound while the firewall was `iptables_hybrid`
/// (Neutron keeps a binding's `vif_details` until it is rebound).
#[derive(Debug)]
struct Carried {
    instance: Uuid,
    port: PortId,
    vif: Vif,
}

async fn bind_hybrid_port_for_later(run: &Run) -> Result<Carried, HarnessError> {
    let client = vireo::network::neutron::NeutronClient::new(
        vireo::network::neutron::NeutronConfig::new(run.env.neutron_url.clone()),
    )
    .map_err(|e| HarnessError::Setup(e.to_string()))?;
    let instance = Uuid::new_v4();
    let p = client
        .create_port(&run.env.network_id)
        .await
        .map_err(|e| HarnessError::Setup(vireo_integration::chain(&e)))?;
    let vif = bind_port(&client, p.id, &run.env.host, instance).await;
    assert!(vif.details.ovs_hybrid_plug, "bound hybrid");
    Ok(Carried {
        instance,
        port: p.id,
        vif,
    })
}

/// A guest that really boots (TCG, direct kernel boot) with an OVS hybrid, an OVS native and
/// a Linux-bridge NIC, prints every NIC with its MAC, and gets one more NIC hot-plugged and
/// removed again.
async fn boot_mixed_nics(run: &Run, carried: Carried) -> R {
    let mut s = Scene::new(run, "booted guest: hybrid+native+lb");
    s.book.instance(carried.instance);
    s.book.user(carried.port);
    s.watch(carried.port.prefix(11));
    let guest = run.guest().await?;
    let consoles = open_dir("vireo-it-console-")?;
    let (lb_net, cfg) = lb_network();
    s.fixture(Fixture::Link(brq(&lb_net)));
    let mut opts = s.system_host();
    opts.network = NetChoice::Split(cfg);
    opts.domain_type = DomainType::Qemu;
    opts.console_dir = Some(consoles.path().display().to_string());
    opts.ovs_native_form = DomainForm::LibvirtManaged;
    s.host(opts).await?;
    let id = carried.instance;
    let host = run.env.host.clone();
    let net = s.a().network.clone();
    let native = s.user_port(&*net, &run.env.network_id).await;
    let native_vif = s.bind_user_port(&*net, native, &host, id).await;
    assert!(!native_vif.details.ovs_hybrid_plug);
    let lb = s.user_port(&*net, &lb_net).await;
    let lb_vif = s.bind_user_port(&*net, lb, &host, id).await;
    assert_eq!(lb_vif.vif_type, VifType::Bridge);
    let mut vifs = vec![carried.vif.clone(), native_vif, lb_vif];
    for (i, v) in vifs.iter_mut().enumerate() {
        v.index = i;
    }
    let dir = consoles.path().join(id.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let log = dir.join("console.log");
    let mut args = s.spawn_args(NetworkRequest::Allocated(NetworkInfo {
        vifs: vifs.clone(),
    }));
    args.flavor = flavor("m1.boot", 1, 256);
    args.boot = BootSource::Kernel {
        kernel: guest.kernel.display().to_string(),
        initrd: Some(guest.initrd.display().to_string()),
        cmdline: Some(format!("{} vireo.nics=3", guest.cmdline)),
    };
    let h = s.a();
    let r = s
        .ok(h, "spawn (booted guest)", id, h.driver.spawn(id, args))
        .await;
    assert_waits(&s, "spawn", &r, &[], &ids(&vifs));
    let boot = wait_ready(&log, 1, Duration::from_secs(180)).await?;
    let seen: BTreeSet<String> = boot.nics.iter().map(|n| n.mac.clone()).collect();
    let want: BTreeSet<String> = vifs.iter().map(|v| v.address.to_string()).collect();
    assert_eq!(
        seen, want,
        "the guest sees every NIC with its MAC: {boot:?}"
    );
    for n in &boot.nics {
        assert_eq!(n.driver, "virtio_net", "{n:?}");
        assert_eq!(n.carrier, "1", "{n:?}");
    }
    println!(
        "guest READY at uptime {} s with {:?}",
        boot.uptime, boot.nics
    );

    // Hot-plug a fourth NIC (native) into the booted guest, then remove it: the guest
    // acknowledges the removal, so the live definition loses it.
    let extra = s.user_port(&*net, &run.env.network_id).await;
    let extra_vif = s.bind_user_port(&*net, extra, &host, id).await;
    let r = s
        .ok(
            h,
            "attach interface",
            id,
            h.driver.attach_interface(id, extra_vif.clone()),
        )
        .await;
    assert_waits(&s, "attach", &r, &[], &[extra]);
    let alias = format!("ua-{extra}");
    assert!(h
        .driver
        .libvirt()
        .xml_desc(id, false)
        .await
        .unwrap()
        .contains(&alias));
    s.ok(
        h,
        "detach interface",
        id,
        h.driver.detach_interface(id, extra),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while h
        .driver
        .libvirt()
        .xml_desc(id, false)
        .await
        .unwrap()
        .contains(&alias)
    {
        assert!(
            Instant::now() < deadline,
            "the guest never released the detached NIC"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    net.update_port(
        extra,
        &vireo_actors::network::unbind_update(&net.get_port(extra).await.unwrap()),
    )
    .await
    .unwrap();
    destroy(&s, h, id).await;
    s.finish().await
}

// ----------------------------------------------------------------------------------------

const HYBRID: [&str; 5] = [
    "hybrid: spawn+lifecycle",
    "hybrid: resize+revert",
    "hybrid: attach+detach",
    "build fails",
    "live migration rollback",
];
const OVN: [&str; 2] = [
    "ML2/OVN libvirt-managed: spawn+lifecycle",
    "ML2/OVN pre-created: spawn+lifecycle",
];
const NATIVE: [&str; 3] = [
    "native libvirt-managed: spawn+lifecycle",
    "native pre-created: spawn+lifecycle",
    "booted guest: hybrid+native+lb",
];

async fn run_all(runner: &mut Runner) {
    let run = match Run::start(EndpointOptions::alone()).await {
        Ok(r) => r,
        Err(e) => {
            runner.fail("set-up", &e);
            return;
        }
    };
    println!(
        "events endpoint on {}, Neutron at {}",
        run.endpoint.addr(),
        run.env.neutron_url
    );
    let hybrid = match FirewallGuard::to(&run.raw, &run.env.host, Firewall::IptablesHybrid).await {
        Ok(g) => g,
        Err(e) => {
            runner.fail("firewall iptables_hybrid", &e);
            return;
        }
    };
    runner.run(HYBRID[0], || hybrid_spawn_lifecycle(&run)).await;
    runner.run(HYBRID[1], || hybrid_resize_revert(&run)).await;
    runner.run(HYBRID[2], || hybrid_attach_detach(&run)).await;
    runner
        .run("build fails: silent port", || {
            build_fails_port_never_active(&run)
        })
        .await;
    runner
        .run("build fails: bad bridge", || build_fails_bad_bridge(&run))
        .await;
    runner
        .run(HYBRID[4], || live_migration_rollback(&run))
        .await;
    runner
        .run("linux bridge (Neutron's agent): spawn+lifecycle", || {
            linuxbridge_spawn_lifecycle(&run)
        })
        .await;
    runner
        .run(OVN[0], || {
            ovn_spawn_lifecycle(&run, DomainForm::LibvirtManaged)
        })
        .await;
    runner
        .run(OVN[1], || ovn_spawn_lifecycle(&run, DomainForm::PreCreated))
        .await;
    runner
        .run("booted guest: disks", || boot_with_disks(&run))
        .await;

    if runner.any_selected(&NATIVE) && !runner.listing() {
        let carried = if runner.selected(NATIVE[2]) {
            match bind_hybrid_port_for_later(&run).await {
                Ok(c) => Some(c),
                Err(e) => {
                    runner.fail("bind the hybrid port", &e);
                    None
                }
            }
        } else {
            None
        };
        let start = Instant::now();
        match FirewallGuard::to(&run.raw, &run.env.host, Firewall::Openvswitch).await {
            Ok(native) => {
                println!(
                    "firewall -> openvswitch in {:.1} s",
                    start.elapsed().as_secs_f64()
                );
                runner
                    .run(NATIVE[0], || {
                        native_spawn_lifecycle(&run, DomainForm::LibvirtManaged)
                    })
                    .await;
                runner
                    .run(NATIVE[1], || {
                        native_spawn_lifecycle(&run, DomainForm::PreCreated)
                    })
                    .await;
                if let Some(c) = carried {
                    runner.run(NATIVE[2], || boot_mixed_nics(&run, c)).await;
                }
                let start = Instant::now();
                if let Err(e) = tokio::task::spawn_blocking(move || native.restore())
                    .await
                    .unwrap()
                {
                    runner.fail("firewall back", &e);
                }
                println!(
                    "firewall restored in {:.1} s",
                    start.elapsed().as_secs_f64()
                );
            }
            Err(e) => runner.fail("firewall openvswitch", &e),
        }
    } else {
        for n in NATIVE {
            runner.run(n, || async { Ok(()) }).await;
        }
    }
    let _ = tokio::task::spawn_blocking(move || drop(hybrid)).await;

    let walls: Vec<(String, Duration)> = runner
        .results()
        .iter()
        .map(|(n, _, t)| (n.clone(), *t))
        .collect();
    let table = format!(
        "{}\nper scenario (ops: the operations' wall times; nested rows of another host's half left out)\n{}\n{}",
        run.timings.render(),
        run.timings.render_scenarios(&walls),
        run.timings.render_wait_lags()
    );
    println!("\ntimings (ms; waits: offsets from the operation's start; events: +ms name[port]source#batch)\n{table}");
    let file = timings_file();
    if let Some(d) = file.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    if std::fs::write(&file, &table).is_ok() {
        println!("written to {}", file.display());
    }
}

fn main() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let mut runner = Runner::from_args();
    let start = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run_all(&mut runner));
    runner.finish(start.elapsed())
}
