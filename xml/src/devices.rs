//! Non-network devices: disks (file, block, rbd), PCI passthrough hostdevs, serial ports and
//! consoles, plus the guest-side [`DeviceAddress`] libvirt assigns to every device.

use serde::Deserialize;
use uuid::Uuid;

use crate::error::XmlError;
use crate::parse::{self, check_root, keyword, opt_num, owned, req, Str};
use crate::types::PciAddress;
use crate::write::Writer;

// ---------------------------------------------------------------------------------------
// Guest address
// ---------------------------------------------------------------------------------------

/// Where a device sits in the guest (`<address>`), as libvirt assigns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceAddress {
    /// `type='pci'`.
    Pci(PciAddress),
    /// `type='drive'` (SATA/SCSI/IDE disks).
    Drive {
        /// Controller index.
        controller: u32,
        /// Bus.
        bus: u32,
        /// Target.
        target: u32,
        /// Unit.
        unit: u32,
    },
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct AddressW<'a> {
    #[serde(borrow, rename = "@type")]
    kind: Option<Str<'a>>,
    #[serde(borrow, rename = "@domain")]
    domain: Option<Str<'a>>,
    #[serde(borrow, rename = "@bus")]
    bus: Option<Str<'a>>,
    #[serde(borrow, rename = "@slot")]
    slot: Option<Str<'a>>,
    #[serde(borrow, rename = "@function")]
    function: Option<Str<'a>>,
    #[serde(borrow, rename = "@controller")]
    controller: Option<Str<'a>>,
    #[serde(borrow, rename = "@target")]
    target: Option<Str<'a>>,
    #[serde(borrow, rename = "@unit")]
    unit: Option<Str<'a>>,
}

impl AddressW<'_> {
    /// A host PCI address (`<source><address .../></source>`; `type` absent or `pci`).
    pub(crate) fn host_pci(self, field: &dyn Fn() -> String) -> Result<PciAddress, XmlError> {
        match self.kind.as_deref() {
            None | Some("pci") => {}
            Some(other) => return Err(XmlError::unsupported(format!("{}/@type", field()), other)),
        }
        parse::pci(self.domain, self.bus, self.slot, self.function, field)
    }

    /// A guest address; address types vireo does not model (usb, isa, virtio-serial, ...)
    /// give `None`.
    pub(crate) fn guest(
        self,
        field: &dyn Fn() -> String,
    ) -> Result<Option<DeviceAddress>, XmlError> {
        match self.kind.as_deref() {
            Some("pci") => Ok(Some(DeviceAddress::Pci(parse::pci(
                self.domain,
                self.bus,
                self.slot,
                self.function,
                field,
            )?))),
            Some("drive") => {
                let n = |v: Option<Str<'_>>, name: &str| -> Result<u32, XmlError> {
                    Ok(opt_num(v, || format!("{}/@{name}", field()))?.unwrap_or(0))
                };
                Ok(Some(DeviceAddress::Drive {
                    controller: n(self.controller, "controller")?,
                    bus: n(self.bus, "bus")?,
                    target: n(self.target, "target")?,
                    unit: n(self.unit, "unit")?,
                }))
            }
            _ => Ok(None),
        }
    }
}

impl DeviceAddress {
    pub(crate) fn write(&self, w: &mut Writer) {
        w.open("address");
        match self {
            DeviceAddress::Pci(pci) => {
                w.attr_raw("type", "pci");
                w.attrs_pci(pci);
            }
            DeviceAddress::Drive {
                controller,
                bus,
                target,
                unit,
            } => {
                w.attr_raw("type", "drive");
                w.attr_u64("controller", u64::from(*controller));
                w.attr_u64("bus", u64::from(*bus));
                w.attr_u64("target", u64::from(*target));
                w.attr_u64("unit", u64::from(*unit));
            }
        }
        w.close_empty();
    }
}

/// `<source><address domain= bus= slot= function=/></source>` for a host PCI device. The
/// schema wants `type='pci'` on an `<interface type='hostdev'>`'s source address and no
/// `type` on a `<hostdev>`'s.
pub(crate) fn write_host_pci_source(w: &mut Writer, pci: &PciAddress, typed: bool) {
    w.raw("<source>");
    w.open("address");
    if typed {
        w.attr_raw("type", "pci");
    }
    w.attrs_pci(pci);
    w.close_empty();
    w.raw("</source>");
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct NameW<'a> {
    #[serde(borrow, rename = "@name")]
    pub(crate) name: Option<Str<'a>>,
}

pub(crate) fn write_alias(w: &mut Writer, alias: Option<&str>) -> Result<(), XmlError> {
    if let Some(a) = alias {
        w.open("alias");
        w.attr("name", a)?;
        w.close_empty();
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Hostdev
// ---------------------------------------------------------------------------------------

/// A whole PCI device given to the guest (`<hostdev mode='subsystem' type='pci'>`): an SR-IOV
/// physical function for `direct-physical` ports, or any passthrough device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hostdev {
    /// The host PCI address.
    pub source: PciAddress,
    /// libvirt detaches the device from its host driver and reattaches it afterwards.
    pub managed: bool,
    /// libvirt's device alias (live XML), e.g. `hostdev0`.
    pub alias: Option<String>,
    /// Guest address (live XML).
    pub address: Option<DeviceAddress>,
}

impl Hostdev {
    /// A managed PCI passthrough of `source`.
    pub fn pci(source: PciAddress) -> Self {
        Hostdev {
            source,
            managed: true,
            alias: None,
            address: None,
        }
    }

    /// The `<hostdev>` element alone (for attach/detach).
    pub fn to_xml(&self) -> Result<String, XmlError> {
        let mut w = Writer::with_capacity(256);
        self.write(&mut w)?;
        Ok(w.out)
    }

    /// Parse a `<hostdev>` element.
    pub fn from_xml(xml: &str) -> Result<Self, XmlError> {
        check_root(xml, "hostdev")?;
        let wire: HostdevW<'_> = crate::parse::de(xml)?;
        Hostdev::from_wire(wire, &|| "hostdev".to_owned())
    }

    /// The host PCI address of a `<hostdev>` in a live document (`None` for non-PCI
    /// hostdevs), for selecting it in a rewrite.
    pub(crate) fn peek_source(xml: &str) -> Result<Option<PciAddress>, XmlError> {
        let h: HostdevW<'_> = crate::parse::de(xml)?;
        if h.kind.as_deref() != Some("pci") {
            return Ok(None);
        }
        match h.source.and_then(|s| s.address) {
            None => Ok(None),
            Some(a) => a
                .host_pci(&|| "hostdev/source/address".to_owned())
                .map(Some),
        }
    }

    pub(crate) fn write(&self, w: &mut Writer) -> Result<(), XmlError> {
        w.open("hostdev");
        w.attr_raw("mode", "subsystem");
        w.attr_raw("type", "pci");
        w.attr_bool("managed", self.managed, "yes", "no");
        w.close_start();
        write_host_pci_source(w, &self.source, false);
        write_alias(w, self.alias.as_deref())?;
        if let Some(a) = &self.address {
            a.write(w);
        }
        w.end("hostdev");
        Ok(())
    }

    pub(crate) fn from_wire(h: HostdevW<'_>, ctx: &dyn Fn() -> String) -> Result<Self, XmlError> {
        match h.mode.as_deref() {
            Some("subsystem") | None => {}
            Some(other) => return Err(XmlError::unsupported(format!("{}/@mode", ctx()), other)),
        }
        let kind = req(h.kind, || format!("{}/@type", ctx()))?;
        if &*kind != "pci" {
            return Err(XmlError::unsupported(format!("{}/@type", ctx()), &kind));
        }
        let managed = match h.managed {
            None => false,
            Some(m) => parse::yes_no(&m, || format!("{}/@managed", ctx()))?,
        };
        let address = h
            .source
            .and_then(|s| s.address)
            .ok_or_else(|| XmlError::missing(format!("{}/source/address", ctx())))?;
        let source = address.host_pci(&|| format!("{}/source/address", ctx()))?;
        Ok(Hostdev {
            source,
            managed,
            alias: h.alias.and_then(|a| a.name).map(Str::into_string),
            address: match h.address {
                Some(a) => a.guest(&|| format!("{}/address", ctx()))?,
                None => None,
            },
        })
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct SourceAddressW<'a> {
    #[serde(borrow)]
    pub(crate) address: Option<AddressW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct HostdevW<'a> {
    #[serde(borrow, rename = "@mode")]
    mode: Option<Str<'a>>,
    #[serde(borrow, rename = "@type")]
    kind: Option<Str<'a>>,
    #[serde(borrow, rename = "@managed")]
    managed: Option<Str<'a>>,
    #[serde(borrow)]
    source: Option<SourceAddressW<'a>>,
    #[serde(borrow)]
    alias: Option<NameW<'a>>,
    #[serde(borrow)]
    address: Option<AddressW<'a>>,
}

// ---------------------------------------------------------------------------------------
// Disk
// ---------------------------------------------------------------------------------------

keywords! {
    /// `<disk device=...>`.
    pub enum DiskDevice {
        /// A disk.
        Disk = "disk",
        /// A CD-ROM.
        Cdrom = "cdrom",
        /// A SCSI LUN passed through.
        Lun = "lun",
    }
}

keywords! {
    /// `<target bus=...>`.
    pub enum DiskBus {
        /// virtio-blk.
        Virtio = "virtio",
        /// SATA (AHCI).
        Sata = "sata",
        /// SCSI (virtio-scsi controller).
        Scsi = "scsi",
        /// IDE.
        Ide = "ide",
        /// USB storage.
        Usb = "usb",
    }
}

keywords! {
    /// `<driver type=...>`: the image format.
    pub enum DiskFormat {
        /// Raw.
        Raw = "raw",
        /// qcow2.
        Qcow2 = "qcow2",
    }
}

keywords! {
    /// `<driver cache=...>`.
    pub enum DiskCache {
        /// O_DIRECT, no host cache.
        None = "none",
        /// Host page cache, write-back.
        Writeback = "writeback",
        /// Host page cache, write-through.
        Writethrough = "writethrough",
        /// O_DIRECT + O_DSYNC.
        Directsync = "directsync",
        /// Ignore flushes.
        Unsafe = "unsafe",
    }
}

/// `<driver name='qemu' type= cache=/>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskDriver {
    /// Image format.
    pub format: DiskFormat,
    /// Cache mode.
    pub cache: Option<DiskCache>,
    /// Pass discards to the image (`discard='unmap'`).
    pub discard_unmap: bool,
}

/// The Ceph credentials of an rbd disk: `<auth username=><secret type='ceph' uuid=/></auth>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskAuth {
    /// The Ceph user.
    pub username: String,
    /// The libvirt secret holding the key.
    pub secret_uuid: Uuid,
}

/// One monitor of an rbd disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdHost {
    /// Host name or address.
    pub name: String,
    /// Port (libvirt's default is 6789).
    pub port: Option<u16>,
}

/// Where a disk's data is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskSource {
    /// An image file (`type='file'`).
    File {
        /// Path on the host.
        path: String,
    },
    /// A block device (`type='block'`).
    Block {
        /// Device path on the host.
        dev: String,
    },
    /// A Ceph RBD image (`type='network'`, `protocol='rbd'`).
    Rbd {
        /// `pool/image`.
        name: String,
        /// Monitors.
        hosts: Vec<RbdHost>,
        /// Credentials.
        auth: Option<DiskAuth>,
    },
}

/// A `<disk>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    /// Disk or CD-ROM.
    pub device: DiskDevice,
    /// Where the data is.
    pub source: DiskSource,
    /// Format and cache.
    pub driver: Option<DiskDriver>,
    /// Guest device name (`vda`).
    pub target_dev: String,
    /// Guest bus.
    pub target_bus: DiskBus,
    /// Read-only.
    pub readonly: bool,
    /// Serial number shown to the guest.
    pub serial: Option<String>,
    /// libvirt's alias (live XML).
    pub alias: Option<String>,
    /// Guest address (live XML).
    pub address: Option<DeviceAddress>,
}

impl Disk {
    /// A virtio disk backed by `source`.
    pub fn virtio(source: DiskSource, target_dev: impl Into<String>) -> Self {
        Disk {
            device: DiskDevice::Disk,
            source,
            driver: None,
            target_dev: target_dev.into(),
            target_bus: DiskBus::Virtio,
            readonly: false,
            serial: None,
            alias: None,
            address: None,
        }
    }

    /// The `<disk>` element alone.
    pub fn to_xml(&self) -> Result<String, XmlError> {
        let mut w = Writer::with_capacity(256);
        self.write(&mut w)?;
        Ok(w.out)
    }

    /// Parse a `<disk>` element.
    pub fn from_xml(xml: &str) -> Result<Self, XmlError> {
        check_root(xml, "disk")?;
        let wire: DiskW<'_> = crate::parse::de(xml)?;
        Disk::from_wire(wire, &|| "disk".to_owned())
    }

    pub(crate) fn write(&self, w: &mut Writer) -> Result<(), XmlError> {
        w.open("disk");
        w.attr_raw(
            "type",
            match self.source {
                DiskSource::File { .. } => "file",
                DiskSource::Block { .. } => "block",
                DiskSource::Rbd { .. } => "network",
            },
        );
        w.attr_raw("device", self.device.as_str());
        w.close_start();
        if let Some(d) = &self.driver {
            w.open("driver");
            w.attr_raw("name", "qemu");
            w.attr_raw("type", d.format.as_str());
            if let Some(c) = d.cache {
                w.attr_raw("cache", c.as_str());
            }
            if d.discard_unmap {
                w.attr_raw("discard", "unmap");
            }
            w.close_empty();
        }
        match &self.source {
            DiskSource::File { path } => {
                w.open("source");
                w.attr("file", path)?;
                w.close_empty();
            }
            DiskSource::Block { dev } => {
                w.open("source");
                w.attr("dev", dev)?;
                w.close_empty();
            }
            DiskSource::Rbd { name, hosts, auth } => {
                if let Some(a) = auth {
                    w.open("auth");
                    w.attr("username", &a.username)?;
                    w.close_start();
                    w.open("secret");
                    w.attr_raw("type", "ceph");
                    w.attr_uuid("uuid", &a.secret_uuid);
                    w.close_empty();
                    w.end("auth");
                }
                w.open("source");
                w.attr_raw("protocol", "rbd");
                w.attr("name", name)?;
                if hosts.is_empty() {
                    w.close_empty();
                } else {
                    w.close_start();
                    for h in hosts {
                        w.open("host");
                        w.attr("name", &h.name)?;
                        if let Some(p) = h.port {
                            w.attr_u64("port", u64::from(p));
                        }
                        w.close_empty();
                    }
                    w.end("source");
                }
            }
        }
        w.open("target");
        w.attr("dev", &self.target_dev)?;
        w.attr_raw("bus", self.target_bus.as_str());
        w.close_empty();
        if self.readonly {
            w.raw("<readonly/>");
        }
        if let Some(s) = &self.serial {
            w.text_elem("serial", s)?;
        }
        write_alias(w, self.alias.as_deref())?;
        if let Some(a) = &self.address {
            a.write(w);
        }
        w.end("disk");
        Ok(())
    }

    pub(crate) fn from_wire(d: DiskW<'_>, ctx: &dyn Fn() -> String) -> Result<Self, XmlError> {
        let kind = req(d.kind, || format!("{}/@type", ctx()))?;
        let device = match d.device {
            None => DiskDevice::Disk,
            Some(s) => keyword(&s, DiskDevice::parse, || format!("{}/@device", ctx()))?,
        };
        let src = d.source.unwrap_or_default();
        let source = match &*kind {
            "file" => DiskSource::File {
                path: req(src.file, || format!("{}/source/@file", ctx()))?.into_string(),
            },
            "block" => DiskSource::Block {
                dev: req(src.dev, || format!("{}/source/@dev", ctx()))?.into_string(),
            },
            "network" => {
                let protocol = req(src.protocol, || format!("{}/source/@protocol", ctx()))?;
                if &*protocol != "rbd" {
                    return Err(XmlError::unsupported(
                        format!("{}/source/@protocol", ctx()),
                        &protocol,
                    ));
                }
                let auth = match d.auth.or(src.auth) {
                    None => None,
                    Some(a) => {
                        let username = req(a.username, || format!("{}/auth/@username", ctx()))?;
                        let secret = a.secret.and_then(|s| s.uuid).ok_or_else(|| {
                            XmlError::missing(format!("{}/auth/secret/@uuid", ctx()))
                        })?;
                        Some(DiskAuth {
                            username: username.into_string(),
                            secret_uuid: parse::uuid(&secret, || {
                                format!("{}/auth/secret/@uuid", ctx())
                            })?,
                        })
                    }
                };
                let mut hosts = Vec::with_capacity(src.host.len());
                for (i, h) in src.host.into_iter().enumerate() {
                    hosts.push(RbdHost {
                        name: req(h.name, || format!("{}/source/host[{i}]/@name", ctx()))?
                            .into_string(),
                        port: opt_num(h.port, || format!("{}/source/host[{i}]/@port", ctx()))?,
                    });
                }
                DiskSource::Rbd {
                    name: req(src.name, || format!("{}/source/@name", ctx()))?.into_string(),
                    hosts,
                    auth,
                }
            }
            other => return Err(XmlError::unsupported(format!("{}/@type", ctx()), other)),
        };
        let driver = match d.driver {
            None => None,
            Some(dr) => match dr.format {
                // A driver without a format carries nothing vireo models.
                None => None,
                Some(f) => Some(DiskDriver {
                    format: keyword(&f, DiskFormat::parse, || format!("{}/driver/@type", ctx()))?,
                    cache: dr
                        .cache
                        .map(|c| {
                            keyword(&c, DiskCache::parse, || format!("{}/driver/@cache", ctx()))
                        })
                        .transpose()?,
                    discard_unmap: dr.discard.as_deref() == Some("unmap"),
                }),
            },
        };
        let target = d
            .target
            .ok_or_else(|| XmlError::missing(format!("{}/target", ctx())))?;
        Ok(Disk {
            device,
            source,
            driver,
            target_dev: req(target.dev, || format!("{}/target/@dev", ctx()))?.into_string(),
            target_bus: match target.bus {
                None => DiskBus::Virtio,
                Some(b) => keyword(&b, DiskBus::parse, || format!("{}/target/@bus", ctx()))?,
            },
            readonly: d.readonly.is_some(),
            serial: owned(d.serial),
            alias: d.alias.and_then(|a| a.name).map(Str::into_string),
            address: match d.address {
                Some(a) => a.guest(&|| format!("{}/address", ctx()))?,
                None => None,
            },
        })
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct DiskW<'a> {
    #[serde(borrow, rename = "@type")]
    kind: Option<Str<'a>>,
    #[serde(borrow, rename = "@device")]
    device: Option<Str<'a>>,
    #[serde(borrow)]
    driver: Option<DiskDriverW<'a>>,
    #[serde(borrow)]
    source: Option<DiskSourceW<'a>>,
    #[serde(borrow)]
    auth: Option<AuthW<'a>>,
    #[serde(borrow)]
    target: Option<DiskTargetW<'a>>,
    readonly: Option<serde::de::IgnoredAny>,
    #[serde(borrow)]
    serial: Option<Str<'a>>,
    #[serde(borrow)]
    alias: Option<NameW<'a>>,
    #[serde(borrow)]
    address: Option<AddressW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct DiskDriverW<'a> {
    #[serde(borrow, rename = "@type")]
    format: Option<Str<'a>>,
    #[serde(borrow, rename = "@cache")]
    cache: Option<Str<'a>>,
    #[serde(borrow, rename = "@discard")]
    discard: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct DiskSourceW<'a> {
    #[serde(borrow, rename = "@file")]
    file: Option<Str<'a>>,
    #[serde(borrow, rename = "@dev")]
    dev: Option<Str<'a>>,
    #[serde(borrow, rename = "@protocol")]
    protocol: Option<Str<'a>>,
    #[serde(borrow, rename = "@name")]
    name: Option<Str<'a>>,
    #[serde(borrow, default)]
    host: Vec<HostW<'a>>,
    #[serde(borrow)]
    auth: Option<AuthW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct HostW<'a> {
    #[serde(borrow, rename = "@name")]
    name: Option<Str<'a>>,
    #[serde(borrow, rename = "@port")]
    port: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct AuthW<'a> {
    #[serde(borrow, rename = "@username")]
    username: Option<Str<'a>>,
    #[serde(borrow)]
    secret: Option<SecretW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct SecretW<'a> {
    #[serde(borrow, rename = "@uuid")]
    uuid: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct DiskTargetW<'a> {
    #[serde(borrow, rename = "@dev")]
    dev: Option<Str<'a>>,
    #[serde(borrow, rename = "@bus")]
    bus: Option<Str<'a>>,
}

// ---------------------------------------------------------------------------------------
// Serial and console
// ---------------------------------------------------------------------------------------

keywords! {
    /// `<source mode=...>` of a UNIX socket character device.
    pub enum UnixMode {
        /// libvirt/QEMU listens.
        Bind = "bind",
        /// QEMU connects.
        Connect = "connect",
    }
}

/// The host side of a serial port or console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CharSource {
    /// A pseudo-terminal (`type='pty'`); live XML reports its path.
    Pty {
        /// `/dev/pts/N` (live XML).
        path: Option<String>,
    },
    /// Output to a file (`type='file'`).
    File {
        /// Path.
        path: String,
        /// Append instead of truncating.
        append: Option<bool>,
    },
    /// A UNIX socket (`type='unix'`).
    Unix {
        /// Socket path.
        path: String,
        /// Who listens.
        mode: UnixMode,
    },
}

/// `<log file= append=/>`: a copy of the output, as Nova uses for `console.log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharLog {
    /// Log file.
    pub file: String,
    /// Append instead of truncating.
    pub append: Option<bool>,
}

/// A `<serial>` port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serial {
    /// Host side.
    pub source: CharSource,
    /// Log copy.
    pub log: Option<CharLog>,
    /// Guest port number.
    pub port: Option<u32>,
    /// libvirt's alias (live XML).
    pub alias: Option<String>,
}

keywords! {
    /// `<console><target type=...>`.
    pub enum ConsoleTarget {
        /// The console is the first serial port.
        Serial = "serial",
        /// A virtio console.
        Virtio = "virtio",
    }
}

/// A `<console>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Console {
    /// Host side.
    pub source: CharSource,
    /// Guest side.
    pub target: Option<ConsoleTarget>,
    /// Guest port number.
    pub port: Option<u32>,
    /// libvirt's alias (live XML).
    pub alias: Option<String>,
}

fn char_type(s: &CharSource) -> &'static str {
    match s {
        CharSource::Pty { .. } => "pty",
        CharSource::File { .. } => "file",
        CharSource::Unix { .. } => "unix",
    }
}

fn write_char_source(w: &mut Writer, s: &CharSource) -> Result<(), XmlError> {
    match s {
        CharSource::Pty { path: None } => {}
        CharSource::Pty { path: Some(p) } => {
            w.open("source");
            w.attr("path", p)?;
            w.close_empty();
        }
        CharSource::File { path, append } => {
            w.open("source");
            w.attr("path", path)?;
            if let Some(a) = append {
                w.attr_bool("append", *a, "on", "off");
            }
            w.close_empty();
        }
        CharSource::Unix { path, mode } => {
            w.open("source");
            w.attr_raw("mode", mode.as_str());
            w.attr("path", path)?;
            w.close_empty();
        }
    }
    Ok(())
}

impl Serial {
    /// A pty serial port on port 0.
    pub fn pty() -> Self {
        Serial {
            source: CharSource::Pty { path: None },
            log: None,
            port: Some(0),
            alias: None,
        }
    }

    pub(crate) fn write(&self, w: &mut Writer) -> Result<(), XmlError> {
        w.open("serial");
        w.attr_raw("type", char_type(&self.source));
        w.close_start();
        write_char_source(w, &self.source)?;
        if let Some(l) = &self.log {
            w.open("log");
            w.attr("file", &l.file)?;
            if let Some(a) = l.append {
                w.attr_bool("append", a, "on", "off");
            }
            w.close_empty();
        }
        if let Some(p) = self.port {
            w.open("target");
            w.attr_u64("port", u64::from(p));
            w.close_empty();
        }
        write_alias(w, self.alias.as_deref())?;
        w.end("serial");
        Ok(())
    }

    pub(crate) fn from_wire(mut c: CharW<'_>, ctx: &dyn Fn() -> String) -> Result<Self, XmlError> {
        let (source, target, alias) = c.parts(ctx)?;
        Ok(Serial {
            source,
            log: match c.log {
                None => None,
                Some(l) => Some(CharLog {
                    file: req(l.file, || format!("{}/log/@file", ctx()))?.into_string(),
                    append: l
                        .append
                        .map(|a| parse::on_off(&a, || format!("{}/log/@append", ctx())))
                        .transpose()?,
                }),
            },
            port: target.1,
            alias,
        })
    }
}

impl Console {
    /// A pty console on the first serial port.
    pub fn pty_serial() -> Self {
        Console {
            source: CharSource::Pty { path: None },
            target: Some(ConsoleTarget::Serial),
            port: Some(0),
            alias: None,
        }
    }

    pub(crate) fn write(&self, w: &mut Writer) -> Result<(), XmlError> {
        w.open("console");
        w.attr_raw("type", char_type(&self.source));
        w.close_start();
        write_char_source(w, &self.source)?;
        if self.target.is_some() || self.port.is_some() {
            w.open("target");
            if let Some(t) = self.target {
                w.attr_raw("type", t.as_str());
            }
            if let Some(p) = self.port {
                w.attr_u64("port", u64::from(p));
            }
            w.close_empty();
        }
        write_alias(w, self.alias.as_deref())?;
        w.end("console");
        Ok(())
    }

    pub(crate) fn from_wire(mut c: CharW<'_>, ctx: &dyn Fn() -> String) -> Result<Self, XmlError> {
        let (source, (target_type, port), alias) = c.parts(ctx)?;
        Ok(Console {
            source,
            target: target_type
                .map(|t| {
                    keyword(&t, ConsoleTarget::parse, || {
                        format!("{}/target/@type", ctx())
                    })
                })
                .transpose()?,
            port,
            alias,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct CharW<'a> {
    #[serde(borrow, rename = "@type")]
    kind: Option<Str<'a>>,
    #[serde(borrow)]
    source: Option<CharSourceW<'a>>,
    #[serde(borrow)]
    log: Option<LogW<'a>>,
    #[serde(borrow)]
    target: Option<CharTargetW<'a>>,
    #[serde(borrow)]
    alias: Option<NameW<'a>>,
}

type CharParts = (CharSource, (Option<String>, Option<u32>), Option<String>);

impl CharW<'_> {
    fn parts(&mut self, ctx: &dyn Fn() -> String) -> Result<CharParts, XmlError> {
        let kind = req(self.kind.take(), || format!("{}/@type", ctx()))?;
        let src = self.source.take().unwrap_or_default();
        let source = match &*kind {
            "pty" => CharSource::Pty {
                path: owned(src.path),
            },
            "file" => CharSource::File {
                path: req(src.path, || format!("{}/source/@path", ctx()))?.into_string(),
                append: src
                    .append
                    .map(|a| parse::on_off(&a, || format!("{}/source/@append", ctx())))
                    .transpose()?,
            },
            "unix" => CharSource::Unix {
                path: req(src.path, || format!("{}/source/@path", ctx()))?.into_string(),
                mode: match src.mode {
                    None => UnixMode::Connect,
                    Some(m) => keyword(&m, UnixMode::parse, || format!("{}/source/@mode", ctx()))?,
                },
            },
            other => return Err(XmlError::unsupported(format!("{}/@type", ctx()), other)),
        };
        let (ttype, port) = match self.target.take() {
            None => (None, None),
            Some(t) => (
                owned(t.kind),
                opt_num(t.port, || format!("{}/target/@port", ctx()))?,
            ),
        };
        Ok((
            source,
            (ttype, port),
            self.alias.take().and_then(|a| a.name).map(Str::into_string),
        ))
    }
}

#[derive(Debug, Default, Deserialize)]
struct CharSourceW<'a> {
    #[serde(borrow, rename = "@path")]
    path: Option<Str<'a>>,
    #[serde(borrow, rename = "@mode")]
    mode: Option<Str<'a>>,
    #[serde(borrow, rename = "@append")]
    append: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct LogW<'a> {
    #[serde(borrow, rename = "@file")]
    file: Option<Str<'a>>,
    #[serde(borrow, rename = "@append")]
    append: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct CharTargetW<'a> {
    #[serde(borrow, rename = "@type")]
    kind: Option<Str<'a>>,
    #[serde(borrow, rename = "@port")]
    port: Option<Str<'a>>,
}
