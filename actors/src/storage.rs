//! An instance's disks, as the instance actor sees them.
//!
//! The actor decides *when* disks exist (created before the domain is first defined, removed
//! when the instance is destroyed or its build rolls back); an [`InstanceStorage`] decides
//! *how*. The real one (`vireo::storage::HostStorage`) keeps each instance's disks in
//! `<state_dir>/instances/<uuid>/` as Nova's libvirt driver does: the root disk a qcow2
//! overlay on the image's cached base (never written to), ephemeral and swap disks from the
//! flavor, and a config drive. The trait exists so the flows do not depend on the driver crate
//! and a test can make a step fail; what the actor records of the result ([`InstanceDisk`]) is
//! plain data kept in the domain's metadata, so a restarted agent knows the disks without
//! asking the storage.
//!
//! An instance with no image, no ephemeral or swap disk and no config drive (the diskless
//! domains of the lifecycle tests and the demo) has no disks: the storage creates nothing for
//! it, not even its directory.

mod config_drive;
mod image;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use uuid::Uuid;
use vireo_xml::devices::{
    Disk, DiskBus, DiskCache, DiskDevice, DiskDriver, DiskFormat, DiskSource,
};
use vireo_xml::metadata::Flavor;

pub use config_drive::{config_drive_files, ConfigDriveError, ConfigDriveFile};
pub use image::{Checksum, ChecksumError, ImageId, ImageIdError};

/// Largest `user_data` a config drive takes (Nova's limit, 64 KiB).
pub const MAX_USER_DATA: usize = 65_535;

/// The format of an image's bytes (Glance's `disk_format`), given by the caller and never
/// probed: a raw image whose first bytes look like a qcow2 header must not become one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    /// Raw bytes.
    #[default]
    Raw,
    /// qcow2.
    Qcow2,
}

impl ImageFormat {
    /// `raw` or `qcow2`, as `qemu-img` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Raw => "raw",
            ImageFormat::Qcow2 => "qcow2",
        }
    }

    fn disk_format(self) -> DiskFormat {
        match self {
            ImageFormat::Raw => DiskFormat::Raw,
            ImageFormat::Qcow2 => DiskFormat::Qcow2,
        }
    }
}

impl fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The image an instance's root disk is made from. The download token is not part of it: it
/// is a secret, valid for one fetch, and never written to the domain's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRef {
    /// Its id (the cached base's file name).
    pub id: ImageId,
    /// Where it is fetched from: an absolute path, a `file://` or an `http(s)://` URL.
    pub source: String,
    /// The checksum the fetched bytes must have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<Checksum>,
    /// The format of its bytes.
    #[serde(default)]
    pub format: ImageFormat,
}

/// What goes on the config drive besides what vireo knows of the instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigDrive {
    /// `openstack/latest/user_data` (at most [`MAX_USER_DATA`] bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    /// SSH public keys by name (`public_keys` in `meta_data.json`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub public_keys: BTreeMap<String, String>,
    /// Instance metadata (`meta` in `meta_data.json`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// The guest's host name (default: the instance's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The availability zone reported to the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
}

/// What one of an instance's disks is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskRole {
    /// The root disk, from the image.
    Root,
    /// The flavor's ephemeral disk.
    Ephemeral,
    /// The flavor's swap disk.
    Swap,
    /// The config drive (ISO 9660, label `config-2`).
    ConfigDrive,
}

impl DiskRole {
    /// The file name in the instance directory (Nova's names).
    pub fn file_name(self) -> &'static str {
        match self {
            DiskRole::Root => "disk",
            DiskRole::Ephemeral => "disk.eph0",
            DiskRole::Swap => "disk.swap",
            DiskRole::ConfigDrive => "disk.config",
        }
    }
}

/// One disk of an instance, as its domain uses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceDisk {
    /// What it is for.
    pub role: DiskRole,
    /// Its file on the host.
    pub path: PathBuf,
    /// The format of that file.
    pub format: ImageFormat,
    /// Its size as the guest sees it, in bytes.
    pub virtual_size: u64,
    /// The image it is an overlay on (the root disk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageId>,
    /// How QEMU caches it (None: libvirt's default, for a record written before vireo chose).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheMode>,
}

/// The host cache mode of an instance's disks, chosen per host as Nova does: `none`
/// (O_DIRECT) where the instances directory supports it, else `writethrough`. `none` is also
/// what a live migration on a shared instances directory needs: no page cache on the source
/// that the destination would not see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// O_DIRECT: no host page cache.
    None,
    /// The host page cache, written through.
    Writethrough,
}

impl CacheMode {
    fn xml(self) -> DiskCache {
        match self {
            CacheMode::None => DiskCache::None,
            CacheMode::Writethrough => DiskCache::Writethrough,
        }
    }
}

impl InstanceDisk {
    /// The guest device (`vda`, `vdb`, ... in role order; the config drive is `sda`).
    fn target(&self, index: usize) -> String {
        match self.role {
            DiskRole::ConfigDrive => "sda".to_owned(),
            _ => format!("vd{}", char::from(b'a' + (index % 26) as u8)),
        }
    }

    /// The `<disk>` element for the `index`-th virtio disk.
    pub fn device(&self, index: usize) -> Disk {
        let source = DiskSource::File {
            path: self.path.display().to_string(),
        };
        let driver = Some(DiskDriver {
            format: self.format.disk_format(),
            cache: self.cache.map(CacheMode::xml),
            discard_unmap: false,
        });
        match self.role {
            DiskRole::ConfigDrive => Disk {
                device: DiskDevice::Cdrom,
                driver,
                target_bus: DiskBus::Sata,
                readonly: true,
                ..Disk::virtio(source, self.target(index))
            },
            _ => Disk {
                driver,
                ..Disk::virtio(source, self.target(index))
            },
        }
    }
}

/// The `<disk>` elements of `disks`, in order (virtio disks `vda`, `vdb`, ...; the config
/// drive a read-only SATA CD-ROM).
pub fn disk_devices(disks: &[InstanceDisk]) -> Vec<Disk> {
    let mut virtio = 0;
    disks
        .iter()
        .map(|d| {
            let dev = d.device(virtio);
            if d.role != DiskRole::ConfigDrive {
                virtio += 1;
            }
            dev
        })
        .collect()
}

/// What an instance's disks must be: the storage makes exactly this.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskPlan {
    /// The instance.
    pub uuid: Uuid,
    /// The root disk's image (none: no root disk).
    pub image: Option<ImageRef>,
    /// A token to fetch the image with (Glance's `X-Auth-Token`), not recorded.
    pub image_token: Option<String>,
    /// The root disk's size in GiB (0: the image's own size).
    pub root_gb: u64,
    /// The ephemeral disk's size in GiB (0: none).
    pub ephemeral_gb: u64,
    /// The swap disk's size in MiB (0: none).
    pub swap_mb: u64,
    /// The config drive's files (none: no config drive).
    pub config_drive: Option<Vec<ConfigDriveFile>>,
    /// The build the disks are made for (its journal entry's token): written into the
    /// instance directory with them ([`BUILD_MARKER`]), so a restarted agent removes exactly
    /// what a build that died before its domain existed made
    /// ([`InstanceStorage::remove_build`]). None: no marker.
    pub build: Option<Uuid>,
}

/// The file in an instance directory that names the build that made its disks.
pub const BUILD_MARKER: &str = ".vireo-build";

impl DiskPlan {
    /// The plan for `flavor`'s disks from `image`.
    pub fn new(uuid: Uuid, flavor: &Flavor, image: Option<ImageRef>) -> DiskPlan {
        DiskPlan {
            uuid,
            image,
            image_token: None,
            root_gb: flavor.root_gb,
            ephemeral_gb: flavor.ephemeral_gb,
            swap_mb: flavor.swap_mb,
            config_drive: None,
            build: None,
        }
    }

    /// No disk at all.
    pub fn is_empty(&self) -> bool {
        self.image.is_none()
            && self.ephemeral_gb == 0
            && self.swap_mb == 0
            && self.config_drive.is_none()
    }
}

/// Why the storage could not make or remove an instance's disks.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The image could not be fetched into the cache (nothing of it is left there).
    #[error("image {id}")]
    Image {
        /// The image.
        id: ImageId,
        /// Why (the cache's error).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The image is larger than the flavor's root disk.
    #[error("image {id} has a virtual size of {virtual_size} bytes, more than the flavor's root disk of {root_gb} GiB")]
    ImageTooLarge {
        /// The image.
        id: ImageId,
        /// Its virtual size in bytes.
        virtual_size: u64,
        /// The flavor's root disk.
        root_gb: u64,
    },
    /// The image names a backing file of its own (a guest could read any file of the host
    /// through it).
    #[error("image {id} names a backing file ({backing}): refused")]
    ImageBacking {
        /// The image.
        id: ImageId,
        /// The backing file it names.
        backing: String,
    },
    /// A resize to a root disk smaller than the instance's (a disk does not shrink).
    #[error("the root disk is {current} bytes; a root disk of {root_gb} GiB would shrink it")]
    RootDiskShrink {
        /// The root disk's size now, in bytes.
        current: u64,
        /// The new flavor's root disk.
        root_gb: u64,
    },
    /// A file or directory could not be created, read or removed.
    #[error("{action} {}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A tool (`qemu-img`, `mkfs.ext4`, `mkswap`, `genisoimage`) could not be started.
    #[error("run {program}")]
    Spawn {
        /// The program.
        program: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A tool failed.
    #[error("{program} {args}: {status}: {stderr}")]
    Tool {
        /// The program.
        program: &'static str,
        /// Its arguments, joined for the message.
        args: String,
        /// How it ended.
        status: String,
        /// What it said (the end of its standard error).
        stderr: String,
    },
    /// A tool's output did not read back (`qemu-img info`).
    #[error("read the output of {program}")]
    Output {
        /// The program.
        program: &'static str,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A size does not fit (GiB or MiB times their unit overflows).
    #[error("{what} of {value} is too large")]
    Size {
        /// Which size.
        what: &'static str,
        /// The value given.
        value: u64,
    },
    /// The config drive's contents could not be written.
    #[error("config drive")]
    ConfigDrive(#[from] ConfigDriveError),
    /// Reading a disk through the source host's libvirt failed.
    #[error("copy {} from {uri}: {step}", path.display())]
    Copy {
        /// The source's libvirt URI.
        uri: String,
        /// The file on the source.
        path: PathBuf,
        /// The libvirt call that failed.
        step: &'static str,
        /// libvirt's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A blocking task of the storage was lost (its thread panicked or the runtime stops).
    #[error("storage task {0} did not finish")]
    Task(&'static str),
}

/// Makes and removes the disks of this host's instances.
#[async_trait]
pub trait InstanceStorage: Send + Sync + fmt::Debug + 'static {
    /// Make the disks `plan` asks for (fetching the image into the cache first) and return
    /// them in device order. On failure everything this call created is removed again.
    async fn create(&self, plan: &DiskPlan) -> Result<Vec<InstanceDisk>, StorageError>;

    /// This host's instance directory holds a disk of the instance already (a resize's
    /// destination on an instance directory shared with the source, or a leftover): copying
    /// into it, or removing it after, would destroy the source's disks.
    async fn holds_disks(&self, uuid: Uuid) -> bool;

    /// Remove the instance's directory and every disk in it (and a copy a resize kept).
    /// Idempotent: an instance with nothing on this host is fine.
    async fn remove(&self, uuid: Uuid) -> Result<(), StorageError>;

    /// Remove what build `build` made for the instance (its disks, and the directory when the
    /// build made it), if the instance directory's [`BUILD_MARKER`] names that build; returns
    /// whether it did. Anything else (no marker, another build's, a directory shared with a
    /// host that built the instance since) is left alone.
    async fn remove_build(&self, uuid: Uuid, build: Uuid) -> Result<bool, StorageError>;

    /// A resize on this host: keep a copy of `disks` for a revert, then grow the root disk to
    /// `root_gb` (a smaller root disk than the current one is refused before anything is
    /// copied); returns the disks as they are now. No disks: nothing is done.
    async fn resize(
        &self,
        uuid: Uuid,
        disks: &[InstanceDisk],
        root_gb: u64,
    ) -> Result<Vec<InstanceDisk>, StorageError>;

    /// Put back the copy [`InstanceStorage::resize`] kept (a revert, or a resize that failed)
    /// and drop it. Nothing kept: nothing to do.
    async fn restore_kept(&self, uuid: Uuid) -> Result<(), StorageError>;

    /// Drop the copy a resize kept (a confirm). Nothing kept: nothing to do.
    async fn drop_kept(&self, uuid: Uuid) -> Result<(), StorageError>;

    /// A cross-host resize's destination: copy `disks` (the source host's files) through
    /// `source_uri`, the source's libvirt (the connection live migration already trusts),
    /// into this host's instance directory; the root disk is rebased on this host's base of
    /// `image` (fetched into this host's cache first, with `image_token` for an HTTP source
    /// that wants one) and grown to `root_gb`. Returns the
    /// disks here. The source is only read; on failure everything made here is removed.
    /// `build`: the token of the journal entry the copy runs under (written into the
    /// instance directory first, as a build's [`BUILD_MARKER`]), so that a restart after an
    /// agent stop mid-copy removes what it made ([`InstanceStorage::remove_build`]).
    #[allow(clippy::too_many_arguments)]
    async fn copy_from(
        &self,
        uuid: Uuid,
        source_uri: &str,
        disks: &[InstanceDisk],
        image: Option<&ImageRef>,
        image_token: Option<String>,
        root_gb: u64,
        build: Option<Uuid>,
    ) -> Result<Vec<InstanceDisk>, StorageError>;

    /// Write the empty file `name` in this host's instances directory (a live migration's
    /// source does, so that its destination can tell whether the two share the directory:
    /// Nova's probe, from the other side).
    async fn write_probe(&self, name: &str) -> Result<(), StorageError>;

    /// This host's instances directory holds the probe file `name`: it is the directory of
    /// the host that wrote it.
    async fn sees_probe(&self, name: &str) -> bool;

    /// Remove the probe file `name` (gone already is fine).
    async fn remove_probe(&self, name: &str);

    /// A block live migration's destination: the target disks the migration copies into,
    /// in this host's instance directory — the root disk an empty overlay on this host's
    /// base of `image` (fetched into this host's cache first; only what the guest wrote
    /// moves), ephemeral and swap disks empty files of their size (copied whole), the
    /// config drive (read-only: never mirrored) copied through `source_uri`, the source's
    /// libvirt. Same sizes as `disks`; returns the disks here, in the same order. On
    /// failure everything made here is removed.
    async fn prepare_incoming(
        &self,
        uuid: Uuid,
        source_uri: &str,
        disks: &[InstanceDisk],
        image: Option<&ImageRef>,
        image_token: Option<String>,
    ) -> Result<Vec<InstanceDisk>, StorageError>;
}

/// The probe file a live migration's source writes in its instances directory (and removes
/// when the migration is over): `.vireo-probe-<migration id>`.
pub fn migration_probe(migration: Uuid) -> String {
    format!(".vireo-probe-{migration}")
}

/// The guest devices of `disks` ([`disk_devices`]' order).
pub fn disk_targets(disks: &[InstanceDisk]) -> Vec<String> {
    disk_devices(disks)
        .into_iter()
        .map(|d| d.target_dev)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(role: DiskRole) -> InstanceDisk {
        InstanceDisk {
            role,
            path: PathBuf::from(format!("/i/{}", role.file_name())),
            format: ImageFormat::Qcow2,
            virtual_size: 1 << 30,
            image: None,
            cache: Some(CacheMode::None),
        }
    }

    #[test]
    fn disks_are_virtio_in_order_and_the_config_drive_a_read_only_cdrom() {
        let disks = [
            disk(DiskRole::Root),
            disk(DiskRole::ConfigDrive),
            disk(DiskRole::Ephemeral),
            disk(DiskRole::Swap),
        ];
        let devs = disk_devices(&disks);
        let targets: Vec<_> = devs.iter().map(|d| d.target_dev.as_str()).collect();
        assert_eq!(targets, ["vda", "sda", "vdb", "vdc"]);
        assert_eq!(devs[1].device, DiskDevice::Cdrom);
        assert_eq!(devs[1].target_bus, DiskBus::Sata);
        assert!(devs[1].readonly);
        assert!(devs
            .iter()
            .filter(|d| !d.readonly)
            .all(|d| d.target_bus == DiskBus::Virtio));
        let xml = devs[0].to_xml().unwrap();
        assert!(
            xml.contains("type=\"qcow2\"") || xml.contains("type='qcow2'"),
            "{xml}"
        );
        assert!(xml.contains("/i/disk"), "{xml}");
    }

    #[test]
    fn a_record_of_disks_reads_back_and_refuses_unknown_fields() {
        let d = InstanceDisk {
            image: Some(ImageId::new("cirros").unwrap()),
            ..disk(DiskRole::Root)
        };
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["role"], "root");
        assert_eq!(v["format"], "qcow2");
        assert_eq!(
            serde_json::from_value::<InstanceDisk>(v.clone()).unwrap(),
            d
        );
        let mut extra = v;
        extra["size"] = 1.into();
        assert!(serde_json::from_value::<InstanceDisk>(extra).is_err());
    }

    #[test]
    fn a_plan_is_empty_only_without_any_disk() {
        let flavor = Flavor {
            name: "f".into(),
            vcpus: 1,
            memory_mb: 64,
            ..Flavor::default()
        };
        let uuid = Uuid::new_v4();
        assert!(DiskPlan::new(uuid, &flavor, None).is_empty());
        let image = ImageRef {
            id: ImageId::new("img").unwrap(),
            source: "/images/img".into(),
            checksum: None,
            format: ImageFormat::Raw,
        };
        assert!(!DiskPlan::new(uuid, &flavor, Some(image)).is_empty());
        for f in [
            Flavor {
                ephemeral_gb: 1,
                ..flavor.clone()
            },
            Flavor {
                swap_mb: 1,
                ..flavor.clone()
            },
        ] {
            assert!(!DiskPlan::new(uuid, &f, None).is_empty());
        }
        let mut cd = DiskPlan::new(uuid, &flavor, None);
        cd.config_drive = Some(vec![]);
        assert!(!cd.is_empty());
    }
}
