//! Per-instance disks made by the real tools (`qemu-img`, `mkfs.ext4`, `mkswap`,
//! `genisoimage`) in a temporary state directory: overlays on a cached base that is never
//! written, growth to the flavor's root disk, refusal of an image larger than it, ephemeral,
//! swap and config drive, and nothing left behind by a failure or a removal.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use uuid::Uuid;
use vireo::storage::{HostStorage, StorageConfig};
use vireo_actors::storage::{
    config_drive_files, Checksum, ConfigDrive, DiskPlan, DiskRole, ImageFormat, ImageId, ImageRef,
    InstanceStorage, StorageError,
};
use vireo_actors::vif::NetworkInfo;
use vireo_xml::metadata::Flavor;

const GIB: u64 = 1 << 30;

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    format!("{:x}", Sha256::digest(bytes))
}

/// A raw image of `size` bytes whose first MiB is a pattern the tests look for.
fn raw_image(dir: &Path, name: &str, size: u64) -> PathBuf {
    let path = dir.join(name);
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(size).unwrap();
    drop(f);
    qemu_io(&path, "raw", "write -P 0xab 0 1M");
    path
}

fn qemu_io(path: &Path, format: &str, cmd: &str) -> String {
    let out = Command::new("qemu-io")
        .args(["-f", format, "-c", cmd])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "qemu-io {cmd}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn image(id: &str, source: &Path, format: ImageFormat) -> ImageRef {
    ImageRef {
        id: ImageId::new(id).unwrap(),
        source: source.display().to_string(),
        checksum: Some(Checksum::Sha256(sha256(source))),
        format,
    }
}

fn flavor(root_gb: u64, ephemeral_gb: u64, swap_mb: u64) -> Flavor {
    Flavor {
        name: "f".into(),
        vcpus: 1,
        memory_mb: 128,
        root_gb,
        ephemeral_gb,
        swap_mb,
        extra_specs: Default::default(),
    }
}

struct Fixture {
    tmp: tempfile::TempDir,
    storage: HostStorage,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let storage =
            HostStorage::new(StorageConfig::in_state_dir(&tmp.path().join("state"))).unwrap();
        Fixture { tmp, storage }
    }

    fn images(&self) -> PathBuf {
        let d = self.tmp.path().join("images");
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn instances(&self) -> Vec<String> {
        let dir = self.tmp.path().join("state/instances");
        match std::fs::read_dir(dir) {
            Ok(rd) => rd
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    fn cache_entries(&self) -> Vec<String> {
        std::fs::read_dir(self.tmp.path().join("state/_base"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
}

fn backing_of(path: &Path) -> serde_json::Value {
    let out = Command::new("qemu-img")
        .args(["info", "--output=json", "-U"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn blkid(path: &Path, tag: &str) -> String {
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", tag])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test]
async fn two_instances_share_one_base_that_neither_writes() {
    let f = Fixture::new();
    let src = raw_image(&f.images(), "cirros.raw", 64 << 20);
    let img = image("cirros", &src, ImageFormat::Raw);
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let disks_a = f
        .storage
        .create(&DiskPlan::new(a, &flavor(1, 0, 0), Some(img.clone())))
        .await
        .unwrap();
    let disks_b = f
        .storage
        .create(&DiskPlan::new(b, &flavor(1, 0, 0), Some(img)))
        .await
        .unwrap();
    let base = f.tmp.path().join("state/_base/cirros");
    let base_sum = sha256(&base);
    assert_eq!(base_sum, sha256(&src));
    for (uuid, disks) in [(a, &disks_a), (b, &disks_b)] {
        assert_eq!(disks.len(), 1);
        let root = &disks[0];
        assert_eq!(root.role, DiskRole::Root);
        assert_eq!(root.format, ImageFormat::Qcow2);
        assert_eq!(
            root.path,
            f.tmp.path().join(format!("state/instances/{uuid}/disk"))
        );
        // Grown to the flavor's root disk; an overlay whose backing file is the base.
        assert_eq!(root.virtual_size, GIB);
        let info = backing_of(&root.path);
        assert_eq!(info["format"], "qcow2");
        assert_eq!(info["virtual-size"], GIB);
        assert_eq!(info["backing-filename"], base.display().to_string());
        assert_eq!(info["backing-filename-format"], "raw");
    }
    // The guest of A writes its disk: B still reads the image, the base is unchanged.
    qemu_io(&disks_a[0].path, "qcow2", "write -P 0x11 0 64k");
    assert!(qemu_io(&disks_a[0].path, "qcow2", "read -P 0x11 0 64k").contains("read 65536"));
    assert!(qemu_io(&disks_b[0].path, "qcow2", "read -P 0xab 0 64k").contains("read 65536"));
    assert_eq!(sha256(&base), base_sum);
    assert_eq!(sha256(&src), base_sum);
    // The base is read-only; the directories are traversable (QEMU is another user), not
    // listable.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode(&f.tmp.path().join(format!("state/instances/{a}"))),
        0o711
    );
    assert_eq!(mode(&f.tmp.path().join("state/instances")), 0o711);
    assert_eq!(mode(&f.tmp.path().join("state/_base")), 0o711);
    assert_eq!(
        std::fs::metadata(&base).unwrap().permissions().mode() & 0o222,
        0
    );
    f.storage.remove(a).await.unwrap();
    f.storage.remove(a).await.unwrap();
    assert_eq!(f.instances(), vec![b.to_string()]);
    assert_eq!(sha256(&base), base_sum);
}

#[tokio::test]
async fn a_qcow2_image_is_a_qcow2_backing_file_and_root_gb_zero_keeps_its_size() {
    let f = Fixture::new();
    let raw = raw_image(&f.images(), "src.raw", 32 << 20);
    let qcow = f.images().join("img.qcow2");
    let st = Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow)
        .status()
        .unwrap();
    assert!(st.success());
    let uuid = Uuid::new_v4();
    let disks = f
        .storage
        .create(&DiskPlan::new(
            uuid,
            &flavor(0, 0, 0),
            Some(image("img-q", &qcow, ImageFormat::Qcow2)),
        ))
        .await
        .unwrap();
    assert_eq!(disks[0].virtual_size, 32 << 20);
    let info = backing_of(&disks[0].path);
    assert_eq!(info["backing-filename-format"], "qcow2");
    assert!(qemu_io(&disks[0].path, "qcow2", "read -P 0xab 0 64k").contains("read 65536"));
}

#[tokio::test]
async fn an_image_larger_than_the_root_disk_is_refused_and_leaves_no_instance_files() {
    let f = Fixture::new();
    // 2 GiB as the guest sees it, a few hundred KiB on disk.
    let src = f.images().join("big.qcow2");
    let st = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&src)
        .arg("2G")
        .status()
        .unwrap();
    assert!(st.success());
    let uuid = Uuid::new_v4();
    let err = f
        .storage
        .create(&DiskPlan::new(
            uuid,
            &flavor(1, 0, 0),
            Some(image("big", &src, ImageFormat::Qcow2)),
        ))
        .await
        .unwrap_err();
    match err {
        StorageError::ImageTooLarge {
            virtual_size,
            root_gb,
            ..
        } => {
            assert_eq!(virtual_size, 2 * GIB);
            assert_eq!(root_gb, 1);
        }
        other => panic!("{other:?}"),
    }
    assert!(f.instances().is_empty());
}

#[tokio::test]
async fn a_corrupt_image_is_refused_with_nothing_left_in_the_cache_or_the_instance() {
    let f = Fixture::new();
    let src = raw_image(&f.images(), "img.raw", 1 << 20);
    let mut img = image("img", &src, ImageFormat::Raw);
    img.checksum = Some(Checksum::Sha256("0".repeat(64)));
    let uuid = Uuid::new_v4();
    let plan = DiskPlan::new(uuid, &flavor(1, 1, 16), Some(img));
    let err = f.storage.create(&plan).await.unwrap_err();
    let chain = format!("{:?}", err);
    assert!(matches!(err, StorageError::Image { .. }), "{chain}");
    assert!(chain.contains("ChecksumMismatch"), "{chain}");
    assert!(f.instances().is_empty());
    assert!(f.cache_entries().is_empty(), "{:?}", f.cache_entries());
}

#[tokio::test]
async fn ephemeral_swap_and_config_drive_are_formatted_and_labelled() {
    let f = Fixture::new();
    let uuid = Uuid::new_v4();
    let ni = NetworkInfo::from_value(&serde_json::json!([{
        "id": "9d3e0c4e-1111-4a2b-8c3d-000000000001",
        "address": "fa:16:3e:00:00:01",
        "type": "ovs",
        "devname": "tap9d3e0c4e-11",
        "network": {"id": "n1", "bridge": "br-int", "subnets": [
            {"cidr": "10.0.0.0/24", "ips": [{"address": "10.0.0.5"}], "gateway": {"address": "10.0.0.1"}}
        ]}
    }]))
    .unwrap();
    let drive = ConfigDrive {
        user_data: Some("#cloud-config\nhostname: vm\n".into()),
        public_keys: [("k".to_owned(), "ssh-ed25519 AAAA k".to_owned())].into(),
        ..ConfigDrive::default()
    };
    let mut plan = DiskPlan::new(uuid, &flavor(0, 1, 64), None);
    plan.config_drive = Some(config_drive_files(uuid, "vm", &drive, &ni).unwrap());
    let disks = f.storage.create(&plan).await.unwrap();
    let roles: Vec<_> = disks.iter().map(|d| d.role).collect();
    assert_eq!(
        roles,
        [DiskRole::Ephemeral, DiskRole::Swap, DiskRole::ConfigDrive]
    );
    assert_eq!(disks[0].virtual_size, GIB);
    assert_eq!(blkid(&disks[0].path, "TYPE"), "ext4");
    assert_eq!(blkid(&disks[0].path, "LABEL"), "ephemeral0");
    assert_eq!(disks[1].virtual_size, 64 << 20);
    assert_eq!(blkid(&disks[1].path, "TYPE"), "swap");
    assert_eq!(blkid(&disks[2].path, "TYPE"), "iso9660");
    assert_eq!(blkid(&disks[2].path, "LABEL"), "config-2");
    // The files read back from the ISO as cloud-init reads them.
    let read = |name: &str| {
        let out = Command::new("isoinfo")
            .args(["-R", "-x", &format!("/openstack/latest/{name}"), "-i"])
            .arg(&disks[2].path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        out.stdout
    };
    let meta: serde_json::Value = serde_json::from_slice(&read("meta_data.json")).unwrap();
    assert_eq!(meta["uuid"], uuid.to_string());
    assert_eq!(meta["public_keys"]["k"], "ssh-ed25519 AAAA k");
    let net: serde_json::Value = serde_json::from_slice(&read("network_data.json")).unwrap();
    assert_eq!(net["networks"][0]["ip_address"], "10.0.0.5");
    assert_eq!(read("user_data"), b"#cloud-config\nhostname: vm\n");
    // Nothing of the staging directory is left; removal takes the whole directory.
    let dir = f.tmp.path().join(format!("state/instances/{uuid}"));
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["disk.config", "disk.eph0", "disk.swap"]);
    f.storage.remove(uuid).await.unwrap();
    assert!(!dir.exists());
}

#[tokio::test]
async fn a_failure_after_some_disks_removes_only_what_the_call_made() {
    let f = Fixture::new();
    let uuid = Uuid::new_v4();
    // A directory that exists already (an earlier attempt's console log) stays; the disks
    // made before the failing one go.
    let dir = f.tmp.path().join(format!("state/instances/{uuid}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("console.log"), "boot").unwrap();
    // The swap file's name is taken by a directory: mkswap's file cannot be created.
    std::fs::create_dir(dir.join("disk.swap")).unwrap();
    let err = f
        .storage
        .create(&DiskPlan::new(uuid, &flavor(0, 1, 16), None))
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::Io { .. }), "{err:?}");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // The ephemeral disk it made is gone; the console log and what was in the way stay.
    assert_eq!(names, ["console.log", "disk.swap"]);
}

#[tokio::test]
async fn an_image_with_a_backing_file_of_its_own_is_refused() {
    let f = Fixture::new();
    let secret = raw_image(&f.images(), "host-file.raw", 1 << 20);
    let img = f.images().join("sneaky.qcow2");
    let st = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(&secret)
        .arg(&img)
        .status()
        .unwrap();
    assert!(st.success());
    let uuid = Uuid::new_v4();
    let err = f
        .storage
        .create(&DiskPlan::new(
            uuid,
            &flavor(1, 0, 0),
            Some(image("sneaky", &img, ImageFormat::Qcow2)),
        ))
        .await
        .unwrap_err();
    match err {
        StorageError::ImageBacking { backing, .. } => {
            assert_eq!(backing, secret.display().to_string())
        }
        other => panic!("{other:?}"),
    }
    assert!(f.instances().is_empty());
}

#[tokio::test]
async fn a_missing_source_is_a_typed_error() {
    let f = Fixture::new();
    let uuid = Uuid::new_v4();
    let img = ImageRef {
        id: ImageId::new("gone").unwrap(),
        source: f.images().join("nope.raw").display().to_string(),
        checksum: None,
        format: ImageFormat::Raw,
    };
    let err = f
        .storage
        .create(&DiskPlan::new(uuid, &flavor(1, 0, 0), Some(img)))
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::Image { .. }), "{err:?}");
    assert!(f.instances().is_empty());
}

/// Two hosts' storage on one shared instances directory, each with its own cache: a base is
/// in use while any root disk in the directory is an overlay on it — including an instance
/// the host has no record of (the other host's, after a migration that copied nothing) — and
/// only then; the other host's cache is not affected. Also: the probe one host writes is seen
/// by the other, and target disks for a block live migration have the source's sizes.
#[tokio::test]
async fn a_shared_instances_directory_keeps_a_base_in_use_and_shows_the_probe() {
    let tmp = tempfile::tempdir().unwrap();
    let shared = tmp.path().join("shared-instances");
    let host = |name: &str, remove_after: u64| {
        let state = tmp.path().join(name);
        let mut cfg = StorageConfig::in_state_dir(&state);
        cfg.instances_dir = shared.clone();
        cfg.cache.remove_unused_after = std::time::Duration::from_secs(remove_after);
        HostStorage::new(cfg).unwrap()
    };
    let (a, b) = (host("a", 0), host("b", 0));
    let images = tmp.path().join("images");
    std::fs::create_dir_all(&images).unwrap();
    let src = raw_image(&images, "img.raw", 32 << 20);
    let img = image("img", &src, ImageFormat::Raw);
    let id = Uuid::new_v4();
    let disks = a
        .create(&DiskPlan::new(id, &flavor(1, 0, 8), Some(img.clone())))
        .await
        .unwrap();
    assert!(disks
        .iter()
        .all(|d| d.cache == Some(vireo_actors::storage::CacheMode::None)));
    let want: std::collections::BTreeSet<_> = [ImageId::new("img").unwrap()].into();
    assert_eq!(a.bases_in_use(), want);
    assert!(b.bases_in_use().is_empty(), "b's cache holds no such base");
    // A pass with nothing recorded (the instance runs on b now) keeps a's base.
    assert!(a.cache().evict(&a.bases_in_use()).unwrap().is_empty());
    assert!(tmp.path().join("a/_base/img").exists());

    // The probe a writes is b's to see; a name that is not a plain file name is refused.
    a.write_probe(".vireo-probe-x").await.unwrap();
    assert!(b.sees_probe(".vireo-probe-x").await);
    assert!(!b.sees_probe(".vireo-probe-y").await);
    assert!(a.write_probe("../escape").await.is_err());
    b.remove_probe(".vireo-probe-x").await;
    assert!(!a.sees_probe(".vireo-probe-x").await);

    // Target disks on another host (its own directory): the root an empty overlay on that
    // host's base, the swap an empty file, each of the source's size.
    let c = HostStorage::new(StorageConfig::in_state_dir(&tmp.path().join("c"))).unwrap();
    let targets = c
        .prepare_incoming(id, "test:///default", &disks, Some(&img), None)
        .await
        .unwrap();
    assert_eq!(targets.len(), disks.len());
    for (t, d) in targets.iter().zip(&disks) {
        assert_eq!((t.role, t.virtual_size), (d.role, d.virtual_size));
        assert!(t.path.starts_with(tmp.path().join("c/instances")), "{t:?}");
    }
    assert_eq!(
        backing_of(&targets[0].path)["backing-filename"],
        tmp.path().join("c/_base/img").display().to_string()
    );
    // Only the root disk's overlay is copied by a migration: the target holds nothing yet.
    assert!(qemu_io(&targets[0].path, "qcow2", "map").contains("not allocated"));
    c.remove(id).await.unwrap();

    a.remove(id).await.unwrap();
    assert!(a.bases_in_use().is_empty());
    assert_eq!(
        a.cache().evict(&a.bases_in_use()).unwrap(),
        vec![ImageId::new("img").unwrap()]
    );
}
