//! `<interface>`: every form a compute host plugs a port with.
//!
//! [`InterfaceKind`] has one variant per libvirt interface `type`, each holding only what
//! libvirt accepts for that type: an Open vSwitch virtualport exists only on
//! [`InterfaceKind::Bridge`], `managed='no'` only on an [`InterfaceKind::Ethernet`] target, a
//! VF PCI address only on [`InterfaceKind::Hostdev`]. Options common to every form (MAC,
//! model, MTU, VLAN tag, driver queues, bandwidth) and what libvirt adds in live XML (alias,
//! guest PCI address, the `vnetN` target of a bridge) are on [`Interface`].

use serde::Deserialize;
use uuid::Uuid;

use crate::devices::{write_alias, write_host_pci_source, AddressW, DeviceAddress, NameW};
use crate::error::XmlError;
use crate::parse::{self, check_root, keyword, opt_dev, opt_num, owned, req, Str};
use crate::types::{DeviceName, MacAddress, PciAddress};
use crate::write::Writer;

/// The highest VLAN id.
pub const MAX_VLAN: u16 = 4095;

/// An Open vSwitch port: `<virtualport type='openvswitch'><parameters interfaceid=/>`.
/// libvirt plugs the tap into the bridge and sets `external_ids:iface-id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OvsPort {
    /// The Neutron port id (`external_ids:iface-id`).
    pub interface_id: Uuid,
    /// `profileid`, rarely used.
    pub profile_id: Option<String>,
}

/// The tap of an ethernet interface: `<target dev= managed=/>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EthernetTarget {
    /// Tap name.
    pub dev: DeviceName,
    /// `Some(false)`: the tap exists already and libvirt must not create or delete it.
    pub managed: Option<bool>,
}

keywords! {
    /// macvtap mode of a `direct` interface.
    pub enum DirectMode {
        /// Traffic between guests on the same lower device goes out to the switch.
        Vepa = "vepa",
        /// Guests on the same lower device talk directly.
        Bridge = "bridge",
        /// Isolated.
        Private = "private",
        /// The lower device (an SR-IOV VF) is given to one guest.
        Passthrough = "passthrough",
    }
}

keywords! {
    /// Who owns the vhost-user socket.
    pub enum VhostUserMode {
        /// QEMU connects to a socket the switch created.
        Client = "client",
        /// QEMU creates the socket and the switch connects.
        Server = "server",
    }
}

/// The form of an interface: its libvirt `type` and what only that type carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterfaceKind {
    /// `type='bridge'`: a tap plugged into a Linux bridge (Linux bridge agent, the qbr of OVS
    /// hybrid plug) or, with `virtualport`, into an OVS bridge.
    Bridge {
        /// The bridge.
        bridge: DeviceName,
        /// Set for an OVS bridge.
        virtualport: Option<OvsPort>,
        /// The tap name to use; live XML reports the name libvirt chose.
        target: Option<DeviceName>,
    },
    /// `type='ethernet'`: a tap with no switch attached by libvirt (vireo or another agent
    /// wires it; `managed='no'` for a tap created in advance).
    Ethernet {
        /// The tap.
        target: Option<EthernetTarget>,
    },
    /// `type='hostdev'`: an SR-IOV VF given to the guest, with its MAC and VLAN set by
    /// libvirt on the PF.
    Hostdev {
        /// The VF's host PCI address.
        source: PciAddress,
        /// libvirt detaches the VF from its host driver.
        managed: bool,
    },
    /// `type='direct'`: a macvtap on a host device.
    Direct {
        /// The lower device.
        source: DeviceName,
        /// macvtap mode.
        mode: DirectMode,
        /// The macvtap name; live XML reports it.
        target: Option<DeviceName>,
    },
    /// `type='vhostuser'`: a vhost-user socket (OVS-DPDK, virtio-forwarder).
    VhostUser {
        /// The socket path.
        path: String,
        /// Who owns the socket.
        mode: VhostUserMode,
        /// Name of the port on the switch side, when one is set.
        target: Option<DeviceName>,
    },
    /// `type='vdpa'`: a vhost-vdpa character device.
    Vdpa {
        /// `/dev/vhost-vdpa-N`.
        dev: String,
    },
    /// `type='network'`: a libvirt virtual network (not used by vireo; parsed so that a
    /// domain holding one can still be read).
    Network {
        /// The libvirt network.
        network: String,
        /// The tap, live XML.
        target: Option<DeviceName>,
    },
}

impl InterfaceKind {
    /// The libvirt `type`.
    pub fn type_str(&self) -> &'static str {
        match self {
            InterfaceKind::Bridge { .. } => "bridge",
            InterfaceKind::Ethernet { .. } => "ethernet",
            InterfaceKind::Hostdev { .. } => "hostdev",
            InterfaceKind::Direct { .. } => "direct",
            InterfaceKind::VhostUser { .. } => "vhostuser",
            InterfaceKind::Vdpa { .. } => "vdpa",
            InterfaceKind::Network { .. } => "network",
        }
    }

    /// The host device name, for forms that have one (tap, macvtap, vhost-user port).
    pub fn target_dev(&self) -> Option<&DeviceName> {
        match self {
            InterfaceKind::Bridge { target, .. }
            | InterfaceKind::Direct { target, .. }
            | InterfaceKind::VhostUser { target, .. }
            | InterfaceKind::Network { target, .. } => target.as_ref(),
            InterfaceKind::Ethernet { target } => target.as_ref().map(|t| &t.dev),
            InterfaceKind::Hostdev { .. } | InterfaceKind::Vdpa { .. } => None,
        }
    }
}

keywords! {
    /// `<model type=...>`: the NIC the guest sees.
    pub enum NicModel {
        /// virtio-net.
        Virtio = "virtio",
        /// virtio-net, transitional (legacy + modern).
        VirtioTransitional = "virtio-transitional",
        /// virtio-net, modern only.
        VirtioNonTransitional = "virtio-non-transitional",
        /// Intel e1000.
        E1000 = "e1000",
        /// Intel e1000e.
        E1000e = "e1000e",
        /// Intel igb.
        Igb = "igb",
        /// Realtek 8139.
        Rtl8139 = "rtl8139",
        /// NE2000 PCI.
        Ne2kPci = "ne2k_pci",
        /// AMD PCnet.
        Pcnet = "pcnet",
        /// VMware vmxnet3.
        Vmxnet3 = "vmxnet3",
    }
}

keywords! {
    /// `<driver name=...>`: the backend.
    pub enum NetDriverName {
        /// vhost-net in the kernel.
        Vhost = "vhost",
        /// QEMU userspace.
        Qemu = "qemu",
        /// VFIO (hostdev interfaces).
        Vfio = "vfio",
        /// Legacy KVM device assignment.
        Kvm = "kvm",
    }
}

/// `<driver name= queues= rx_queue_size= tx_queue_size=/>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetDriver {
    /// Backend.
    pub name: Option<NetDriverName>,
    /// Multiqueue: number of queue pairs.
    pub queues: Option<u32>,
    /// RX ring size.
    pub rx_queue_size: Option<u32>,
    /// TX ring size.
    pub tx_queue_size: Option<u32>,
}

/// One direction of `<bandwidth>`, in kilobytes per second / kilobytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Average rate (KiB/s).
    pub average: u64,
    /// Peak rate (KiB/s).
    pub peak: Option<u64>,
    /// Burst size (KiB).
    pub burst: Option<u64>,
}

/// `<bandwidth>` (Nova's `quota:vif_*` flavor extra specs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bandwidth {
    /// Into the guest.
    pub inbound: Option<Rate>,
    /// Out of the guest.
    pub outbound: Option<Rate>,
}

/// An `<interface>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// The form and what belongs to it.
    pub kind: InterfaceKind,
    /// The guest MAC (libvirt generates one when absent).
    pub mac: Option<MacAddress>,
    /// The NIC model.
    pub model: Option<NicModel>,
    /// `<mtu size=/>`.
    pub mtu: Option<u32>,
    /// `<vlan><tag id=/></vlan>`, 0..=4095.
    pub vlan: Option<u16>,
    /// Backend and queues.
    pub driver: Option<NetDriver>,
    /// QoS.
    pub bandwidth: Option<Bandwidth>,
    /// libvirt's alias (`net0` in live XML, or a user alias `ua-...`).
    pub alias: Option<String>,
    /// Guest address (live XML).
    pub address: Option<DeviceAddress>,
}

impl Interface {
    /// An interface of `kind` with nothing else set.
    pub fn new(kind: InterfaceKind) -> Self {
        Interface {
            kind,
            mac: None,
            model: None,
            mtu: None,
            vlan: None,
            driver: None,
            bandwidth: None,
            alias: None,
            address: None,
        }
    }

    /// The `<interface>` element alone (for attach/detach and for [`crate::live::rewrite`]).
    pub fn to_xml(&self) -> Result<String, XmlError> {
        let mut w = Writer::with_capacity(384);
        self.write(&mut w)?;
        Ok(w.out)
    }

    /// Parse an `<interface>` element (vireo's or libvirt's live form).
    pub fn from_xml(xml: &str) -> Result<Self, XmlError> {
        check_root(xml, "interface")?;
        let wire: InterfaceW<'_> = crate::parse::de(xml)?;
        Interface::from_wire(wire, &|| "interface".to_owned())
    }

    pub(crate) fn write(&self, w: &mut Writer) -> Result<(), XmlError> {
        w.open("interface");
        w.attr_raw("type", self.kind.type_str());
        if let InterfaceKind::Hostdev { managed, .. } = &self.kind {
            w.attr_bool("managed", *managed, "yes", "no");
        }
        w.close_start();
        if let Some(mac) = &self.mac {
            w.open("mac");
            w.attr_mac("address", mac);
            w.close_empty();
        }
        let mut target: Option<&DeviceName> = None;
        match &self.kind {
            InterfaceKind::Bridge {
                bridge,
                virtualport,
                target: t,
            } => {
                w.open("source");
                w.attr("bridge", bridge.as_str())?;
                w.close_empty();
                if let Some(vp) = virtualport {
                    w.raw("<virtualport type='openvswitch'>");
                    w.open("parameters");
                    w.attr_uuid("interfaceid", &vp.interface_id);
                    if let Some(p) = &vp.profile_id {
                        w.attr("profileid", p)?;
                    }
                    w.close_empty();
                    w.raw("</virtualport>");
                }
                target = t.as_ref();
            }
            InterfaceKind::Ethernet { target: t } => {
                if let Some(t) = t {
                    w.open("target");
                    w.attr("dev", t.dev.as_str())?;
                    if let Some(m) = t.managed {
                        w.attr_bool("managed", m, "yes", "no");
                    }
                    w.close_empty();
                }
            }
            InterfaceKind::Hostdev { source, .. } => write_host_pci_source(w, source, true),
            InterfaceKind::Direct {
                source,
                mode,
                target: t,
            } => {
                w.open("source");
                w.attr("dev", source.as_str())?;
                w.attr_raw("mode", mode.as_str());
                w.close_empty();
                target = t.as_ref();
            }
            InterfaceKind::VhostUser {
                path,
                mode,
                target: t,
            } => {
                w.open("source");
                w.attr_raw("type", "unix");
                w.attr("path", path)?;
                w.attr_raw("mode", mode.as_str());
                w.close_empty();
                target = t.as_ref();
            }
            InterfaceKind::Vdpa { dev } => {
                w.open("source");
                w.attr("dev", dev)?;
                w.close_empty();
            }
            InterfaceKind::Network { network, target: t } => {
                w.open("source");
                w.attr("network", network)?;
                w.close_empty();
                target = t.as_ref();
            }
        }
        if let Some(t) = target {
            w.open("target");
            w.attr("dev", t.as_str())?;
            w.close_empty();
        }
        if let Some(m) = self.model {
            w.open("model");
            w.attr_raw("type", m.as_str());
            w.close_empty();
        }
        if let Some(d) = &self.driver {
            w.open("driver");
            if let Some(n) = d.name {
                w.attr_raw("name", n.as_str());
            }
            if let Some(q) = d.queues {
                w.attr_u64("queues", u64::from(q));
            }
            if let Some(q) = d.rx_queue_size {
                w.attr_u64("rx_queue_size", u64::from(q));
            }
            if let Some(q) = d.tx_queue_size {
                w.attr_u64("tx_queue_size", u64::from(q));
            }
            w.close_empty();
        }
        if let Some(b) = &self.bandwidth {
            if b.inbound.is_some() || b.outbound.is_some() {
                w.raw("<bandwidth>");
                for (name, rate) in [("inbound", &b.inbound), ("outbound", &b.outbound)] {
                    if let Some(r) = rate {
                        w.open(name);
                        w.attr_u64("average", r.average);
                        if let Some(p) = r.peak {
                            w.attr_u64("peak", p);
                        }
                        if let Some(b) = r.burst {
                            w.attr_u64("burst", b);
                        }
                        w.close_empty();
                    }
                }
                w.raw("</bandwidth>");
            }
        }
        if let Some(v) = self.vlan {
            if v > MAX_VLAN {
                return Err(XmlError::number("interface/vlan/tag/@id", &v.to_string()));
            }
            w.raw("<vlan>");
            w.open("tag");
            w.attr_u64("id", u64::from(v));
            w.close_empty();
            w.raw("</vlan>");
        }
        if let Some(m) = self.mtu {
            w.open("mtu");
            w.attr_u64("size", u64::from(m));
            w.close_empty();
        }
        write_alias(w, self.alias.as_deref())?;
        if let Some(a) = &self.address {
            a.write(w);
        }
        w.end("interface");
        Ok(())
    }

    pub(crate) fn from_wire(i: InterfaceW<'_>, ctx: &dyn Fn() -> String) -> Result<Self, XmlError> {
        let f = |rest: &str| format!("{}/{rest}", ctx());
        let kind_s = req(i.kind, || f("@type"))?;
        let src = i.source.unwrap_or_default();
        let target = i.target.unwrap_or_default();
        let kind = match &*kind_s {
            "bridge" => InterfaceKind::Bridge {
                bridge: parse::dev(req(src.bridge, || f("source/@bridge"))?, || {
                    f("source/@bridge")
                })?,
                virtualport: match i.virtualport {
                    None => None,
                    Some(vp) => {
                        match vp.kind.as_deref() {
                            Some("openvswitch") => {}
                            other => {
                                return Err(XmlError::unsupported(
                                    f("virtualport/@type"),
                                    other.unwrap_or(""),
                                ))
                            }
                        }
                        let params = vp.parameters.unwrap_or_default();
                        let id = req(params.interfaceid, || {
                            f("virtualport/parameters/@interfaceid")
                        })?;
                        Some(OvsPort {
                            interface_id: parse::uuid(&id, || {
                                f("virtualport/parameters/@interfaceid")
                            })?,
                            profile_id: owned(params.profileid),
                        })
                    }
                },
                target: opt_dev(target.dev, || f("target/@dev"))?,
            },
            "ethernet" => InterfaceKind::Ethernet {
                target: match target.dev {
                    None => None,
                    Some(dev) => Some(EthernetTarget {
                        dev: parse::dev(dev, || f("target/@dev"))?,
                        managed: target
                            .managed
                            .map(|m| parse::yes_no(&m, || f("target/@managed")))
                            .transpose()?,
                    }),
                },
            },
            "hostdev" => InterfaceKind::Hostdev {
                source: src
                    .address
                    .ok_or_else(|| XmlError::missing(f("source/address")))?
                    .host_pci(&|| f("source/address"))?,
                managed: match i.managed {
                    None => false,
                    Some(m) => parse::yes_no(&m, || f("@managed"))?,
                },
            },
            "direct" => InterfaceKind::Direct {
                source: parse::dev(req(src.dev, || f("source/@dev"))?, || f("source/@dev"))?,
                mode: match src.mode {
                    None => DirectMode::Vepa,
                    Some(m) => keyword(&m, DirectMode::parse, || f("source/@mode"))?,
                },
                target: opt_dev(target.dev, || f("target/@dev"))?,
            },
            "vhostuser" => InterfaceKind::VhostUser {
                path: req(src.path, || f("source/@path"))?.into_string(),
                mode: keyword(
                    &req(src.mode, || f("source/@mode"))?,
                    VhostUserMode::parse,
                    || f("source/@mode"),
                )?,
                target: opt_dev(target.dev, || f("target/@dev"))?,
            },
            "vdpa" => InterfaceKind::Vdpa {
                dev: req(src.dev, || f("source/@dev"))?.into_string(),
            },
            "network" => InterfaceKind::Network {
                network: req(src.network, || f("source/@network"))?.into_string(),
                target: opt_dev(target.dev, || f("target/@dev"))?,
            },
            other => return Err(XmlError::unsupported(f("@type"), other)),
        };
        let mac = match i.mac.and_then(|m| m.address) {
            None => None,
            Some(m) => Some(parse::mac(&m, || f("mac/@address"))?),
        };
        let model = match i.model.and_then(|m| m.kind) {
            None => None,
            Some(m) => Some(keyword(&m, NicModel::parse, || f("model/@type"))?),
        };
        let vlan = match i.vlan {
            None => None,
            Some(v) => match v.tag.into_iter().next().and_then(|t| t.id) {
                None => return Err(XmlError::missing(f("vlan/tag/@id"))),
                Some(id) => {
                    let id: u16 = parse::num(&id, || f("vlan/tag/@id"))?;
                    if id > MAX_VLAN {
                        return Err(XmlError::number(f("vlan/tag/@id"), &id.to_string()));
                    }
                    Some(id)
                }
            },
        };
        let driver = match i.driver {
            None => None,
            Some(d) => Some(NetDriver {
                name: d
                    .name
                    .map(|n| keyword(&n, NetDriverName::parse, || f("driver/@name")))
                    .transpose()?,
                queues: opt_num(d.queues, || f("driver/@queues"))?,
                rx_queue_size: opt_num(d.rx_queue_size, || f("driver/@rx_queue_size"))?,
                tx_queue_size: opt_num(d.tx_queue_size, || f("driver/@tx_queue_size"))?,
            }),
        };
        let bandwidth = match i.bandwidth {
            None => None,
            Some(b) => {
                let rate = |r: Option<RateW<'_>>, name: &str| -> Result<Option<Rate>, XmlError> {
                    match r {
                        None => Ok(None),
                        Some(r) => Ok(Some(Rate {
                            average: parse::num(
                                &req(r.average, || f(&format!("bandwidth/{name}/@average")))?,
                                || f(&format!("bandwidth/{name}/@average")),
                            )?,
                            peak: opt_num(r.peak, || f(&format!("bandwidth/{name}/@peak")))?,
                            burst: opt_num(r.burst, || f(&format!("bandwidth/{name}/@burst")))?,
                        })),
                    }
                };
                let b = Bandwidth {
                    inbound: rate(b.inbound, "inbound")?,
                    outbound: rate(b.outbound, "outbound")?,
                };
                // An empty `<bandwidth/>` sets no limit (libvirt keeps none): the same as
                // none, and what the writer produces for it (found by fuzzing).
                (b.inbound.is_some() || b.outbound.is_some()).then_some(b)
            }
        };
        Ok(Interface {
            kind,
            mac,
            model,
            mtu: opt_num(i.mtu.and_then(|m| m.size), || f("mtu/@size"))?,
            vlan,
            driver,
            bandwidth,
            alias: i.alias.and_then(|a| a.name).map(Str::into_string),
            address: match i.address {
                Some(a) => a.guest(&|| f("address"))?,
                None => None,
            },
        })
    }

    /// The MAC as written in a live document (for selecting an interface in a rewrite).
    pub(crate) fn peek(xml: &str) -> Result<(Option<MacAddress>, Option<String>), XmlError> {
        let wire: PeekW<'_> = crate::parse::de(xml)?;
        let mac = match wire.mac.and_then(|m| m.address) {
            None => None,
            Some(m) => Some(parse::mac(&m, || "interface/mac/@address".to_owned())?),
        };
        Ok((mac, wire.alias.and_then(|a| a.name).map(Str::into_string)))
    }
}

#[derive(Debug, Default, Deserialize)]
struct PeekW<'a> {
    #[serde(borrow)]
    mac: Option<MacW<'a>>,
    #[serde(borrow)]
    alias: Option<NameW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct InterfaceW<'a> {
    #[serde(borrow, rename = "@type")]
    kind: Option<Str<'a>>,
    #[serde(borrow, rename = "@managed")]
    managed: Option<Str<'a>>,
    #[serde(borrow)]
    mac: Option<MacW<'a>>,
    #[serde(borrow)]
    source: Option<IfSourceW<'a>>,
    #[serde(borrow)]
    virtualport: Option<VirtualportW<'a>>,
    #[serde(borrow)]
    target: Option<IfTargetW<'a>>,
    #[serde(borrow)]
    model: Option<TypeW<'a>>,
    #[serde(borrow)]
    driver: Option<NetDriverW<'a>>,
    #[serde(borrow)]
    bandwidth: Option<BandwidthW<'a>>,
    #[serde(borrow)]
    vlan: Option<VlanW<'a>>,
    #[serde(borrow)]
    mtu: Option<MtuW<'a>>,
    #[serde(borrow)]
    alias: Option<NameW<'a>>,
    #[serde(borrow)]
    address: Option<AddressW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct MacW<'a> {
    #[serde(borrow, rename = "@address")]
    address: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct IfSourceW<'a> {
    #[serde(borrow, rename = "@bridge")]
    bridge: Option<Str<'a>>,
    #[serde(borrow, rename = "@dev")]
    dev: Option<Str<'a>>,
    #[serde(borrow, rename = "@mode")]
    mode: Option<Str<'a>>,
    #[serde(borrow, rename = "@path")]
    path: Option<Str<'a>>,
    #[serde(borrow, rename = "@network")]
    network: Option<Str<'a>>,
    #[serde(borrow)]
    address: Option<AddressW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct VirtualportW<'a> {
    #[serde(borrow, rename = "@type")]
    kind: Option<Str<'a>>,
    #[serde(borrow)]
    parameters: Option<ParamsW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct ParamsW<'a> {
    #[serde(borrow, rename = "@interfaceid")]
    interfaceid: Option<Str<'a>>,
    #[serde(borrow, rename = "@profileid")]
    profileid: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct IfTargetW<'a> {
    #[serde(borrow, rename = "@dev")]
    dev: Option<Str<'a>>,
    #[serde(borrow, rename = "@managed")]
    managed: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct TypeW<'a> {
    #[serde(borrow, rename = "@type")]
    kind: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct NetDriverW<'a> {
    #[serde(borrow, rename = "@name")]
    name: Option<Str<'a>>,
    #[serde(borrow, rename = "@queues")]
    queues: Option<Str<'a>>,
    #[serde(borrow, rename = "@rx_queue_size")]
    rx_queue_size: Option<Str<'a>>,
    #[serde(borrow, rename = "@tx_queue_size")]
    tx_queue_size: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct BandwidthW<'a> {
    #[serde(borrow)]
    inbound: Option<RateW<'a>>,
    #[serde(borrow)]
    outbound: Option<RateW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct RateW<'a> {
    #[serde(borrow, rename = "@average")]
    average: Option<Str<'a>>,
    #[serde(borrow, rename = "@peak")]
    peak: Option<Str<'a>>,
    #[serde(borrow, rename = "@burst")]
    burst: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct VlanW<'a> {
    #[serde(borrow, default)]
    tag: Vec<TagW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct TagW<'a> {
    #[serde(borrow, rename = "@id")]
    id: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct MtuW<'a> {
    #[serde(borrow, rename = "@size")]
    size: Option<Str<'a>>,
}
