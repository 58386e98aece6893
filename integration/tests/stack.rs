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
use vireo::agent::model::{Flavor as ModelFlavor, OpState, Report as WireReport};
use vireo::client::AgentClient;
use vireo::compute::{ComputeDriver, ComputeOps};
use vireo::config::OvsNativeForm;
use vireo::network::embedded::{EmbeddedConfig, EmbeddedNetworkDef, Mechanism};
use vireo::plug::leak::Fixture;
use vireo_actors::instance::{
    BootSource, DestroyArgs, InstanceError, LiveMigrateArgs, Migration, NetworkRequest, OpReport,
    RebootKind, ResizeArgs,
};
use vireo_actors::instance::{Operation, SpawnStorage, StepKind};
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
use vireo_integration::hostb::{self, AgentOptions, HostASide, HostBAgent, HostBEnv};
use vireo_integration::runner::{Outcome, Runner};
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

/// Host `h`'s libvirt has a domain of instance `id`.
async fn has_domain(h: &Host, id: Uuid) -> bool {
    h.driver
        .libvirt()
        .list_all()
        .await
        .unwrap()
        .iter()
        .any(|d| d.uuid == id)
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
// Scenarios: two hosts on ML2/OVN and on Linux bridge

/// The waits of a report on another host (or a remote call's), by timing: every one
/// completed (its events came; never a timeout), and they awaited exactly `bind` at bind
/// time and `plug` at plug time: the cell of docs/EVENT_MODEL.md's table, as vireo's
/// prediction chose it for the flow, proved by the events Neutron really sent.
fn assert_cell(what: &str, r: &OpReport, bind: &[PortId], plug: &[PortId]) {
    for w in &r.waits {
        println!(
            "{what}: {} wait for {} port(s) {} in {} ms",
            w.timing.as_str(),
            w.expected.len(),
            if w.complete { "complete" } else { "incomplete" },
            w.took.as_millis()
        );
    }
    assert_waited(what, r, bind, plug);
}

/// The logical port of `port` is `up` in OVN's northbound database: its chassis claimed it
/// (what ML2/OVN turns into the port's status, when that update does not get lost).
fn ovn_port_up(nb_db: &str, port: PortId) -> bool {
    let out = Command::new("ovn-nbctl")
        .arg(format!("--db={nb_db}"))
        .args(["--timeout=10", "get", "Logical_Switch_Port"])
        .arg(port.to_string())
        .arg("up")
        .output()
        .unwrap();
    out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "true"
}

/// Every port of `vifs` is bound to `host` only, without `migrating_to`, and ACTIVE; but a
/// port whose events `report` trusted while Neutron did not show it ACTIVE (`unconfirmed`:
/// Neutron lost the status, docs/EVENT_MODEL.md section 7) must instead be up in OVN, where
/// the truth is (`ovn_nb`: OVN's northbound database; none: no such port allowed).
async fn assert_bound_up(
    s: &Scene<'_>,
    vifs: &[Vif],
    host: &str,
    report: &OpReport,
    ovn_nb: Option<&str>,
) {
    let unconfirmed: BTreeSet<PortId> = report
        .waits
        .iter()
        .flat_map(|w| w.unconfirmed.iter().copied())
        .collect();
    let (lost, rest): (Vec<PortId>, Vec<PortId>) =
        ids(vifs).into_iter().partition(|p| unconfirmed.contains(p));
    assert_ports_bound_active(s, &rest, host).await;
    for id in lost {
        let Some(nb) = ovn_nb else {
            panic!("port {id}: its events trusted while Neutron did not show it ACTIVE");
        };
        let port = s.a().network.get_port(id).await.unwrap();
        assert_eq!(port.host_id, host, "port {id} bound to {host}");
        assert!(port.migrating_to().is_none(), "{id}: migrating_to left");
        println!(
            "port {id}: its events trusted, Neutron's status {:?}",
            port.status
        );
        until_ovn_port_up(nb, id).await;
    }
}

/// Waits (up to 30 s) until the logical port of `id` is `up` in OVN's northbound database `nb`.
async fn until_ovn_port_up(nb: &str, id: PortId) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ovn_port_up(nb, id) {
        assert!(
            Instant::now() < deadline,
            "logical port {id} never up in OVN"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// After a live migration on ML2/OVN (LM dst: no wait, docs/EVENT_MODEL.md): every port of
/// `vifs` is bound to `host` alone, without `migrating_to`, and up in OVN's northbound
/// database `nb`. Neutron's status is shown, not asserted: ML2/OVN sets it DOWN at the
/// activation and may never set it ACTIVE again (OVN's `up` need not change then).
async fn assert_bound_up_in_ovn(s: &Scene<'_>, vifs: &[Vif], host: &str, nb: &str) {
    let net = s.a().network.clone();
    for id in ids(vifs) {
        let port = net.get_port(id).await.unwrap();
        assert_eq!(port.host_id, host, "port {id} bound to {host}");
        assert!(port.migrating_to().is_none(), "{id}: migrating_to left");
        let bindings = net.show_bindings(id).await.unwrap();
        assert_eq!(bindings.len(), 1, "{id}: one binding: {bindings:?}");
        assert_eq!(bindings[0].host, host);
        until_ovn_port_up(nb, id).await;
        println!("port {id}: up in OVN, Neutron's status {:?}", port.status);
    }
}

/// The tap of a Linux bridge port inside host B is in its bridge, or gone.
fn assert_lb_tap_b(b: &HostBEnv, v: &Vif, present: bool) {
    let (tap, br) = (v.tap_name(), v.linux_bridge_name().unwrap());
    assert_eq!(
        hb_link_master(b, &tap).flatten().as_deref() == Some(br.as_str()),
        present,
        "host B: tap {tap} in {br} (present: {present})"
    );
}

/// The tap of a native OVS port inside host B is in `bridge`, or gone.
fn assert_tap_b(b: &HostBEnv, v: &Vif, bridge: &str, present: bool) {
    let tap = v.tap_name();
    assert_eq!(
        hb_ovs_bridge_of(b, &tap).as_deref() == Some(bridge),
        present,
        "host B: tap {tap} in B's {bridge} (present: {present})"
    );
}

/// What backend a two-host cells scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// ML2/OVN, both hosts plugging OVS native ports in this form.
    Ovn(DomainForm),
    /// Neutron's Linux bridge agent on both hosts (libvirt-managed taps).
    LinuxBridge,
}

/// Two hosts on `backend`: host A's vireo runs as A's host of that backend (its OVN chassis
/// `<hostname>-ovn` on this machine's Open vSwitch, or its Linux bridge agent's host
/// `<hostname>-lb`), host B's agent as B's (the chassis `vireo-hb-ovn`, an ovn-controller
/// inside host B on B's Open vSwitch; or `vireo-hb-lb`, a neutron-linuxbridge-agent inside
/// host B). A resize A > B and its revert, then a live migration A > B and the delete on B.
/// Every wait is checked against the cross-host cells of the backend's row in
/// docs/EVENT_MODEL.md (finish x, revert x, profile set, LM src, LM dst): the prediction
/// chose exactly those waits and every one ended on the events Neutron sent (through A's
/// endpoint, which forwards host B's), never a timeout.
async fn two_host_cells(run: &Run, b: &HostBAgent, backend: Backend) -> R {
    let env = &run.env;
    let (mut s, form, net, revert_x_bind) = match backend {
        Backend::Ovn(form) => {
            let (name, kept) = match form {
                DomainForm::LibvirtManaged => (TWO_HOSTS_OVN[0], false),
                DomainForm::PreCreated => (TWO_HOSTS_OVN[1], true),
            };
            let s = Scene::on_neutron(run, name, &env.ovn_neutron_url, &env.ovn_bridge)?;
            (s, form, env.ovn_network_id.clone(), kept)
        }
        Backend::LinuxBridge => (
            Scene::new(run, TWO_HOSTS_LB),
            DomainForm::LibvirtManaged,
            env.lb_network_id.clone(),
            false,
        ),
    };
    s.peers.insert(b.peer()?);
    let mut opts = s.system_host();
    opts.name = match backend {
        Backend::Ovn(_) => env.ovn_host.clone(),
        Backend::LinuxBridge => env.lb_host.clone(),
    };
    opts.ovs_native_form = form;
    s.host(opts).await?;
    let on_b = |v: &Vif, present: bool| match backend {
        Backend::Ovn(_) => assert_tap_b(&b.env, v, &env.ovn_bridge, present),
        Backend::LinuxBridge => assert_lb_tap_b(&b.env, v, present),
    };
    let ovn_nb = matches!(backend, Backend::Ovn(_)).then_some(env.ovn_nb_db.as_str());
    let (id, vifs, report) = spawn_allocated(&mut s, 0, &net, 1).await;
    assert_waits(&s, "spawn", &report, &[], &ids(&vifs));
    assert_devices(&vifs[0], form, true);
    let h = s.a();
    let a_api = run.api_client()?;
    let bname = b.env.name.clone();
    let all = ids(&vifs);

    // Resize A > B: B's finish waits at plug time (finish x: plug).
    resize_a_to_b(&s, &a_api, h, b, id).await;
    for v in &vifs {
        on_b(v, true);
    }
    let finish = last_report(&b.client, id).await;
    assert_eq!(finish.request, "finish-resize");
    assert_bound_up(&s, &vifs, &bname, &finish, ovn_nb).await;
    assert_cell("finish x (B)", &finish, &[], &all);
    s.peer_row("finish-resize (B)", id, &finish);

    // Its revert: A takes the instance back (revert x: plug when libvirt re-creates the tap,
    // bind when A kept its pre-created tap wired).
    s.remote_ok(
        "revert on B",
        id,
        api_op(&b.client, &bname, id, Operation::RevertResize {}),
    )
    .await;
    assert_state(h, id, InstanceState::Running).await;
    assert!(hb_domain_state(&b.env, id).is_none(), "no domain left on B");
    for v in &vifs {
        on_b(v, false);
        assert_devices(v, form, true);
    }
    let back = h.driver.show(id).await.unwrap().last_operation.unwrap();
    assert_eq!(back.request, "finish-revert-resize");
    assert_bound_up(&s, &vifs, &h.name, &back, ovn_nb).await;
    if revert_x_bind {
        assert_cell("revert x (A)", &back, &all, &[]);
    } else {
        assert_cell("revert x (A)", &back, &[], &all);
    }
    s.peer_row("finish-revert (A)", id, &back);

    // Live migration A > B: the source sets `migrating_to` on its ACTIVE ports (profile
    // set: bind; a port whose status Neutron lost reports nothing new) and awaits nothing
    // while B pre-wires (LM src: none); B awaits the activation of its bindings (LM dst:
    // bind), but on ML2/OVN, whose status need not change then (LM dst: none).
    let mut active = Vec::new();
    for &p in &all {
        if h.network.get_port(p).await.unwrap().status == vireo_actors::network::PortStatus::Active
        {
            active.push(p);
        }
    }
    let r = live_migrate_a_to_b(&s, &a_api, h, id, &bname).await;
    assert_cell("profile set, LM src (A)", &r, &active, &[]);
    assert!(
        h.driver.show(id).await.is_err(),
        "host A forgot the instance"
    );
    assert_eq!(hb_domain_state(&b.env, id).as_deref(), Some("running"));
    for v in &vifs {
        on_b(v, true);
    }
    let post = last_report(&b.client, id).await;
    assert_eq!(post.request, "post-live-migration-at-destination");
    match ovn_nb {
        Some(nb) => {
            assert_bound_up_in_ovn(&s, &vifs, &bname, nb).await;
            assert_cell("LM dst (B)", &post, &[], &[]);
        }
        None => {
            assert_bound_up(&s, &vifs, &bname, &post, None).await;
            assert_cell("LM dst (B)", &post, &all, &[]);
        }
    }
    s.peer_row("post-live-migr. (B)", id, &post);
    let del = s.remote_ok("delete on B", id, delete_on_b(b, id)).await;
    assert_eq!(
        del.released.as_ref().map(|r| r.deleted.len()),
        Some(vifs.len())
    );
    for v in &vifs {
        on_b(v, false);
    }
    finish_two_hosts(s, b).await
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
// Scenarios: two hosts (host B of two-host.sh runs the real `vireo agent` in its namespaces)

/// Run `action` on `uuid` through an agent's API and wait for it: its report, or its error
/// as the agent's stable code.
async fn api_op(
    client: &AgentClient,
    host: &str,
    uuid: Uuid,
    action: Operation,
) -> Result<OpReport, InstanceError> {
    let remote = |code: &str, message: String| InstanceError::Remote {
        host: host.to_owned(),
        code: code.to_owned(),
        message,
    };
    let op = client
        .action(uuid, &action)
        .await
        .map_err(|e| remote("api", vireo_integration::chain(&e)))?;
    let done = client
        .wait(op.id, Duration::from_millis(100), |_, _| {})
        .await
        .map_err(|e| remote("api", vireo_integration::chain(&e)))?;
    match (done.state, done.report, done.error) {
        (OpState::Succeeded, Some(report), _) => {
            wire_report(report).map_err(|m| remote("bad-answer", m))
        }
        (_, _, Some(e)) => Err(remote(&e.code, e.message)),
        (state, _, _) => Err(remote("bad-answer", format!("{state:?} without a report"))),
    }
}

fn wire_report(v: serde_json::Value) -> Result<OpReport, String> {
    let r: WireReport = serde_json::from_value(v).map_err(|e| e.to_string())?;
    vireo::agent::view::op_report(&r)
}

/// The last report an agent kept for `uuid` (the peer request it served for it).
async fn last_report(client: &AgentClient, uuid: Uuid) -> OpReport {
    let i = client.show_instance(uuid).await.unwrap();
    wire_report(i.last_operation.expect("a last operation")).unwrap()
}

/// Every wait of `r` completed, and together they awaited an event of every port of
/// `ports` (the real events Neutron sent for that host's half); prints them.
fn assert_peer_waits(what: &str, r: &OpReport, ports: &[PortId]) {
    let mut awaited = BTreeSet::new();
    for w in &r.waits {
        assert!(
            w.complete,
            "{what}: wait {:?} incomplete: {}",
            w.timing, w.outcome
        );
        let names: Vec<String> = w
            .expected
            .iter()
            .map(|e| format!("{}[{}]", e.name.as_str(), e.tag.prefix(8)))
            .collect();
        awaited.extend(w.expected.iter().map(|e| e.tag));
        println!(
            "{what}: {} wait for {names:?} complete in {} ms",
            w.timing.as_str(),
            w.took.as_millis()
        );
    }
    assert_eq!(awaited, set(ports), "{what}: ports awaited");
}

fn hb_link_master(b: &HostBEnv, name: &str) -> Option<Option<String>> {
    let out = Command::new("ip")
        .args(["-n", &b.netns, "-o", "link", "show", "dev", name])
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = text.split_whitespace();
    let mut master = None;
    while let Some(w) = words.next() {
        if w == "master" {
            master = words.next().map(str::to_owned);
        }
    }
    Some(master)
}

fn hb_ovs_bridge_of(b: &HostBEnv, port: &str) -> Option<String> {
    let out = Command::new("ovs-vsctl")
        .arg(format!("--db=unix:{}", b.ovsdb_socket.display()))
        .args(["--timeout=10", "port-to-br", port])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The hybrid devices of `v` inside host B are there (qbr, qvb in it, qvo in B's br-int)
/// or all gone.
fn assert_devices_b(b: &HostBEnv, v: &Vif, present: bool) {
    assert!(v.details.ovs_hybrid_plug, "hybrid VIFs only");
    let (qbr, qvb, qvo) = (v.qbr_name(), v.qvb_name(), v.qvo_name());
    assert_eq!(
        hb_link_master(b, &qbr).is_some(),
        present,
        "host B: qbr {qbr}"
    );
    assert_eq!(
        hb_link_master(b, &qvb).flatten().as_deref() == Some(qbr.as_str()),
        present,
        "host B: qvb {qvb} in {qbr}"
    );
    assert_eq!(
        hb_ovs_bridge_of(b, &qvo).as_deref() == Some("br-int"),
        present,
        "host B: qvo {qvo} in B's br-int"
    );
}

fn hb_domain_state(b: &HostBEnv, id: Uuid) -> Option<String> {
    let out = Command::new("virsh")
        .args(["-c", &b.unix_uri, "domstate", &id.to_string()])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Every port of `vifs` is bound to `host` only, without `migrating_to`, and goes ACTIVE.
async fn assert_bound_active(s: &Scene<'_>, vifs: &[Vif], host: &str) {
    assert_ports_bound_active(s, &ids(vifs), host).await
}

/// [`assert_bound_active`] by port id.
async fn assert_ports_bound_active(s: &Scene<'_>, ports: &[PortId], host: &str) {
    let net = s.a().network.clone();
    for &id in ports {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let port = net.get_port(id).await.unwrap();
            assert_eq!(port.host_id, host, "port {id} bound to {host}");
            assert!(port.migrating_to().is_none(), "{id}: migrating_to left");
            if port.status == vireo_actors::network::PortStatus::Active {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "port {id} never ACTIVE on {host}: {port:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let bindings = net.show_bindings(id).await.unwrap();
        assert_eq!(bindings.len(), 1, "{id}: one binding: {bindings:?}");
        assert_eq!(bindings[0].host, host);
    }
}

/// The scenario's leak check on host B too (its agent, libvirt, links, OVS), then A's.
async fn finish_two_hosts(s: Scene<'_>, b: &HostBAgent) -> R {
    let mut fragments = vec![format!("vit{}", s.id)];
    fragments.extend(s.book.all_ports().iter().map(|p| p.prefix(11)));
    let instances: Vec<Uuid> = s.book.instances().into_iter().collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    let found = loop {
        let found = b.leaks(&instances, &fragments).await;
        if found.is_empty() || Instant::now() >= deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let a = s.finish().await;
    match (found.is_empty(), a) {
        (true, a) => a,
        (false, Ok(())) => Err(HarnessError::Leak(found.join("\n  "))),
        (false, Err(e)) => Err(HarnessError::Leak(format!(
            "{}\n  {}",
            found.join("\n  "),
            vireo_integration::chain(&e)
        ))),
    }
}

/// A real live migration A → B through vireo: host A's driver (called through A's agent
/// API) prepares B over HTTP (B's `vireo agent` plugs the hybrid devices in B's namespace and
/// OVS), libvirt migrates peer-to-peer to B's libvirtd, B activates its bindings and waits
/// for the `network-vif-plugged` B's Neutron agent causes (Neutron posts it to A's endpoint,
/// which forwards it to B), A cleans up. Then the instance is deleted on B.
async fn two_host_live_migration(run: &Run, b: &HostBAgent) -> R {
    let mut s = Scene::new(run, "two hosts: live migrate A>B");
    s.peers.insert(b.peer()?);
    let opts = s.system_host();
    s.host(opts).await?;
    let net = run.env.network_id.clone();
    let (id, vifs, report) = spawn_allocated(&mut s, 0, &net, 2).await;
    assert_waits(&s, "spawn", &report, &[], &ids(&vifs));
    let h = s.a();
    let a_api = run.api_client()?;
    let bname = b.env.name.clone();
    live_migrate_a_to_b(&s, &a_api, h, id, &bname).await;
    // Host A: nothing left of the instance.
    assert!(
        h.driver.show(id).await.is_err(),
        "host A forgot the instance"
    );
    assert!(!has_domain(h, id).await, "host A's libvirt has no domain");
    for v in &vifs {
        assert_devices(v, DomainForm::LibvirtManaged, false);
    }
    // Host B: the guest runs there (the same domain: libvirt moved it), wired in B.
    assert_eq!(hb_domain_state(&b.env, id).as_deref(), Some("running"));
    let view = b.client.show_instance(id).await.unwrap();
    assert_eq!(
        (view.host.as_str(), view.state.as_str()),
        (bname.as_str(), "running")
    );
    for v in &vifs {
        assert_devices_b(&b.env, v, true);
    }
    assert_bound_active(&s, &vifs, &bname).await;
    // B's half: it waited for the plug-time events of B's wiring, and they came.
    let post = last_report(&b.client, id).await;
    assert_eq!(post.request, "post-live-migration-at-destination");
    assert_peer_waits("post-live-migration on B", &post, &ids(&vifs));
    s.peer_row("post-live-migr. (B)", id, &post);
    // Neutron posted them to host A's endpoint, which forwarded them to B.
    let metrics = a_api.metrics().await.unwrap();
    let forwarded: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("vireo_events_forwarded_total{result=\"accepted\"}"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(forwarded >= 1.0, "host A forwarded events to B:\n{metrics}");

    let del = s.remote_ok("delete on B", id, delete_on_b(b, id)).await;
    assert_eq!(
        del.released.as_ref().map(|r| r.deleted.len()),
        Some(vifs.len())
    );
    for v in &vifs {
        assert_devices_b(&b.env, v, false);
    }
    assert!(hb_domain_state(&b.env, id).is_none(), "no domain left on B");
    finish_two_hosts(s, b).await
}

/// Host B's agent is killed (SIGKILL) the moment host A starts migrating the guest to it,
/// and started again 4 s later. libvirt finishes the migration without it; the restarted agent finds a
/// domain whose record still names host A with the migration in flight and adopts it as the
/// incoming guest (it used to leave it alone: A's hand-over got `not-found` and nobody owned
/// the guest); A asks an unreachable B again until it answers, and the hand-over completes.
async fn two_host_live_migration_destination_restarted(run: &Run, b: &mut HostBAgent) -> R {
    let mut s = Scene::new(run, "two hosts: live migrate A>B, B's agent killed");
    s.peers.insert(b.peer()?);
    let opts = s.system_host();
    s.host(opts).await?;
    let net = run.env.network_id.clone();
    let (id, vifs, _) = spawn_allocated(&mut s, 0, &net, 2).await;
    let h = s.a();
    let lm = live_migrate_via_api(run, h, id, &b.env.name)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let phase = h
            .driver
            .show(id)
            .await
            .ok()
            .and_then(|v| v.operation)
            .map(|o| o.phase);
        if phase.as_deref().is_some_and(|p| p.starts_with("migrate")) {
            break;
        }
        assert!(
            Instant::now() < deadline && !lm.is_finished(),
            "host A never reached its migration (phase {phase:?})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Down for longer than the migration takes: the guest arrives without B's agent and A
    // finds B unreachable at first.
    let killed = Instant::now();
    b.kill_and_restart(Duration::from_secs(4)).await?;
    println!(
        "host B's agent killed and answering again after {:.1} s",
        killed.elapsed().as_secs_f64()
    );
    asked_again(lm).await;
    let log = std::fs::read_to_string(b.log_path()).unwrap_or_default();
    assert!(
        log.lines()
            .any(|l| l.contains("a guest arriving by live migration adopted")
                && l.contains(&id.to_string())),
        "host B's restarted agent did not adopt the arrived guest:\n{}",
        b.log_tail()
    );
    assert!(
        h.driver.show(id).await.is_err(),
        "host A forgot the instance"
    );
    moved_to_b(&s, b, id, &vifs).await;
    delete_on_b_and_finish(s, b, id).await
}

/// A live migration of `id` from host `h` to `dest` through A's API (Neutron's events for
/// the instance are then forwarded to B while it moves), in a task of its own.
fn live_migrate_via_api(
    run: &Run,
    h: &Host,
    id: Uuid,
    dest: &str,
) -> Result<tokio::task::JoinHandle<Result<OpReport, InstanceError>>, HarnessError> {
    let a_api = run.api_client()?;
    let (a_name, op) = (
        h.name.clone(),
        Operation::LiveMigrate(Box::new(LiveMigrateArgs::new(dest))),
    );
    Ok(tokio::spawn(async move {
        api_op(&a_api, &a_name, id, op).await
    }))
}

/// The live migration succeeded, and host A had to ask host B more than once to take the
/// guest over.
async fn asked_again(lm: tokio::task::JoinHandle<Result<OpReport, InstanceError>>) {
    let r = match lm.await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => panic!(
            "the live migration failed: {}",
            vireo_integration::chain(&e)
        ),
        Err(e) => panic!("the live migration's task: {e}"),
    };
    let asked = r
        .steps
        .iter()
        .filter(|st| st.name.starts_with("post-live-migration on"))
        .count();
    println!("host A asked host B to take the guest over {asked} time(s)");
    assert!(asked >= 2, "host A asked host B once only: {:?}", r.steps);
}

/// The guest of a live migration to host B runs there (the same domain: libvirt moved it),
/// wired in B and no longer in A, its ports bound and active on B. Returns B's
/// post-live-migration report (recorded as a nested row).
async fn moved_to_b(s: &Scene<'_>, b: &HostBAgent, id: Uuid, vifs: &[Vif]) -> OpReport {
    assert_eq!(hb_domain_state(&b.env, id).as_deref(), Some("running"));
    let view = b.client.show_instance(id).await.unwrap();
    assert_eq!(
        (view.host.as_str(), view.state.as_str()),
        (b.env.name.as_str(), "running")
    );
    for v in vifs {
        assert_devices(v, DomainForm::LibvirtManaged, false);
        assert_devices_b(&b.env, v, true);
    }
    assert_bound_active(s, vifs, &b.env.name).await;
    let post = last_report(&b.client, id).await;
    assert_eq!(post.request, "post-live-migration-at-destination");
    s.peer_row("post-live-migr. (B)", id, &post);
    post
}

/// Delete `id` on host B (its ports released), check no domain is left there, and finish
/// the scene with both hosts' leak checks.
async fn delete_on_b_and_finish(s: Scene<'_>, b: &HostBAgent, id: Uuid) -> R {
    s.remote_ok("delete on B", id, delete_on_b(b, id)).await;
    assert!(hb_domain_state(&b.env, id).is_none(), "no domain left on B");
    finish_two_hosts(s, b).await
}

/// Poll host B's agent until instance `id`'s running operation is at `phase` (120 s at most).
async fn b_at_phase(b: &HostBAgent, id: Uuid, phase: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = b
            .client
            .show_instance(id)
            .await
            .ok()
            .and_then(|v| v.operation)
            .and_then(|o| o.phase);
        if now.as_deref() == Some(phase) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "host B never reached {phase:?} (at {now:?})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Ask host B's agent to build an m1.tiny instance on `ports` new ports of the test network
/// (B allocates them); returns once B accepted it.
async fn create_on_b(
    s: &mut Scene<'_>,
    run: &Run,
    b: &HostBAgent,
    ports: usize,
) -> Result<Uuid, HarnessError> {
    let id = s.instance();
    let name = s.domain_name();
    let net = run.env.network_id.clone();
    let req = vireo::agent::model::CreateInstance {
        uuid: Some(id),
        name: Some(name),
        flavor: ModelFlavor {
            name: "m1.tiny".into(),
            vcpus: 1,
            memory_mb: 128,
            root_gb: 0,
            ephemeral_gb: 0,
            swap_mb: 0,
            extra_specs: Default::default(),
        },
        image: Default::default(),
        config_drive: None,
        ports: Some(vec![
            vireo::agent::model::PortRequest::Network {
                network_id: net.clone()
            };
            ports
        ]),
        network_info: None,
        power_on: true,
    };
    b.client.create_instance(&req).await.map_err(|e| {
        HarnessError::Setup(format!("create on B: {}", vireo_integration::chain(&e)))
    })?;
    Ok(id)
}

/// The ports Neutron shows for instance `id`, booked as vireo's (the leak check looks for
/// them and their devices).
async fn book_ports_of(
    s: &mut Scene<'_>,
    run: &Run,
    id: Uuid,
) -> Result<Vec<PortId>, HarnessError> {
    let mut out = Vec::new();
    for p in run.raw.ports_of_device(id).await? {
        if let Some(pid) = p["id"].as_str().and_then(|p| p.parse().ok()) {
            s.book.vireo(PortId(pid));
            s.watch(PortId(pid).prefix(11));
            out.push(PortId(pid));
        }
    }
    Ok(out)
}

/// A scene with host A (and host B as its peer) and an instance built on host B on one port,
/// running there with no operation under way: the scene, the instance and its port.
async fn running_on_b<'r>(
    run: &'r Run,
    b: &HostBAgent,
    name: &str,
) -> Result<(Scene<'r>, Uuid, Vec<PortId>), HarnessError> {
    let mut s = Scene::new(run, name);
    s.peers.insert(b.peer()?);
    let opts = s.system_host();
    s.host(opts).await?;
    let id = create_on_b(&mut s, run, b, 1).await?;
    b_until(b, id, |v| {
        v.state == InstanceState::Running.as_str() && v.operation.is_none()
    })
    .await;
    let ports = book_ports_of(&mut s, run, id).await?;
    assert_eq!(ports.len(), 1, "{ports:?}");
    Ok((s, id, ports))
}

/// A cross-host resize B → A with host B's agent — the source — killed (SIGKILL) while host
/// A finishes it, and started again at once. A finishes on its own (its answer is lost with
/// B's connection); B's restarted agent finds its hand-over done (the resize in flight, the
/// domain off) and keeps the instance as the resize's source, its copy untouched. Confirm on
/// A then removes B's copy: the guest runs on A with its new flavor, its ports bound and
/// active there, and B holds nothing.
async fn two_host_resize_source_killed(run: &Run, b: &mut HostBAgent) -> R {
    let (s, id, ports) =
        running_on_b(run, b, "two hosts: resize B>A, B (the source) killed").await?;
    let h = s.a();
    let a_name = h.name.clone();
    let resize = {
        let (client, bname, op) = (b.client.clone(), b.env.name.clone(), resize_to(&a_name));
        tokio::spawn(async move { api_op(&client, &bname, id, op).await })
    };
    kill_b_at(
        b,
        id,
        "finish on destination",
        "the resize through B",
        resize,
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let on_a = h.driver.show(id).await.ok();
        let on_b = b.client.show_instance(id).await.ok();
        let a_done = on_a
            .as_ref()
            .is_some_and(|v| v.state == InstanceState::ResizeTarget && v.operation.is_none());
        let b_done = on_b.as_ref().is_some_and(|v| {
            v.state == InstanceState::ResizeSource.as_str() && v.operation.is_none()
        });
        if a_done && b_done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the resize did not settle: A {:?}; B {:?}",
            on_a.map(|v| (v.state, v.operation.map(|o| o.phase))),
            on_b.map(|v| (v.state, v.operation))
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        hb_domain_state(&b.env, id).as_deref(),
        Some("shut off"),
        "B keeps its copy, off"
    );
    let a_api = run.api_client()?;
    s.remote_ok(
        "confirm on A",
        id,
        api_op(&a_api, &a_name, id, Operation::ConfirmResize {}),
    )
    .await;
    b_until_gone(b, id).await;
    assert_eq!(hb_domain_state(&b.env, id), None, "no domain left on B");
    let view = h.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.flavor.as_deref(), Some("m1.small"));
    assert_ports_bound_active(&s, &ports, &a_name).await;
    destroy(&s, h, id).await;
    finish_two_hosts(s, b).await
}

/// A live migration B → A with host B's agent — the source — killed (SIGKILL) while
/// libvirt migrates the guest, and started again at once. Wherever the guest ends (libvirt
/// finishes or drops the job without the agent), it must end running on exactly one host,
/// owned by that host's agent, its port bound and ACTIVE there only (no `migrating_to`, no
/// inactive binding), and nothing of it left on the other host. B's recovery used to roll
/// the migration back whenever its record said one was in flight: A then destroyed the guest
/// that had just arrived, and the instance was gone from both hosts.
///
/// `kept_down`: B's agent stays down until libvirt has finished the migration without it
/// (the domain gone from B's libvirt, running in A's). The restarted B used to find no
/// domain and nothing else: A held the guest as incoming with nobody to hand it over, and
/// B's devices and port binding stayed. B's live-migration journal now recovers it: the
/// guest must end on A.
async fn two_host_live_migration_source_killed(
    run: &Run,
    b: &mut HostBAgent,
    kept_down: bool,
) -> R {
    let name = TWO_HOSTS[if kept_down { 12 } else { 11 }];
    let (s, id, ports) = running_on_b(run, b, name).await?;
    let h = s.a();
    let a_name = h.name.clone();
    let lm = {
        let (client, bname) = (b.client.clone(), b.env.name.clone());
        let op = Operation::LiveMigrate(Box::new(LiveMigrateArgs::new(&a_name)));
        tokio::spawn(async move { api_op(&client, &bname, id, op).await })
    };
    if kept_down {
        b_at_phase(b, id, "migrate").await;
        b.kill().await;
        let started = Instant::now();
        let deadline = started + Duration::from_secs(120);
        while hb_domain_state(&b.env, id).is_some() || !has_domain(h, id).await {
            assert!(
                Instant::now() < deadline,
                "libvirt did not finish the migration without B's agent in 120 s: B's domain \
                 {:?}",
                hb_domain_state(&b.env, id)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!(
            "the guest left B {:.1} s after B's agent was killed",
            started.elapsed().as_secs_f64()
        );
        let _ = lm.await;
        b.restart().await?;
    } else {
        kill_b_at(b, id, "migrate", "the live migration through B", lm).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    let on = loop {
        let on_a = h.driver.show(id).await.ok();
        let on_b = b.client.show_instance(id).await.ok();
        let a_settled = on_a
            .as_ref()
            .is_some_and(|v| v.state == InstanceState::Running && v.operation.is_none());
        let b_settled = on_b
            .as_ref()
            .is_some_and(|v| v.state == InstanceState::Running.as_str() && v.operation.is_none());
        match (a_settled, b_settled, on_a.is_none(), on_b.is_none()) {
            (true, _, _, true) => break "A",
            (_, true, true, _) => break "B",
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "the live migration did not settle: A {:?}; B {:?}; B's domain {:?}",
            on_a.map(|v| (v.state, v.operation.map(|o| o.phase))),
            on_b.map(|v| (v.state, v.operation)),
            hb_domain_state(&b.env, id)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("the guest ended on host {on}");
    assert!(
        !kept_down || on == "A",
        "the guest had left B: it must end on A"
    );
    if on == "A" {
        assert_eq!(hb_domain_state(&b.env, id), None, "no domain left on B");
        assert_ports_bound_active(&s, &ports, &a_name).await;
        destroy(&s, h, id).await;
        finish_two_hosts(s, b).await
    } else {
        assert_eq!(hb_domain_state(&b.env, id).as_deref(), Some("running"));
        assert!(!has_domain(h, id).await, "host A's libvirt has no domain");
        assert_ports_bound_active(&s, &ports, &b.env.name).await;
        delete_on_b_and_finish(s, b, id).await
    }
}

/// Kill host B's agent (SIGKILL) once instance `id`'s operation there is at `phase`, start it
/// again at once, and print what became of `task`, the operation `what` whose caller the
/// kill cut off.
async fn kill_b_at(
    b: &mut HostBAgent,
    id: Uuid,
    phase: &str,
    what: &str,
    task: tokio::task::JoinHandle<Result<OpReport, InstanceError>>,
) -> R {
    b_at_phase(b, id, phase).await;
    b.kill_and_restart(Duration::ZERO).await?;
    let outcome = task.await.expect("the operation's task");
    println!(
        "{what} after B's agent was killed: {}",
        match &outcome {
            Ok(_) => "succeeded".to_owned(),
            Err(e) => vireo_integration::chain(e),
        }
    );
    Ok(())
}

/// Poll host B's agent until its view of `id` satisfies `done` (120 s at most).
async fn b_until(b: &HostBAgent, id: Uuid, done: impl Fn(&vireo::agent::model::Instance) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let v = b.client.show_instance(id).await.ok();
        if v.as_ref().is_some_and(&done) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "host B: not there in 120 s: {:?}",
            v.map(|v| (v.state, v.operation))
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Poll host B's agent until it no longer knows `id` (60 s at most).
async fn b_until_gone(b: &HostBAgent, id: Uuid) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Ok(v) = b.client.show_instance(id).await {
        assert!(
            Instant::now() < deadline,
            "host B kept the instance: {:?}",
            (v.state, v.operation)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A build on host B whose agent is killed (SIGKILL) while it waits for its ports' events,
/// and started again at once: the restarted agent finds the domain with the build in flight
/// and rolls it back — the domain, B's devices and the ports it created go, nothing is left
/// (the leak check of both hosts and Neutron).
async fn two_host_spawn_killed_in_its_wait(run: &Run, b: &mut HostBAgent) -> R {
    let mut s = Scene::new(run, "two hosts: spawn on B, B's agent killed in its wait");
    let opts = s.system_host();
    s.host(opts).await?;
    let id = create_on_b(&mut s, run, b, 2).await?;
    b_at_phase(b, id, "wait for events").await;
    let ports = book_ports_of(&mut s, run, id).await?;
    assert_eq!(ports.len(), 2, "{ports:?}");
    b.kill_and_restart(Duration::ZERO).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while b.client.show_instance(id).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "the restarted agent kept the interrupted build: {:?}",
            b.client.show_instance(id).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(hb_domain_state(&b.env, id).is_none(), "no domain left on B");
    finish_two_hosts(s, b).await
}

/// A live migration A → B with host B's agent killed (SIGKILL) in its hand-over, once it
/// activated the binding of one port on B, and started again at once. The guest runs on B
/// already: the restarted agent adopts it (its record still names A), host A asks again, and
/// B — for which that port's binding is active already, its events gone with the killed
/// agent — does not wait for that port (it waited in vain until its timeout: nothing
/// activates it again).
async fn two_host_live_migration_killed_in_post(run: &Run, b: &mut HostBAgent) -> R {
    let mut s = Scene::new(
        run,
        "two hosts: live migrate A>B, B killed in its hand-over",
    );
    s.peers.insert(b.peer()?);
    let opts = s.system_host();
    s.host(opts).await?;
    let net = run.env.network_id.clone();
    let (id, vifs, _) = spawn_allocated(&mut s, 0, &net, 2).await;
    let lm = live_migrate_via_api(run, s.a(), id, &b.env.name)?;
    b_at_phase(b, id, "activate bindings").await;
    // The first port B activates (each activation takes Neutron a few hundred ms; B then
    // activates the other and waits for their events before it saves).
    let deadline = Instant::now() + Duration::from_secs(60);
    let activated = 'found: loop {
        for v in &vifs {
            let bindings = run.raw.bindings(v.id).await?;
            if bindings
                .iter()
                .any(|x| x["host"] == b.env.name.as_str() && x["status"] == "ACTIVE")
            {
                break 'found v.id;
            }
        }
        assert!(Instant::now() < deadline, "host B activated no binding");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    b.kill_and_restart(Duration::ZERO).await?;
    asked_again(lm).await;
    let post = moved_to_b(&s, b, id, &vifs).await;
    assert!(
        !waited(&post, Timing::BindTime).contains(&activated),
        "host B waited again for the events of {activated}, active before it was killed: {:?}",
        post.waits
    );
    delete_on_b_and_finish(s, b, id).await
}

/// Delete instance `id` on host B through B's API (networking released) and wait for it.
async fn delete_on_b(b: &HostBAgent, id: Uuid) -> Result<OpReport, InstanceError> {
    let bname = b.env.name.clone();
    let op = b
        .client
        .delete_instance(id, true)
        .await
        .map_err(|e| InstanceError::Remote {
            host: bname.clone(),
            code: "api".into(),
            message: vireo_integration::chain(&e),
        })?;
    let done = b
        .client
        .wait(op.id, Duration::from_millis(100), |_, _| {})
        .await
        .unwrap();
    assert_eq!(done.state, OpState::Succeeded, "{done:?}");
    wire_report(done.report.unwrap()).map_err(|m| InstanceError::Remote {
        host: bname,
        code: "bad-answer".into(),
        message: m,
    })
}

/// A scene with host B as a peer of host A (started), and an instance spawned on A with
/// `ports` ports on the test network.
async fn two_host_scene<'r>(
    run: &'r Run,
    b: &HostBAgent,
    name: &str,
    ports: usize,
) -> Result<(Scene<'r>, Uuid, Vec<Vif>), HarnessError> {
    let mut s = Scene::new(run, name);
    s.peers.insert(b.peer()?);
    let opts = s.system_host();
    s.host(opts).await?;
    let net = run.env.network_id.clone();
    let (id, vifs, _) = spawn_allocated(&mut s, 0, &net, ports).await;
    Ok((s, id, vifs))
}

/// Live-migrate `id` from host A (`h`, through A's agent API `a_api`) to host B
/// (`bname`); its report, once B was called.
async fn live_migrate_a_to_b(
    s: &Scene<'_>,
    a_api: &AgentClient,
    h: &Host,
    id: Uuid,
    bname: &str,
) -> OpReport {
    let op = Operation::LiveMigrate(Box::new(LiveMigrateArgs::new(bname)));
    let r = s
        .remote_ok("live-migrate A>B", id, api_op(a_api, &h.name, id, op))
        .await;
    assert!(
        r.total(StepKind::Peer) > Duration::ZERO,
        "host B was called"
    );
    r
}

/// Resize `id` from host A (`h`, through A's agent API `a_api`) to host B into m1.small:
/// B was called, A holds the instance as the resize's source, B as its target, running
/// there with the new flavor.
async fn resize_a_to_b(s: &Scene<'_>, a_api: &AgentClient, h: &Host, b: &HostBAgent, id: Uuid) {
    let r = s
        .remote_ok(
            "resize A>B",
            id,
            api_op(a_api, &h.name, id, resize_to(&b.env.name)),
        )
        .await;
    assert!(
        r.total(StepKind::Peer) > Duration::ZERO,
        "host B was called"
    );
    assert_state(h, id, InstanceState::ResizeSource).await;
    let view = b.client.show_instance(id).await.unwrap();
    assert_eq!(view.state, "resize-target", "{view:?}");
    assert_eq!(view.flavor.as_deref(), Some("m1.small"));
    assert_eq!(hb_domain_state(&b.env, id).as_deref(), Some("running"));
}

/// A resize to host `dest` into m1.small (1 vCPU, 192 MiB; the instances start as m1.tiny).
fn resize_to(dest: &str) -> Operation {
    let small = ModelFlavor {
        name: "m1.small".into(),
        vcpus: 1,
        memory_mb: 192,
        root_gb: 0,
        ephemeral_gb: 0,
        swap_mb: 0,
        extra_specs: Default::default(),
    };
    Operation::Resize(Box::new(ResizeArgs::new(Some(dest), small)))
}

/// A cross-host resize A → B and its revert: A powers the guest off and hands it to B
/// (define with the new flavor, bind the ports to B, plug in B, start, await B's events), then
/// the revert on B removes B's copy and has A bring the instance back (bind back, plug,
/// start, await A's events).
async fn two_host_resize_revert(run: &Run, b: &HostBAgent) -> R {
    let (s, id, vifs) = two_host_scene(run, b, "two hosts: resize A>B+revert", 1).await?;
    let h = s.a();
    let a_api = run.api_client()?;
    let bname = b.env.name.clone();
    resize_a_to_b(&s, &a_api, h, b, id).await;
    for v in &vifs {
        assert_devices_b(&b.env, v, true);
    }
    assert_bound_active(&s, &vifs, &bname).await;
    let finish = last_report(&b.client, id).await;
    assert_eq!(finish.request, "finish-resize");
    assert_peer_waits("finish-resize on B", &finish, &ids(&vifs));
    s.peer_row("finish-resize (B)", id, &finish);

    let r = s
        .remote_ok(
            "revert on B",
            id,
            api_op(&b.client, &bname, id, Operation::RevertResize {}),
        )
        .await;
    assert!(
        r.total(StepKind::Peer) > Duration::ZERO,
        "host A was called"
    );
    assert_state(h, id, InstanceState::Running).await;
    assert_eq!(
        h.driver.show(id).await.unwrap().flavor.as_deref(),
        Some("m1.tiny")
    );
    assert!(hb_domain_state(&b.env, id).is_none(), "no domain left on B");
    for v in &vifs {
        assert_devices_b(&b.env, v, false);
        assert_devices(v, DomainForm::LibvirtManaged, true);
    }
    assert_bound_active(&s, &vifs, &h.name).await;
    let back = h.driver.show(id).await.unwrap().last_operation.unwrap();
    assert_eq!(back.request, "finish-revert-resize");
    assert_peer_waits("finish-revert-resize on A", &back, &ids(&vifs));
    s.peer_row("finish-revert (A)", id, &back);
    destroy(&s, h, id).await;
    finish_two_hosts(s, b).await
}

/// A cross-host resize A → B with host B's agent killed (SIGKILL) while its finish waits for
/// the ports' events on B, and started again at once. Host A's resize loses its call to B and
/// rolls back; B's restarted agent finds the finish in flight and gives the instance back.
/// Whichever gets there first, the guest runs on A again with its old flavor, its ports bound
/// and active on A, and B holds nothing (no domain, no device, no binding).
async fn two_host_resize_killed_in_finish(run: &Run, b: &mut HostBAgent) -> R {
    let (s, id, vifs) =
        two_host_scene(run, b, "two hosts: resize A>B, B killed in its finish", 2).await?;
    let h = s.a();
    let a_api = run.api_client()?;
    let (a_name, bname) = (h.name.clone(), b.env.name.clone());
    let resize = {
        let op = resize_to(&bname);
        tokio::spawn(async move { api_op(&a_api, &a_name, id, op).await })
    };
    kill_b_at(b, id, "wait for events", "host A's resize", resize).await?;
    back_on_a(&s, b, id, &vifs).await?;
    destroy(&s, h, id).await;
    finish_two_hosts(s, b).await
}

/// After a resize or revert whose host-B half was killed: the instance settles on host A
/// (running, its old flavor, no operation) within 60 s while host B lets go of it, and B holds
/// nothing of it (no domain, no device, no binding); its ports are bound and active on A.
async fn back_on_a(s: &Scene<'_>, b: &HostBAgent, id: Uuid, vifs: &[Vif]) -> R {
    let (run, h, bname) = (s.run, s.a(), &b.env.name);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let on_a = h.driver.show(id).await.ok();
        let settled = on_a.as_ref().is_some_and(|v| {
            v.state == InstanceState::Running
                && v.operation.is_none()
                && v.flavor.as_deref() == Some("m1.tiny")
        });
        let b_free = b.client.show_instance(id).await.is_err();
        if settled && b_free {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not back on A: A {:?}; B {:?}",
            on_a.map(|v| (v.state, v.flavor, v.operation.map(|o| o.phase))),
            b.client
                .show_instance(id)
                .await
                .map(|v| (v.state, v.operation))
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(hb_domain_state(&b.env, id), None, "no domain left on B");
    for v in vifs {
        assert_devices_b(&b.env, v, false);
        assert_devices(v, DomainForm::LibvirtManaged, true);
    }
    assert_bound_active(s, vifs, &h.name).await;
    for v in vifs {
        let bindings = run.raw.bindings(v.id).await?;
        assert!(
            bindings.iter().all(|x| x["host"] != bname.as_str()),
            "{}: a binding for B left: {bindings:?}",
            v.id
        );
    }
    Ok(())
}

/// A cross-host resize A → B, then its revert with host B's agent killed (SIGKILL) once it
/// removed its copy and asked host A to bring the instance back, and started again at once.
/// A finishes the revert without B (it binds back, plugs, starts and awaits its own
/// events); B's restarted agent finds the revert in flight with no domain left and lets the
/// instance go.
async fn two_host_revert_killed(run: &Run, b: &mut HostBAgent) -> R {
    let (s, id, vifs) = two_host_scene(
        run,
        b,
        "two hosts: resize A>B+revert, B killed in the revert",
        1,
    )
    .await?;
    let h = s.a();
    let a_api = run.api_client()?;
    let bname = b.env.name.clone();
    s.remote_ok(
        "resize A>B",
        id,
        api_op(&a_api, &h.name, id, resize_to(&bname)),
    )
    .await;
    assert_state(h, id, InstanceState::ResizeSource).await;
    let revert = {
        let (client, name) = (b.client.clone(), bname.clone());
        tokio::spawn(async move { api_op(&client, &name, id, Operation::RevertResize {}).await })
    };
    // Its caller loses the revert with the agent (the connection closes).
    kill_b_at(
        b,
        id,
        "bring back on the source",
        "the revert through B",
        revert,
    )
    .await?;
    back_on_a(&s, b, id, &vifs).await?;
    let back = h.driver.show(id).await.unwrap().last_operation.unwrap();
    assert_eq!(back.request, "finish-revert-resize");
    assert_peer_waits("finish-revert-resize on A", &back, &ids(&vifs));
    destroy(&s, h, id).await;
    finish_two_hosts(s, b).await
}

/// A live migration A → B that runs past its completion timeout: the job is aborted on A
/// (`virDomainAbortJob`), the migration rolled back from A (bindings, `migrating_to`), B
/// removes what it prepared; the guest never stopped running on A.
async fn two_host_live_migration_timeout(run: &Run, b: &HostBAgent) -> R {
    let mut s = Scene::new(run, "two hosts: live migration aborted by its timeout");
    s.peers.insert(b.peer()?);
    let mut opts = s.system_host();
    // 10 ms per GiB of a guest counted as 2 GiB: aborted at the first look at the job.
    opts.migration = vireo_actors::instance::MigrationPolicy {
        completion_timeout_per_gib: Some(Duration::from_millis(10)),
        poll: Duration::from_millis(50),
        ..Default::default()
    };
    s.host(opts).await?;
    let net = run.env.network_id.clone();
    let (id, vifs, _) = spawn_allocated(&mut s, 0, &net, 1).await;
    let h = s.a();
    let bname = b.env.name.clone();
    let e = h
        .driver
        .live_migrate(id, LiveMigrateArgs::new(&bname))
        .await
        .unwrap_err();
    let text = vireo_integration::chain(&e);
    assert!(text.contains("aborted after"), "{text}");
    match &e {
        InstanceError::RolledBack { cause, .. } => assert!(
            matches!(**cause, InstanceError::MigrationAborted { .. }),
            "{text}"
        ),
        other => panic!("not rolled back: {}", vireo_integration::chain(other)),
    }
    println!("aborted and rolled back: {text}");
    assert_state(h, id, InstanceState::Running).await;
    assert!(hb_domain_state(&b.env, id).is_none(), "no domain left on B");
    for v in &vifs {
        assert_devices_b(&b.env, v, false);
        assert_devices(v, DomainForm::LibvirtManaged, true);
    }
    assert_bound_active(&s, &vifs, &h.name).await;
    destroy(&s, h, id).await;
    finish_two_hosts(s, b).await
}

/// A two-host disk scenario's start: host A (B its peer) on the `shared` instances directory
/// or on a state directory of its own, and one instance spawned stopped from a fresh 16 MiB
/// raw image `image_id` ("VIREODSK" at 0): a root disk of `root_gb`, 8 MiB of swap and a
/// config drive. Stopped, so that the test writes the guest's data into the disk itself.
struct DiskScene<'a> {
    s: Scene<'a>,
    id: Uuid,
    image: std::path::PathBuf,
    sum: String,
    /// Host A's state directory.
    state: std::path::PathBuf,
    /// The instance's directory on A, and where B keeps its disks (the same on a shared one).
    a_dir: std::path::PathBuf,
    b_dir: std::path::PathBuf,
    _images: tempfile::TempDir,
    // Last: removed after the scene's hosts are gone.
    _own: tempfile::TempDir,
}

async fn disk_scene<'a>(
    run: &'a Run,
    b: &HostBAgent,
    title: &str,
    shared: Option<&std::path::Path>,
    image_id: &str,
    root_gb: u64,
) -> Result<DiskScene<'a>, HarnessError> {
    let own = open_dir("vireo-it-state-")?;
    let state = shared.map_or_else(|| own.path().to_owned(), |p| p.to_owned());
    let mut s = Scene::new(run, title);
    s.peers.insert(b.peer()?);
    let images = open_dir("vireo-it-images-")?;
    let mut opts = s.system_host();
    opts.state_dir = state.clone();
    s.host(opts).await?;
    let image = images.path().join("disk.raw");
    let mut bytes = vec![0u8; 16 << 20];
    bytes[..8].copy_from_slice(b"VIREODSK");
    std::fs::write(&image, &bytes).unwrap();
    let sum = sha256_file(&image);
    let id = s.instance();
    let mut args = s.spawn_args(NetworkRequest::Allocated(NetworkInfo::default()));
    args.flavor.root_gb = root_gb;
    args.flavor.swap_mb = 8;
    args.power_on = false;
    args.storage = SpawnStorage {
        image: Some(ImageRef {
            id: ImageId::new(image_id).unwrap(),
            source: image.display().to_string(),
            checksum: Some(Checksum::Sha256(sum.clone())),
            format: ImageFormat::Raw,
        }),
        image_token: None,
        config_drive: Some(ConfigDrive::default()),
    };
    let h = s.a();
    s.ok(h, "spawn (disks, stopped)", id, h.driver.spawn(id, args))
        .await;
    let a_dir = state.join(format!("instances/{id}"));
    let b_dir = match shared {
        Some(_) => a_dir.clone(),
        None => b.state_dir.join(format!("instances/{id}")),
    };
    Ok(DiskScene {
        s,
        id,
        image,
        sum,
        state,
        a_dir,
        b_dir,
        _images: images,
        _own: own,
    })
}

/// A cross-host resize of an instance with disks, A → B, then revert, then again and confirm:
/// B copies the disks from A's libvirtd (the connection migrations use) into its own state
/// directory, rebases the root disk on its own base and grows it; the data written before is
/// on B; revert removes B's copy and A's disks are untouched; confirm removes A's. With
/// `shared` (an instances directory both agents use) B sees A's probe and resizes the same
/// files in place, keeping the old ones for a revert; confirm drops those, revert puts them
/// back.
async fn two_host_resize_with_disks(
    run: &Run,
    b: &HostBAgent,
    shared: Option<&std::path::Path>,
) -> R {
    let title = if shared.is_some() {
        TWO_HOSTS_SHARED[1]
    } else {
        TWO_HOSTS[2]
    };
    let DiskScene {
        s,
        id,
        image: _,
        sum,
        state,
        a_dir,
        b_dir,
        _images,
        _own,
    } = disk_scene(run, b, title, shared, "it-resize", 1).await?;
    let kept = state.join(format!("instances/{id}_resize"));
    let out = Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", "write -P 0x58 1M 1M"])
        .arg(a_dir.join("disk"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let bname = b.env.name.clone();
    for confirm in [false, true] {
        let mut bigger = flavor("m1.disk2", 1, 192);
        bigger.root_gb = 2;
        let h = s.a();
        let r = s
            .ok(
                h,
                "resize A>B (disks)",
                id,
                h.driver.resize(id, ResizeArgs::new(Some(&bname), bigger)),
            )
            .await;
        assert!(
            r.total(StepKind::Peer) > Duration::ZERO,
            "host B was called"
        );
        let finish = last_report(&b.client, id).await;
        assert_eq!(finish.request, "finish-resize");
        let step = if shared.is_some() {
            "resize disks"
        } else {
            "copy disks"
        };
        let copy = finish
            .steps
            .iter()
            .find(|st| st.name == step)
            .unwrap_or_else(|| panic!("no {step} step on B: {finish:?}"));
        println!("B: {step} in {} ms", copy.took.as_millis());
        s.peer_row("finish-resize (B, disks)", id, &finish);
        let view = b.client.show_instance(id).await.unwrap();
        assert_eq!(view.disks.len(), 3, "{view:?}");
        for d in &view.disks {
            assert!(d.path.starts_with(&b_dir), "{d:?}");
        }
        assert_eq!(view.disks[0].virtual_size, 2 << 30);
        // The data written on A is in B's copy; B's base is its own.
        assert!(overlay_holds(&b_dir.join("disk"), 1 << 20, 1 << 20, b'X'));
        let info = Command::new("qemu-img")
            .args(["info", "--output=json", "-U", "-f", "qcow2"])
            .arg(b_dir.join("disk"))
            .output()
            .unwrap();
        let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
        let base_dir = if shared.is_some() {
            &state
        } else {
            &b.state_dir
        };
        assert_eq!(
            info["backing-filename"],
            base_dir.join("_base/it-resize").display().to_string()
        );
        assert_eq!(info["virtual-size"], 2u64 << 30);
        if shared.is_some() {
            assert!(kept.join("disk").exists(), "the old disks are kept");
        } else {
            assert!(
                a_dir.join("disk").exists(),
                "A keeps its disks until confirm"
            );
        }
        if confirm {
            s.remote_ok(
                "confirm on B",
                id,
                api_op(&b.client, &bname, id, Operation::ConfirmResize {}),
            )
            .await;
            if shared.is_some() {
                assert!(!kept.exists(), "confirm drops the kept disks");
            } else {
                assert!(!a_dir.exists(), "confirm removes A's disks");
            }
            assert!(b_dir.join("disk").exists());
        } else {
            s.remote_ok(
                "revert on B",
                id,
                api_op(&b.client, &bname, id, Operation::RevertResize {}),
            )
            .await;
            if shared.is_some() {
                assert!(!kept.exists(), "revert put the kept disks back");
            } else {
                assert!(!b_dir.exists(), "revert removes B's copy");
            }
            assert!(overlay_holds(&a_dir.join("disk"), 1 << 20, 1 << 20, b'X'));
        }
    }
    assert_eq!(sha256_file(&state.join("_base/it-resize")), sum);
    if shared.is_none() {
        assert_eq!(sha256_file(&b.state_dir.join("_base/it-resize")), sum);
    }
    s.remote_ok("delete on B", id, delete_on_b(b, id)).await;
    assert!(!b_dir.exists(), "delete removes B's disks");
    finish_two_hosts(s, b).await
}

/// Bytes the guest "wrote" before a block live migration (besides a 1 MiB marker): the
/// overlay the migration copies, and the figure for its copy rate against `dd`.
const BLOCK_MIGRATION_BYTES: u64 = 1 << 30;

/// A live migration A → B of a running instance with disks (root overlay, swap, config
/// drive). With B's own instances directory B makes target disks (the root an empty overlay
/// on B's own base) and the migration copies them (`VIR_MIGRATE_NON_SHARED_INC`: only the
/// overlay); with `shared`, an instances directory both agents use, B sees A's probe file,
/// nothing is copied and the disks stay where they are. Either way the data written before
/// is in the disk B's guest runs on, A keeps nothing it should not, and deleting the
/// instance on B removes its directory.
async fn two_host_live_migration_with_disks(
    run: &Run,
    b: &HostBAgent,
    shared: Option<&std::path::Path>,
) -> R {
    let title = if shared.is_some() {
        TWO_HOSTS_SHARED[0]
    } else {
        TWO_HOSTS[4]
    };
    let DiskScene {
        s,
        id,
        image,
        sum,
        state,
        a_dir,
        b_dir,
        _images,
        _own,
    } = disk_scene(run, b, title, shared, "it-block-lm", 2).await?;
    let h = s.a();
    let mut writes = vec!["write -P 0x58 1M 1M".to_owned()];
    if shared.is_none() {
        writes.push(format!("write -P 0x59 64M {BLOCK_MIGRATION_BYTES}"));
    }
    for w in &writes {
        let out = Command::new("qemu-io")
            .args(["-f", "qcow2", "-c", w])
            .arg(a_dir.join("disk"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    // The plain copies the block migration is compared with: the same overlay, `dd` into
    // B's state directory on this machine's file system, once through the page cache (the
    // overlay qemu-io just wrote is in it) and once with O_DIRECT on both sides, the way QEMU
    // reads and writes the guest's `cache='none'` disks during the migration.
    let dd = if shared.is_none() {
        let scratch = b.state_dir.join("dd-scratch");
        let copy = |extra: &[&str]| {
            let t = Instant::now();
            let out = Command::new("dd")
                .arg(format!("if={}", a_dir.join("disk").display()))
                .arg(format!("of={}", scratch.display()))
                .args(["bs=1M", "conv=fsync", "status=none"])
                .args(extra)
                .output()
                .unwrap();
            let took = t.elapsed();
            let _ = std::fs::remove_file(&scratch);
            assert!(out.status.success(), "{out:?}");
            took
        };
        Some((copy(&[]), copy(&["iflag=direct", "oflag=direct"])))
    } else {
        None
    };
    s.ok(h, "power on (disks)", id, h.driver.power_on(id)).await;
    let bname = b.env.name.clone();
    let r = s
        .ok(
            h,
            "live migrate A>B (disks)",
            id,
            h.driver.live_migrate(id, LiveMigrateArgs::new(&bname)),
        )
        .await;
    let steps: Vec<&str> = r.steps.iter().map(|st| st.name.as_str()).collect();
    assert!(
        steps.contains(&"write the shared-directory probe"),
        "{steps:?}"
    );
    assert_eq!(
        steps.contains(&"migratable xml"),
        shared.is_none(),
        "{steps:?}"
    );
    if let (Some((cached, direct)), Some(m)) = (dd, r.steps.iter().find(|st| st.name == "migrate"))
    {
        let mib = (BLOCK_MIGRATION_BYTES >> 20) as f64;
        let rate = |d: Duration| mib / d.as_secs_f64();
        println!(
            "block live migration of {mib} MiB written: migrate {} ms ({:.0} MiB/s); dd of the \
             same overlay {} ms ({:.0} MiB/s): {:.2}x; dd with O_DIRECT {} ms ({:.0} MiB/s): \
             {:.2}x",
            m.took.as_millis(),
            rate(m.took),
            cached.as_millis(),
            rate(cached),
            cached.as_secs_f64() / m.took.as_secs_f64(),
            direct.as_millis(),
            rate(direct),
            direct.as_secs_f64() / m.took.as_secs_f64()
        );
    }
    assert_eq!(hb_domain_state(&b.env, id).as_deref(), Some("running"));
    let view = b.client.show_instance(id).await.unwrap();
    assert_eq!(view.disks.len(), 3, "{view:?}");
    for d in &view.disks {
        assert!(d.path.starts_with(&b_dir), "{d:?}");
    }
    // The guest's data is in the disk B runs on.
    assert!(overlay_holds(&b_dir.join("disk"), 1 << 20, 1 << 20, b'X'));
    let info = Command::new("qemu-img")
        .args(["info", "--output=json", "-U", "-f", "qcow2"])
        .arg(b_dir.join("disk"))
        .output()
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let base_dir = if shared.is_some() {
        &state
    } else {
        &b.state_dir
    };
    assert_eq!(
        info["backing-filename"],
        base_dir.join("_base/it-block-lm").display().to_string()
    );
    if shared.is_none() {
        assert!(
            overlay_holds(&b_dir.join("disk"), 64 << 20, 1 << 20, b'Y'),
            "the written block was copied"
        );
        assert!(!a_dir.exists(), "A removed its copy of the disks");
        assert!(b_dir.join("disk.config").exists());
    }
    let probes: Vec<_> = [state.join("instances"), b.state_dir.join("instances")]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".vireo-probe"))
        .map(|e| e.path())
        .collect();
    assert!(probes.is_empty(), "probes left: {probes:?}");
    assert_eq!(sha256_file(&image), sum, "the image never changes");
    s.remote_ok("delete on B", id, delete_on_b(b, id)).await;
    assert!(!b_dir.exists(), "delete removes the disks");
    finish_two_hosts(s, b).await
}

// ----------------------------------------------------------------------------------------

const HYBRID: [&str; 5] = [
    "hybrid: spawn+lifecycle",
    "hybrid: resize+revert",
    "hybrid: attach+detach",
    "build fails",
    "live migration rollback",
];
const TWO_HOSTS: [&str; 13] = [
    "two hosts: live migrate A>B",
    "two hosts: resize A>B+revert",
    "two hosts: resize A>B with disks",
    "two hosts: live migration aborted by its timeout",
    "two hosts: block live migration A>B",
    "two hosts: live migrate A>B, B's agent killed",
    "two hosts: spawn on B, B's agent killed in its wait",
    "two hosts: live migrate A>B, B killed in its hand-over",
    "two hosts: resize A>B, B killed in its finish",
    "two hosts: resize A>B+revert, B killed in the revert",
    "two hosts: resize B>A, B (the source) killed",
    "two hosts: live migrate B>A, B (the source) killed",
    "two hosts: live migrate B>A, B (the source) down until the guest left",
];
/// Run with host B's agent restarted on an instances directory host A uses too.
const TWO_HOSTS_SHARED: [&str; 2] = [
    "two hosts (shared instances): live migrate A>B with disks",
    "two hosts (shared instances): resize A>B with disks",
];
const TWO_HOSTS_OVN: [&str; 2] = [
    "two hosts on ML2/OVN, libvirt-managed: resize A>B+revert, live migrate A>B",
    "two hosts on ML2/OVN, pre-created: resize A>B+revert, live migrate A>B",
];
const TWO_HOSTS_LB: &str = "two hosts on Linux bridge: resize A>B+revert, live migrate A>B";
const OVN: [&str; 2] = [
    "ML2/OVN libvirt-managed: spawn+lifecycle",
    "ML2/OVN pre-created: spawn+lifecycle",
];
const NATIVE: [&str; 3] = [
    "native libvirt-managed: spawn+lifecycle",
    "native pre-created: spawn+lifecycle",
    "booted guest: hybrid+native+lb",
];

/// Host B's facts and its agent's API token, or why host B cannot be used.
type HostBPlan = Result<(HostBEnv, String), HarnessError>;

/// Host B for the two-host scenarios: its facts and its agent's API token (None: not
/// selected).
fn plan_host_b(runner: &mut Runner) -> (EndpointOptions, Option<HostBPlan>) {
    let mut opts = EndpointOptions::alone();
    if runner.listing()
        || !(runner.any_selected(&TWO_HOSTS)
            || runner.any_selected(&TWO_HOSTS_SHARED)
            || runner.any_selected(&TWO_HOSTS_OVN)
            || runner.selected(TWO_HOSTS_LB))
    {
        return (opts, None);
    }
    let plan = HostBEnv::load().map(|env| {
        let secret = Uuid::new_v4().simple().to_string();
        // Both of host B's agents (never running at once): events the endpoint cannot
        // place go to each.
        opts.peers
            .push(hostb::link(&env, &AgentOptions::ovs(&env), &secret));
        opts.peers
            .push(hostb::link(&env, &AgentOptions::ovn(&env), &secret));
        opts.peers
            .push(hostb::link(&env, &AgentOptions::lb(&env), &secret));
        (env, secret)
    });
    (opts, Some(plan))
}

async fn two_hosts(runner: &mut Runner, run: &Run, plan: Option<HostBPlan>) {
    let (env, secret) = match plan {
        None => return,
        Some(Err(e)) => {
            runner.fail("host B", &e);
            return;
        }
        Some(Ok(p)) => p,
    };
    let side = HostASide {
        name: run.env.host.clone(),
        api: run.endpoint.addr(),
        api_secret: run.endpoint.api_secret().to_owned(),
        neutron: run
            .env
            .neutron_url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("Neutron's URL is http://ADDR:PORT"),
    };
    let start = Instant::now();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_vireo-it-agent"));
    let mut b =
        match HostBAgent::start(env.clone(), &AgentOptions::ovs(&env), &secret, bin, &side).await {
            Ok(b) => b,
            Err(e) => {
                runner.fail("host B's vireo agent", &e);
                return;
            }
        };
    println!(
        "host B's vireo agent ({}) answers at {} after {:.1} s",
        b.env.name,
        b.link.url,
        start.elapsed().as_secs_f64()
    );
    runner
        .run(TWO_HOSTS[0], || two_host_live_migration(run, &b))
        .await;
    runner
        .run(TWO_HOSTS[1], || two_host_resize_revert(run, &b))
        .await;
    runner
        .run(TWO_HOSTS[2], || two_host_resize_with_disks(run, &b, None))
        .await;
    runner
        .run(TWO_HOSTS[3], || two_host_live_migration_timeout(run, &b))
        .await;
    runner
        .run(TWO_HOSTS[4], || {
            two_host_live_migration_with_disks(run, &b, None)
        })
        .await;
    runner
        .run(TWO_HOSTS[5], || {
            two_host_live_migration_destination_restarted(run, &mut b)
        })
        .await;
    runner
        .run(TWO_HOSTS[6], || {
            two_host_spawn_killed_in_its_wait(run, &mut b)
        })
        .await;
    runner
        .run(TWO_HOSTS[7], || {
            two_host_live_migration_killed_in_post(run, &mut b)
        })
        .await;
    runner
        .run(TWO_HOSTS[8], || {
            two_host_resize_killed_in_finish(run, &mut b)
        })
        .await;
    runner
        .run(TWO_HOSTS[9], || two_host_revert_killed(run, &mut b))
        .await;
    runner
        .run(TWO_HOSTS[10], || two_host_resize_source_killed(run, &mut b))
        .await;
    runner
        .run(TWO_HOSTS[11], || {
            two_host_live_migration_source_killed(run, &mut b, false)
        })
        .await;
    runner
        .run(TWO_HOSTS[12], || {
            two_host_live_migration_source_killed(run, &mut b, true)
        })
        .await;
    let failed = |runner: &Runner, names: &[&str]| {
        runner
            .results()
            .iter()
            .any(|(n, o, _)| names.contains(&n.as_str()) && *o != Outcome::Passed)
    };
    if failed(runner, &TWO_HOSTS) {
        println!("host B's agent log (last lines):\n{}", b.log_tail());
    }
    b.stop().await;
    if !runner.any_selected(&TWO_HOSTS_SHARED) {
        return;
    }
    // Host B again, on an instances directory host A's agent in the scenario uses too.
    let shared = match open_dir("vireo-it-shared-") {
        Ok(d) => d,
        Err(e) => {
            runner.fail("a shared instances directory", &e);
            return;
        }
    };
    let instances = shared.path().join("instances");
    let mut opts = AgentOptions::ovs(&env);
    opts.instances_path = Some(instances);
    let b = match HostBAgent::start(env, &opts, &secret, bin, &side).await {
        Ok(b) => b,
        Err(e) => {
            runner.fail("host B's vireo agent (shared instances)", &e);
            return;
        }
    };
    runner
        .run(TWO_HOSTS_SHARED[0], || {
            two_host_live_migration_with_disks(run, &b, Some(shared.path()))
        })
        .await;
    runner
        .run(TWO_HOSTS_SHARED[1], || {
            two_host_resize_with_disks(run, &b, Some(shared.path()))
        })
        .await;
    if failed(runner, &TWO_HOSTS_SHARED) {
        println!("host B's agent log (last lines):\n{}", b.log_tail());
    }
    b.stop().await;
}

/// Host B as its ML2/OVN chassis (its agent started for each form; both hosts plug the
/// same) and as its Linux bridge agent's host, after the ML2/OVS agent of [`two_hosts`]
/// has stopped: one of host B's agents at a time.
async fn two_hosts_backends(runner: &mut Runner, run: &Run, plan: Option<(HostBEnv, String)>) {
    let Some((env, secret)) = plan else {
        return;
    };
    let addr = |url: &str| -> std::net::SocketAddr {
        url.trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("Neutron's URL is http://ADDR:PORT")
    };
    let side = |name: &str, neutron: &str| HostASide {
        name: name.to_owned(),
        api: run.endpoint.addr(),
        api_secret: run.endpoint.api_secret().to_owned(),
        neutron: addr(neutron),
    };
    let ovn = |form: OvsNativeForm| {
        let mut opts = AgentOptions::ovn(&env);
        opts.ovs_bridge = Some(run.env.ovn_bridge.clone());
        opts.ovs_native_form = form;
        opts
    };
    let ovn_a = side(&run.env.ovn_host, &run.env.ovn_neutron_url);
    let lb_a = side(&run.env.lb_host, &run.env.neutron_url);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_vireo-it-agent"));
    for (name, backend, opts, a) in [
        (
            TWO_HOSTS_OVN[0],
            Backend::Ovn(DomainForm::LibvirtManaged),
            ovn(OvsNativeForm::LibvirtManaged),
            &ovn_a,
        ),
        (
            TWO_HOSTS_OVN[1],
            Backend::Ovn(DomainForm::PreCreated),
            ovn(OvsNativeForm::PreCreated),
            &ovn_a,
        ),
        (
            TWO_HOSTS_LB,
            Backend::LinuxBridge,
            AgentOptions::lb(&env),
            &lb_a,
        ),
    ] {
        if !runner.selected(name) {
            continue;
        }
        let b = match HostBAgent::start(env.clone(), &opts, &secret, bin, a).await {
            Ok(b) => b,
            Err(e) => {
                runner.fail(name, &e);
                continue;
            }
        };
        runner.run(name, || two_host_cells(run, &b, backend)).await;
        if runner
            .results()
            .iter()
            .any(|(n, o, _)| n == name && *o != Outcome::Passed)
        {
            println!("host B's agent log (last lines):\n{}", b.log_tail());
        }
        b.stop().await;
    }
}

async fn run_all(runner: &mut Runner) {
    let (endpoint, plan) = plan_host_b(runner);
    let run = match Run::start(endpoint).await {
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
    if runner.listing() {
        for n in TWO_HOSTS
            .iter()
            .chain(&TWO_HOSTS_SHARED)
            .chain(&TWO_HOSTS_OVN)
            .chain(&[TWO_HOSTS_LB])
        {
            runner.run(n, || async { Ok(()) }).await;
        }
    } else {
        let ovn = match &plan {
            Some(Ok(p)) => Some(p.clone()),
            _ => None,
        };
        two_hosts(runner, &run, plan).await;
        two_hosts_backends(runner, &run, ovn).await;
    }

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
