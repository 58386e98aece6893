//! Instance actors under load, on libvirt's test driver.
//!
//! 1. Throughput: N instances spawned, hard-rebooted and destroyed concurrently through vireo
//!    (actors, embedded network service, recording plugger; no event delay), against a plain
//!    loop of the same libvirt calls on the same number of threads (4, vireo's worker count).
//! 2. Memory per idle instance actor: RSS growth per actor, with a 4-VIF record.
//!
//! `cargo bench -p vireo --bench instances [-- N]` (default N = 100). A bench binary, not a
//! timed test: it prints figures; it fails only if vireo itself fails.
//!
//! `INSTANCES_BENCH_ONLY=vireo|plain` runs one side once (after the warm-up), for a profiler
//! (e.g. `valgrind --tool=callgrind`, which counts instructions whatever else the machine does);
//! `layer` and `layer4` run the plain loop's calls through vireo's libvirt layer alone (all
//! instances at once, or 4 at a time), to split the gap (see `layer_run`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;
use vireo::compute::ComputeOps;
use vireo::local::{LocalCloud, LocalCloudConfig};
use vireo::network::embedded::{EmbeddedConfig, EmbeddedNetworkDef, Mechanism};
use vireo_actors::events::{EventConfig, WaitPolicy};
use vireo_actors::instance::{
    BootSource, DestroyArgs, InstanceActor, InstanceConfig, InstanceRecord, NetworkRequest,
    RebootKind, SpawnArgs,
};
use vireo_actors::lifecycle::InstanceState;
use vireo_actors::network::PortRequest;
use vireo_actors::vif::NetworkInfo;
use vireo_xml::metadata::Flavor;

const NET_A: &str = "be4c0000-0000-4000-8000-000000000001";
const NET_B: &str = "be4c0000-0000-4000-8000-000000000002";

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn flavor() -> Flavor {
    Flavor {
        name: "m1.tiny".into(),
        vcpus: 1,
        memory_mb: 256,
        root_gb: 1,
        ephemeral_gb: 0,
        swap_mb: 0,
        extra_specs: Default::default(),
    }
}

async fn cloud(dir: &std::path::Path) -> LocalCloud {
    let net = |id: &str, hybrid| EmbeddedNetworkDef {
        id: id.into(),
        name: id.into(),
        mtu: Some(1450),
        mechanism: Mechanism::Openvswitch,
        ovs_hybrid_plug: hybrid,
        bridge_name: None,
        datapath_type: None,
        physical_network: None,
        vlan: None,
    };
    LocalCloud::start(LocalCloudConfig {
        hosts: vec!["bench".into()],
        dir: dir.to_owned(),
        network: EmbeddedConfig {
            networks: vec![net(NET_A, true), net(NET_B, false)],
            ..EmbeddedConfig::default()
        },
        instances: InstanceConfig {
            wait: WaitPolicy {
                timeout: Duration::from_secs(60),
                fatal: true,
            },
            ..InstanceConfig::default()
        },
        events: EventConfig::default(),
    })
    .await
    .unwrap()
}

fn spawn_args(i: usize) -> SpawnArgs {
    SpawnArgs {
        name: format!("bench-{i}"),
        flavor: flavor(),
        boot: BootSource::None,
        storage: Default::default(),
        network: NetworkRequest::Allocate(vec![
            PortRequest::Network {
                network_id: NET_A.into(),
            },
            PortRequest::Network {
                network_id: NET_B.into(),
            },
        ]),
        power_on: true,
    }
}

/// What vireo defines for one instance of the run: its domain XML (without its uuid, named
/// `{name}`) and its metadata element, so that the plain loop makes the same calls with the
/// same payloads (libvirt's test driver spends its time parsing them).
async fn vireo_payload() -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let c = cloud(dir.path()).await;
    let d = c.hosts[0].driver.clone();
    let id = Uuid::new_v4();
    d.spawn(id, spawn_args(0)).await.unwrap();
    let xml = d.libvirt().xml_desc(id, true).await.unwrap();
    let meta = d
        .libvirt()
        .get_metadata(
            id,
            vireo_xml::metadata::NAMESPACE_URI,
            vireo_actors::libvirt::Affect::Config,
        )
        .await
        .unwrap()
        .unwrap();
    d.destroy(
        id,
        DestroyArgs {
            deallocate_network: true,
        },
    )
    .await
    .unwrap();
    c.shutdown(Duration::from_secs(5)).await;
    let (start, end) = (xml.find("<uuid>").unwrap(), xml.find("</uuid>").unwrap());
    let xml = format!("{}{}", &xml[..start], &xml[end + "</uuid>".len()..])
        .replace("<name>bench-0</name>", "<name>{name}</name>");
    (xml, meta)
}

async fn vireo_run(n: usize) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let c = cloud(dir.path()).await;
    let d = c.hosts[0].driver.clone();
    let ids: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (i, id) in ids.iter().copied().enumerate() {
        let d = d.clone();
        tasks.push(tokio::spawn(async move {
            d.spawn(id, spawn_args(i)).await.unwrap();
            d.reboot(id, RebootKind::Hard).await.unwrap();
            d.destroy(
                id,
                DestroyArgs {
                    deallocate_network: true,
                },
            )
            .await
            .unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let took = start.elapsed();
    c.shutdown(Duration::from_secs(5)).await;
    took
}

/// The libvirt calls vireo makes for spawn + hard reboot + destroy of one instance, made
/// directly with vireo's domain XML and metadata ([`vireo_payload`]): define, start, suspend,
/// resume, is-active, set-metadata (spawn); is-active, set-metadata, info, destroy, start,
/// suspend, resume, is-active, set-metadata (hard reboot); info, destroy, undefine (destroy).
/// The test driver refuses `START_PAUSED`; vireo's libvirt layer learns that at the first
/// paused start of a run and then starts and suspends in one worker call, so the one refused
/// call per run is left out here.
fn plain_lifecycle(conn: &virt::connect::Connect, xml: &str, meta: &str) {
    use virt::domain::Domain;
    use virt::sys;
    let d = conn
        .define_domain_xml_flags(xml, sys::VIR_DOMAIN_DEFINE_VALIDATE)
        .unwrap();
    let set_meta = |d: &Domain| {
        let _ = d.is_active();
        d.set_metadata(
            sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            Some(meta),
            Some("vireo"),
            Some(vireo_xml::metadata::NAMESPACE_URI),
            sys::VIR_DOMAIN_AFFECT_LIVE | sys::VIR_DOMAIN_AFFECT_CONFIG,
        )
        .unwrap();
    };
    let boot = |d: &Domain| {
        d.create_with_flags(0).unwrap();
        d.suspend().unwrap();
        d.resume().unwrap();
    };
    boot(&d);
    set_meta(&d);
    set_meta(&d);
    let _ = d.info().unwrap();
    d.destroy().unwrap();
    boot(&d);
    set_meta(&d);
    let _ = d.info().unwrap();
    d.destroy().unwrap();
    d.undefine().unwrap();
}

fn plain_run(n: usize, threads: usize, payload: &(String, String)) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain.xml");
    std::fs::write(&file, "<node/>\n").unwrap();
    let uri = format!("test://{}", file.display());
    let conn = Arc::new(virt::connect::Connect::open(Some(&uri)).unwrap());
    let (template, meta) = payload;
    let meta = meta.as_str();
    let start = Instant::now();
    let per = n.div_ceil(threads);
    std::thread::scope(|s| {
        for t in 0..threads {
            let conn = conn.clone();
            s.spawn(move || {
                for i in (t * per)..((t + 1) * per).min(n) {
                    let xml = template.replace("{name}", &format!("plain-{i}"));
                    plain_lifecycle(&conn, &xml, meta);
                }
            });
        }
    });
    start.elapsed()
}

/// The plain loop's calls through vireo's libvirt layer alone (its worker threads and
/// queue, a uuid lookup per call, its lifecycle-event callbacks registered), `at_once`
/// instances at a time: which part of the gap between vireo and the plain loop is the
/// layer's, and which the actors' and the rest's (`INSTANCES_BENCH_ONLY=layer|layer4`;
/// `LAYER_WORKERS` sets the layer's worker count, `PLAIN_THREADS` the plain loop's threads).
async fn layer_run(n: usize, at_once: usize, payload: &(String, String)) -> Duration {
    use vireo_actors::libvirt::{Libvirt, LibvirtConfig, Metadata};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("layer.xml");
    std::fs::write(&file, "<node/>\n").unwrap();
    let mut cfg = LibvirtConfig::for_uri(format!("test://{}", file.display()));
    if let Ok(w) = std::env::var("LAYER_WORKERS") {
        cfg.workers = w.parse().unwrap();
    }
    let lv = Libvirt::open(cfg).await.unwrap();
    let (template, meta) = payload;
    let gate = Arc::new(tokio::sync::Semaphore::new(at_once));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let (lv, gate) = (lv.clone(), gate.clone());
        let xml = template.replace("{name}", &format!("layer-{i}"));
        let meta = Metadata {
            xml: meta.clone(),
            key: "vireo".into(),
            uri: vireo_xml::metadata::NAMESPACE_URI.into(),
        };
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let id = lv.define_xml(xml, true).await.unwrap().uuid;
            let boot = || async {
                lv.start_paused(id).await.unwrap();
                lv.resume(id).await.unwrap();
            };
            let set_meta = || async {
                let _ = lv.is_active(id).await.unwrap();
                lv.save_metadata(id, meta.clone()).await.unwrap();
            };
            boot().await;
            set_meta().await;
            set_meta().await;
            let _ = lv.info(id).await.unwrap();
            lv.destroy(id).await.unwrap();
            boot().await;
            set_meta().await;
            let _ = lv.info(id).await.unwrap();
            lv.destroy(id).await.unwrap();
            lv.undefine(id).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    start.elapsed()
}

async fn idle_actor_memory(count: usize) -> (u64, usize) {
    let dir = tempfile::tempdir().unwrap();
    let c = cloud(dir.path()).await;
    let driver = c.hosts[0].driver.clone();
    let deps = Arc::new(vireo_actors::instance::HostDeps {
        host: "bench".into(),
        libvirt: driver.libvirt().clone(),
        events: driver.events().clone(),
        plugger: driver.plugger().clone(),
        network: driver.network().clone(),
        storage: Arc::new(
            vireo::storage::HostStorage::new(vireo::storage::StorageConfig::in_state_dir(
                dir.path(),
            ))
            .unwrap(),
        ),
        builds: Arc::new(
            vireo_actors::instance::BuildJournal::open(dir.path().join("builds")).unwrap(),
        ),
        migrations: Arc::new(
            vireo_actors::instance::LiveMigrationJournal::open(dir.path().join("live-migrations"))
                .unwrap(),
        ),
        peers: driver.peers().clone(),
        config: InstanceConfig::default(),
    });
    let gone = driver.host_handle().addr().clone().recipient();
    let vif = |n: u8| {
        serde_json::json!({
            "id": format!("be4c0000-0000-4000-8000-0000000000{n:02x}"),
            "address": format!("fa:16:3e:00:00:{n:02x}"),
            "type": "ovs", "vnic_type": "normal", "active": true,
            "details": {"ovs_hybrid_plug": true, "port_filter": true, "datapath_type": "system"},
            "network": {"id": NET_A, "bridge": "br-int", "label": "private",
                        "meta": {"mtu": 1450, "injected": false}, "subnets": []},
            "devname": format!("tapbe4c0000-{n:02x}"), "profile": {}, "preserve_on_delete": false
        })
    };
    let ni = NetworkInfo::from_value(&serde_json::json!([vif(1), vif(2), vif(3), vif(4)])).unwrap();
    let op_ids = Arc::new(AtomicU64::new(0));
    let system = c.system.clone();
    let before = rss_kib();
    let mut addrs = Vec::with_capacity(count);
    for _ in 0..count {
        let uuid = Uuid::new_v4();
        let record = InstanceRecord {
            uuid,
            name: format!("idle-{uuid}"),
            flavor: flavor(),
            boot: BootSource::None,
            storage: Default::default(),
            network_info: ni.clone(),
            state: InstanceState::Running,
            resize: None,
            arrived_by: None,
        };
        let (deps, gone, op_ids) = (deps.clone(), gone.clone(), op_ids.clone());
        let addr = actix::Actor::start_in_arbiter(system.arbiter(), move |_| {
            InstanceActor::new(
                uuid,
                deps,
                gone,
                op_ids,
                InstanceState::Running,
                Some(record),
                vireo_actors::instance::PowerState::Running,
            )
        });
        addrs.push(addr);
    }
    // Let every actor start.
    for a in &addrs {
        let _ = a.send(vireo_actors::instance::actor::Show).await;
    }
    let after = rss_kib();
    let per = (after.saturating_sub(before)) * 1024 / count as u64;
    drop(addrs);
    c.shutdown(Duration::from_secs(5)).await;
    (per, std::mem::size_of::<InstanceActor>())
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    vireo_actors::libvirt::init_event_loop().unwrap();
    let payload = rt.block_on(vireo_payload());
    // Warm up both paths once.
    rt.block_on(vireo_run(4));
    plain_run(4, 4, &payload);
    if let Ok(side) = std::env::var("INSTANCES_BENCH_ONLY") {
        let took = match side.as_str() {
            "vireo" => rt.block_on(vireo_run(n)),
            "plain" => plain_run(
                n,
                std::env::var("PLAIN_THREADS").map_or(4, |t| t.parse().unwrap()),
                &payload,
            ),
            "layer" => rt.block_on(layer_run(n, n, &payload)),
            "layer4" => rt.block_on(layer_run(n, 4, &payload)),
            other => panic!("INSTANCES_BENCH_ONLY={other}: vireo, plain, layer or layer4"),
        };
        println!(
            "{side}: {n} instances in {:.0} ms",
            took.as_secs_f64() * 1000.0
        );
        return;
    }
    let mut ratios = Vec::new();
    // Five rounds, vireo and the plain loop alternating which goes first (vireo in even
    // rounds), so that drift in the machine's speed hits both alike; the median is the figure.
    for round in 0..5 {
        let (v, p) = if round % 2 == 0 {
            let v = rt.block_on(vireo_run(n));
            (v, plain_run(n, 4, &payload))
        } else {
            let p = plain_run(n, 4, &payload);
            (rt.block_on(vireo_run(n)), p)
        };
        let vireo_rate = n as f64 / v.as_secs_f64();
        let plain_rate = n as f64 / p.as_secs_f64();
        ratios.push(vireo_rate / plain_rate);
        println!(
            "round {round}: {n} instances spawn+hard reboot+destroy: vireo {:.0} ms ({vireo_rate:.0}/s), \
             plain loop on 4 threads {:.0} ms ({plain_rate:.0}/s), vireo/plain throughput {:.2}",
            v.as_secs_f64() * 1000.0,
            p.as_secs_f64() * 1000.0,
            vireo_rate / plain_rate
        );
    }
    ratios.sort_by(|a, b| a.total_cmp(b));
    println!(
        "median vireo/plain throughput ratio over {} rounds: {:.2} (target >= 0.90)",
        ratios.len(),
        ratios[ratios.len() / 2]
    );
    let (per, size) = rt.block_on(idle_actor_memory(10_000));
    println!(
        "idle instance actor with a 4-VIF record: {per} bytes RSS each over 10,000 actors \
         (struct {size} bytes; target <= 16384)"
    );
}
