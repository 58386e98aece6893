//! Instance disks through the whole driver on libvirt's test driver: the disks are real files
//! made by the real tools in each host's state directory (the test driver never opens them),
//! the domain names them, destroy removes them, and a build that fails removes every disk it
//! made — whichever step failed — before it reports, while the cached base is never written.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod faults_support;

use std::path::{Path, PathBuf};

use common::*;
use sha2::{Digest, Sha256};
use vireo::compute::{ComputeDriver, ComputeOps};
use vireo_actors::instance::{InstanceError, SpawnArgs, SpawnStorage};
use vireo_actors::plug::PlugStep;
use vireo_actors::storage::{
    Checksum, ConfigDrive, DiskRole, ImageFormat, ImageId, ImageRef, StorageError,
};

fn sha256(path: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

/// A 16 MiB raw image with some bytes in it, in the cloud's directory.
fn make_image(c: &TestCloud, name: &str) -> PathBuf {
    let path = c.dir.path().join(name);
    let mut bytes = vec![0u8; 16 << 20];
    bytes[..4096].fill(0xab);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn image_args(name: &str, image: &Path, checksum: Checksum, root_gb: u64) -> SpawnArgs {
    let mut args = spawn_args(name, vec![on(NET_HYBRID)]);
    args.flavor.root_gb = root_gb;
    args.flavor.swap_mb = 8;
    args.storage = SpawnStorage {
        image: Some(ImageRef {
            id: ImageId::new("img-1").unwrap(),
            source: image.display().to_string(),
            checksum: Some(checksum),
            format: ImageFormat::Raw,
        }),
        image_token: None,
        config_drive: Some(ConfigDrive {
            user_data: Some("#!/bin/sh\necho hi\n".into()),
            ..ConfigDrive::default()
        }),
    };
    args
}

fn build_failed(e: &InstanceError) -> (bool, &InstanceError) {
    match e {
        InstanceError::BuildFailed {
            reschedule, cause, ..
        } => (*reschedule, cause),
        other => panic!("not a build failure: {}", chain(other)),
    }
}

#[tokio::test]
async fn instances_from_one_image_get_their_own_disks_which_destroy_removes() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let image = make_image(&c, "img.raw");
    let sum = sha256(&image);
    let (a, b) = (uuid(), uuid());
    for (id, name) in [(a, "vm-st-a"), (b, "vm-st-b")] {
        h1.driver
            .spawn(
                id,
                image_args(name, &image, Checksum::Sha256(sum.clone()), 1),
            )
            .await
            .unwrap_or_else(|e| panic!("{}", chain(&e)));
    }
    let base = c.cache_dir("h1").join("img-1");
    for id in [a, b] {
        let view = h1.driver.show(id).await.unwrap();
        let roles: Vec<_> = view.disks.iter().map(|d| d.role).collect();
        assert_eq!(
            roles,
            [DiskRole::Root, DiskRole::Swap, DiskRole::ConfigDrive]
        );
        let dir = c.dir.path().join(format!("h1/instances/{id}"));
        assert_eq!(view.disks[0].path, dir.join("disk"));
        assert_eq!(view.disks[0].virtual_size, 1 << 30);
        // The definition names the overlay, the swap disk and the config drive.
        let xml = h1.driver.libvirt().xml_desc(id, false).await.unwrap();
        for d in &view.disks {
            assert!(xml.contains(&d.path.display().to_string()), "{xml}");
        }
        assert!(
            xml.contains("device=\"cdrom\"") || xml.contains("device='cdrom'"),
            "{xml}"
        );
        assert!(
            !xml.contains(&base.display().to_string()),
            "the base is not the disk: {xml}"
        );
    }
    // One fetch for both; the base is the image, unchanged.
    assert_eq!(sha256(&base), sum);
    // The record keeps the disks: an agent that restarts knows them, and removes them.
    let before = c.host("h1").driver.show(a).await.unwrap().disks;
    let domains = c.dump_domains().await;
    let c = TestCloud::restart(c.crash(), domains).await;
    assert_eq!(c.host("h1").driver.show(a).await.unwrap().disks, before);
    c.destroy_and_assert_clean(&[a, b], &[]).await;
    assert_eq!(sha256(&base), sum);
}

#[tokio::test]
async fn destroy_removes_the_instance_directory_and_the_leak_check_sees_disks() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let image = make_image(&c, "img.raw");
    let id = uuid();
    h1.driver
        .spawn(
            id,
            image_args("vm-st-d", &image, Checksum::Sha256(sha256(&image)), 1),
        )
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(c.disks_left("h1").len(), 1);
    c.destroy_and_assert_clean(&[id], &[]).await;
    assert!(c.disks_left("h1").is_empty());
    // The cached base stays for the next instance (eviction is by age).
    assert!(c.cache_dir("h1").join("img-1").exists());
}

#[tokio::test]
async fn a_corrupt_image_fails_the_build_with_nothing_left_and_may_be_rescheduled() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let image = make_image(&c, "img.raw");
    let id = uuid();
    let e = h1
        .driver
        .spawn(
            id,
            image_args("vm-st-c", &image, Checksum::Sha256("0".repeat(64)), 1),
        )
        .await
        .unwrap_err();
    let (reschedule, cause) = build_failed(&e);
    // Another host fetches again: the image may be fine there.
    assert!(reschedule, "{}", chain(&e));
    assert!(
        matches!(
            cause,
            InstanceError::Storage {
                source: StorageError::Image { .. },
                ..
            }
        ),
        "{}",
        chain(&e)
    );
    assert!(chain(&e).contains("sha256"), "{}", chain(&e));
    assert!(!c.cache_dir("h1").join("img-1").exists());
    c.assert_clean(&[]).await;
}

#[tokio::test]
async fn an_image_larger_than_the_flavor_fails_the_build_without_a_reschedule() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    // A 2 GiB qcow2 image (a few hundred KiB on disk) for a 1 GiB root disk.
    let image = c.dir.path().join("big.qcow2");
    let st = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&image)
        .arg("2G")
        .status()
        .unwrap();
    assert!(st.success());
    let mut args = image_args("vm-st-big", &image, Checksum::Sha256(sha256(&image)), 1);
    if let Some(i) = args.storage.image.as_mut() {
        i.format = ImageFormat::Qcow2;
    }
    let e = h1.driver.spawn(uuid(), args).await.unwrap_err();
    let (reschedule, cause) = build_failed(&e);
    assert!(!reschedule, "every host would refuse it: {}", chain(&e));
    assert!(matches!(
        cause,
        InstanceError::Storage {
            source: StorageError::ImageTooLarge { .. },
            ..
        }
    ));
    c.assert_clean(&[]).await;
}

#[tokio::test]
async fn a_build_that_fails_after_its_disks_were_made_removes_them() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let image = make_image(&c, "img.raw");
    let sum = sha256(&image);
    h1.plugger
        .faults()
        .fail_once(PlugStep::EnsureLinuxBridge, None);
    let e = h1
        .driver
        .spawn(
            uuid(),
            image_args("vm-st-p", &image, Checksum::Sha256(sum.clone()), 1),
        )
        .await
        .unwrap_err();
    let (reschedule, _) = build_failed(&e);
    assert!(reschedule, "{}", chain(&e));
    let report = h1.driver.list().await;
    assert!(report.is_empty());
    // The disks were made (the report says so) and are gone again; the base stays intact.
    c.assert_clean(&[]).await;
    assert_eq!(sha256(&c.cache_dir("h1").join("img-1")), sum);
}

/// An agent killed while a build's disks exist and its domain does not (image fetched, disks
/// made, the first definition queued behind a held libvirt): the restarted agent releases the
/// ports the build allocated and removes the disks it made (its journal entry's token names
/// them), so nothing is left. Those disks used to stay for good: no domain named them and the
/// journal entry released only ports.
#[tokio::test]
async fn a_build_killed_before_its_domain_existed_leaves_no_disk_after_a_restart() {
    let c = spec(&["h1"]).start().await;
    let image = make_image(&c, "img.raw");
    let sum = sha256(&image);
    let id = uuid();
    let dir = c.instances_dir("h1").join(id.to_string());
    let domains = c.dump_domains().await;
    let hold = faults_support::LibvirtHold::start(c.host("h1").driver.libvirt()).await;
    let task = {
        let d = c.host("h1").driver.clone();
        let args = image_args("vm-st-k", &image, Checksum::Sha256(sum.clone()), 1);
        tokio::spawn(async move { d.spawn(id, args).await })
    };
    let c = restarted_while_defining(c, "h1", id, &dir, hold, task, domains).await;
    assert_eq!(c.host("h1").driver.recovery().released_builds, vec![id]);
    assert!(!dir.exists(), "the build's disks are left: {dir:?}");
    c.assert_clean(&[]).await;
    assert_eq!(sha256(&c.cache_dir("h1").join("img-1")), sum);
}

/// Once `host`'s operation on `id` made its disks in `dir` (the config drive last) and waits
/// at its definition, queued behind `hold`: the agent stops there (`task` aborted, the cloud
/// crashed), the held libvirt goes free and the cloud starts again on `domains`.
async fn restarted_while_defining<T: std::fmt::Debug>(
    c: TestCloud,
    host: &str,
    id: uuid::Uuid,
    dir: &Path,
    hold: faults_support::LibvirtHold,
    task: tokio::task::JoinHandle<T>,
    domains: std::collections::BTreeMap<String, String>,
) -> TestCloud {
    let driver = c.host(host).driver.clone();
    eventually(
        std::time::Duration::from_secs(20),
        "the disks made, the definition queued",
        || async {
            let defining = driver
                .show(id)
                .await
                .ok()
                .and_then(|v| v.operation)
                .is_some_and(|o| o.phase == "define");
            (defining && dir.join(DiskRole::ConfigDrive.file_name()).exists()).then_some(())
        },
    )
    .await;
    drop(driver);
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    let remains = c.crash();
    hold.release().await;
    TestCloud::restart(remains, domains).await
}

/// What a failed live migration of an instance with disks leaves, with and without an
/// instances directory shared between the hosts. The test driver has no migration API, so
/// each attempt fails at the migration itself, after the destination prepared for it.
async fn failed_live_migration_with_disks(shared: bool) {
    let c = spec(&["h1", "h2"]).shared_instances(shared).start().await;
    let h1 = c.host("h1");
    let image = make_image(&c, "img.raw");
    let id = uuid();
    h1.driver
        .spawn(
            id,
            image_args("vm-st-m", &image, Checksum::Sha256(sha256(&image)), 1),
        )
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let before = h1.driver.show(id).await.unwrap();
    let root = before.disks[0].path.clone();
    qemu_io(&root, "write -P 0x5a 0 64k");
    let root_sum = sha256(&root);
    for _ in 0..2 {
        let e = h1.driver.live_migrate(id, lm("h2")).await.unwrap_err();
        assert!(
            matches!(e, InstanceError::RolledBack { .. }),
            "{}",
            chain(&e)
        );
        assert!(chain(&e).contains("migrate"), "{}", chain(&e));
        let last = h1.driver.show(id).await.unwrap().last_operation.unwrap();
        let steps: Vec<_> = last.steps.iter().map(|s| s.name.as_str()).collect();
        assert!(
            steps.contains(&"write the shared-directory probe"),
            "{steps:?}"
        );
        // Not shared: the destination made its own disks, and the migration is given the
        // domain naming them. Shared: the disks are where they are on both hosts.
        assert_eq!(steps.contains(&"migratable xml"), !shared, "{steps:?}");
        // The instance runs here on its disks, untouched; nothing of it is left on h2 and
        // no probe is left behind.
        let after = h1.driver.show(id).await.unwrap();
        assert_eq!(after.state, before.state);
        assert_eq!(after.disks, before.disks);
        assert_eq!(sha256(&root), root_sum, "the source's root disk changed");
        assert!(c.host("h2").driver.list().await.is_empty());
        let left = c.disks_left("h2");
        if shared {
            assert_eq!(left, vec![c.instances_dir("h1").join(id.to_string())]);
        } else {
            assert!(left.is_empty(), "{left:?}");
        }
        assert_eq!(
            c.disks_left("h1"),
            vec![c.instances_dir("h1").join(id.to_string())],
            "a probe is left"
        );
    }
    c.destroy_and_assert_clean(&[id], &[]).await;
    assert!(c.disks_left("h1").is_empty());
}

#[tokio::test]
async fn a_failed_block_live_migration_removes_the_destinations_disks_and_keeps_the_sources() {
    failed_live_migration_with_disks(false).await;
}

#[tokio::test]
async fn a_failed_live_migration_on_a_shared_instances_directory_removes_no_disk() {
    failed_live_migration_with_disks(true).await;
}

/// The root disk's size as `qemu-img` reads the file.
fn file_size(path: &Path) -> u64 {
    let out = std::process::Command::new("qemu-img")
        .args(["info", "--output=json", "-U", "-f", "qcow2"])
        .arg(path)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["virtual-size"].as_u64().unwrap()
}

#[tokio::test]
async fn a_same_host_resize_grows_the_root_disk_keeps_a_copy_and_revert_restores_it() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let image = make_image(&c, "img.raw");
    let id = uuid();
    h1.driver
        .spawn(
            id,
            image_args("vm-st-r", &image, Checksum::Sha256(sha256(&image)), 1),
        )
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let dir = c.dir.path().join(format!("h1/instances/{id}"));
    let kept = c.dir.path().join(format!("h1/instances/{id}_resize"));
    let root = dir.join("disk");
    let same_host = vireo_actors::instance::Migration {
        id: uuid(),
        source_host: "h1".into(),
        dest_host: "h1".into(),
    };
    let bigger = |root_gb| {
        let mut f = flavor("m1.big", 1, 512);
        f.root_gb = root_gb;
        vireo_actors::instance::ResizeArgs::of(&same_host, f)
    };
    // Grow: the disk and the record say 2 GiB, the old overlay is kept.
    h1.driver
        .resize(id, bigger(2))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.disks[0].virtual_size, 2 << 30);
    assert_eq!(file_size(&root), 2 << 30);
    assert_eq!(file_size(&kept.join("disk")), 1 << 30);
    // Revert: the kept disks are back, the copy gone.
    h1.driver
        .revert_resize(id)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.disks[0].virtual_size, 1 << 30);
    assert_eq!(file_size(&root), 1 << 30);
    assert!(!kept.exists());
    // A smaller root disk is refused and changes nothing.
    let mut small = flavor("m1.small", 1, 512);
    small.root_gb = 1;
    h1.driver
        .resize(id, bigger(2))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    h1.driver
        .confirm_resize(id)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert!(!kept.exists());
    assert_eq!(file_size(&root), 2 << 30);
    let e = h1
        .driver
        .resize(
            id,
            vireo_actors::instance::ResizeArgs::of(&same_host, small),
        )
        .await
        .unwrap_err();
    assert!(chain(&e).contains("shrink"), "{}", chain(&e));
    assert_eq!(file_size(&root), 2 << 30);
    assert!(!kept.exists());
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        vireo_actors::lifecycle::InstanceState::Running
    );
    c.destroy_and_assert_clean(&[id], &[]).await;
}

fn qemu_io(path: &Path, cmd: &str) -> String {
    let out = std::process::Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", cmd])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn backing(path: &Path) -> String {
    let out = std::process::Command::new("qemu-img")
        .args(["info", "--output=json", "-U", "-f", "qcow2"])
        .arg(path)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["backing-filename"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_cross_host_resize_copies_the_disks_and_revert_and_confirm_clean_the_right_side() {
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let image = make_image(&c, "img.raw");
    let sum = sha256(&image);
    let id = uuid();
    h1.driver
        .spawn(
            id,
            image_args("vm-st-x", &image, Checksum::Sha256(sum.clone()), 1),
        )
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let src_dir = c.dir.path().join(format!("h1/instances/{id}"));
    let dst_dir = c.dir.path().join(format!("h2/instances/{id}"));
    // What the guest wrote before the resize.
    assert!(qemu_io(&src_dir.join("disk"), "write -P 0x58 1M 64k").contains("wrote 65536"));
    let to_h2 = |root_gb| {
        let mut f = flavor("m1.big", 2, 512);
        f.root_gb = root_gb;
        let m = vireo_actors::instance::Migration {
            id: uuid(),
            source_host: "h1".into(),
            dest_host: "h2".into(),
        };
        vireo_actors::instance::ResizeArgs::of(&m, f)
    };
    for confirm in [false, true] {
        h1.driver
            .resize(id, to_h2(2))
            .await
            .unwrap_or_else(|e| panic!("{}", chain(&e)));
        let view = h2.driver.show(id).await.unwrap();
        let roles: Vec<_> = view.disks.iter().map(|d| d.role).collect();
        assert_eq!(
            roles,
            [DiskRole::Root, DiskRole::Swap, DiskRole::ConfigDrive]
        );
        for d in &view.disks {
            assert!(d.path.starts_with(&dst_dir), "{d:?}");
            assert!(d.path.exists(), "{d:?}");
        }
        // The destination's root disk: grown, on the destination's own base, with the data.
        assert_eq!(view.disks[0].virtual_size, 2 << 30);
        assert_eq!(file_size(&dst_dir.join("disk")), 2 << 30);
        assert_eq!(
            backing(&dst_dir.join("disk")),
            c.cache_dir("h2").join("img-1").display().to_string()
        );
        assert!(qemu_io(&dst_dir.join("disk"), "read -P 0x58 1M 64k").contains("read 65536"));
        assert!(qemu_io(&dst_dir.join("disk"), "read -P 0xab 0 4k").contains("read 4096"));
        // The source keeps its own, untouched.
        assert_eq!(file_size(&src_dir.join("disk")), 1 << 30);
        let xml = h2.driver.libvirt().xml_desc(id, false).await.unwrap();
        assert!(xml.contains(&dst_dir.display().to_string()), "{xml}");
        assert!(!xml.contains(&src_dir.display().to_string()), "{xml}");
        if confirm {
            h2.driver
                .confirm_resize(id)
                .await
                .unwrap_or_else(|e| panic!("{}", chain(&e)));
            assert!(!src_dir.exists(), "confirm removes the source's disks");
            assert!(dst_dir.exists());
        } else {
            h2.driver
                .revert_resize(id)
                .await
                .unwrap_or_else(|e| panic!("{}", chain(&e)));
            assert!(!dst_dir.exists(), "revert removes the destination's copy");
            let back = h1.driver.show(id).await.unwrap();
            assert_eq!(back.disks[0].path, src_dir.join("disk"));
            assert_eq!(back.disks[0].virtual_size, 1 << 30);
            assert!(qemu_io(&src_dir.join("disk"), "read -P 0x58 1M 64k").contains("read 65536"));
        }
    }
    assert_eq!(sha256(&c.cache_dir("h1").join("img-1")), sum);
    assert_eq!(sha256(&c.cache_dir("h2").join("img-1")), sum);
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test]
async fn unused_bases_are_evicted_once_old_and_never_while_an_instance_uses_them() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let kept_img = make_image(&c, "kept.raw");
    let gone_img = make_image(&c, "gone.raw");
    let with_image = |name: &str, id: &str, path: &Path| {
        let mut args = image_args(name, path, Checksum::Sha256(sha256(path)), 1);
        if let Some(i) = args.storage.image.as_mut() {
            i.id = ImageId::new(id).unwrap();
        }
        args
    };
    let (a, b) = (uuid(), uuid());
    for (id, args) in [
        (a, with_image("vm-st-ea", "img-kept", &kept_img)),
        (b, with_image("vm-st-eb", "img-gone", &gone_img)),
    ] {
        h1.driver
            .spawn(id, args)
            .await
            .unwrap_or_else(|e| panic!("{}", chain(&e)));
    }
    c.destroy_everywhere(b).await;
    // Both bases last used two days ago (the default age is one day).
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 86_400);
    for id in ["img-kept", "img-gone"] {
        let f = std::fs::File::open(c.cache_dir("h1").join(id)).unwrap();
        f.set_modified(old).unwrap();
    }
    let removed = h1.driver.evict_unused_images().await.unwrap();
    assert_eq!(removed, vec![ImageId::new("img-gone").unwrap()]);
    assert!(c.cache_dir("h1").join("img-kept").exists(), "in use: kept");
    assert!(!c.cache_dir("h1").join("img-gone").exists());
    // A base used recently is kept even with no instance on it.
    c.destroy_everywhere(a).await;
    let f = std::fs::File::open(c.cache_dir("h1").join("img-kept")).unwrap();
    f.set_modified(std::time::SystemTime::now()).unwrap();
    assert!(h1.driver.evict_unused_images().await.unwrap().is_empty());
    c.assert_clean(&[]).await;
}

#[tokio::test]
async fn a_resize_destination_that_finds_the_disks_there_already_refuses_and_removes_nothing() {
    let c = spec(&["h1", "h2"]).start().await;
    let h1 = c.host("h1");
    let image = make_image(&c, "img.raw");
    let id = uuid();
    h1.driver
        .spawn(
            id,
            image_args("vm-st-sh", &image, Checksum::Sha256(sha256(&image)), 1),
        )
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    // h2's instance directory is h1's (as on storage both hosts share).
    let src_dir = c.dir.path().join(format!("h1/instances/{id}"));
    let h2_instances = c.dir.path().join("h2/instances");
    std::fs::create_dir_all(&h2_instances).unwrap();
    std::os::unix::fs::symlink(&src_dir, h2_instances.join(id.to_string())).unwrap();
    let before = sha256(&src_dir.join("disk"));
    let m = vireo_actors::instance::Migration {
        id: uuid(),
        source_host: "h1".into(),
        dest_host: "h2".into(),
    };
    let e = h1
        .driver
        .resize(
            id,
            vireo_actors::instance::ResizeArgs::of(&m, flavor("m1.big", 2, 512)),
        )
        .await
        .unwrap_err();
    assert!(
        chain(&e).contains("disks are on h2 already"),
        "{}",
        chain(&e)
    );
    // h2 made and removed nothing: its (shared) directory is as it was.
    assert!(h2_instances.join(id.to_string()).exists());
    // The source took the instance back, on its disks, untouched.
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, vireo_actors::lifecycle::InstanceState::Running);
    assert_eq!(view.disks[0].path, src_dir.join("disk"));
    assert_eq!(sha256(&src_dir.join("disk")), before);
    assert!(c.host("h2").driver.list().await.is_empty());
    std::fs::remove_file(h2_instances.join(id.to_string())).unwrap();
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test]
async fn a_cross_host_resize_on_a_shared_instances_directory_resizes_in_place_and_keeps_a_copy() {
    let c = spec(&["h1", "h2"]).shared_instances(true).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let image = make_image(&c, "img.raw");
    let sum = sha256(&image);
    let id = uuid();
    h1.driver
        .spawn(
            id,
            image_args("vm-st-sh", &image, Checksum::Sha256(sum.clone()), 1),
        )
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let dir = c.instances_dir("h1").join(id.to_string());
    let kept = c.instances_dir("h1").join(format!("{id}_resize"));
    assert!(qemu_io(&dir.join("disk"), "write -P 0x58 1M 64k").contains("wrote 65536"));
    let to_h2 = || {
        let mut f = flavor("m1.big", 2, 512);
        f.root_gb = 2;
        let m = vireo_actors::instance::Migration {
            id: uuid(),
            source_host: "h1".into(),
            dest_host: "h2".into(),
        };
        vireo_actors::instance::ResizeArgs::of(&m, f)
    };
    for confirm in [false, true] {
        let r = h1
            .driver
            .resize(id, to_h2())
            .await
            .unwrap_or_else(|e| panic!("{}", chain(&e)));
        assert!(
            r.steps
                .iter()
                .any(|s| s.name == "write the shared-directory probe"),
            "{r:?}"
        );
        // The destination saw the probe: the same files, grown in place (still on h1's
        // base), the old ones kept; nothing copied into a second directory.
        let view = h2.driver.show(id).await.unwrap();
        assert_eq!(view.disks[0].path, dir.join("disk"));
        assert_eq!(file_size(&dir.join("disk")), 2 << 30);
        assert_eq!(file_size(&kept.join("disk")), 1 << 30);
        assert_eq!(
            backing(&dir.join("disk")),
            c.cache_dir("h1").join("img-1").display().to_string()
        );
        assert!(qemu_io(&dir.join("disk"), "read -P 0x58 1M 64k").contains("read 65536"));
        let last = h2.driver.show(id).await.unwrap().last_operation.unwrap();
        assert!(
            last.steps.iter().all(|s| s.name != "copy disks"),
            "{last:?}"
        );
        if confirm {
            h2.driver
                .confirm_resize(id)
                .await
                .unwrap_or_else(|e| panic!("{}", chain(&e)));
            // The source let go of its domain and kept the disks: they are h2's now.
            assert!(h1.driver.show(id).await.is_err());
            assert!(dir.join("disk").exists(), "confirm kept the shared disks");
            assert!(!kept.exists(), "confirm dropped the kept copy");
        } else {
            h2.driver
                .revert_resize(id)
                .await
                .unwrap_or_else(|e| panic!("{}", chain(&e)));
            let back = h1.driver.show(id).await.unwrap();
            assert_eq!(back.disks[0].path, dir.join("disk"));
            assert_eq!(
                file_size(&dir.join("disk")),
                1 << 30,
                "the old disk is back"
            );
            assert!(!kept.exists());
            assert!(qemu_io(&dir.join("disk"), "read -P 0x58 1M 64k").contains("read 65536"));
        }
        let probes: Vec<_> = c
            .disks_left("h1")
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(".vireo-probe"))
            .collect();
        assert!(probes.is_empty(), "{probes:?}");
    }
    assert_eq!(sha256(&c.cache_dir("h1").join("img-1")), sum);
    c.destroy_and_assert_clean(&[id], &[]).await;
    assert!(c.disks_left("h1").is_empty(), "{:?}", c.disks_left("h1"));
}

/// A live migration with disks on a shared instances directory whose guest moved (here: its
/// migrate call failed after the guest moved, the flow let the job end and began the
/// hand-over), and whose source's agent was killed before the destination took it over: the
/// restarted source recovers it from its journal entry, which says whether the migration
/// copied the disks (the destination's pre-live-migration answered before the migration
/// began): shared, so the source removes nothing — the files are the ones the guest runs on,
/// on the destination. (The source's probe file could not tell: the source wrote it in its
/// own directory; once a first clean-up removed it, a second start took the directory for a
/// copy and removed the guest's disks.) Not shared cannot be played on the test driver: a
/// block migration reads the source's domain after the destination answered, so the guest
/// cannot have moved yet; the source's copy then goes as after any migration.
async fn departed_live_migration_with_disks(shared: bool) {
    let c = spec(&["h1", "h2"]).shared_instances(shared).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    let image = make_image(&c, "img.raw");
    let id = uuid();
    h1.driver
        .spawn(
            id,
            image_args("vm-st-lm", &image, Checksum::Sha256(sha256(&image)), 1),
        )
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let handing_over = std::sync::Arc::new(tokio::sync::Notify::new());
    // h2's agent, once prepared, receives the guest as libvirt's job would deliver it (naming
    // h2's disk files), and never answers the hand-over: h1's agent is killed in it.
    let (from, to) = (h1.driver.libvirt().clone(), h2.driver.libvirt().clone());
    let dirs = (
        c.instances_dir("h1").display().to_string(),
        c.instances_dir("h2").display().to_string(),
    );
    let notify = handing_over.clone();
    c.peers.insert(StagedPeer::over(
        &c.peers,
        "h2",
        Box::new(move |real, instance, request| {
            let (from, to, dirs, notify) = (from.clone(), to.clone(), dirs.clone(), notify.clone());
            Box::pin(async move {
                use vireo_actors::instance::Operation as O;
                match request {
                    O::PostLiveMigrationAtDestination { .. } => {
                        notify.notify_one();
                        futures::future::pending().await
                    }
                    O::PreLiveMigration { .. } => {
                        let reply = real.request(instance, request).await?;
                        deliver_guest(&from, &to, instance, |xml| xml.replace(&dirs.0, &dirs.1))
                            .await;
                        Ok(reply)
                    }
                    other => real.request(instance, other).await,
                }
            })
        }),
    ));
    let d = h1.driver.clone();
    let mut op = tokio::spawn(async move { d.live_migrate(id, lm("h2")).await });
    tokio::select! {
        _ = handing_over.notified() => {}
        r = &mut op => panic!(
            "the migration ended before its hand-over: {:?}",
            r.unwrap().map_err(|e| chain(&e))
        ),
    }
    let domains = c.dump_domains().await;
    op.abort();
    assert!(op.await.unwrap_err().is_cancelled());
    let c = TestCloud::restart(c.crash(), domains).await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    eventually(
        std::time::Duration::from_secs(10),
        "the guest handed over",
        || async {
            (h2.driver.show(id).await.ok()?.state
                == vireo_actors::lifecycle::InstanceState::Running
                && h1.driver.show(id).await.is_err())
            .then_some(())
        },
    )
    .await;
    let on_h2 = h2.driver.show(id).await.unwrap();
    assert!(!on_h2.disks.is_empty());
    for disk in &on_h2.disks {
        assert!(disk.path.exists(), "{disk:?} is gone");
    }
    let dir = id.to_string();
    if shared {
        assert_eq!(c.disks_left("h1"), vec![c.instances_dir("h1").join(&dir)]);
    } else {
        assert!(c.disks_left("h1").is_empty(), "{:?}", c.disks_left("h1"));
        assert_eq!(c.disks_left("h2"), vec![c.instances_dir("h2").join(&dir)]);
    }
    c.destroy_everywhere(id).await;
    c.assert_clean(&[]).await;
    assert!(c.disks_left("h1").is_empty());
    assert!(c.disks_left("h2").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_departed_live_migration_on_a_shared_directory_recovered_from_the_journal_keeps_the_disks(
) {
    departed_live_migration_with_disks(true).await;
}

/// A finish Nova runs on h2, its agent stopped after the disks were copied and before the
/// domain that names them existed (its definition queued behind a held libvirt): no domain
/// marker tells of it, only the build journal's entry, whose token the copy carries. The
/// restarted agent removes the copy, so that Nova's driver can ask for the finish again (a
/// copy left behind made the next finish refuse: `DisksAlreadyHere`); h1 keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_nova_runs_killed_before_its_domain_existed_leaves_no_copy_after_a_restart() {
    use vireo_actors::instance::{CallerTask, Handover, Migration, Operation, ResizeArgs};
    let c = spec(&["h1", "h2"]).start().await;
    let image = make_image(&c, "img.raw");
    let sum = sha256(&image);
    let id = uuid();
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    h1.driver
        .spawn(
            id,
            image_args("vm-st-nf", &image, Checksum::Sha256(sum.clone()), 1),
        )
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let migration = Migration {
        id: uuid(),
        source_host: "h1".into(),
        dest_host: "h2".into(),
    };
    let mut args = ResizeArgs::of(&migration, flavor("m1.small", 2, 512));
    args.caller_finishes = true;
    let handover: Handover = h1
        .driver
        .run(id, Operation::Resize(Box::new(args)))
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)))
        .handover
        .expect("the source answers with the handover");
    let src_dir = c.instances_dir("h1").join(id.to_string());
    let dst_dir = c.instances_dir("h2").join(id.to_string());
    let domains = c.dump_domains().await;
    let hold = faults_support::LibvirtHold::start(h2.driver.libvirt()).await;
    let task = {
        let d = h2.driver.clone();
        let finish = Operation::FinishResize {
            migration: migration.clone(),
            handover: Box::new(handover),
            caller: Some(Box::new(CallerTask::default())),
        };
        tokio::spawn(async move { d.run(id, finish).await })
    };
    let c = restarted_while_defining(c, "h2", id, &dst_dir, hold, task, domains).await;
    assert_eq!(c.host("h2").driver.recovery().released_builds, vec![id]);
    assert!(!dst_dir.exists(), "the finish's copy is left: {dst_dir:?}");
    // The source keeps its copy, waiting for Nova to finish again or revert.
    let src = c.host("h1").driver.show(id).await.unwrap();
    assert_eq!(
        src.state,
        vireo_actors::lifecycle::InstanceState::ResizeSource
    );
    assert!(src_dir.join("disk").exists());
    c.destroy_and_assert_clean(&[id], &[]).await;
    assert_eq!(sha256(&c.cache_dir("h1").join("img-1")), sum);
}
