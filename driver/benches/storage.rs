//! Instance storage figures: the disks of one build (`HostStorage::create`) against the bare
//! `qemu-img create` of the same overlay, so vireo's own share is visible.
//!
//! `cargo bench -p vireo --bench storage [-- N]` (default N = 50): N builds of a root disk
//! (a 1 GiB qcow2 overlay on a cached 64 MiB raw base) and N of root + ephemeral (1 GiB,
//! ext4) + swap (256 MiB) + config drive, each followed by its removal; the same N bare
//! `qemu-img create` runs. Prints min / median / max in ms; target: overlay ≤ 50 ms.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use uuid::Uuid;
use vireo::storage::{HostStorage, StorageConfig};
use vireo_actors::storage::{
    config_drive_files, ConfigDrive, DiskPlan, ImageFormat, ImageId, ImageRef, InstanceStorage,
};
use vireo_actors::vif::NetworkInfo;
use vireo_xml::metadata::Flavor;

fn stats(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:<44} min {:7.2} ms  median {:7.2} ms  max {:7.2} ms  (n = {})",
        ms(v[0]),
        ms(v[v.len() / 2]),
        ms(v[v.len() - 1]),
        v.len()
    );
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(50);
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("image.raw");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let storage = HostStorage::new(StorageConfig::in_state_dir(&tmp.path().join("state"))).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let img = ImageRef {
        id: ImageId::new("bench").unwrap(),
        source: image.display().to_string(),
        checksum: None,
        format: ImageFormat::Raw,
    };
    let root = Flavor {
        name: "b".into(),
        vcpus: 1,
        memory_mb: 64,
        root_gb: 1,
        ..Flavor::default()
    };
    let full = Flavor {
        ephemeral_gb: 1,
        swap_mb: 256,
        ..root.clone()
    };
    // Warm: the first build fetches the image into the cache.
    rt.block_on(async {
        let u = Uuid::new_v4();
        storage
            .create(&DiskPlan::new(u, &root, Some(img.clone())))
            .await
            .unwrap();
        storage.remove(u).await.unwrap();
    });
    let mut overlay = Vec::new();
    let mut all = Vec::new();
    let mut remove = Vec::new();
    let mut bare = Vec::new();
    let base = tmp.path().join("state/_base/bench");
    for i in 0..n {
        rt.block_on(async {
            let u = Uuid::new_v4();
            let t = Instant::now();
            storage
                .create(&DiskPlan::new(u, &root, Some(img.clone())))
                .await
                .unwrap();
            overlay.push(t.elapsed());
            let t = Instant::now();
            storage.remove(u).await.unwrap();
            remove.push(t.elapsed());
            let u = Uuid::new_v4();
            let mut plan = DiskPlan::new(u, &full, Some(img.clone()));
            plan.config_drive = Some(
                config_drive_files(u, "bench", &ConfigDrive::default(), &NetworkInfo::default())
                    .unwrap(),
            );
            let t = Instant::now();
            storage.create(&plan).await.unwrap();
            all.push(t.elapsed());
            storage.remove(u).await.unwrap();
        });
        let out = tmp.path().join(format!("bare-{i}.qcow2"));
        let t = Instant::now();
        let st = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&base)
            .arg(&out)
            .arg("1G")
            .status()
            .unwrap();
        bare.push(t.elapsed());
        assert!(st.success());
        std::fs::remove_file(&out).unwrap();
    }
    stats("root disk (overlay, info + create)", overlay);
    stats("bare qemu-img create of the same overlay", bare);
    stats("root + ephemeral + swap + config drive", all);
    stats("remove an instance directory", remove);
}
