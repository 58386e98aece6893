//! Spawn overhead on real libvirt (`qemu:///system`): vireo's spawn against the raw libvirt
//! calls it makes, event wait excluded (the instances have no VIFs, so nothing is waited for).
//!
//! Per round, one instance is spawned through vireo (driver → instance actor → libvirt
//! worker) and one with the same calls made directly on a `virt` connection from this
//! thread: define (VALIDATE), create (START_PAUSED), resume, is-active, set-metadata (live
//! and config). The raw side defines the very XML vireo defined (read back with
//! `VIR_DOMAIN_XML_INACTIVE`, renamed). Rounds alternate which side goes first; both sides
//! destroy and undefine outside the timed part. Prints p50/p90 of both sides and the ratio of
//! medians (target ≤ 1.10), and vireo's own time (its wall time minus the libvirt calls it
//! timed), which is what the ratio measures once libvirt's noise is taken out.
//!
//! `--disk`: each instance also gets a 1 GiB root disk (a qcow2 overlay on a cached raw image),
//! and the raw side makes the same `qemu-img info` and `create` before its define.
//!
//! `cargo bench -p vireo --bench spawn_qemu [-- ROUNDS] [--disk]` (default 20), as root on a host with
//! libvirtd (`integration/host-setup.sh up`). A bench binary, not a timed test: it prints
//! figures and fails only if a call fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use uuid::Uuid;
use vireo::compute::{
    ComputeDriver, ComputeOps, DriverConfig, LibvirtDriver, NetworkConfig, PluggingConfig,
};
use vireo::network::embedded::EmbeddedConfig;
use vireo_actors::events::EventConfig;
use vireo_actors::instance::{
    BootSource, DestroyArgs, DomainSettings, InstanceConfig, NetworkRequest, SpawnArgs,
};
use vireo_actors::libvirt::LibvirtConfig;
use vireo_actors::lifecycle::InstanceState;
use vireo_xml::domain::DomainType;
use vireo_xml::metadata::Flavor;

const URI: &str = "qemu:///system";
const PREFIX: &str = "vireo-bench-spawn";

fn flavor() -> Flavor {
    Flavor {
        name: "m1.tiny".into(),
        vcpus: 1,
        memory_mb: 128,
        root_gb: 0,
        ephemeral_gb: 0,
        swap_mb: 0,
        extra_specs: Default::default(),
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// The raw calls of a vireo spawn, timed; destroy and undefine after, untimed. None: a call
/// failed (the domain is removed all the same).
/// The storage calls vireo makes for a root disk, made directly: `qemu-img info` of the base,
/// `qemu-img create` of the overlay in the instance's directory.
fn raw_disk(base: &std::path::Path, overlay: &std::path::Path) {
    std::fs::create_dir_all(overlay.parent().unwrap()).unwrap();
    let info = std::process::Command::new("qemu-img")
        .args(["info", "--output=json", "-f", "raw"])
        .arg(base)
        .output()
        .unwrap();
    assert!(info.status.success());
    let st = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(base)
        .arg(overlay)
        .arg("1073741824")
        .status()
        .unwrap();
    assert!(st.success());
}

fn raw_spawn(
    conn: &virt::connect::Connect,
    xml: &str,
    meta: &str,
    disk: Option<(&std::path::Path, &std::path::Path)>,
) -> Option<Duration> {
    use virt::sys;
    let start = Instant::now();
    if let Some((base, overlay)) = disk {
        raw_disk(base, overlay);
    }
    let d = conn
        .define_domain_xml_flags(xml, sys::VIR_DOMAIN_DEFINE_VALIDATE)
        .unwrap();
    let calls = || -> Result<(), virt::error::Error> {
        d.create_with_flags(sys::VIR_DOMAIN_START_PAUSED)?;
        d.resume()?;
        let _ = d.is_active()?;
        d.set_metadata(
            sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            Some(meta),
            Some(vireo_xml::metadata::NAMESPACE_PREFIX),
            Some(vireo_xml::metadata::NAMESPACE_URI),
            sys::VIR_DOMAIN_AFFECT_LIVE | sys::VIR_DOMAIN_AFFECT_CONFIG,
        )
    };
    let r = calls();
    let took = start.elapsed();
    let _ = d.destroy();
    d.undefine().unwrap();
    if let Some((_, overlay)) = disk {
        let _ = std::fs::remove_dir_all(overlay.parent().unwrap());
    }
    match r {
        Ok(()) => Some(took),
        Err(e) => {
            eprintln!("raw spawn failed: {e}");
            None
        }
    }
}

fn remove_leftovers(conn: &virt::connect::Connect) {
    for d in conn.list_all_domains(0).unwrap_or_default() {
        if d.name().is_ok_and(|n| n.starts_with(PREFIX)) {
            let _ = d.destroy();
            let _ = d.undefine();
        }
    }
}

#[actix_rt::main]
async fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let conn = match virt::connect::Connect::open(Some(URI)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("spawn_qemu: cannot open {URI} ({e}); run integration/host-setup.sh up");
            std::process::exit(2);
        }
    };
    remove_leftovers(&conn);
    let domain_type = if std::path::Path::new("/dev/kvm").exists() {
        DomainType::Kvm
    } else {
        DomainType::Qemu
    };
    // `--disk`: each instance gets a root disk (a qcow2 overlay on a cached 16 MiB raw
    // image, 1 GiB), and the raw side makes the same storage calls.
    let with_disk = std::env::args().any(|a| a == "--disk");
    // QEMU (another user) must reach the disks: a traversable state directory.
    let state = tempfile::Builder::new()
        .prefix("vireo-bench-spawn-")
        .tempdir_in("/var/tmp")
        .expect("state dir");
    std::fs::set_permissions(
        state.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let image = state.path().join("image.raw");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let image_ref = vireo_actors::storage::ImageRef {
        id: vireo_actors::storage::ImageId::new("bench").unwrap(),
        source: image.display().to_string(),
        checksum: None,
        format: vireo_actors::storage::ImageFormat::Raw,
    };
    let cfg = DriverConfig {
        host: "bench".into(),
        libvirt: LibvirtConfig::for_uri(URI),
        instances: InstanceConfig {
            domain: DomainSettings {
                domain_type,
                machine: None,
                console_dir: None,
            },
            ..InstanceConfig::default()
        },
        events: EventConfig::default(),
        plugging: PluggingConfig::Static,
        network: NetworkConfig::Embedded(EmbeddedConfig::default()),
        migration_uri: None,
        storage: vireo::storage::StorageConfig::in_state_dir(state.path()),
    };
    let driver = LibvirtDriver::builder(cfg).build().await.unwrap();
    let spawn_args = |i: usize| SpawnArgs {
        name: format!("{PREFIX}-v{i}"),
        flavor: flavor(),
        boot: BootSource::None,
        storage: vireo_actors::instance::SpawnStorage {
            image: with_disk.then(|| image_ref.clone()),
            ..Default::default()
        },
        network: NetworkRequest::Allocate(Vec::new()),
        power_on: true,
    };
    let destroy = DestroyArgs {
        deallocate_network: true,
    };

    // Warm-up, and the XML vireo defines (config form, with its metadata) for the raw side.
    let id = Uuid::new_v4();
    let report = driver.spawn(id, spawn_args(0)).await.unwrap();
    assert_eq!(driver.show(id).await.unwrap().state, InstanceState::Running);
    let dom = conn.lookup_domain_by_uuid_string(&id.to_string()).unwrap();
    let template = dom.xml_desc(virt::sys::VIR_DOMAIN_XML_INACTIVE).unwrap();
    let meta = dom
        .metadata(
            virt::sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            Some(vireo_xml::metadata::NAMESPACE_URI),
            0,
        )
        .unwrap();
    driver.destroy(id, destroy).await.unwrap();
    let raw_xml = |i: usize, uuid: Uuid| {
        template
            .replace(&id.to_string(), &uuid.to_string())
            .replace(&format!("{PREFIX}-v0"), &format!("{PREFIX}-r{i}"))
    };
    let base = state.path().join("_base/bench");
    let overlay = |uuid: Uuid| state.path().join(format!("instances/{uuid}/disk"));
    let raw_run = |i: usize| {
        let uuid = Uuid::new_v4();
        let o = overlay(uuid);
        raw_spawn(
            &conn,
            &raw_xml(i, uuid),
            &meta,
            with_disk.then_some((base.as_path(), o.as_path())),
        )
    };
    let _ = raw_run(0);
    println!(
        "spawn_qemu: {rounds} rounds on {URI} ({domain_type:?}), no VIFs, {}; vireo's warm-up spawn {}",
        if with_disk { "a 1 GiB root disk (overlay)" } else { "no disk" },
        ms(report.took)
    );

    let mut vireo_t = Vec::with_capacity(rounds);
    let mut vireo_lv = Vec::with_capacity(rounds);
    let mut raw_t = Vec::with_capacity(rounds);
    // Rounds where either side's qemu failed to start (seen here now and then under nested
    // KVM: "process exited while connecting to monitor"): left out of both sides.
    let mut failed = 0;
    for i in 1..=rounds {
        let run_vireo = async {
            let id = Uuid::new_v4();
            let start = Instant::now();
            let r = driver.spawn(id, spawn_args(i)).await;
            let took = start.elapsed();
            driver.destroy(id, destroy).await.unwrap();
            match r {
                Ok(r) => Some((took, r.total(vireo_actors::instance::StepKind::Libvirt))),
                Err(e) => {
                    eprintln!("vireo spawn failed: {e}");
                    None
                }
            }
        };
        let run_raw = || raw_run(i);
        let (v, r) = if i % 2 == 0 {
            let v = run_vireo.await;
            (v, run_raw())
        } else {
            let r = run_raw();
            (run_vireo.await, r)
        };
        match (v, r) {
            (Some((t, lv)), Some(r)) => {
                vireo_t.push(t);
                vireo_lv.push(lv);
                raw_t.push(r);
            }
            _ => failed += 1,
        }
    }
    remove_leftovers(&conn);
    if vireo_t.is_empty() {
        eprintln!("spawn_qemu: every round failed");
        std::process::exit(1);
    }
    println!(
        "rounds measured: {} ({failed} left out: a qemu failed to start)",
        vireo_t.len()
    );
    let mut overhead: Vec<Duration> = vireo_t
        .iter()
        .zip(&vireo_lv)
        .map(|(t, lv)| t.saturating_sub(*lv))
        .collect();
    let (o50, o90) = (pct(&mut overhead, 0.5), pct(&mut overhead, 0.9));
    let (v50, v90) = (pct(&mut vireo_t, 0.5), pct(&mut vireo_t, 0.9));
    let (r50, r90) = (pct(&mut raw_t, 0.5), pct(&mut raw_t, 0.9));
    let lv50 = pct(&mut vireo_lv, 0.5);
    println!("                      p50        p90");
    println!("vireo spawn     {:>10} {:>10}", ms(v50), ms(v90));
    println!("  its libvirt   {:>10}", ms(lv50));
    println!("  the rest      {:>10} {:>10}", ms(o50), ms(o90));
    println!("raw calls       {:>10} {:>10}", ms(r50), ms(r90));
    println!(
        "ratio vireo/raw (p50): {:.3} (target <= 1.10)",
        v50.as_secs_f64() / r50.as_secs_f64()
    );
}
