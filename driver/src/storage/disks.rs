//! Per-instance disks in `<state_dir>/instances/<uuid>/`, Nova's layout: `disk` (the root
//! disk, a qcow2 overlay on the image's cached base), `disk.eph0` (ephemeral, ext4, label
//! `ephemeral0`), `disk.swap` (swap) and `disk.config` (the config drive, ISO 9660, label
//! `config-2`).
//!
//! Why `qemu-img`, `mkfs.ext4`, `mkswap` and `genisoimage` run as programs (argument vectors,
//! never a shell) and not libvirt's storage API: libvirt's `dir` pool makes its volumes with
//! the same `qemu-img` (and has no config drive, file system or swap formatting at all), a
//! pool lists only the files directly in its directory (one pool per instance directory, kept
//! defined on every host, just to create four files), and the in-process test driver's pools
//! are in memory and make no files, so the embedded default would test a different path from
//! the real host. Measured here (`cargo bench -p vireo --bench storage -- 30`, another build
//! on the second core): a root disk in 30 ms median (17–39 ms), which is two `qemu-img` runs
//! (`info` of the base, `create` of the overlay); the bare `qemu-img create` alone 16 ms median
//! (8–24); root + ephemeral + swap + config drive 57 ms median; removing an instance directory
//! 0.5 ms. The time is the tools' own start-up, which a libvirt pool would pay too. The base
//! is only ever opened read-only: it is
//! the overlay's backing file (`-F` names its format, so it is never probed), and the cache
//! made it mode 0444.
//!
//! A resize on this host keeps a copy of the disks in `<uuid>_resize/` (sparse files stay
//! sparse) before it grows the root disk (`qemu-img resize`); a revert or a failed resize puts
//! the copy back (renames), a confirm drops it.
//!
//! A block live migration's destination makes target disks of the same sizes instead
//! (`prepare_incoming`): an empty overlay on its own base (QEMU copies the overlay only), empty
//! raw ephemeral and swap files, and a copy of the read-only config drive, which the
//! migration does not mirror. A live migration's source writes a probe file in the instances
//! directory (`write_probe`) that a destination sharing the directory sees.
//!
//! Disks get `cache='none'` where the instances directory opens files with `O_DIRECT`,
//! `writethrough` elsewhere (Nova's rule; found out once per host).
//!
//! Every failure removes what the call created: the instance directory when it made it,
//! otherwise the files it made in it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::process::Command;
use tracing::{debug, warn};
use uuid::Uuid;
use vireo_actors::storage::{
    CacheMode, ConfigDriveFile, DiskPlan, DiskRole, ImageFormat, ImageRef, InstanceDisk,
    InstanceStorage, StorageError, BUILD_MARKER,
};

use super::cache::{CacheConfig, CacheError, ImageCache, ImageId, ImageRequest, ImageSource};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Where a host keeps its instances' disks and its image cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageConfig {
    /// `<state_dir>/instances`: one directory per instance.
    pub instances_dir: PathBuf,
    /// The image cache (`<state_dir>/_base`).
    pub cache: CacheConfig,
    /// The build journal (`<state_dir>/builds`): per host, never on a shared path.
    pub journal_dir: PathBuf,
    /// The live-migration journal (`<state_dir>/live-migrations`): per host too.
    pub migration_journal_dir: PathBuf,
}

impl StorageConfig {
    /// The layout of `state_dir` with the cache's defaults.
    pub fn in_state_dir(state_dir: &Path) -> StorageConfig {
        StorageConfig {
            instances_dir: state_dir.join("instances"),
            cache: CacheConfig::in_state_dir(state_dir),
            journal_dir: state_dir.join("builds"),
            migration_journal_dir: state_dir.join("live-migrations"),
        }
    }
}

/// The instance storage of a host: real files, made by real tools.
#[derive(Debug)]
pub struct HostStorage {
    instances_dir: PathBuf,
    cache: Arc<ImageCache>,
    /// The disks' cache mode, found out once (see [`HostStorage::cache_mode`]).
    cache_mode: tokio::sync::OnceCell<CacheMode>,
}

impl HostStorage {
    /// The storage of `config`; the cache directory is created now, instance directories
    /// when an instance first has a disk.
    pub fn new(config: StorageConfig) -> Result<HostStorage, CacheError> {
        Ok(HostStorage {
            cache: ImageCache::new(config.cache)?,
            instances_dir: config.instances_dir,
            cache_mode: tokio::sync::OnceCell::new(),
        })
    }

    /// The cache mode this host gives its disks: `none` when a file in the instances
    /// directory opens with `O_DIRECT` (Nova's test), else `writethrough` (tmpfs has no
    /// `O_DIRECT`). Found out on first use, the directory created if missing.
    pub async fn cache_mode(&self) -> Result<CacheMode, StorageError> {
        self.cache_mode
            .get_or_try_init(|| async {
                make_dir(&self.instances_dir, true).await?;
                let probe = self
                    .instances_dir
                    .join(format!(".vireo-direct-io-{}", Uuid::new_v4()));
                let p = probe.clone();
                let direct = tokio::task::spawn_blocking(move || {
                    use std::os::unix::fs::OpenOptionsExt;
                    let r = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .custom_flags(libc::O_DIRECT)
                        .open(&p);
                    let ok = r.is_ok();
                    let _ = std::fs::remove_file(&p);
                    ok
                })
                .await
                .map_err(|_| StorageError::Task("probe O_DIRECT"))?;
                let mode = if direct {
                    CacheMode::None
                } else {
                    CacheMode::Writethrough
                };
                debug!(dir = %self.instances_dir.display(), ?mode, "disk cache mode");
                Ok(mode)
            })
            .await
            .copied()
    }

    /// The cached bases some root disk in the instances directory is an overlay on, by
    /// reading each `disk` file's qcow2 header (`<uuid>/disk` and a resize's kept
    /// `<uuid>_resize/disk`): instances this host has no record of count too, which on an
    /// instances directory shared with other hosts are theirs, running on this host's base
    /// after a live migration or a resize that copied nothing (Nova's image cache manager
    /// scans the directory the same way). Unreadable entries are skipped.
    pub fn bases_in_use(&self) -> std::collections::BTreeSet<ImageId> {
        let cache_dir = &self.cache.config().dir;
        let mut used = std::collections::BTreeSet::new();
        let Ok(entries) = std::fs::read_dir(&self.instances_dir) else {
            return used;
        };
        for entry in entries.flatten() {
            let Some(backing) = qcow2_backing_file(&entry.path().join(DiskRole::Root.file_name()))
            else {
                continue;
            };
            let backing = Path::new(&backing);
            if backing.parent() == Some(cache_dir.as_path()) {
                if let Some(id) = backing
                    .file_name()
                    .and_then(|n| ImageId::new(n.to_string_lossy().into_owned()).ok())
                {
                    used.insert(id);
                }
            }
        }
        used
    }

    /// `disks` with this host's cache mode.
    async fn with_cache_mode(
        &self,
        disks: Result<Vec<InstanceDisk>, StorageError>,
    ) -> Result<Vec<InstanceDisk>, StorageError> {
        let mut disks = disks?;
        let mode = self.cache_mode().await?;
        for d in &mut disks {
            d.cache = Some(mode);
        }
        Ok(disks)
    }

    /// The image cache.
    pub fn cache(&self) -> &Arc<ImageCache> {
        &self.cache
    }

    /// The instances directory (`<state_dir>/instances`, or `[instances] instances_path`).
    pub fn instances_dir(&self) -> &Path {
        &self.instances_dir
    }

    /// Instance `uuid`'s directory.
    pub fn instance_dir(&self, uuid: Uuid) -> PathBuf {
        self.instances_dir.join(uuid.to_string())
    }

    /// Where a resize on this host keeps the copy of instance `uuid`'s disks until it is
    /// confirmed or reverted (`<uuid>_resize`, Nova's name).
    pub fn kept_dir(&self, uuid: Uuid) -> PathBuf {
        self.instances_dir.join(format!("{uuid}_resize"))
    }

    async fn make(
        &self,
        plan: &DiskPlan,
        dir: &Path,
        made: &mut Vec<PathBuf>,
    ) -> Result<Vec<InstanceDisk>, StorageError> {
        let mut disks = Vec::new();
        if let Some(image) = &plan.image {
            let path = dir.join(DiskRole::Root.file_name());
            claim(&path, made).await?;
            let base = self.base(image, plan.image_token.clone()).await?;
            disks.push(root_disk(image, &base, &path, plan.root_gb).await?);
        }
        if plan.ephemeral_gb > 0 {
            let size = bytes("ephemeral_gb", plan.ephemeral_gb, GIB)?;
            let path = dir.join(DiskRole::Ephemeral.file_name());
            claim(&path, made).await?;
            sparse_file(&path, size).await?;
            run(
                "mkfs.ext4",
                &["-F", "-q", "-L", "ephemeral0", path_str(&path)?],
            )
            .await?;
            disks.push(raw_disk(DiskRole::Ephemeral, path, size));
        }
        if plan.swap_mb > 0 {
            let size = bytes("swap_mb", plan.swap_mb, MIB)?;
            let path = dir.join(DiskRole::Swap.file_name());
            claim(&path, made).await?;
            sparse_file(&path, size).await?;
            run("mkswap", &["-L", "swap0", path_str(&path)?]).await?;
            disks.push(raw_disk(DiskRole::Swap, path, size));
        }
        if let Some(files) = &plan.config_drive {
            let path = dir.join(DiskRole::ConfigDrive.file_name());
            let staging = dir.join(CONFIG_DRIVE_STAGING);
            claim(&path, made).await?;
            claim(&staging, made).await?;
            let size = config_drive(files, &staging, &path).await;
            remove_path(&staging).await?;
            disks.push(raw_disk(DiskRole::ConfigDrive, path, size?));
        }
        Ok(disks)
    }

    async fn base(&self, image: &ImageRef, token: Option<String>) -> Result<PathBuf, StorageError> {
        let fail = |source: Box<dyn std::error::Error + Send + Sync>| StorageError::Image {
            id: image.id.clone(),
            source,
        };
        let source = ImageSource::parse(&image.source).map_err(|e| fail(Box::new(e)))?;
        let req = ImageRequest {
            id: image.id.clone(),
            source,
            checksum: image.checksum.clone(),
            token,
        };
        self.cache.fetch(&req).await.map_err(|e| fail(Box::new(e)))
    }
}

#[async_trait]
impl InstanceStorage for HostStorage {
    async fn create(&self, plan: &DiskPlan) -> Result<Vec<InstanceDisk>, StorageError> {
        let (dir, existed) = self.open_instance_dir(plan.uuid).await?;
        let mut made = Vec::new();
        let disks = match plan.build {
            Some(build) => mark_build(&dir, build, existed, &mut made).await,
            None => Ok(()),
        };
        let disks = match disks {
            Ok(()) => {
                self.with_cache_mode(self.make(plan, &dir, &mut made).await)
                    .await
            }
            Err(e) => Err(e),
        };
        match &disks {
            Ok(d) => debug!(instance = %plan.uuid, disks = d.len(), "disks created"),
            Err(_) => undo(plan.uuid, &dir, existed, &made).await,
        }
        disks
    }

    async fn holds_disks(&self, uuid: Uuid) -> bool {
        let dir = self.instance_dir(uuid);
        for role in [
            DiskRole::Root,
            DiskRole::Ephemeral,
            DiskRole::Swap,
            DiskRole::ConfigDrive,
        ] {
            if tokio::fs::symlink_metadata(dir.join(role.file_name()))
                .await
                .is_ok()
            {
                return true;
            }
        }
        false
    }

    async fn remove(&self, uuid: Uuid) -> Result<(), StorageError> {
        remove_path(&self.kept_dir(uuid)).await?;
        remove_path(&self.instance_dir(uuid)).await
    }

    async fn remove_build(&self, uuid: Uuid, build: Uuid) -> Result<bool, StorageError> {
        let dir = self.instance_dir(uuid);
        let marker = dir.join(BUILD_MARKER);
        let text = match tokio::fs::read(&marker).await {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(source) => {
                return Err(StorageError::Io {
                    action: "read the build marker",
                    path: marker,
                    source,
                })
            }
        };
        let mark: BuildMark = match serde_json::from_slice(&text) {
            Ok(mark) => mark,
            Err(e) => {
                warn!(instance = %uuid, error = %e, path = %marker.display(), "unreadable build marker: the directory is left alone");
                return Ok(false);
            }
        };
        if mark.build != build {
            return Ok(false);
        }
        if mark.made_dir {
            remove_path(&dir).await?;
        } else {
            // The directory was there before the build (a console log of an earlier attempt):
            // only what the build makes goes.
            for role in [
                DiskRole::Root,
                DiskRole::Ephemeral,
                DiskRole::Swap,
                DiskRole::ConfigDrive,
            ] {
                remove_path(&dir.join(role.file_name())).await?;
            }
            remove_path(&dir.join(CONFIG_DRIVE_STAGING)).await?;
            remove_path(&marker).await?;
        }
        Ok(true)
    }

    async fn resize(
        &self,
        uuid: Uuid,
        disks: &[InstanceDisk],
        root_gb: u64,
    ) -> Result<Vec<InstanceDisk>, StorageError> {
        if disks.is_empty() {
            return Ok(Vec::new());
        }
        // Refused before anything is copied.
        let wanted = match disks.iter().find(|d| d.role == DiskRole::Root) {
            Some(r) => root_size(r, root_gb)?,
            None => 0,
        };
        // The copy: every disk file, sparse files kept sparse (an overlay holds only what
        // the guest wrote; ephemeral and swap are mostly holes).
        let kept = self.kept_dir(uuid);
        if tokio::fs::symlink_metadata(&kept).await.is_ok() {
            return Err(StorageError::Io {
                action: "keep a copy for the resize in (an earlier resize's copy is there)",
                path: kept,
                source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            });
        }
        make_dir(&kept, false).await?;
        let copied = async {
            for d in disks {
                let to = kept.join(d.role.file_name());
                run(
                    "cp",
                    &[
                        "--sparse=always",
                        "--preserve=mode",
                        path_str(&d.path)?,
                        path_str(&to)?,
                    ],
                )
                .await?;
            }
            Ok::<_, StorageError>(())
        }
        .await;
        if let Err(e) = copied {
            if let Err(c) = remove_path(&kept).await {
                warn!(instance = %uuid, error = %c, "a resize's partial copy left");
            }
            return Err(e);
        }
        let mut out = disks.to_vec();
        for d in out.iter_mut().filter(|d| d.role == DiskRole::Root) {
            grow(d, wanted).await?;
        }
        Ok(out)
    }

    async fn restore_kept(&self, uuid: Uuid) -> Result<(), StorageError> {
        let kept = self.kept_dir(uuid);
        let mut entries = match tokio::fs::read_dir(&kept).await {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(StorageError::Io {
                    action: "read",
                    path: kept,
                    source,
                })
            }
        };
        let dir = self.instance_dir(uuid);
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(|source| StorageError::Io {
                action: "read",
                path: kept.clone(),
                source,
            })?
        {
            let to = dir.join(entry.file_name());
            tokio::fs::rename(entry.path(), &to)
                .await
                .map_err(|source| StorageError::Io {
                    action: "put back",
                    path: to,
                    source,
                })?;
        }
        remove_path(&kept).await
    }

    async fn drop_kept(&self, uuid: Uuid) -> Result<(), StorageError> {
        remove_path(&self.kept_dir(uuid)).await
    }

    async fn copy_from(
        &self,
        uuid: Uuid,
        source_uri: &str,
        disks: &[InstanceDisk],
        image: Option<&ImageRef>,
        image_token: Option<String>,
        root_gb: u64,
        build: Option<Uuid>,
    ) -> Result<Vec<InstanceDisk>, StorageError> {
        let (dir, existed) = self.open_instance_dir(uuid).await?;
        let mut made = Vec::new();
        if let Some(build) = build {
            if let Err(e) = mark_build(&dir, build, existed, &mut made).await {
                undo(uuid, &dir, existed, &made).await;
                return Err(e);
            }
        }
        let copied = self
            .with_cache_mode(
                self.copy_into(
                    source_uri,
                    disks,
                    image.map(|i| (i, image_token)),
                    root_gb,
                    &dir,
                    &mut made,
                )
                .await,
            )
            .await;
        if copied.is_err() {
            undo(uuid, &dir, existed, &made).await;
        }
        copied
    }

    async fn write_probe(&self, name: &str) -> Result<(), StorageError> {
        make_dir(&self.instances_dir, true).await?;
        let path = self.probe_path(name)?;
        tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .map(drop)
            .map_err(|source| StorageError::Io {
                action: "write the shared-directory probe",
                path,
                source,
            })
    }

    async fn sees_probe(&self, name: &str) -> bool {
        match self.probe_path(name) {
            Ok(p) => tokio::fs::try_exists(p).await.unwrap_or(false),
            Err(_) => false,
        }
    }

    async fn remove_probe(&self, name: &str) {
        if let Ok(p) = self.probe_path(name) {
            if let Err(e) = remove_path(&p).await {
                warn!(error = %e, "a shared-directory probe left");
            }
        }
    }

    async fn prepare_incoming(
        &self,
        uuid: Uuid,
        source_uri: &str,
        disks: &[InstanceDisk],
        image: Option<&ImageRef>,
        image_token: Option<String>,
    ) -> Result<Vec<InstanceDisk>, StorageError> {
        let (dir, existed) = self.open_instance_dir(uuid).await?;
        let mut made = Vec::new();
        let prepared = self
            .with_cache_mode(
                self.prepare_into(source_uri, disks, image, image_token, &dir, &mut made)
                    .await,
            )
            .await;
        match &prepared {
            Ok(d) => debug!(instance = %uuid, disks = d.len(), "target disks prepared"),
            Err(_) => undo(uuid, &dir, existed, &made).await,
        }
        prepared
    }
}

impl HostStorage {
    /// A probe file's path: a plain file name in the instances directory, nothing else.
    fn probe_path(&self, name: &str) -> Result<PathBuf, StorageError> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(StorageError::Io {
                action: "name a probe",
                path: PathBuf::from(name),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
        Ok(self.instances_dir.join(name))
    }

    async fn prepare_into(
        &self,
        source_uri: &str,
        disks: &[InstanceDisk],
        image: Option<&ImageRef>,
        image_token: Option<String>,
        dir: &Path,
        made: &mut Vec<PathBuf>,
    ) -> Result<Vec<InstanceDisk>, StorageError> {
        let mut out = Vec::with_capacity(disks.len());
        for d in disks {
            let path = dir.join(d.role.file_name());
            claim(&path, made).await?;
            let size = d.virtual_size.to_string();
            match (d.role, image) {
                (DiskRole::Root, Some(image)) if d.image.is_some() => {
                    let base = self.base(image, image_token.clone()).await?;
                    create_overlay(&base, image.format, &path, d.virtual_size).await?;
                }
                (DiskRole::ConfigDrive, _) => {
                    let (uri, from, local) = (source_uri.to_owned(), d.path.clone(), path.clone());
                    tokio::task::spawn_blocking(move || transfer(&uri, &from, &local))
                        .await
                        .map_err(|_| StorageError::Task("copy the config drive"))??;
                }
                _ => {
                    run(
                        "qemu-img",
                        &[
                            "create",
                            "-q",
                            "-f",
                            d.format.as_str(),
                            path_str(&path)?,
                            &size,
                        ],
                    )
                    .await?;
                }
            }
            out.push(InstanceDisk { path, ..d.clone() });
        }
        Ok(out)
    }

    /// Instance `uuid`'s directory, created when missing (and whether it was there before).
    async fn open_instance_dir(&self, uuid: Uuid) -> Result<(PathBuf, bool), StorageError> {
        let dir = self.instance_dir(uuid);
        let existed = tokio::fs::try_exists(&dir).await.unwrap_or(false);
        make_dir(&dir, true).await?;
        Ok((dir, existed))
    }

    async fn copy_into(
        &self,
        source_uri: &str,
        disks: &[InstanceDisk],
        image: Option<(&ImageRef, Option<String>)>,
        root_gb: u64,
        dir: &Path,
        made: &mut Vec<PathBuf>,
    ) -> Result<Vec<InstanceDisk>, StorageError> {
        // The base first (with the image's token, if its source wants one): a copy whose
        // backing file cannot be had here is of no use.
        let base = match image {
            Some((i, token)) => Some((i, self.base(i, token).await?)),
            None => None,
        };
        let mut out = Vec::with_capacity(disks.len());
        for d in disks {
            let to = dir.join(d.role.file_name());
            claim(&to, made).await?;
            let (uri, from, local) = (source_uri.to_owned(), d.path.clone(), to.clone());
            tokio::task::spawn_blocking(move || transfer(&uri, &from, &local))
                .await
                .map_err(|_| StorageError::Task("copy a disk"))??;
            let mut here = InstanceDisk {
                path: to,
                ..d.clone()
            };
            if d.role == DiskRole::Root {
                if let Some((image, base)) = &base {
                    run(
                        "qemu-img",
                        &[
                            "rebase",
                            "-q",
                            "-u",
                            "-f",
                            "qcow2",
                            "-F",
                            image.format.as_str(),
                            "-b",
                            path_str(base)?,
                            path_str(&here.path)?,
                        ],
                    )
                    .await?;
                }
                let wanted = root_size(&here, root_gb)?;
                grow(&mut here, wanted).await?;
            }
            out.push(here);
        }
        Ok(out)
    }
}

/// The backing file a qcow2 image's header names (None: not qcow2, no backing file, or
/// unreadable). The header is QEMU's documented format (docs/interop/qcow2.txt): magic
/// `QFI\xfb`, the backing file name's offset (u64, big-endian) at byte 8 and its length
/// (u32) at byte 16; reading 24 bytes and the name here spares a `qemu-img info` process per
/// instance on every cache pass.
fn qcow2_backing_file(path: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let mut header = [0u8; 20];
    f.read_exact(&mut header).ok()?;
    if header[..4] != *b"QFI\xfb" {
        return None;
    }
    let offset = u64::from_be_bytes(header[8..16].try_into().ok()?);
    let len = u32::from_be_bytes(header[16..20].try_into().ok()?);
    // QEMU limits the name to 1023 bytes.
    if offset == 0 || len == 0 || len > 1023 {
        return None;
    }
    f.seek(SeekFrom::Start(offset)).ok()?;
    let mut name = vec![0u8; len as usize];
    f.read_exact(&mut name).ok()?;
    String::from_utf8(name).ok()
}

/// Copy `remote`, a file on the host `uri` names, to `local` (which must not exist). Runs on
/// a blocking thread: libvirt's calls block.
///
/// Through that host's libvirt: the volume's download stream (a transient `dir` pool over
/// the file's directory makes it a volume unless a pool covers it already), written as it
/// comes, runs of zeros skipped so sparse files stay sparse. libvirt's test driver (the
/// embedded default, whose hosts are in one process on one machine) has no storage streams:
/// from a `test:` URI the file is copied directly (`cp --sparse=always`).
fn transfer(uri: &str, remote: &Path, local: &Path) -> Result<u64, StorageError> {
    if uri.starts_with("test:") || uri.starts_with("test+") {
        let out = std::process::Command::new("cp")
            .args(["--sparse=always", "--preserve=mode"])
            .arg(remote)
            .arg(local)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| StorageError::Spawn {
                program: "cp",
                source,
            })?;
        if !out.status.success() {
            return Err(StorageError::Tool {
                program: "cp",
                args: format!("{} {}", remote.display(), local.display()),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        return std::fs::metadata(local)
            .map(|m| m.len())
            .map_err(|source| StorageError::Io {
                action: "read",
                path: local.to_owned(),
                source,
            });
    }
    use std::io::{Seek, SeekFrom, Write};
    let fail = |step: &'static str| {
        move |e: virt::error::Error| StorageError::Copy {
            uri: uri.to_owned(),
            path: remote.to_owned(),
            step,
            source: Box::new(e),
        }
    };
    let remote_str = path_str(remote)?;
    let conn = virt::connect::Connect::open(Some(uri)).map_err(fail("open the connection"))?;
    let mut pool = None;
    let vol = match conn.lookup_storage_vol_by_path(remote_str) {
        Ok(v) => v,
        Err(_) => {
            let parent = remote.parent().map(Path::to_path_buf).unwrap_or_default();
            let xml = format!(
                "<pool type='dir'><name>vireo-copy-{}</name><target><path>{}</path></target></pool>",
                Uuid::new_v4().simple(),
                xml_escape(path_str(&parent)?)
            );
            let p = conn
                .create_storage_pool_xml(&xml, 0)
                .map_err(fail("start a pool over the instance directory"))?;
            let v = conn
                .lookup_storage_vol_by_path(remote_str)
                .map_err(fail("find the disk"));
            pool = Some(p);
            match v {
                Ok(v) => v,
                Err(e) => {
                    end_pool(pool);
                    return Err(e);
                }
            }
        }
    };
    let result = (|| {
        let stream = virt::stream::Stream::new(&conn, 0).map_err(fail("open a stream"))?;
        vol.download(&stream, 0, 0, 0)
            .map_err(fail("start the download"))?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(local)
            .map_err(|source| StorageError::Io {
                action: "create",
                path: local.to_owned(),
                source,
            })?;
        let write_err = |source| StorageError::Io {
            action: "write",
            path: local.to_owned(),
            source,
        };
        let mut buf = vec![0u8; 1 << 20];
        let mut total: u64 = 0;
        loop {
            let n = match stream.recv(&mut buf) {
                Ok(n) => n,
                Err(e) => {
                    let _ = stream.abort();
                    return Err(fail("read the stream")(e));
                }
            };
            let n = usize::try_from(n).unwrap_or(0);
            if n == 0 {
                break;
            }
            let chunk = &buf[..n];
            if chunk.iter().all(|b| *b == 0) {
                file.seek(SeekFrom::Current(n as i64)).map_err(write_err)?;
            } else {
                file.write_all(chunk).map_err(write_err)?;
            }
            total += n as u64;
        }
        stream.finish().map_err(fail("finish the stream"))?;
        file.set_len(total).map_err(write_err)?;
        file.sync_all().map_err(write_err)?;
        Ok(total)
    })();
    end_pool(pool);
    result
}

/// Stop a transient pool (which removes it; its directory and files stay).
fn end_pool(pool: Option<virt::storage_pool::StoragePool>) {
    if let Some(p) = pool {
        if let Err(e) = p.destroy() {
            warn!(error = %e, "transient copy pool left");
        }
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
}

/// The root disk: a qcow2 overlay on `base`, `root_gb` large (the image's own size when 0).
async fn root_disk(
    image: &ImageRef,
    base: &Path,
    path: &Path,
    root_gb: u64,
) -> Result<InstanceDisk, StorageError> {
    let info = image_info(base, image.format).await?;
    if let Some(backing) = info.backing_filename {
        return Err(StorageError::ImageBacking {
            id: image.id.clone(),
            backing,
        });
    }
    let image_size = info.virtual_size;
    let wanted = bytes("root_gb", root_gb, GIB)?;
    if root_gb > 0 && image_size > wanted {
        return Err(StorageError::ImageTooLarge {
            id: image.id.clone(),
            virtual_size: image_size,
            root_gb,
        });
    }
    let size = image_size.max(wanted);
    create_overlay(base, image.format, path, size).await?;
    Ok(InstanceDisk {
        role: DiskRole::Root,
        path: path.to_owned(),
        format: ImageFormat::Qcow2,
        virtual_size: size,
        image: Some(image.id.clone()),
        cache: None,
    })
}

/// A qcow2 overlay at `path` of `size` bytes whose backing file is `base` (its format given,
/// never probed).
async fn create_overlay(
    base: &Path,
    format: ImageFormat,
    path: &Path,
    size: u64,
) -> Result<(), StorageError> {
    let size = size.to_string();
    run(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            format.as_str(),
            "-b",
            path_str(base)?,
            path_str(path)?,
            &size,
        ],
    )
    .await?;
    Ok(())
}

/// The size in bytes a root disk gets for a flavor's `root_gb` (0: it keeps its size); a
/// size smaller than the disk's is refused (a disk does not shrink).
fn root_size(disk: &InstanceDisk, root_gb: u64) -> Result<u64, StorageError> {
    let wanted = bytes("root_gb", root_gb, GIB)?;
    if root_gb > 0 && wanted < disk.virtual_size {
        return Err(StorageError::RootDiskShrink {
            current: disk.virtual_size,
            root_gb,
        });
    }
    Ok(wanted)
}

/// Grow `disk` to `size` bytes (`qemu-img resize`); nothing when it is that large already.
async fn grow(disk: &mut InstanceDisk, size: u64) -> Result<(), StorageError> {
    if size > disk.virtual_size {
        let arg = size.to_string();
        run(
            "qemu-img",
            &[
                "resize",
                "-q",
                "-f",
                disk.format.as_str(),
                path_str(&disk.path)?,
                &arg,
            ],
        )
        .await?;
        disk.virtual_size = size;
    }
    Ok(())
}

/// What `qemu-img info` says of an image.
#[derive(Debug, serde::Deserialize)]
pub struct ImageInfo {
    /// The size a guest sees, in bytes.
    #[serde(rename = "virtual-size")]
    pub virtual_size: u64,
    /// The backing file it names (qcow2).
    #[serde(rename = "backing-filename", default)]
    pub backing_filename: Option<String>,
}

/// `qemu-img info` of `file` read as `format` (never probed).
pub async fn image_info(file: &Path, format: ImageFormat) -> Result<ImageInfo, StorageError> {
    let out = run(
        "qemu-img",
        &[
            "info",
            "--output=json",
            "-f",
            format.as_str(),
            path_str(file)?,
        ],
    )
    .await?;
    serde_json::from_slice(&out).map_err(|source| StorageError::Output {
        program: "qemu-img",
        source,
    })
}

fn raw_disk(role: DiskRole, path: PathBuf, size: u64) -> InstanceDisk {
    InstanceDisk {
        role,
        path,
        format: ImageFormat::Raw,
        virtual_size: size,
        image: None,
        cache: None,
    }
}

/// Write `files` under `staging` and make the ISO at `iso`; returns its size.
async fn config_drive(
    files: &[ConfigDriveFile],
    staging: &Path,
    iso: &Path,
) -> Result<u64, StorageError> {
    let io = |action, path: &Path| {
        let path = path.to_owned();
        move |source| StorageError::Io {
            action,
            path,
            source,
        }
    };
    for f in files {
        let path = staging.join(&f.path);
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(io("create config drive directory", parent))?;
        }
        tokio::fs::write(&path, &f.contents)
            .await
            .map_err(io("write config drive file", &path))?;
    }
    run(
        "genisoimage",
        &[
            "-o",
            path_str(iso)?,
            "-ldots",
            "-allow-lowercase",
            "-allow-multidot",
            "-l",
            "-publisher",
            "vireo",
            "-quiet",
            "-J",
            "-r",
            "-V",
            "config-2",
            path_str(staging)?,
        ],
    )
    .await?;
    let meta = tokio::fs::metadata(iso)
        .await
        .map_err(io("read config drive", iso))?;
    Ok(meta.len())
}

/// Create `dir` (and its parents with `parents`), mode 0711: traversable by QEMU (another
/// user under qemu:///system, which libvirt makes the owner of each disk file while the
/// domain runs), not listable.
async fn make_dir(dir: &Path, parents: bool) -> Result<(), StorageError> {
    let err = |source| StorageError::Io {
        action: "create directory",
        path: dir.to_owned(),
        source,
    };
    let mut builder = tokio::fs::DirBuilder::new();
    builder.recursive(parents).mode(0o711);
    builder.create(dir).await.map_err(err)?;
    // The mode asked for, not what the umask left of it (the unit runs with 0077): the
    // directory and, when made with it, its parent (`instances/`).
    let dirs = std::iter::once(dir).chain(dir.parent().filter(|_| parents));
    for d in dirs {
        tokio::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711))
            .await
            .map_err(|source| StorageError::Io {
                action: "set the mode of",
                path: d.to_owned(),
                source,
            })?;
    }
    Ok(())
}

/// Where a config drive's files are laid out before they become its image.
const CONFIG_DRIVE_STAGING: &str = ".config-drive";

/// What [`BUILD_MARKER`] holds: the build that made the instance's disks, and whether it made
/// the directory too.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct BuildMark {
    build: Uuid,
    made_dir: bool,
}

/// Write the build's marker before its first disk (a build killed while it makes them leaves
/// the marker with whatever it made). One left by an earlier build of the instance is
/// replaced: its disks are gone (they would be in the way of this build's), and so is its
/// journal entry.
async fn mark_build(
    dir: &Path,
    build: Uuid,
    existed: bool,
    made: &mut Vec<PathBuf>,
) -> Result<(), StorageError> {
    let path = dir.join(BUILD_MARKER);
    let there = tokio::fs::symlink_metadata(&path).await.is_ok();
    let mark = BuildMark {
        build,
        made_dir: !existed,
    };
    let text = serde_json::to_vec(&mark).map_err(|e| StorageError::Io {
        action: "write the build marker",
        path: path.clone(),
        source: std::io::Error::other(e),
    })?;
    tokio::fs::write(&path, text)
        .await
        .map_err(|source| StorageError::Io {
            action: "write the build marker",
            path: path.clone(),
            source,
        })?;
    if !there {
        made.push(path);
    }
    Ok(())
}

/// After a failed create or copy: what the call `made` goes; a directory that was there
/// before stays (it may hold the console log of an earlier attempt), one it made goes whole.
async fn undo(uuid: Uuid, dir: &Path, existed: bool, made: &[PathBuf]) {
    let cleanup = if existed {
        let mut r = Ok(());
        for p in made.iter().rev() {
            r = r.and(remove_path(p).await);
        }
        r
    } else {
        remove_path(dir).await
    };
    if let Err(c) = cleanup {
        warn!(instance = %uuid, error = %c, "disks left after a failed create or copy");
    }
}

/// Refuse a path that exists (a disk is never made over something already there, and a
/// clean-up never removes what this call did not make); otherwise note it as made.
async fn claim(path: &Path, made: &mut Vec<PathBuf>) -> Result<(), StorageError> {
    if tokio::fs::symlink_metadata(path).await.is_ok() {
        return Err(StorageError::Io {
            action: "create (something is in the way)",
            path: path.to_owned(),
            source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        });
    }
    made.push(path.to_owned());
    Ok(())
}

fn bytes(what: &'static str, value: u64, unit: u64) -> Result<u64, StorageError> {
    value
        .checked_mul(unit)
        .ok_or(StorageError::Size { what, value })
}

fn path_str(p: &Path) -> Result<&str, StorageError> {
    p.to_str().ok_or_else(|| StorageError::Io {
        action: "use a path that is not UTF-8:",
        path: p.to_owned(),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })
}

/// A sparse file of `size` bytes (refusing to replace one that exists).
async fn sparse_file(path: &Path, size: u64) -> Result<(), StorageError> {
    let err = |action| {
        move |source| StorageError::Io {
            action,
            path: path.to_owned(),
            source,
        }
    };
    let f = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .await
        .map_err(err("create"))?;
    f.set_len(size).await.map_err(err("size"))
}

/// Remove a file or a directory tree; what is not there is fine.
async fn remove_path(path: &Path) -> Result<(), StorageError> {
    let r = match tokio::fs::symlink_metadata(path).await {
        Ok(m) if m.is_dir() => tokio::fs::remove_dir_all(path).await,
        Ok(_) => tokio::fs::remove_file(path).await,
        Err(e) => Err(e),
    };
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StorageError::Io {
            action: "remove",
            path: path.to_owned(),
            source,
        }),
    }
}

/// Run `program` with `args` (no shell), returning its standard output; a failure carries
/// the end of its standard error.
async fn run(program: &'static str, args: &[&str]) -> Result<Vec<u8>, StorageError> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| StorageError::Spawn { program, source })?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String = stderr
        .trim()
        .chars()
        .rev()
        .take(500)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    Err(StorageError::Tool {
        program,
        args: args.join(" "),
        status: out.status.to_string(),
        stderr: tail,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use vireo_xml::metadata::Flavor;

    fn swap_only(uuid: Uuid, build: Option<Uuid>) -> DiskPlan {
        let flavor = Flavor {
            swap_mb: 1,
            ..Flavor::default()
        };
        let mut plan = DiskPlan::new(uuid, &flavor, None);
        plan.build = build;
        plan
    }

    fn storage(dir: &Path) -> HostStorage {
        HostStorage::new(StorageConfig::in_state_dir(dir)).unwrap()
    }

    #[tokio::test]
    async fn a_build_removes_only_what_its_own_marker_names() {
        let d = tempfile::tempdir().unwrap();
        let s = storage(d.path());
        let (uuid, mine, other) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        s.create(&swap_only(uuid, Some(mine))).await.unwrap();
        let dir = s.instance_dir(uuid);
        assert!(dir.join(BUILD_MARKER).exists());
        // Another build's token (a host that built the instance since, on a shared
        // directory) removes nothing.
        assert!(!s.remove_build(uuid, other).await.unwrap());
        assert!(dir.join(DiskRole::Swap.file_name()).exists());
        assert!(s.remove_build(uuid, mine).await.unwrap());
        assert!(!dir.exists());
        // Nothing there: nothing to do.
        assert!(!s.remove_build(uuid, mine).await.unwrap());
    }

    #[tokio::test]
    async fn a_directory_there_before_the_build_keeps_what_the_build_did_not_make() {
        let d = tempfile::tempdir().unwrap();
        let s = storage(d.path());
        let (uuid, build) = (Uuid::new_v4(), Uuid::new_v4());
        let dir = s.instance_dir(uuid);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("console.log"), b"an earlier attempt").unwrap();
        s.create(&swap_only(uuid, Some(build))).await.unwrap();
        assert!(s.remove_build(uuid, build).await.unwrap());
        let mut left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["console.log"]);
    }

    #[tokio::test]
    async fn disks_made_without_a_build_token_are_never_removed_as_a_build() {
        let d = tempfile::tempdir().unwrap();
        let s = storage(d.path());
        let uuid = Uuid::new_v4();
        s.create(&swap_only(uuid, None)).await.unwrap();
        assert!(!s.remove_build(uuid, Uuid::new_v4()).await.unwrap());
        assert!(s.holds_disks(uuid).await);
    }

    #[tokio::test]
    async fn a_failed_create_takes_its_marker_with_it() {
        let d = tempfile::tempdir().unwrap();
        let s = storage(d.path());
        let uuid = Uuid::new_v4();
        let dir = s.instance_dir(uuid);
        std::fs::create_dir_all(&dir).unwrap();
        // Something in the way of the swap disk: the create fails.
        std::fs::write(dir.join(DiskRole::Swap.file_name()), b"x").unwrap();
        s.create(&swap_only(uuid, Some(Uuid::new_v4())))
            .await
            .unwrap_err();
        assert!(!dir.join(BUILD_MARKER).exists());
    }
}
