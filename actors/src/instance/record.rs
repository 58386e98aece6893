//! What an instance actor knows about its instance, how it is kept in the domain's
//! `<metadata>` (so a restarted agent recovers from libvirt alone), and how the domain XML is
//! built from it.

use serde::{Deserialize, Serialize};
use uuid::Uuid;
use vireo_xml::devices::{CharSource, Console, ConsoleTarget, Serial};
use vireo_xml::domain::{Domain, DomainType, LifecycleAction};
use vireo_xml::metadata::{Flavor, InFlightOperation, VireoMetadata};
use vireo_xml::types::DomainName;
use vireo_xml::XmlError;

use crate::lifecycle::InstanceState;
use crate::storage::{disk_devices, ConfigDrive, ImageRef, InstanceDisk};
use crate::vif::{NetworkInfo, VifError};
use crate::vif_config::DeviceConfig;

use super::types::Migration;

/// Why a record could not be built, stored or read back.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The domain XML or metadata is invalid.
    #[error("domain XML")]
    Xml(#[from] XmlError),
    /// The stored `network_info` does not parse.
    #[error("stored network_info")]
    NetworkInfo(#[from] VifError),
    /// The stored record JSON does not parse.
    #[error("stored record")]
    Json(#[from] serde_json::Error),
    /// The domain has no vireo metadata.
    #[error("domain has no vireo metadata")]
    NoMetadata,
    /// The domain name is not valid.
    #[error("domain name")]
    Name(#[from] vireo_xml::types::ValueError),
    /// A value is out of range.
    #[error("{0}")]
    Invalid(String),
    /// A disk of the record is not in the domain's XML.
    #[error("the domain has no disk {target}")]
    MissingDisk {
        /// The guest device the record names.
        target: String,
    },
    /// The directory of the serial console log could not be created.
    #[error("create console directory {path}")]
    ConsoleDir {
        /// The directory.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// What the guest boots besides its disks: nothing more (a diskless domain, or one that
/// boots its root disk), or a kernel given directly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum BootSource {
    /// No kernel: the domain boots its root disk when it has one (a diskless domain, for
    /// lifecycle and device work that needs no guest OS, boots nothing).
    #[default]
    None,
    /// Direct kernel boot.
    Kernel {
        /// Kernel image path on the host.
        kernel: String,
        /// Initramfs path on the host.
        #[serde(default)]
        initrd: Option<String>,
        /// Kernel command line.
        #[serde(default)]
        cmdline: Option<String>,
    },
}

/// What an instance's disks are made from, and what they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageRecord {
    /// The image of its root disk (none: no root disk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRef>,
    /// What its config drive holds besides what vireo knows (none: no config drive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_drive: Option<ConfigDrive>,
    /// Its disks on this host, in device order (empty until they are made).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<InstanceDisk>,
}

impl StorageRecord {
    /// No image, no config drive, no disks.
    pub fn is_empty(&self) -> bool {
        self.image.is_none() && self.config_drive.is_none() && self.disks.is_empty()
    }
}

/// The side of a resize an instance is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResizeRole {
    /// The host the instance left (its stopped domain waits for confirm or revert).
    Source,
    /// The host the resized instance runs on.
    Target,
}

/// A resize waiting for confirm or revert.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResizeRecord {
    /// The migration.
    pub migration: Migration,
    /// This host's role.
    pub role: ResizeRole,
    /// The flavor before the resize.
    pub old_flavor: Flavor,
    /// The instance ran before the resize (and runs again after a revert).
    pub was_running: bool,
    /// Its disks before the resize (what a revert restores on this host).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub old_disks: Vec<InstanceDisk>,
    /// A cross-host resize on an instances directory both hosts share (the destination saw
    /// the source's probe): one set of disk files, resized in place with the old ones kept
    /// in `<uuid>_resize/` (as on one host). Neither side removes the disks when it lets go
    /// of its domain: a revert puts the kept ones back, a confirm drops them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_disks: bool,
}

/// The part of the record kept as JSON in `<vireo:record>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredRecord {
    state: InstanceState,
    boot: BootSource,
    #[serde(default, skip_serializing_if = "StorageRecord::is_empty")]
    storage: StorageRecord,
    #[serde(default)]
    resize: Option<ResizeRecord>,
    /// The host whose agent saved the record last: the domain's owner. Absent in records
    /// written before vireo recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    host: Option<String>,
    /// The live migration that brought the instance to this host (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    arrived_by: Option<Uuid>,
}

/// Everything an instance actor knows about its instance.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceRecord {
    /// Instance (and domain) uuid.
    pub uuid: Uuid,
    /// Domain name.
    pub name: String,
    /// Current flavor.
    pub flavor: Flavor,
    /// What it boots.
    pub boot: BootSource,
    /// Its image, config drive and disks.
    pub storage: StorageRecord,
    /// Its VIFs.
    pub network_info: NetworkInfo,
    /// The stable state last recorded (what a restarted agent starts from).
    pub state: InstanceState,
    /// A resize waiting for confirm or revert.
    pub resize: Option<ResizeRecord>,
    /// The live migration that brought the instance to the host that holds it, once that
    /// host took it over: a source that asks again (its answer was lost) is told it is done.
    pub arrived_by: Option<Uuid>,
}

/// Host-wide settings that shape every domain vireo defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainSettings {
    /// `kvm`, `qemu` (TCG) or `test`.
    pub domain_type: DomainType,
    /// Machine type (e.g. `q35`); None lets libvirt choose.
    pub machine: Option<String>,
    /// Where serial console logs go (`<dir>/<uuid>/console.log`); None: no serial log.
    pub console_dir: Option<String>,
}

impl DomainSettings {
    /// The serial console log of instance `uuid` (`<console_dir>/<uuid>/console.log`): where
    /// its domain writes it and where its console output is read; None: no serial log.
    pub fn console_log(&self, uuid: Uuid) -> Option<String> {
        self.console_dir
            .as_ref()
            .map(|dir| format!("{dir}/{uuid}/console.log"))
    }
}

impl InstanceRecord {
    /// A resize under way whose disks are shared with the other host (resized in place):
    /// not this host's to remove.
    pub fn resize_shares_disks(&self) -> bool {
        self.resize.as_ref().is_some_and(|r| r.shared_disks)
    }

    /// The metadata element for this record as `host` saves it (the host is recorded as the
    /// domain's owner), with `operation` in flight.
    pub fn metadata(
        &self,
        host: &str,
        operation: Option<InFlightOperation>,
    ) -> Result<VireoMetadata, RecordError> {
        let stored = StoredRecord {
            state: self.state,
            boot: self.boot.clone(),
            storage: self.storage.clone(),
            resize: self.resize.clone(),
            host: Some(host.to_owned()),
            arrived_by: self.arrived_by,
        };
        Ok(VireoMetadata {
            instance_uuid: self.uuid,
            flavor: self.flavor.clone(),
            network_info: self.network_info.to_value(),
            operation,
            record: Some(serde_json::to_value(stored)?),
        })
    }

    /// Rebuild the record from a domain's name and its vireo metadata.
    pub fn from_metadata(name: &str, meta: &VireoMetadata) -> Result<Self, RecordError> {
        let network_info = NetworkInfo::from_value(&meta.network_info)?;
        let stored: StoredRecord = match &meta.record {
            Some(v) => serde_json::from_value(v.clone())?,
            None => StoredRecord {
                state: InstanceState::Stopped,
                boot: BootSource::None,
                storage: StorageRecord::default(),
                resize: None,
                host: None,
                arrived_by: None,
            },
        };
        Ok(InstanceRecord {
            uuid: meta.instance_uuid,
            name: name.to_owned(),
            flavor: meta.flavor.clone(),
            boot: stored.boot,
            storage: stored.storage,
            network_info,
            state: stored.state,
            resize: stored.resize,
            arrived_by: stored.arrived_by,
        })
    }

    /// The host that saved `meta` last (the domain's owner); None for a record written
    /// before vireo recorded the host, or metadata without a record.
    pub fn owner(meta: &VireoMetadata) -> Result<Option<String>, RecordError> {
        match &meta.record {
            Some(v) => Ok(serde_json::from_value::<StoredRecord>(v.clone())?.host),
            None => Ok(None),
        }
    }

    /// The live migration to `host` that `meta` records in flight: the domain is the guest
    /// of a migration from the host that saved it (its owner) to this one. libvirt moves the
    /// source's metadata with the domain, so this is what a destination that lost its
    /// instance actor (its agent restarted) finds.
    pub fn arriving_at(meta: &VireoMetadata, host: &str) -> Option<Migration> {
        let marker = super::in_flight::Marker::from_stored(meta.operation.as_ref()?).ok()?;
        match marker.operation {
            super::in_flight::InFlight::LiveMigrate(step) if step.migration.dest_host == host => {
                Some(step.migration)
            }
            _ => None,
        }
    }

    /// The record of a guest that arrived by live migration, from the source's record and
    /// the domain's live XML here: in state [`InstanceState::Incoming`], with each disk at
    /// the file this host's domain uses (the source's XML named the destination's files for
    /// a migration that copied them; on a shared directory they are the same).
    pub fn arrived(self, live_xml: &str) -> Result<InstanceRecord, RecordError> {
        let mut this = self.arriving();
        this.disks_from(live_xml)?;
        Ok(this)
    }

    /// The record of a guest still arriving by live migration (libvirt does not show its
    /// XML until the migration ended), from the source's record: in state
    /// [`InstanceState::Incoming`], its disks as the source named them until
    /// [`Self::disks_from`] reads them from the arrived domain.
    pub fn arriving(mut self) -> InstanceRecord {
        self.state = InstanceState::Incoming;
        self
    }

    /// Each disk at the file the domain whose live XML is `live_xml` uses for it.
    pub fn disks_from(&mut self, live_xml: &str) -> Result<(), RecordError> {
        let domain = Domain::from_xml(live_xml)?;
        let targets = crate::storage::disk_targets(&self.storage.disks);
        for (disk, target) in self.storage.disks.iter_mut().zip(targets) {
            let here = domain
                .devices
                .disks
                .iter()
                .find(|d| d.target_dev == target)
                .ok_or(RecordError::MissingDisk { target })?;
            if let vireo_xml::devices::DiskSource::File { path } = &here.source {
                disk.path = std::path::PathBuf::from(path);
            }
        }
        Ok(())
    }

    /// The directory of its serial console log (`<console_dir>/<uuid>`), when the settings
    /// give the domain one.
    pub fn console_log_dir(&self, settings: &DomainSettings) -> Option<String> {
        settings
            .console_dir
            .as_ref()
            .map(|dir| format!("{dir}/{}", self.uuid))
    }

    /// Create [`Self::console_log_dir`] (and its parents) when there is one: libvirt opens
    /// the log file but does not create its directory, so a domain defined on a host where
    /// it was never created (a spawn, or a resize's or a revert's destination) could not
    /// start otherwise.
    pub fn prepare_console_log_dir(&self, settings: &DomainSettings) -> Result<(), RecordError> {
        let Some(dir) = self.console_log_dir(settings) else {
            return Ok(());
        };
        std::fs::create_dir_all(&dir)
            .map_err(|source| RecordError::ConsoleDir { path: dir, source })
    }

    /// Remove [`Self::console_log_dir`] if it is empty (what [`Self::prepare_console_log_dir`]
    /// made for a domain that never started here); anything in it stays.
    pub fn remove_empty_console_log_dir(&self, settings: &DomainSettings) {
        if let Some(dir) = self.console_log_dir(settings) {
            // ENOTEMPTY or ENOENT: nothing of ours to remove.
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// The domain definition as `host` defines it: flavor, boot source, the VIF devices (in
    /// `network_info` order), a serial console, and the metadata (naming `host` the owner).
    pub fn domain(
        &self,
        settings: &DomainSettings,
        host: &str,
        devices: Vec<DeviceConfig>,
        operation: Option<InFlightOperation>,
    ) -> Result<Domain, RecordError> {
        let name = DomainName::new(self.name.clone())?;
        let mut d = Domain::new(name);
        d.domain_type = settings.domain_type;
        d.uuid = Some(self.uuid);
        d.metadata = Some(self.metadata(host, operation)?);
        d.memory_kib = self
            .flavor
            .memory_mb
            .checked_mul(1024)
            .filter(|m| *m > 0)
            .ok_or_else(|| RecordError::Invalid(format!("memory_mb {}", self.flavor.memory_mb)))?;
        if self.flavor.vcpus == 0 {
            return Err(RecordError::Invalid("vcpus 0".to_owned()));
        }
        d.vcpus = self.flavor.vcpus;
        d.os.machine = settings.machine.clone();
        if matches!(settings.domain_type, DomainType::Kvm | DomainType::Qemu) {
            // Without ACPI QEMU has no PCI hot-plug on i440fx (interface attach fails with
            // "Bus 'pci.0' does not support hotplugging") and the guest never sees the
            // power button (graceful power off and soft reboot).
            d.features.acpi = true;
            d.features.apic = true;
        }
        d.on_poweroff = Some(LifecycleAction::Destroy);
        d.on_reboot = Some(LifecycleAction::Restart);
        d.on_crash = Some(LifecycleAction::Destroy);
        match &self.boot {
            BootSource::None => {}
            BootSource::Kernel {
                kernel,
                initrd,
                cmdline,
            } => {
                d.os.kernel = Some(kernel.clone());
                d.os.initrd = initrd.clone();
                d.os.cmdline = cmdline.clone();
            }
        }
        d.devices.disks.extend(disk_devices(&self.storage.disks));
        if let Some(file) = settings.console_log(self.uuid) {
            d.devices.serials.push(Serial {
                source: CharSource::File {
                    path: file,
                    append: Some(true),
                },
                log: None,
                port: Some(0),
                alias: None,
            });
            d.devices.consoles.push(Console {
                source: CharSource::Pty { path: None },
                target: Some(ConsoleTarget::Serial),
                port: Some(0),
                alias: None,
            });
        }
        for dev in devices {
            dev.add_to(&mut d.devices);
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vireo_xml::metadata::Flavor;

    fn record() -> InstanceRecord {
        InstanceRecord {
            uuid: Uuid::new_v4(),
            name: "vm-1".into(),
            flavor: Flavor {
                name: "m1".into(),
                vcpus: 1,
                memory_mb: 128,
                root_gb: 0,
                ephemeral_gb: 0,
                swap_mb: 0,
                extra_specs: Default::default(),
            },
            boot: BootSource::None,
            storage: StorageRecord::default(),
            network_info: NetworkInfo { vifs: vec![] },
            state: InstanceState::Building,
            resize: None,
            arrived_by: None,
        }
    }

    #[test]
    fn the_saving_host_is_recorded_as_the_owner_and_older_records_have_none() {
        let r = record();
        let meta = r.metadata("h1", None).unwrap();
        let xml = meta.to_xml().unwrap();
        let back = VireoMetadata::from_xml(&xml).unwrap();
        assert_eq!(InstanceRecord::owner(&back).unwrap().as_deref(), Some("h1"));
        assert_eq!(InstanceRecord::from_metadata("vm-1", &back).unwrap(), r);
        // Another host saving the same record (a migration's or resize's destination)
        // becomes its owner.
        let moved = r.metadata("h2", None).unwrap();
        assert_eq!(
            InstanceRecord::owner(&moved).unwrap().as_deref(),
            Some("h2")
        );
        // The definition carries it too.
        let settings = DomainSettings {
            domain_type: DomainType::Test,
            machine: None,
            console_dir: None,
        };
        let d = r.domain(&settings, "h3", vec![], None).unwrap();
        let m = d.metadata.unwrap();
        assert_eq!(InstanceRecord::owner(&m).unwrap().as_deref(), Some("h3"));
        // A record written before the owner was recorded: no owner, still readable.
        let mut old = back.clone();
        old.record = Some(serde_json::json!({"state": "running", "boot": {"type": "none"}}));
        assert_eq!(InstanceRecord::owner(&old).unwrap(), None);
        assert_eq!(
            InstanceRecord::from_metadata("vm-1", &old).unwrap().state,
            InstanceState::Running
        );
        old.record = None;
        assert_eq!(InstanceRecord::owner(&old).unwrap(), None);
        // An owner that is not a string: a typed error, not a panic.
        old.record =
            Some(serde_json::json!({"state": "running", "boot": {"type": "none"}, "host": 7}));
        assert!(matches!(
            InstanceRecord::owner(&old),
            Err(RecordError::Json(_))
        ));
    }

    #[test]
    fn a_guest_migrating_here_is_recognised_and_takes_this_hosts_disk_files() {
        use super::super::in_flight::{InFlight, Marker, MigrationStep};
        use crate::storage::{DiskRole, ImageFormat};
        let disk = |role: DiskRole, dir: &str| InstanceDisk {
            role,
            path: std::path::PathBuf::from(format!("{dir}/{}", role.file_name())),
            format: ImageFormat::Qcow2,
            virtual_size: 1 << 30,
            image: None,
            cache: None,
        };
        let mut r = record();
        r.state = InstanceState::Running;
        r.storage.disks = vec![disk(DiskRole::Root, "/a"), disk(DiskRole::Swap, "/a")];
        let marker = |dest: &str| Marker {
            id: "op-1".into(),
            phase: "migrate".into(),
            started_at: 0,
            operation: InFlight::LiveMigrate(MigrationStep::of(Migration {
                id: Uuid::new_v4(),
                source_host: "h1".into(),
                dest_host: dest.into(),
            })),
        };
        let meta = r
            .metadata("h1", Some(marker("h2").to_stored().unwrap()))
            .unwrap();
        let arriving = InstanceRecord::arriving_at(&meta, "h2").unwrap();
        assert_eq!(
            (arriving.source_host.as_str(), arriving.dest_host.as_str()),
            ("h1", "h2")
        );
        // Not to this host, or no migration in flight: not arriving.
        assert!(InstanceRecord::arriving_at(&meta, "h3").is_none());
        assert!(InstanceRecord::arriving_at(&r.metadata("h1", None).unwrap(), "h2").is_none());

        // The destination's domain names its own files (the source rewrote them).
        let settings = DomainSettings {
            domain_type: DomainType::Test,
            machine: None,
            console_dir: None,
        };
        let mut there = r.clone();
        there.storage.disks = vec![disk(DiskRole::Root, "/b"), disk(DiskRole::Swap, "/b")];
        let live = there
            .domain(&settings, "h1", vec![], None)
            .unwrap()
            .to_xml()
            .unwrap();
        let arrived = r.clone().arrived(&live).unwrap();
        assert_eq!(arrived.state, InstanceState::Incoming);
        assert_eq!(arrived.storage.disks, there.storage.disks);
        // A domain without one of the record's disks: a typed error.
        there.storage.disks.pop();
        let live = there
            .domain(&settings, "h1", vec![], None)
            .unwrap()
            .to_xml()
            .unwrap();
        assert!(matches!(
            r.arrived(&live),
            Err(RecordError::MissingDisk { target }) if target == "vdb"
        ));
    }

    #[test]
    fn qemu_and_kvm_domains_have_acpi_for_hotplug_and_the_power_button() {
        for (t, acpi) in [
            (DomainType::Kvm, true),
            (DomainType::Qemu, true),
            (DomainType::Test, false),
        ] {
            let settings = DomainSettings {
                domain_type: t,
                machine: None,
                console_dir: None,
            };
            let d = record().domain(&settings, "h1", vec![], None).unwrap();
            assert_eq!(d.features.acpi, acpi, "{t:?}");
            assert_eq!(d.features.apic, acpi, "{t:?}");
            let xml = d.to_xml().unwrap();
            assert_eq!(xml.contains("<acpi/>"), acpi, "{t:?}: {xml}");
        }
    }

    #[test]
    fn the_console_log_directory_is_created_before_a_define_needs_it() {
        let tmp = tempfile::tempdir().unwrap();
        let r = record();
        let none = DomainSettings {
            domain_type: DomainType::Qemu,
            machine: None,
            console_dir: None,
        };
        assert_eq!(r.console_log_dir(&none), None);
        r.prepare_console_log_dir(&none).unwrap();
        let base = tmp.path().join("instances");
        let settings = DomainSettings {
            console_dir: Some(base.display().to_string()),
            ..none
        };
        let dir = base.join(r.uuid.to_string());
        assert_eq!(
            r.console_log_dir(&settings).as_deref(),
            Some(dir.to_str().unwrap())
        );
        // The serial log the definition names lives in that directory.
        let xml = r
            .domain(&settings, "h1", vec![], None)
            .unwrap()
            .to_xml()
            .unwrap();
        assert!(
            xml.contains(&format!("{}/console.log", dir.display())),
            "{xml}"
        );
        r.prepare_console_log_dir(&settings).unwrap();
        assert!(dir.is_dir());
        // Twice is fine (a resize or revert defines again).
        r.prepare_console_log_dir(&settings).unwrap();
        // A live migration's rollback removes it while empty, never with a log in it.
        r.remove_empty_console_log_dir(&settings);
        assert!(!dir.exists());
        r.prepare_console_log_dir(&settings).unwrap();
        std::fs::write(dir.join("console.log"), "boot").unwrap();
        r.remove_empty_console_log_dir(&settings);
        assert!(dir.join("console.log").exists());
        // A file in the way: a typed error naming the directory.
        let blocked = DomainSettings {
            console_dir: Some(tmp.path().join("file").display().to_string()),
            ..settings
        };
        std::fs::write(tmp.path().join("file"), "x").unwrap();
        match r.prepare_console_log_dir(&blocked) {
            Err(RecordError::ConsoleDir { path, .. }) => {
                assert!(path.ends_with(&r.uuid.to_string()))
            }
            other => panic!("{other:?}"),
        }
    }
}
