//! Throughput of create+destroy cycles through a `LibvirtHandle` against a plain loop of the
//! same libvirt calls on the same number of threads sharing one connection; both on private
//! `test:///` connections. With 4 threads (the handle's 4 workers fed by 4 concurrent callers)
//! the handle's target is >= 0.8x the plain loop; the 1-thread pair shows the per-call cost of
//! the hand-off to a worker.
//!
//! One cycle: `virDomainCreateXML` of a transient test domain, its UUID and name,
//! `virDomainLookupByUUID`, `virDomainDestroy` — what `create_xml` + `destroy(uuid)` do.
#![allow(clippy::unwrap_used, clippy::expect_used)] // benchmark setup

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use uuid::Uuid;
use vireo_actors::libvirt::{init_event_loop, Libvirt, LibvirtConfig, LibvirtHandle};
use virt::connect::Connect;

/// Cycles for thread `t` of `threads` so that they add up to `iters`.
fn share(iters: u64, threads: usize, t: usize) -> u64 {
    let threads = threads as u64;
    iters / threads + u64::from((t as u64) < iters % threads)
}

fn node_file(dir: &tempfile::TempDir, name: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(
        &path,
        "<node><cpu><mhz>2000</mhz><model>x86_64</model><active>4</active><nodes>1</nodes>\
         <sockets>1</sockets><cores>4</cores><threads>1</threads></cpu>\
         <memory>8388608</memory></node>",
    )
    .unwrap();
    format!("test://{}", path.display())
}

/// One domain per thread, recreated every cycle (a destroyed transient domain is gone).
fn domains(threads: usize) -> Vec<(Uuid, String)> {
    (0..threads)
        .map(|t| {
            let uuid = Uuid::new_v4();
            let xml = format!(
                "<domain type='test'><name>bench-{t}</name><uuid>{uuid}</uuid>\
                 <memory unit='KiB'>65536</memory><vcpu>1</vcpu>\
                 <os><type arch='x86_64'>hvm</type></os></domain>"
            );
            (uuid, xml)
        })
        .collect()
}

fn plain_cycles(conn: &Connect, domains: &[(Uuid, String)], iters: u64) -> Duration {
    let threads = domains.len();
    let start = Instant::now();
    std::thread::scope(|scope| {
        for (t, (uuid, xml)) in domains.iter().enumerate() {
            scope.spawn(move || {
                for _ in 0..share(iters, threads, t) {
                    let dom = conn.create_domain_xml(xml, 0).unwrap();
                    let _ = (dom.uuid().unwrap(), dom.name().unwrap());
                    drop(dom);
                    conn.lookup_domain_by_uuid(*uuid)
                        .unwrap()
                        .destroy()
                        .unwrap();
                }
            });
        }
    });
    start.elapsed()
}

fn handle_cycles(
    rt: &tokio::runtime::Runtime,
    lv: &LibvirtHandle,
    domains: &[(Uuid, String)],
    iters: u64,
) -> Duration {
    let threads = domains.len();
    let start = Instant::now();
    rt.block_on(async {
        let tasks = domains
            .iter()
            .enumerate()
            .map(|(t, (uuid, xml))| async move {
                for _ in 0..share(iters, threads, t) {
                    lv.create_xml(xml.clone()).await.unwrap();
                    lv.destroy(*uuid).await.unwrap();
                }
            });
        futures::future::join_all(tasks).await;
    });
    start.elapsed()
}

fn create_destroy(c: &mut Criterion) {
    init_event_loop().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let mut group = c.benchmark_group("create_destroy");
    group.throughput(Throughput::Elements(1));
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(8));
    for threads in [1, 4] {
        let lv = rt
            .block_on(Libvirt::open(LibvirtConfig {
                workers: threads,
                ..LibvirtConfig::for_uri(node_file(&dir, &format!("handle-{threads}.xml")))
            }))
            .unwrap();
        let plain = Connect::open(Some(&node_file(&dir, &format!("plain-{threads}.xml")))).unwrap();
        let (plain_domains, handle_domains) = (domains(threads), domains(threads));
        group.bench_function(BenchmarkId::new("plain", threads), |b| {
            b.iter_custom(|iters| plain_cycles(&plain, &plain_domains, iters));
        });
        group.bench_function(BenchmarkId::new("handle", threads), |b| {
            b.iter_custom(|iters| handle_cycles(&rt, &lv, &handle_domains, iters));
        });
    }
    group.finish();
}

criterion_group!(benches, create_destroy);
criterion_main!(benches);
