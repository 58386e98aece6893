//! Which libvirt device connects a VIF: the mapping from a parsed [`Vif`] to a domain
//! [`DeviceConfig`], following the facts of Nova's libvirt VIF driver.
//!
//! | vif_type × vnic_type | device |
//! |---|---|
//! | `ovs` × `normal`, hybrid plug | `<interface type='bridge'>` on the `qbr` bridge, target = tap |
//! | `ovs` × `normal`, [`DomainForm::LibvirtManaged`] | `bridge` on the OVS bridge + `<virtualport type='openvswitch'>` (interfaceid = port id), target = tap |
//! | `ovs` × `normal`, [`DomainForm::PreCreated`] | `ethernet`, `<target dev=TAP managed='no'/>` |
//! | `ovs` × `direct`/`remote-managed` (hardware offload) | `hostdev` with the VF's PCI address (VLAN is OVS's business) |
//! | `ovs` × `virtio-forwarder`, `vhostuser` × `normal`/`virtio-forwarder` | `vhostuser` socket (path, mode; target `vhu…` when OVS plugs it) |
//! | `ovs` × `vdpa`, `vdpa` × `vdpa` | `vdpa` with the `/dev/vhost-vdpa-N` from [`InterfaceOptions::vdpa_dev`] |
//! | `bridge` × `normal` | `bridge` on the VIF's Linux bridge (`network.bridge`, else `brq…`), target = tap |
//! | `hw_veb` × `direct`/`accelerator-direct` | `<interface type='hostdev' managed='yes'>` with the VF address and `<vlan>` tag |
//! | `hw_veb` × `macvtap` | `direct` on the VF's netdev ([`InterfaceOptions::vf_netdev`]), mode `passthrough`, `<vlan>` tag |
//! | `hostdev_physical` × `direct-physical`/`accelerator-direct-physical` | `<hostdev mode='subsystem' type='pci' managed='yes'>` with the PF address |
//! | `tap` × `normal` | `ethernet`, `<target dev=TAP managed='no'/>` (vireo creates the tap) |
//! | `macvtap` × `normal` | `direct` on `details.macvtap_source` (else `physical_interface`), `details.macvtap_mode` |
//! | anything else | [`VifConfigError::Unsupported`] naming the port |
//!
//! The form only changes OVS native ports: hybrid and Linux bridge ports always let libvirt
//! create the tap in the bridge (libvirt accepts `managed='no'` only on `ethernet`). MTU
//! (`network.meta.mtu`) goes on tap-backed and vhost-user interfaces; a VF's MTU is the PF's.
//! The NIC model ([`InterfaceOptions::model`], virtio by default) goes on every form the guest
//! sees as a paravirtual NIC, never on a VF. Queues and RX ring size go on virtio forms; the
//! TX ring size only on vhost-user (the only backend libvirt supports it for).

use vireo_xml::interface::{
    Bandwidth, DirectMode, EthernetTarget, Interface, InterfaceKind, NetDriver, NicModel, OvsPort,
    VhostUserMode,
};
use vireo_xml::types::{DeviceName, MacAddress, PciAddress, ValueError};
use vireo_xml::{Hostdev, XmlError};

use crate::vif::{PortId, Vif, VifType, VnicType};

pub use crate::plug::DomainForm;

/// What the mapping needs beyond the VIF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceOptions {
    /// NIC model for paravirtual forms.
    pub model: NicModel,
    /// Multiqueue: queue pairs (flavor `hw:vif_multiqueue_enabled`).
    pub queues: Option<u32>,
    /// RX ring size (`[libvirt] rx_queue_size`).
    pub rx_queue_size: Option<u32>,
    /// TX ring size (`[libvirt] tx_queue_size`), vhost-user only.
    pub tx_queue_size: Option<u32>,
    /// QoS from the flavor's `quota:vif_*` extra specs.
    pub bandwidth: Option<Bandwidth>,
    /// `hw_veb` × `macvtap`: the netdev name of the VF at `profile.pci_slot`, resolved by the
    /// caller on the host (sysfs).
    pub vf_netdev: Option<String>,
    /// vDPA: the `/dev/vhost-vdpa-N` device of the port's VF, resolved by the caller.
    pub vdpa_dev: Option<String>,
}

impl Default for InterfaceOptions {
    fn default() -> Self {
        InterfaceOptions {
            model: NicModel::Virtio,
            queues: None,
            rx_queue_size: None,
            tx_queue_size: None,
            bandwidth: None,
            vf_netdev: None,
            vdpa_dev: None,
        }
    }
}

/// The device that connects a VIF.
// Built once per VIF and consumed right away: boxing the larger variant buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceConfig {
    /// An `<interface>`.
    Interface(Interface),
    /// A `<hostdev>` (a whole PF, whose MAC the guest owns).
    Hostdev(Hostdev),
}

impl DeviceConfig {
    /// The device element alone, for attach/detach.
    pub fn to_xml(&self) -> Result<String, XmlError> {
        match self {
            DeviceConfig::Interface(i) => i.to_xml(),
            DeviceConfig::Hostdev(h) => h.to_xml(),
        }
    }

    /// The guest MAC libvirt sets, when the device has one.
    pub fn mac(&self) -> Option<MacAddress> {
        match self {
            DeviceConfig::Interface(i) => i.mac,
            DeviceConfig::Hostdev(_) => None,
        }
    }

    /// Add the device to a domain's device list.
    pub fn add_to(self, devices: &mut vireo_xml::Devices) {
        match self {
            DeviceConfig::Interface(i) => devices.interfaces.push(i),
            DeviceConfig::Hostdev(h) => devices.hostdevs.push(h),
        }
    }
}

/// Why a VIF has no device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VifConfigError {
    /// vireo has no device for this combination.
    #[error("port {port}: vif_type {vif_type} with vnic_type {vnic_type} is not supported")]
    Unsupported {
        /// The port.
        port: PortId,
        /// Its vif_type.
        vif_type: VifType,
        /// Its vnic_type.
        vnic_type: VnicType,
    },
    /// An input the device needs is absent.
    #[error("port {port}: {what} is missing")]
    Missing {
        /// The port.
        port: PortId,
        /// What (`profile.pci_slot`, `details.vhostuser_socket`, ...).
        what: &'static str,
    },
    /// A name derived from the VIF is not a valid device name.
    #[error("port {port}: invalid {what}")]
    InvalidName {
        /// The port.
        port: PortId,
        /// Which name.
        what: &'static str,
        /// Why.
        #[source]
        source: ValueError,
    },
    /// A keyword the device needs has a value libvirt does not know.
    #[error("port {port}: {what} {value:?} is not one of {allowed}")]
    BadKeyword {
        /// The port.
        port: PortId,
        /// Which field.
        what: &'static str,
        /// The value found.
        value: String,
        /// The values accepted.
        allowed: &'static str,
    },
}

/// Map `vif` to the device that connects it (see the module table).
pub fn interface_for(
    vif: &Vif,
    form: DomainForm,
    opts: &InterfaceOptions,
) -> Result<DeviceConfig, VifConfigError> {
    let port = vif.id;
    let name = |value: String, what: &'static str| {
        DeviceName::new(value).map_err(|source| VifConfigError::InvalidName { port, what, source })
    };
    let missing = |what: &'static str| VifConfigError::Missing { port, what };
    let pci_slot = || vif.profile.pci_slot.ok_or(missing("profile.pci_slot"));
    let vlan = vif.details.vlan.filter(|v| *v != 0);

    let kind = match (vif.vif_type, vif.vnic_type) {
        (VifType::Ovs, VnicType::Normal) if vif.details.ovs_hybrid_plug => {
            return Ok(tap_backed(
                vif,
                opts,
                InterfaceKind::Bridge {
                    bridge: name(vif.qbr_name(), "qbr bridge name")?,
                    virtualport: None,
                    target: Some(name(vif.tap_name(), "tap name")?),
                },
            ))
        }
        (VifType::Ovs, VnicType::Normal) => {
            let tap = name(vif.tap_name(), "tap name")?;
            let kind = match form {
                DomainForm::LibvirtManaged => InterfaceKind::Bridge {
                    bridge: name(vif.ovs_bridge().to_owned(), "OVS bridge name")?,
                    virtualport: Some(OvsPort {
                        interface_id: vif.id.0,
                        profile_id: None,
                    }),
                    target: Some(tap),
                },
                DomainForm::PreCreated => pre_created(tap),
            };
            return Ok(tap_backed(vif, opts, kind));
        }
        (VifType::Bridge, VnicType::Normal) => {
            let bridge = vif
                .linux_bridge_name()
                .ok_or(missing("network.bridge (or network.id)"))?;
            return Ok(tap_backed(
                vif,
                opts,
                InterfaceKind::Bridge {
                    bridge: name(bridge, "Linux bridge name")?,
                    virtualport: None,
                    target: Some(name(vif.tap_name(), "tap name")?),
                },
            ));
        }
        (VifType::Tap, VnicType::Normal) => {
            let tap = name(vif.tap_name(), "tap name")?;
            return Ok(tap_backed(vif, opts, pre_created(tap)));
        }
        (VifType::Ovs, VnicType::Direct | VnicType::RemoteManaged) => {
            return Ok(vf(vif, pci_slot()?, None));
        }
        (VifType::HwVeb, VnicType::Direct | VnicType::AcceleratorDirect) => {
            return Ok(vf(vif, pci_slot()?, vlan));
        }
        (
            VifType::HostdevPhysical,
            VnicType::DirectPhysical | VnicType::AcceleratorDirectPhysical,
        ) => {
            return Ok(DeviceConfig::Hostdev(Hostdev::pci(pci_slot()?)));
        }
        (VifType::HwVeb, VnicType::Macvtap) => {
            pci_slot()?;
            let dev = opts
                .vf_netdev
                .clone()
                .ok_or(missing("netdev of the VF (InterfaceOptions::vf_netdev)"))?;
            let mut i = paravirtual(
                vif,
                opts,
                InterfaceKind::Direct {
                    source: name(dev, "VF netdev name")?,
                    mode: DirectMode::Passthrough,
                    target: None,
                },
            );
            i.vlan = vlan;
            return Ok(DeviceConfig::Interface(i));
        }
        (VifType::Macvtap, VnicType::Normal) => {
            let source = vif
                .details
                .macvtap_source
                .clone()
                .or_else(|| vif.details.physical_interface.clone())
                .ok_or(missing("details.macvtap_source"))?;
            let mode_text = vif
                .details
                .macvtap_mode
                .as_deref()
                .ok_or(missing("details.macvtap_mode"))?;
            let mode = DirectMode::parse(mode_text).ok_or_else(|| VifConfigError::BadKeyword {
                port,
                what: "details.macvtap_mode",
                value: mode_text.to_owned(),
                allowed: "vepa, bridge, private, passthrough",
            })?;
            InterfaceKind::Direct {
                source: name(source, "macvtap source")?,
                mode,
                target: None,
            }
        }
        (VifType::Vhostuser, VnicType::Normal | VnicType::VirtioForwarder)
        | (VifType::Ovs, VnicType::VirtioForwarder) => {
            let path = vif
                .details
                .vhostuser_socket
                .clone()
                .ok_or(missing("details.vhostuser_socket"))?;
            let mode_text = vif.details.vhostuser_mode.as_deref().unwrap_or("server");
            let mode =
                VhostUserMode::parse(mode_text).ok_or_else(|| VifConfigError::BadKeyword {
                    port,
                    what: "details.vhostuser_mode",
                    value: mode_text.to_owned(),
                    allowed: "client, server",
                })?;
            let target = if vif.details.vhostuser_ovs_plug || vif.vif_type == VifType::Ovs {
                Some(name(vif.device_name("vhu"), "vhost-user port name")?)
            } else {
                None
            };
            let mut i = paravirtual(vif, opts, InterfaceKind::VhostUser { path, mode, target });
            i.mtu = vif.network.mtu;
            if let Some(d) = &mut i.driver {
                d.tx_queue_size = opts.tx_queue_size;
            } else if opts.tx_queue_size.is_some() {
                i.driver = Some(NetDriver {
                    tx_queue_size: opts.tx_queue_size,
                    ..NetDriver::default()
                });
            }
            return Ok(DeviceConfig::Interface(i));
        }
        (VifType::Vdpa, VnicType::Vdpa) | (VifType::Ovs, VnicType::Vdpa) => {
            let dev = opts
                .vdpa_dev
                .clone()
                .ok_or(missing("vhost-vdpa device (InterfaceOptions::vdpa_dev)"))?;
            InterfaceKind::Vdpa { dev }
        }
        (vif_type, vnic_type) => {
            return Err(VifConfigError::Unsupported {
                port,
                vif_type,
                vnic_type,
            })
        }
    };
    Ok(DeviceConfig::Interface(paravirtual(vif, opts, kind)))
}

fn pre_created(tap: DeviceName) -> InterfaceKind {
    InterfaceKind::Ethernet {
        target: Some(EthernetTarget {
            dev: tap,
            managed: Some(false),
        }),
    }
}

/// A paravirtual NIC: MAC, model, queues, bandwidth.
fn paravirtual(vif: &Vif, opts: &InterfaceOptions, kind: InterfaceKind) -> Interface {
    let driver = (opts.queues.is_some() || opts.rx_queue_size.is_some()).then_some(NetDriver {
        name: None,
        queues: opts.queues,
        rx_queue_size: opts.rx_queue_size,
        tx_queue_size: None,
    });
    Interface {
        mac: Some(vif.address),
        model: Some(opts.model),
        driver,
        bandwidth: opts.bandwidth,
        ..Interface::new(kind)
    }
}

/// A tap-backed paravirtual NIC, with the network's MTU.
fn tap_backed(vif: &Vif, opts: &InterfaceOptions, kind: InterfaceKind) -> DeviceConfig {
    let mut i = paravirtual(vif, opts, kind);
    i.mtu = vif.network.mtu;
    DeviceConfig::Interface(i)
}

/// An SR-IOV VF given to the guest: MAC and VLAN set by libvirt through the PF.
fn vf(vif: &Vif, pci: PciAddress, vlan: Option<u16>) -> DeviceConfig {
    DeviceConfig::Interface(Interface {
        mac: Some(vif.address),
        vlan,
        ..Interface::new(InterfaceKind::Hostdev {
            source: pci,
            managed: true,
        })
    })
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use serde_json::{json, Value};
    use vireo_xml::{Domain, DomainName};

    use super::*;

    const P: &str = "3b2c4d5e-0000-4000-8000-000000000001";
    const MAC: &str = "fa:16:3e:00:00:01";

    fn vif(v: Value) -> Vif {
        let mut base = json!({"id": P, "address": MAC,
            "network": {"id": "a1b2c3d4-e5f6-4000-8000-000000000009", "meta": {"mtu": 1450}}});
        for (k, val) in v.as_object().unwrap() {
            base[k] = val.clone();
        }
        Vif::from_value(0, &base).unwrap()
    }

    fn map(v: Value, form: DomainForm) -> Result<DeviceConfig, VifConfigError> {
        interface_for(&vif(v), form, &InterfaceOptions::default())
    }

    fn iface(d: DeviceConfig) -> Interface {
        match d {
            DeviceConfig::Interface(i) => i,
            DeviceConfig::Hostdev(h) => panic!("expected an interface, got {h:?}"),
        }
    }

    fn dn(s: &str) -> DeviceName {
        DeviceName::new(s).unwrap()
    }

    fn mac() -> MacAddress {
        MAC.parse().unwrap()
    }

    /// Validate a device inside a whole domain with virt-xml-validate.
    fn validate(d: &DeviceConfig) {
        let mut dom = Domain::new(DomainName::new("vx-vifcfg").unwrap());
        dom.os.machine = Some("q35".into());
        d.clone().add_to(&mut dom.devices);
        let xml = dom.to_xml().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.xml");
        std::fs::write(&path, &xml).unwrap();
        let out = Command::new("virt-xml-validate")
            .arg(&path)
            .arg("domain")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}\n{xml}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn ovs_native_libvirt_managed_is_bridge_with_virtualport() {
        let d = map(json!({"type": "ovs"}), DomainForm::LibvirtManaged).unwrap();
        validate(&d);
        assert_eq!(
            iface(d),
            Interface {
                mac: Some(mac()),
                model: Some(NicModel::Virtio),
                mtu: Some(1450),
                ..Interface::new(InterfaceKind::Bridge {
                    bridge: dn("br-int"),
                    virtualport: Some(OvsPort {
                        interface_id: P.parse().unwrap(),
                        profile_id: None
                    }),
                    target: Some(dn("tap3b2c4d5e-00")),
                })
            }
        );
        // details.bridge_name wins over network.bridge.
        let d = map(
            json!({"type": "ovs", "details": {"bridge_name": "br-custom"},
                "network": {"bridge": "br-int"}}),
            DomainForm::LibvirtManaged,
        )
        .unwrap();
        assert!(
            matches!(iface(d).kind, InterfaceKind::Bridge { bridge, .. } if bridge.as_str() == "br-custom")
        );
    }

    #[test]
    fn ovs_native_pre_created_is_unmanaged_ethernet() {
        let d = map(
            json!({"type": "ovs", "devname": "tapcustom-01"}),
            DomainForm::PreCreated,
        )
        .unwrap();
        validate(&d);
        let i = iface(d);
        assert_eq!(
            i.kind,
            InterfaceKind::Ethernet {
                target: Some(EthernetTarget {
                    dev: dn("tapcustom-01"),
                    managed: Some(false)
                })
            }
        );
        assert_eq!(i.mtu, Some(1450));
        assert_eq!(i.model, Some(NicModel::Virtio));
    }

    #[test]
    fn ovs_hybrid_is_bridge_on_qbr_in_both_forms() {
        for form in [DomainForm::LibvirtManaged, DomainForm::PreCreated] {
            let d = map(
                json!({"type": "ovs", "details": {"ovs_hybrid_plug": "True"}}),
                form,
            )
            .unwrap();
            validate(&d);
            assert_eq!(
                iface(d).kind,
                InterfaceKind::Bridge {
                    bridge: dn("qbr3b2c4d5e-00"),
                    virtualport: None,
                    target: Some(dn("tap3b2c4d5e-00")),
                }
            );
        }
    }

    #[test]
    fn linux_bridge_uses_the_vifs_bridge() {
        let d = map(
            json!({"type": "bridge", "network": {"bridge": "brq-given", "meta": {"mtu": 9000}}}),
            DomainForm::LibvirtManaged,
        )
        .unwrap();
        validate(&d);
        let i = iface(d);
        assert!(
            matches!(&i.kind, InterfaceKind::Bridge { bridge, virtualport: None, target: Some(t) }
            if bridge.as_str() == "brq-given" && t.as_str() == "tap3b2c4d5e-00")
        );
        assert_eq!(i.mtu, Some(9000));
        // Without network.bridge: brq + network id, as the Linux bridge agent names it.
        let i = iface(map(json!({"type": "bridge"}), DomainForm::LibvirtManaged).unwrap());
        assert!(
            matches!(&i.kind, InterfaceKind::Bridge { bridge, .. } if bridge.as_str() == "brqa1b2c3d4-e5")
        );
    }

    #[test]
    fn hw_veb_direct_is_hostdev_interface_with_vlan() {
        let d = map(
            json!({"type": "hw_veb", "vnic_type": "direct", "details": {"vlan": "100"},
                "profile": {"pci_slot": "0000:81:10.2", "physical_network": "physnet1"}}),
            DomainForm::LibvirtManaged,
        )
        .unwrap();
        validate(&d);
        assert_eq!(
            iface(d),
            Interface {
                mac: Some(mac()),
                vlan: Some(100),
                ..Interface::new(InterfaceKind::Hostdev {
                    source: "0000:81:10.2".parse().unwrap(),
                    managed: true
                })
            }
        );
        // VLAN 0 means untagged.
        let i = iface(
            map(
                json!({"type": "hw_veb", "vnic_type": "direct", "details": {"vlan": 0},
                    "profile": {"pci_slot": "0000:81:10.2"}}),
                DomainForm::LibvirtManaged,
            )
            .unwrap(),
        );
        assert_eq!(i.vlan, None);
    }

    #[test]
    fn hw_veb_macvtap_is_direct_passthrough_on_the_vf_netdev() {
        let v = vif(
            json!({"type": "hw_veb", "vnic_type": "macvtap", "details": {"vlan": 7},
            "profile": {"pci_slot": "0000:81:10.2"}}),
        );
        let err = interface_for(&v, DomainForm::LibvirtManaged, &InterfaceOptions::default())
            .unwrap_err();
        assert!(matches!(err, VifConfigError::Missing { .. }), "{err}");
        let opts = InterfaceOptions {
            vf_netdev: Some("enp129s0f0v2".into()),
            ..InterfaceOptions::default()
        };
        let d = interface_for(&v, DomainForm::LibvirtManaged, &opts).unwrap();
        validate(&d);
        let i = iface(d);
        assert_eq!(
            i.kind,
            InterfaceKind::Direct {
                source: dn("enp129s0f0v2"),
                mode: DirectMode::Passthrough,
                target: None
            }
        );
        assert_eq!(i.vlan, Some(7));
        assert_eq!(i.model, Some(NicModel::Virtio));
    }

    #[test]
    fn hostdev_physical_is_a_pci_hostdev_of_the_pf() {
        let d = map(
            json!({"type": "hostdev_physical", "vnic_type": "direct-physical",
                "profile": {"pci_slot": "0000:82:00.0"}}),
            DomainForm::LibvirtManaged,
        )
        .unwrap();
        validate(&d);
        assert_eq!(d.mac(), None);
        assert_eq!(
            d,
            DeviceConfig::Hostdev(Hostdev::pci("0000:82:00.0".parse().unwrap()))
        );
        assert!(d
            .to_xml()
            .unwrap()
            .starts_with("<hostdev mode='subsystem' type='pci' managed='yes'>"));
    }

    #[test]
    fn vhostuser_has_socket_mode_and_ovs_port_name() {
        let opts = InterfaceOptions {
            queues: Some(4),
            rx_queue_size: Some(1024),
            tx_queue_size: Some(1024),
            ..InterfaceOptions::default()
        };
        let v = vif(json!({"type": "vhostuser", "details": {
            "vhostuser_socket": "/var/run/openvswitch/vhu3b2c4d5e-00",
            "vhostuser_mode": "client", "vhostuser_ovs_plug": true}}));
        let d = interface_for(&v, DomainForm::LibvirtManaged, &opts).unwrap();
        validate(&d);
        let i = iface(d);
        assert_eq!(
            i.kind,
            InterfaceKind::VhostUser {
                path: "/var/run/openvswitch/vhu3b2c4d5e-00".into(),
                mode: VhostUserMode::Client,
                target: Some(dn("vhu3b2c4d5e-00")),
            }
        );
        assert_eq!(i.mtu, Some(1450));
        assert_eq!(
            i.driver,
            Some(NetDriver {
                name: None,
                queues: Some(4),
                rx_queue_size: Some(1024),
                tx_queue_size: Some(1024)
            })
        );
        // Mode defaults to server; a bad mode is a typed error.
        let v = vif(json!({"type": "vhostuser", "details": {"vhostuser_socket": "/s"}}));
        let i = iface(
            interface_for(&v, DomainForm::LibvirtManaged, &InterfaceOptions::default()).unwrap(),
        );
        assert!(matches!(
            i.kind,
            InterfaceKind::VhostUser {
                mode: VhostUserMode::Server,
                target: None,
                ..
            }
        ));
        let v = vif(
            json!({"type": "vhostuser", "details": {"vhostuser_socket": "/s", "vhostuser_mode": "both"}}),
        );
        let err = interface_for(&v, DomainForm::LibvirtManaged, &InterfaceOptions::default())
            .unwrap_err();
        assert!(matches!(err, VifConfigError::BadKeyword { .. }), "{err}");
        let err = map(json!({"type": "vhostuser"}), DomainForm::LibvirtManaged).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("port {P}: details.vhostuser_socket is missing")
        );
    }

    #[test]
    fn tap_is_unmanaged_ethernet() {
        let d = map(json!({"type": "tap"}), DomainForm::LibvirtManaged).unwrap();
        validate(&d);
        assert_eq!(
            iface(d).kind,
            InterfaceKind::Ethernet {
                target: Some(EthernetTarget {
                    dev: dn("tap3b2c4d5e-00"),
                    managed: Some(false)
                })
            }
        );
    }

    #[test]
    fn macvtap_mechanism_driver_is_direct() {
        let d = map(
            json!({"type": "macvtap", "details": {"macvtap_source": "eth1.100",
                "macvtap_mode": "bridge", "physical_interface": "eth1"}}),
            DomainForm::LibvirtManaged,
        )
        .unwrap();
        validate(&d);
        assert_eq!(
            iface(d).kind,
            InterfaceKind::Direct {
                source: dn("eth1.100"),
                mode: DirectMode::Bridge,
                target: None
            }
        );
        let err = map(
            json!({"type": "macvtap", "details": {"physical_interface": "eth1", "macvtap_mode": "odd"}}),
            DomainForm::LibvirtManaged,
        )
        .unwrap_err();
        assert!(matches!(err, VifConfigError::BadKeyword { .. }), "{err}");
    }

    #[test]
    fn vdpa_uses_the_resolved_device() {
        let v = vif(
            json!({"type": "vdpa", "vnic_type": "vdpa", "profile": {"pci_slot": "0000:81:00.5"}}),
        );
        let err = interface_for(&v, DomainForm::LibvirtManaged, &InterfaceOptions::default())
            .unwrap_err();
        assert!(matches!(err, VifConfigError::Missing { .. }));
        let opts = InterfaceOptions {
            vdpa_dev: Some("/dev/vhost-vdpa-0".into()),
            ..InterfaceOptions::default()
        };
        let d = interface_for(&v, DomainForm::LibvirtManaged, &opts).unwrap();
        validate(&d);
        assert_eq!(
            iface(d).kind,
            InterfaceKind::Vdpa {
                dev: "/dev/vhost-vdpa-0".into()
            }
        );
    }

    #[test]
    fn ovs_offload_forms() {
        // Hardware offload: the VF goes to the guest; OVS handles VLANs on the representor.
        let d = map(
            json!({"type": "ovs", "vnic_type": "direct", "details": {"vlan": 5},
                "profile": {"pci_slot": "0000:81:10.3"}}),
            DomainForm::LibvirtManaged,
        )
        .unwrap();
        validate(&d);
        let i = iface(d);
        assert!(matches!(i.kind, InterfaceKind::Hostdev { .. }));
        assert_eq!(i.vlan, None);
        // virtio-forwarder on OVS: vhost-user.
        let d = map(
            json!({"type": "ovs", "vnic_type": "virtio-forwarder",
                "details": {"vhostuser_socket": "/run/vf.sock"}}),
            DomainForm::LibvirtManaged,
        )
        .unwrap();
        validate(&d);
        assert!(matches!(iface(d).kind, InterfaceKind::VhostUser { .. }));
    }

    #[test]
    fn every_unsupported_combination_is_a_typed_error_naming_the_port() {
        let mut supported = 0;
        for vif_type in VifType::ALL {
            for vnic_type in VnicType::ALL {
                let v = vif(json!({
                    "type": vif_type.as_str(), "vnic_type": vnic_type.as_str(),
                    "details": {"vhostuser_socket": "/s", "macvtap_source": "eth1",
                        "macvtap_mode": "bridge"},
                    "profile": {"pci_slot": "0000:81:10.2"}}));
                let opts = InterfaceOptions {
                    vf_netdev: Some("eth2".into()),
                    vdpa_dev: Some("/dev/vhost-vdpa-1".into()),
                    ..InterfaceOptions::default()
                };
                match interface_for(&v, DomainForm::LibvirtManaged, &opts) {
                    Ok(d) => {
                        supported += 1;
                        validate(&d);
                    }
                    Err(e) => {
                        assert_eq!(
                            e,
                            VifConfigError::Unsupported {
                                port: v.id,
                                vif_type,
                                vnic_type
                            }
                        );
                        assert!(e.to_string().contains(P), "{e}");
                    }
                }
            }
        }
        // ovs×{normal,direct,remote-managed,virtio-forwarder,vdpa}, bridge×normal,
        // hw_veb×{direct,accelerator-direct,macvtap}, hostdev_physical×{direct-physical,
        // accelerator-direct-physical}, vhostuser×{normal,virtio-forwarder}, tap×normal,
        // macvtap×normal, vdpa×vdpa.
        assert_eq!(supported, 16);
    }

    #[test]
    fn missing_pci_slot_is_a_typed_error() {
        let err = map(
            json!({"type": "hostdev_physical", "vnic_type": "direct-physical"}),
            DomainForm::LibvirtManaged,
        )
        .unwrap_err();
        assert_eq!(
            err,
            VifConfigError::Missing {
                port: P.parse().unwrap(),
                what: "profile.pci_slot"
            }
        );
    }
}
