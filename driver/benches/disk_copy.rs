//! The disk copy of a cross-host resize against a plain `dd` of the same file.
//!
//! `HostStorage::copy_from` reads a disk through the source host's libvirt (a storage-volume
//! download stream over a transient `dir` pool) and writes it into this host's instance
//! directory; `dd bs=1M conv=fsync` copies the same file on the same machine. Both read the
//! same file (in the page cache after the first round) and end with the data on disk, so
//! the ratio is what the libvirt stream costs. Rounds alternate which goes first.
//!
//! `cargo bench -p vireo --bench disk_copy [-- MiB [ROUNDS]]` (default 1024 MiB, 5 rounds), as
//! root with libvirtd running (`integration/host-setup.sh up`); the source URI is
//! `VIREO_BENCH_SOURCE_URI` (default `qemu:///system`: this host reads its own libvirtd, the
//! same stream a second host reads over `qemu+tcp`). Target: copy rate ≥ 0.8 × dd's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use uuid::Uuid;
use vireo::storage::{HostStorage, StorageConfig};
use vireo_actors::storage::{DiskRole, ImageFormat, InstanceDisk, InstanceStorage};

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse::<u64>().ok());
    let mib = args.next().unwrap_or(1024);
    let rounds = args.next().unwrap_or(5);
    // libvirt's default error printer off, as in the agent (a first volume lookup that
    // misses is expected).
    vireo_actors::libvirt::init_event_loop().unwrap();
    let uri = std::env::var("VIREO_BENCH_SOURCE_URI").unwrap_or_else(|_| "qemu:///system".into());
    let tmp = tempfile::Builder::new()
        .prefix("vireo-bench-copy-")
        .tempdir_in("/var/tmp")
        .unwrap();
    // The "source host's" instance directory with one raw disk of incompressible bytes.
    let src_dir = tmp.path().join("source");
    std::fs::create_dir_all(&src_dir).unwrap();
    let src = src_dir.join("disk.eph0");
    {
        let mut f = std::fs::File::create(&src).unwrap();
        let mut block = vec![0u8; 1 << 20];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..mib {
            for b in block.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
            }
            f.write_all(&block).unwrap();
        }
        f.sync_all().unwrap();
    }
    let storage = HostStorage::new(StorageConfig::in_state_dir(&tmp.path().join("dest"))).unwrap();
    let disk = InstanceDisk {
        role: DiskRole::Ephemeral,
        path: src.clone(),
        format: ImageFormat::Raw,
        virtual_size: mib << 20,
        image: None,
        cache: None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bytes = (mib << 20) as f64;
    let rate = |d: Duration| bytes / d.as_secs_f64() / f64::from(1u32 << 20);
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let copy = || {
            let uuid = Uuid::new_v4();
            let t = Instant::now();
            rt.block_on(storage.copy_from(
                uuid,
                &uri,
                std::slice::from_ref(&disk),
                None,
                None,
                0,
                None,
            ))
            .unwrap();
            let took = t.elapsed();
            rt.block_on(storage.remove(uuid)).unwrap();
            took
        };
        let dd = || {
            let out = tmp.path().join("dd.out");
            let t = Instant::now();
            let st = Command::new("dd")
                .arg(format!("if={}", src.display()))
                .arg(format!("of={}", out.display()))
                .args(["bs=1M", "conv=fsync", "status=none"])
                .status()
                .unwrap();
            let took = t.elapsed();
            assert!(st.success());
            std::fs::remove_file(&out).unwrap();
            took
        };
        let (c, d) = if round % 2 == 0 {
            let c = copy();
            (c, dd())
        } else {
            let d = dd();
            (copy(), d)
        };
        let r = rate(c) / rate(d);
        println!(
            "round {round}: {mib} MiB through libvirt {:7.1} MiB/s ({} ms), dd {:7.1} MiB/s ({} ms), ratio {r:.2}",
            rate(c),
            c.as_millis(),
            rate(d),
            d.as_millis()
        );
        ratios.push(r);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "median copy/dd rate over {rounds} rounds: {:.2} (target >= 0.8)",
        ratios[ratios.len() / 2]
    );
}
