//! [`Domain`]: the whole `<domain>` document and its non-device parts.

use serde::Deserialize;
use uuid::Uuid;

use crate::devices::{CharW, DiskW, HostdevW};
use crate::error::XmlError;
use crate::interface::InterfaceW;
use crate::metadata::VireoMetadata;
use crate::parse::{self, check_root, keyword, owned, req, Str};
use crate::types::DomainName;
use crate::write::Writer;
use crate::{Console, Disk, Hostdev, Interface, Serial};

keywords! {
    /// `<domain type=...>`: the hypervisor.
    pub enum DomainType {
        /// QEMU with KVM acceleration.
        Kvm = "kvm",
        /// QEMU with TCG (no KVM).
        Qemu = "qemu",
        /// libvirt's test driver.
        Test = "test",
    }
}

keywords! {
    /// `<cpu mode=...>`.
    pub enum CpuMode {
        /// A named model (`<model>`).
        Custom = "custom",
        /// The closest model to the host CPU.
        HostModel = "host-model",
        /// The host CPU as is.
        HostPassthrough = "host-passthrough",
        /// Everything the hypervisor can offer.
        Maximum = "maximum",
    }
}

/// `<topology sockets= cores= threads=/>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTopology {
    /// Sockets.
    pub sockets: u32,
    /// Cores per socket.
    pub cores: u32,
    /// Threads per core.
    pub threads: u32,
}

/// `<cpu>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cpu {
    /// Mode.
    pub mode: CpuMode,
    /// Model name (custom mode).
    pub model: Option<String>,
    /// Topology.
    pub topology: Option<CpuTopology>,
}

keywords! {
    /// `<boot dev=...>`.
    pub enum BootDevice {
        /// First disk.
        Hd = "hd",
        /// CD-ROM.
        Cdrom = "cdrom",
        /// PXE.
        Network = "network",
        /// Floppy.
        Fd = "fd",
    }
}

/// `<os>`: always `hvm`; firmware boot or direct kernel boot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Os {
    /// `arch` (`x86_64`).
    pub arch: Option<String>,
    /// Machine type (`q35`, `pc-q35-10.0`).
    pub machine: Option<String>,
    /// Direct boot: kernel path.
    pub kernel: Option<String>,
    /// Direct boot: initrd path.
    pub initrd: Option<String>,
    /// Direct boot: kernel command line.
    pub cmdline: Option<String>,
    /// Boot order for firmware boot.
    pub boot: Vec<BootDevice>,
}

/// `<features>`: the flags vireo sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    /// ACPI.
    pub acpi: bool,
    /// APIC.
    pub apic: bool,
    /// PAE.
    pub pae: bool,
    /// vmcoreinfo device.
    pub vmcoreinfo: bool,
    /// `<vmport state=/>`.
    pub vmport: Option<bool>,
}

impl Features {
    fn any(&self) -> bool {
        self.acpi || self.apic || self.pae || self.vmcoreinfo || self.vmport.is_some()
    }
}

keywords! {
    /// `<clock offset=...>`.
    pub enum ClockOffset {
        /// UTC.
        Utc = "utc",
        /// Host local time.
        Localtime = "localtime",
    }
}

keywords! {
    /// `<timer name=...>`.
    pub enum TimerName {
        /// i8254.
        Pit = "pit",
        /// MC146818.
        Rtc = "rtc",
        /// HPET.
        Hpet = "hpet",
        /// KVM paravirtual clock.
        Kvmclock = "kvmclock",
        /// Hyper-V clock.
        Hypervclock = "hypervclock",
        /// TSC.
        Tsc = "tsc",
    }
}

keywords! {
    /// `<timer tickpolicy=...>`.
    pub enum TickPolicy {
        /// Deliver late ticks late.
        Delay = "delay",
        /// Catch up.
        Catchup = "catchup",
        /// Merge missed ticks.
        Merge = "merge",
        /// Drop missed ticks.
        Discard = "discard",
    }
}

/// `<timer>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timer {
    /// Which timer.
    pub name: TimerName,
    /// Tick policy.
    pub tickpolicy: Option<TickPolicy>,
    /// `present='yes'|'no'`.
    pub present: Option<bool>,
}

/// `<clock>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clock {
    /// Offset.
    pub offset: ClockOffset,
    /// Timers.
    pub timers: Vec<Timer>,
}

keywords! {
    /// `on_poweroff` / `on_reboot` / `on_crash`.
    pub enum LifecycleAction {
        /// Stop the domain.
        Destroy = "destroy",
        /// Restart it.
        Restart = "restart",
        /// Keep it as is.
        Preserve = "preserve",
        /// Restart under a new name.
        RenameRestart = "rename-restart",
        /// Dump core, then destroy.
        CoredumpDestroy = "coredump-destroy",
        /// Dump core, then restart.
        CoredumpRestart = "coredump-restart",
    }
}

/// `<devices>`: the devices vireo models. Written in this order: emulator, disks,
/// interfaces, hostdevs, serials, consoles.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Devices {
    /// `<emulator>` path.
    pub emulator: Option<String>,
    /// Disks.
    pub disks: Vec<Disk>,
    /// Network interfaces.
    pub interfaces: Vec<Interface>,
    /// PCI passthrough devices.
    pub hostdevs: Vec<Hostdev>,
    /// Serial ports.
    pub serials: Vec<Serial>,
    /// Consoles.
    pub consoles: Vec<Console>,
}

/// A `<domain>`.
///
/// Plain data: build it with [`Domain::new`] and struct update syntax,
/// `Domain { vcpus: 2, ..Domain::new(name) }`. A domain has no `Default` because a domain
/// name cannot be empty.
#[derive(Debug, Clone, PartialEq)]
pub struct Domain {
    /// Hypervisor type.
    pub domain_type: DomainType,
    /// Running domain id (live XML only; ignored by libvirt on define).
    pub id: Option<u32>,
    /// Name.
    pub name: DomainName,
    /// UUID (libvirt generates one when absent).
    pub uuid: Option<Uuid>,
    /// vireo's metadata element.
    pub metadata: Option<VireoMetadata>,
    /// Maximum memory, KiB.
    pub memory_kib: u64,
    /// Current memory (balloon), KiB.
    pub current_memory_kib: Option<u64>,
    /// vCPUs.
    pub vcpus: u32,
    /// CPU model.
    pub cpu: Option<Cpu>,
    /// Boot.
    pub os: Os,
    /// Features.
    pub features: Features,
    /// Clock.
    pub clock: Option<Clock>,
    /// Action on guest power-off.
    pub on_poweroff: Option<LifecycleAction>,
    /// Action on guest reboot.
    pub on_reboot: Option<LifecycleAction>,
    /// Action on guest crash.
    pub on_crash: Option<LifecycleAction>,
    /// Devices.
    pub devices: Devices,
}

impl Domain {
    /// A KVM domain named `name`: 512 MiB, 1 vCPU, `hvm` on x86_64, nothing else.
    pub fn new(name: DomainName) -> Self {
        Domain {
            domain_type: DomainType::Kvm,
            id: None,
            name,
            uuid: None,
            metadata: None,
            memory_kib: 512 * 1024,
            current_memory_kib: None,
            vcpus: 1,
            cpu: None,
            os: Os {
                arch: Some("x86_64".to_owned()),
                ..Os::default()
            },
            features: Features::default(),
            clock: None,
            on_poweroff: None,
            on_reboot: None,
            on_crash: None,
            devices: Devices::default(),
        }
    }

    /// The interface with this MAC.
    pub fn interface_by_mac(&self, mac: &crate::MacAddress) -> Option<&Interface> {
        self.devices
            .interfaces
            .iter()
            .find(|i| i.mac.as_ref() == Some(mac))
    }

    /// Write the document.
    pub fn to_xml(&self) -> Result<String, XmlError> {
        let mut w = Writer::with_capacity(1024 + 384 * self.devices.interfaces.len());
        self.write(&mut w)?;
        Ok(w.out)
    }

    fn write(&self, w: &mut Writer) -> Result<(), XmlError> {
        w.open("domain");
        w.attr_raw("type", self.domain_type.as_str());
        if let Some(id) = self.id {
            w.attr_u64("id", u64::from(id));
        }
        w.close_start();
        w.text_elem("name", self.name.as_str())?;
        if let Some(u) = &self.uuid {
            w.raw("<uuid>");
            let mut buf = Uuid::encode_buffer();
            w.raw(u.hyphenated().encode_lower(&mut buf));
            w.raw("</uuid>");
        }
        if let Some(m) = &self.metadata {
            w.raw("<metadata>");
            m.write(w, true)?;
            w.raw("</metadata>");
        }
        w.raw("<memory unit='KiB'>");
        crate::write::push_u64(&mut w.out, self.memory_kib);
        w.raw("</memory>");
        if let Some(c) = self.current_memory_kib {
            w.raw("<currentMemory unit='KiB'>");
            crate::write::push_u64(&mut w.out, c);
            w.raw("</currentMemory>");
        }
        w.u64_elem("vcpu", u64::from(self.vcpus));
        if let Some(cpu) = &self.cpu {
            w.open("cpu");
            w.attr_raw("mode", cpu.mode.as_str());
            w.close_start();
            if let Some(m) = &cpu.model {
                w.text_elem("model", m)?;
            }
            if let Some(t) = &cpu.topology {
                w.open("topology");
                w.attr_u64("sockets", u64::from(t.sockets));
                w.attr_u64("cores", u64::from(t.cores));
                w.attr_u64("threads", u64::from(t.threads));
                w.close_empty();
            }
            w.end("cpu");
        }
        self.write_os(w)?;
        if self.features.any() {
            let f = &self.features;
            w.raw("<features>");
            for (on, name) in [
                (f.acpi, "<acpi/>"),
                (f.apic, "<apic/>"),
                (f.pae, "<pae/>"),
                (f.vmcoreinfo, "<vmcoreinfo/>"),
            ] {
                if on {
                    w.raw(name);
                }
            }
            if let Some(v) = f.vmport {
                w.open("vmport");
                w.attr_bool("state", v, "on", "off");
                w.close_empty();
            }
            w.raw("</features>");
        }
        if let Some(c) = &self.clock {
            w.open("clock");
            w.attr_raw("offset", c.offset.as_str());
            if c.timers.is_empty() {
                w.close_empty();
            } else {
                w.close_start();
                for t in &c.timers {
                    w.open("timer");
                    w.attr_raw("name", t.name.as_str());
                    if let Some(p) = t.tickpolicy {
                        w.attr_raw("tickpolicy", p.as_str());
                    }
                    if let Some(p) = t.present {
                        w.attr_bool("present", p, "yes", "no");
                    }
                    w.close_empty();
                }
                w.end("clock");
            }
        }
        for (name, action) in [
            ("on_poweroff", self.on_poweroff),
            ("on_reboot", self.on_reboot),
            ("on_crash", self.on_crash),
        ] {
            if let Some(a) = action {
                w.open(name);
                w.close_start();
                w.raw(a.as_str());
                w.end(name);
            }
        }
        let d = &self.devices;
        w.raw("<devices>");
        if let Some(e) = &d.emulator {
            w.text_elem("emulator", e)?;
        }
        for x in &d.disks {
            x.write(w)?;
        }
        for x in &d.interfaces {
            x.write(w)?;
        }
        for x in &d.hostdevs {
            x.write(w)?;
        }
        for x in &d.serials {
            x.write(w)?;
        }
        for x in &d.consoles {
            x.write(w)?;
        }
        w.raw("</devices></domain>");
        Ok(())
    }

    fn write_os(&self, w: &mut Writer) -> Result<(), XmlError> {
        let os = &self.os;
        w.raw("<os>");
        w.open("type");
        if let Some(a) = &os.arch {
            w.attr("arch", a)?;
        }
        if let Some(m) = &os.machine {
            w.attr("machine", m)?;
        }
        w.close_start();
        w.raw("hvm</type>");
        if let Some(k) = &os.kernel {
            w.text_elem("kernel", k)?;
        }
        if let Some(i) = &os.initrd {
            w.text_elem("initrd", i)?;
        }
        if let Some(c) = &os.cmdline {
            w.text_elem("cmdline", c)?;
        }
        for b in &os.boot {
            w.open("boot");
            w.attr_raw("dev", b.as_str());
            w.close_empty();
        }
        w.raw("</os>");
        Ok(())
    }

    /// Parse a domain document: vireo's own output or libvirt's (live or inactive) XML.
    /// Elements and attributes the model does not hold are ignored; the vireo metadata
    /// element is found by its namespace, other applications' metadata is ignored.
    pub fn from_xml(xml: &str) -> Result<Self, XmlError> {
        // The namespace scan also checks the root; skip it when the namespace is absent.
        let span = if xml.contains(crate::metadata::NAMESPACE_URI) {
            crate::live::find_metadata(xml)?
        } else {
            check_root(xml, "domain")?;
            None
        };
        let metadata = match span {
            None => None,
            Some(span) => Some(VireoMetadata::from_checked_xml(&xml[span])?),
        };
        let d: DomainW<'_> = crate::parse::de(xml)?;
        let field = |s: &str| format!("domain/{s}");
        let domain_type = keyword(&req(d.kind, || field("@type"))?, DomainType::parse, || {
            field("@type")
        })?;
        let name = req(d.name, || field("name"))?;
        let name =
            DomainName::new(name.into_string()).map_err(|e| XmlError::invalid(field("name"), e))?;
        let uuid = match d.uuid {
            None => None,
            Some(u) => Some(parse::uuid(&u, || field("uuid"))?),
        };
        let id = match d.id.as_deref() {
            // libvirt writes id='-1' for... nothing current, but be lenient with it.
            None | Some("-1") => None,
            Some(s) => Some(parse::num(s, || field("@id"))?),
        };
        let memory = d.memory.ok_or_else(|| XmlError::missing(field("memory")))?;
        let memory_kib = memory.kib(&|| field("memory"))?;
        let current_memory_kib = match d.current_memory {
            None => None,
            Some(m) => Some(m.kib(&|| field("currentMemory"))?),
        };
        let vcpus = match d.vcpu {
            None => 1,
            Some(v) => parse::num(&v.value, || field("vcpu"))?,
        };
        let cpu = match d.cpu {
            None => None,
            Some(c) => {
                let mode = match c.mode {
                    None => CpuMode::Custom,
                    Some(m) => keyword(&m, CpuMode::parse, || field("cpu/@mode"))?,
                };
                let topology = match c.topology {
                    None => None,
                    Some(t) => {
                        let n = |v: Option<Str<'_>>, a: &str| -> Result<u32, XmlError> {
                            parse::num(&req(v, || field(&format!("cpu/topology/@{a}")))?, || {
                                field(&format!("cpu/topology/@{a}"))
                            })
                        };
                        Some(CpuTopology {
                            sockets: n(t.sockets, "sockets")?,
                            cores: n(t.cores, "cores")?,
                            threads: n(t.threads, "threads")?,
                        })
                    }
                };
                // host-model/host-passthrough may carry a model libvirt filled in (live XML
                // of host-model); keep it, it is what the guest got.
                Some(Cpu {
                    mode,
                    model: owned(c.model),
                    topology,
                })
            }
        };
        let os = {
            let o = d.os.ok_or_else(|| XmlError::missing(field("os")))?;
            let t = o
                .os_type
                .ok_or_else(|| XmlError::missing(field("os/type")))?;
            if t.value.trim() != "hvm" {
                return Err(XmlError::unsupported(field("os/type"), &t.value));
            }
            let mut boot = Vec::with_capacity(o.boot.len());
            for (i, b) in o.boot.into_iter().enumerate() {
                let dev = req(b.dev, || field(&format!("os/boot[{i}]/@dev")))?;
                boot.push(keyword(&dev, BootDevice::parse, || {
                    field(&format!("os/boot[{i}]/@dev"))
                })?);
            }
            Os {
                arch: owned(t.arch),
                machine: owned(t.machine),
                kernel: owned(o.kernel),
                initrd: owned(o.initrd),
                cmdline: owned(o.cmdline),
                boot,
            }
        };
        let features = match d.features {
            None => Features::default(),
            Some(f) => Features {
                acpi: f.acpi.is_some(),
                apic: f.apic.is_some(),
                pae: f.pae.is_some(),
                vmcoreinfo: f.vmcoreinfo.is_some(),
                vmport: match f.vmport.and_then(|v| v.state) {
                    None => None,
                    Some(s) => Some(parse::on_off(&s, || field("features/vmport/@state"))?),
                },
            },
        };
        let clock = match d.clock {
            None => None,
            Some(c) => {
                let offset = match c.offset {
                    None => ClockOffset::Utc,
                    Some(o) => keyword(&o, ClockOffset::parse, || field("clock/@offset"))?,
                };
                let mut timers = Vec::with_capacity(c.timer.len());
                for (i, t) in c.timer.into_iter().enumerate() {
                    let f = |a: &str| field(&format!("clock/timer[{i}]/@{a}"));
                    timers.push(Timer {
                        name: keyword(&req(t.name, || f("name"))?, TimerName::parse, || f("name"))?,
                        tickpolicy: t
                            .tickpolicy
                            .map(|p| keyword(&p, TickPolicy::parse, || f("tickpolicy")))
                            .transpose()?,
                        present: t
                            .present
                            .map(|p| parse::yes_no(&p, || f("present")))
                            .transpose()?,
                    });
                }
                Some(Clock { offset, timers })
            }
        };
        let action =
            |v: Option<Str<'_>>, name: &str| -> Result<Option<LifecycleAction>, XmlError> {
                v.map(|s| keyword(s.trim(), LifecycleAction::parse, || field(name)))
                    .transpose()
            };
        let dv = d.devices.unwrap_or_default();
        let mut devices = Devices {
            emulator: owned(dv.emulator),
            disks: Vec::with_capacity(dv.disk.len()),
            interfaces: Vec::with_capacity(dv.interface.len()),
            hostdevs: Vec::with_capacity(dv.hostdev.len()),
            serials: Vec::with_capacity(dv.serial.len()),
            consoles: Vec::with_capacity(dv.console.len()),
        };
        for (i, x) in dv.disk.into_iter().enumerate() {
            devices
                .disks
                .push(Disk::from_wire(x, &|| format!("domain/devices/disk[{i}]"))?);
        }
        for (i, x) in dv.interface.into_iter().enumerate() {
            devices.interfaces.push(Interface::from_wire(x, &|| {
                format!("domain/devices/interface[{i}]")
            })?);
        }
        for (i, x) in dv.hostdev.into_iter().enumerate() {
            devices.hostdevs.push(Hostdev::from_wire(x, &|| {
                format!("domain/devices/hostdev[{i}]")
            })?);
        }
        for (i, x) in dv.serial.into_iter().enumerate() {
            devices.serials.push(Serial::from_wire(x, &|| {
                format!("domain/devices/serial[{i}]")
            })?);
        }
        for (i, x) in dv.console.into_iter().enumerate() {
            devices.consoles.push(Console::from_wire(x, &|| {
                format!("domain/devices/console[{i}]")
            })?);
        }
        Ok(Domain {
            domain_type,
            id,
            name,
            uuid,
            metadata,
            memory_kib,
            current_memory_kib,
            vcpus,
            cpu,
            os,
            features,
            clock,
            on_poweroff: action(d.on_poweroff, "on_poweroff")?,
            on_reboot: action(d.on_reboot, "on_reboot")?,
            on_crash: action(d.on_crash, "on_crash")?,
            devices,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
struct DomainW<'a> {
    #[serde(borrow, rename = "@type")]
    kind: Option<Str<'a>>,
    #[serde(borrow, rename = "@id")]
    id: Option<Str<'a>>,
    #[serde(borrow)]
    name: Option<Str<'a>>,
    #[serde(borrow)]
    uuid: Option<Str<'a>>,
    #[serde(borrow)]
    memory: Option<ScaledW<'a>>,
    #[serde(borrow, rename = "currentMemory")]
    current_memory: Option<ScaledW<'a>>,
    #[serde(borrow)]
    vcpu: Option<TextW<'a>>,
    #[serde(borrow)]
    cpu: Option<CpuW<'a>>,
    #[serde(borrow)]
    os: Option<OsW<'a>>,
    #[serde(borrow)]
    features: Option<FeaturesW<'a>>,
    #[serde(borrow)]
    clock: Option<ClockW<'a>>,
    #[serde(borrow)]
    on_poweroff: Option<Str<'a>>,
    #[serde(borrow)]
    on_reboot: Option<Str<'a>>,
    #[serde(borrow)]
    on_crash: Option<Str<'a>>,
    #[serde(borrow)]
    devices: Option<DevicesW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct ScaledW<'a> {
    #[serde(borrow, rename = "@unit")]
    unit: Option<Str<'a>>,
    #[serde(borrow, rename = "$text", default)]
    value: Str<'a>,
}

impl ScaledW<'_> {
    /// The value in KiB (libvirt's units; bytes round up to whole KiB as libvirt does).
    fn kib(&self, field: &dyn Fn() -> String) -> Result<u64, XmlError> {
        let n: u64 = parse::num(&self.value, field)?;
        let bytes_per_unit: u64 = match self.unit.as_deref().unwrap_or("KiB") {
            "k" | "KiB" => return Ok(n),
            "b" | "bytes" => 1,
            "KB" => 1000,
            "MB" => 1_000_000,
            "M" | "MiB" => 1 << 20,
            "GB" => 1_000_000_000,
            "G" | "GiB" => 1 << 30,
            "TB" => 1_000_000_000_000,
            "T" | "TiB" => 1 << 40,
            other => return Err(XmlError::unsupported(format!("{}/@unit", field()), other)),
        };
        n.checked_mul(bytes_per_unit)
            .map(|b| b.div_ceil(1024))
            .ok_or_else(|| XmlError::number(field(), &self.value))
    }
}

#[derive(Debug, Default, Deserialize)]
struct TextW<'a> {
    #[serde(borrow, rename = "$text", default)]
    value: Str<'a>,
}

#[derive(Debug, Default, Deserialize)]
struct CpuW<'a> {
    #[serde(borrow, rename = "@mode")]
    mode: Option<Str<'a>>,
    // A plain string (not a `$text` struct) so edge whitespace written as character
    // references survives; quick-xml ignores the element's attributes (`fallback`).
    #[serde(borrow)]
    model: Option<Str<'a>>,
    #[serde(borrow)]
    topology: Option<TopologyW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct TopologyW<'a> {
    #[serde(borrow, rename = "@sockets")]
    sockets: Option<Str<'a>>,
    #[serde(borrow, rename = "@cores")]
    cores: Option<Str<'a>>,
    #[serde(borrow, rename = "@threads")]
    threads: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct OsW<'a> {
    #[serde(borrow, rename = "type")]
    os_type: Option<OsTypeW<'a>>,
    #[serde(borrow)]
    kernel: Option<Str<'a>>,
    #[serde(borrow)]
    initrd: Option<Str<'a>>,
    #[serde(borrow)]
    cmdline: Option<Str<'a>>,
    #[serde(borrow, default)]
    boot: Vec<BootW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct OsTypeW<'a> {
    #[serde(borrow, rename = "@arch")]
    arch: Option<Str<'a>>,
    #[serde(borrow, rename = "@machine")]
    machine: Option<Str<'a>>,
    #[serde(borrow, rename = "$text", default)]
    value: Str<'a>,
}

#[derive(Debug, Default, Deserialize)]
struct BootW<'a> {
    #[serde(borrow, rename = "@dev")]
    dev: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct FeaturesW<'a> {
    acpi: Option<serde::de::IgnoredAny>,
    apic: Option<serde::de::IgnoredAny>,
    pae: Option<serde::de::IgnoredAny>,
    vmcoreinfo: Option<serde::de::IgnoredAny>,
    #[serde(borrow)]
    vmport: Option<StateW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct StateW<'a> {
    #[serde(borrow, rename = "@state")]
    state: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct ClockW<'a> {
    #[serde(borrow, rename = "@offset")]
    offset: Option<Str<'a>>,
    #[serde(borrow, default)]
    timer: Vec<TimerW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct TimerW<'a> {
    #[serde(borrow, rename = "@name")]
    name: Option<Str<'a>>,
    #[serde(borrow, rename = "@tickpolicy")]
    tickpolicy: Option<Str<'a>>,
    #[serde(borrow, rename = "@present")]
    present: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct DevicesW<'a> {
    #[serde(borrow)]
    emulator: Option<Str<'a>>,
    #[serde(borrow, default)]
    disk: Vec<DiskW<'a>>,
    #[serde(borrow, default)]
    interface: Vec<InterfaceW<'a>>,
    #[serde(borrow, default)]
    hostdev: Vec<HostdevW<'a>>,
    #[serde(borrow, default)]
    serial: Vec<CharW<'a>>,
    #[serde(borrow, default)]
    console: Vec<CharW<'a>>,
}
