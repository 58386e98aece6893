//! The VIF model, parsed strictly from Nova's `network_info` cache format.
//!
//! `network_info` is a JSON list of VIF dicts. vireo follows Nova's defaults where a key is
//! missing (`active` absent counts as not active, `vnic_type` absent is `normal`) but parses
//! strictly where Nova is lax: a boolean is a JSON boolean or the string `"true"`/`"false"`
//! in any case, never "any non-empty string"; MACs and port ids must be well formed; vif
//! types that cannot be plugged (`other`, `unbound`, `binding_failed`) are errors. Every error
//! names the VIF's index, its port id (when it has one) and the field.
//!
//! The original dict of every VIF is kept (`Vif::raw`) so vireo can store `network_info`
//! back into the domain metadata exactly as it received it.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use uuid::Uuid;
use vireo_xml::types::{MacAddress, PciAddress};

/// Largest MTU vireo accepts from a network's `meta.mtu` (jumbo frames included).
pub const MAX_MTU: u32 = 65_535;
/// Smallest MTU vireo accepts (IPv4's minimum).
pub const MIN_MTU: u32 = 68;

/// What was wrong with one field of one VIF.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// A required key is absent or null.
    #[error("missing")]
    Missing,
    /// Expected a JSON object.
    #[error("not an object")]
    NotObject,
    /// Expected a JSON string.
    #[error("not a string")]
    NotString,
    /// Expected a boolean (`true`/`false` or the strings "true"/"false", any case).
    #[error("not a boolean: {0}")]
    NotBool(String),
    /// Expected an integer in the given range.
    #[error("not an integer in {min}..={max}: {value}")]
    OutOfRange {
        /// The offending value as JSON text.
        value: String,
        /// Lowest allowed.
        min: u64,
        /// Highest allowed.
        max: u64,
    },
    /// Not a MAC address, or a multicast one.
    #[error("invalid MAC address {0:?}")]
    BadMac(String),
    /// Not a UUID.
    #[error("invalid UUID {0:?}")]
    BadUuid(String),
    /// Not a PCI address.
    #[error("invalid PCI address {0:?}")]
    BadPci(String),
    /// A vif_type vireo does not know.
    #[error("unknown vif_type {0:?}")]
    UnknownVifType(String),
    /// A vif_type that means the port has no usable binding.
    #[error("unusable vif_type {0:?}: the port is not bound to a usable host")]
    UnusableVifType(String),
    /// A vnic_type vireo does not know.
    #[error("unknown vnic_type {0:?}")]
    UnknownVnicType(String),
    /// A device name that is empty, too long for IFNAMSIZ, or holds characters a Linux
    /// interface name may not.
    #[error("invalid device name {0:?}")]
    BadDevName(String),
    /// Another VIF of the same instance has the same value.
    #[error("duplicate of VIF {0}")]
    Duplicate(usize),
}

/// Why `network_info` could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VifError {
    /// The text is not JSON.
    #[error("network_info is not valid JSON: {0}")]
    Json(String),
    /// The document is not a list.
    #[error("network_info is not a JSON list")]
    NotAList,
    /// The list item is not an object.
    #[error("VIF {index}: not a JSON object")]
    NotAnObject {
        /// Position in the list.
        index: usize,
    },
    /// One field of one VIF is invalid.
    #[error("VIF {index} (port {port}): field `{field}`: {problem}")]
    Field {
        /// Position in the list.
        index: usize,
        /// The port id as given (or `?` when it is missing or unreadable).
        port: String,
        /// Dotted path of the field, e.g. `details.ovs_hybrid_plug`.
        field: String,
        /// What was wrong.
        problem: Problem,
    },
}

/// Neutron's `binding:vif_type`, as Nova stores it in `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VifType {
    /// Open vSwitch (native or hybrid plug, see [`VifDetails::ovs_hybrid_plug`]).
    Ovs,
    /// Linux bridge.
    Bridge,
    /// SR-IOV virtual function (hardware VEB): `direct` or `macvtap` vnic.
    HwVeb,
    /// Whole physical function passed through (`direct-physical`).
    HostdevPhysical,
    /// vhost-user socket (OVS-DPDK, virtio-forwarder).
    Vhostuser,
    /// A plain tap device vireo creates (routed networking such as Calico).
    Tap,
    /// The macvtap mechanism driver: a macvtap on a physical interface.
    Macvtap,
    /// vDPA device.
    Vdpa,
}

impl VifType {
    /// Every vif_type vireo accepts.
    pub const ALL: [VifType; 8] = [
        VifType::Ovs,
        VifType::Bridge,
        VifType::HwVeb,
        VifType::HostdevPhysical,
        VifType::Vhostuser,
        VifType::Tap,
        VifType::Macvtap,
        VifType::Vdpa,
    ];

    /// The name Neutron and Nova use.
    pub fn as_str(&self) -> &'static str {
        match self {
            VifType::Ovs => "ovs",
            VifType::Bridge => "bridge",
            VifType::HwVeb => "hw_veb",
            VifType::HostdevPhysical => "hostdev_physical",
            VifType::Vhostuser => "vhostuser",
            VifType::Tap => "tap",
            VifType::Macvtap => "macvtap",
            VifType::Vdpa => "vdpa",
        }
    }
}

impl FromStr for VifType {
    type Err = Problem;

    fn from_str(s: &str) -> Result<Self, Problem> {
        Ok(match s {
            "ovs" => VifType::Ovs,
            "bridge" => VifType::Bridge,
            "hw_veb" => VifType::HwVeb,
            "hostdev_physical" => VifType::HostdevPhysical,
            "vhostuser" => VifType::Vhostuser,
            "tap" => VifType::Tap,
            "macvtap" => VifType::Macvtap,
            "vdpa" => VifType::Vdpa,
            "other" | "unbound" | "binding_failed" => {
                return Err(Problem::UnusableVifType(s.to_owned()))
            }
            _ => return Err(Problem::UnknownVifType(s.to_owned())),
        })
    }
}

impl fmt::Display for VifType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Neutron's `binding:vnic_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum VnicType {
    /// A virtio NIC backed by a host device (tap, vhost-user).
    #[default]
    Normal,
    /// SR-IOV VF given to the guest.
    Direct,
    /// SR-IOV PF given to the guest whole.
    DirectPhysical,
    /// A macvtap on top of an SR-IOV VF.
    Macvtap,
    /// Bare metal (Ironic); never on a libvirt host.
    Baremetal,
    /// vhost-user with a virtio-forwarder.
    VirtioForwarder,
    /// vDPA device.
    Vdpa,
    /// Cyborg-managed accelerator VF.
    AcceleratorDirect,
    /// Cyborg-managed accelerator PF.
    AcceleratorDirectPhysical,
    /// Smart NIC (Ironic).
    SmartNic,
    /// A VF whose port is managed on a DPU (off-host control plane).
    RemoteManaged,
}

impl VnicType {
    /// Every vnic_type vireo knows.
    pub const ALL: [VnicType; 11] = [
        VnicType::Normal,
        VnicType::Direct,
        VnicType::DirectPhysical,
        VnicType::Macvtap,
        VnicType::Baremetal,
        VnicType::VirtioForwarder,
        VnicType::Vdpa,
        VnicType::AcceleratorDirect,
        VnicType::AcceleratorDirectPhysical,
        VnicType::SmartNic,
        VnicType::RemoteManaged,
    ];

    /// The name Neutron and Nova use.
    pub fn as_str(&self) -> &'static str {
        match self {
            VnicType::Normal => "normal",
            VnicType::Direct => "direct",
            VnicType::DirectPhysical => "direct-physical",
            VnicType::Macvtap => "macvtap",
            VnicType::Baremetal => "baremetal",
            VnicType::VirtioForwarder => "virtio-forwarder",
            VnicType::Vdpa => "vdpa",
            VnicType::AcceleratorDirect => "accelerator-direct",
            VnicType::AcceleratorDirectPhysical => "accelerator-direct-physical",
            VnicType::SmartNic => "smart-nic",
            VnicType::RemoteManaged => "remote-managed",
        }
    }
}

impl FromStr for VnicType {
    type Err = Problem;

    fn from_str(s: &str) -> Result<Self, Problem> {
        VnicType::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| Problem::UnknownVnicType(s.to_owned()))
    }
}

impl fmt::Display for VnicType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Neutron port id (always a UUID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortId(pub Uuid);

impl PortId {
    /// The first `n` characters of the hyphenated form, as os-vif and Nova use for device
    /// names (`tap` + 11 characters, `qbr` + 11, ...).
    pub fn prefix(&self, n: usize) -> String {
        let s = self.0.hyphenated().to_string();
        s.chars().take(n).collect()
    }
}

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl FromStr for PortId {
    type Err = Problem;

    fn from_str(s: &str) -> Result<Self, Problem> {
        // Accept only the canonical hyphenated form Neutron produces.
        if s.len() != 36 {
            return Err(Problem::BadUuid(s.to_owned()));
        }
        Uuid::parse_str(s)
            .map(PortId)
            .map_err(|_| Problem::BadUuid(s.to_owned()))
    }
}

impl<'de> Deserialize<'de> for PortId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for PortId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `binding:vif_details`, the keys vireo uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VifDetails {
    /// OVS hybrid plug: tap → qbr Linux bridge → qvb/qvo veth → br-int.
    pub ovs_hybrid_plug: bool,
    /// The backend filters traffic itself.
    pub port_filter: bool,
    /// VLAN tag for SR-IOV VFs (`details.vlan`), 0 = untagged.
    pub vlan: Option<u16>,
    /// OVS bridge named by the binding (`details.bridge_name`), overrides `network.bridge`.
    pub bridge_name: Option<String>,
    /// OVS datapath type (`system` or `netdev`).
    pub datapath_type: Option<String>,
    /// vhost-user socket path.
    pub vhostuser_socket: Option<String>,
    /// vhost-user mode: `client` or `server` (`vhostuser_mode`).
    pub vhostuser_mode: Option<String>,
    /// vhost-user port plugged into OVS (`vhostuser_ovs_plug`).
    pub vhostuser_ovs_plug: bool,
    /// macvtap mechanism driver: the physical interface (`physical_interface`).
    pub physical_interface: Option<String>,
    /// macvtap mechanism driver: mode (`macvtap_mode`, e.g. `bridge`, `vepa`, `passthrough`).
    pub macvtap_mode: Option<String>,
    /// macvtap mechanism driver: the lower device (`macvtap_source`).
    pub macvtap_source: Option<String>,
    /// Whether Neutron's agent on this host is expected to report the port up
    /// (`connectivity`, informative).
    pub connectivity: Option<String>,
    /// The ML2 mechanism driver that bound the port's bottom level (`bound_drivers`, a map
    /// of binding level to driver: `openvswitch`, `ovn`, `linuxbridge`, `sriovnicswitch`...).
    /// Neutron adds it when it shows a port (not in the answer to a binding update, nor in
    /// the bindings API); the event model tells ML2/OVN's ports from the OVS agent's by it.
    pub bound_by: Option<String>,
}

/// `binding:profile`, the keys vireo uses; the whole object is kept in [`VifProfile::raw`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VifProfile {
    /// SR-IOV: PCI address of the VF or PF (`pci_slot`).
    pub pci_slot: Option<PciAddress>,
    /// SR-IOV: the physnet (`physical_network`).
    pub physical_network: Option<String>,
    /// PCI vendor/product (`pci_vendor_info`).
    pub pci_vendor_info: Option<String>,
    /// Live migration: the host the instance is migrating to.
    pub migrating_to: Option<String>,
    /// Trusted VF (`trusted`).
    pub trusted: bool,
    /// The whole profile as received.
    pub raw: Map<String, Value>,
}

/// The `network` of a VIF.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Network {
    /// Network id, when given.
    pub id: Option<String>,
    /// The bridge (`br-int` for OVS, `brq...` for Linux bridge).
    pub bridge: Option<String>,
    /// The network's label.
    pub label: Option<String>,
    /// `meta.mtu`.
    pub mtu: Option<u32>,
    /// `meta.physical_network`.
    pub physical_network: Option<String>,
}

/// One VIF of an instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Vif {
    /// Position in `network_info`.
    pub index: usize,
    /// The Neutron port id.
    pub id: PortId,
    /// The port's MAC.
    pub address: MacAddress,
    /// `type`.
    pub vif_type: VifType,
    /// `vnic_type` (default `normal`).
    pub vnic_type: VnicType,
    /// `details`.
    pub details: VifDetails,
    /// `profile`.
    pub profile: VifProfile,
    /// `active`: the port was ACTIVE when the cache was written (absent counts as false).
    pub active: bool,
    /// `devname`: the host device name, when Nova gave one.
    pub devname: Option<String>,
    /// `network`.
    pub network: Network,
    /// `preserve_on_delete`: a user-supplied port, to be unbound rather than deleted.
    pub preserve_on_delete: bool,
    /// The dict as received, as compact JSON text: shared by every copy of the VIF (an idle
    /// instance actor keeps its `network_info`; a parsed `Value` would cost several times
    /// the memory). [`Vif::raw_value`] gives it back as a value.
    pub raw: Arc<str>,
}

impl Vif {
    /// The dict as received.
    pub fn raw_value(&self) -> Value {
        // The text was written by serde_json from a value: it always parses.
        serde_json::from_str(&self.raw).unwrap_or(Value::Null)
    }

    /// The OVS bridge this VIF plugs into: `details.bridge_name`, else `network.bridge`,
    /// else `br-int`.
    pub fn ovs_bridge(&self) -> &str {
        self.details
            .bridge_name
            .as_deref()
            .or(self.network.bridge.as_deref())
            .unwrap_or("br-int")
    }
}

/// Length of the host device names os-vif and Nova derive from a port id: a 3-letter prefix
/// and the first 11 characters of the id (14 in all, under IFNAMSIZ's 15).
pub const NIC_NAME_LEN: usize = 14;

impl Vif {
    /// `prefix` + the port id, cut to [`NIC_NAME_LEN`] characters, as os-vif names devices.
    pub fn device_name(&self, prefix: &str) -> String {
        let mut name = String::with_capacity(NIC_NAME_LEN);
        name.push_str(prefix);
        name.push_str(&self.id.prefix(NIC_NAME_LEN.saturating_sub(prefix.len())));
        name
    }

    /// The tap device: `devname` when Nova gave one, else `tap` + id.
    pub fn tap_name(&self) -> String {
        self.devname
            .clone()
            .unwrap_or_else(|| self.device_name("tap"))
    }

    /// OVS hybrid plug: the per-VIF Linux bridge `qbr` + id.
    pub fn qbr_name(&self) -> String {
        self.device_name("qbr")
    }

    /// OVS hybrid plug: the veth end enslaved to the qbr bridge, `qvb` + id.
    pub fn qvb_name(&self) -> String {
        self.device_name("qvb")
    }

    /// OVS hybrid plug: the veth end on the integration bridge, `qvo` + id.
    pub fn qvo_name(&self) -> String {
        self.device_name("qvo")
    }

    /// Linux bridge VIF: `network.bridge`, else `brq` + the network id.
    pub fn linux_bridge_name(&self) -> Option<String> {
        if let Some(b) = &self.network.bridge {
            return Some(b.clone());
        }
        let id = self.network.id.as_deref()?;
        let name: String = std::iter::once("brq")
            .chain(std::iter::once(id))
            .collect::<String>()
            .chars()
            .take(NIC_NAME_LEN)
            .collect();
        valid_ifname(&name).then_some(name)
    }
}

/// An instance's parsed `network_info`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NetworkInfo {
    /// The VIFs in `network_info` order.
    pub vifs: Vec<Vif>,
}

impl NetworkInfo {
    /// The ports of the VIFs, in `network_info` order.
    pub fn port_ids(&self) -> Vec<PortId> {
        self.vifs.iter().map(|v| v.id).collect()
    }

    /// Parse `network_info` JSON text.
    pub fn parse(text: &str) -> Result<Self, VifError> {
        let value: Value = serde_json::from_str(text).map_err(|e| VifError::Json(e.to_string()))?;
        Self::from_value(&value)
    }

    /// Parse an already decoded `network_info` value.
    pub fn from_value(value: &Value) -> Result<Self, VifError> {
        let list = value.as_array().ok_or(VifError::NotAList)?;
        let mut vifs = Vec::with_capacity(list.len());
        let mut ids = HashSet::with_capacity(list.len());
        let mut macs = HashSet::with_capacity(list.len());
        for (index, item) in list.iter().enumerate() {
            let vif = Vif::from_value(index, item)?;
            // The port as given (another spelling of a duplicate id may differ in case).
            let port = item.get("id").and_then(Value::as_str).unwrap_or("?");
            if !ids.insert(vif.id) {
                let first = vifs.iter().position(|v: &Vif| v.id == vif.id).unwrap_or(0);
                return Err(field_err(index, port, "id", Problem::Duplicate(first)));
            }
            if !macs.insert(vif.address) {
                let first = vifs
                    .iter()
                    .position(|v: &Vif| v.address == vif.address)
                    .unwrap_or(0);
                return Err(field_err(index, port, "address", Problem::Duplicate(first)));
            }
            vifs.push(vif);
        }
        Ok(NetworkInfo { vifs })
    }

    /// The `network_info` list as received (the raw dicts), for storing back.
    pub fn to_value(&self) -> Value {
        Value::Array(self.vifs.iter().map(Vif::raw_value).collect())
    }

    /// Find a VIF by port id.
    pub fn get(&self, id: &PortId) -> Option<&Vif> {
        self.vifs.iter().find(|v| &v.id == id)
    }
}

fn field_err(index: usize, port: &str, field: &str, problem: Problem) -> VifError {
    VifError::Field {
        index,
        port: port.to_owned(),
        field: field.to_owned(),
        problem,
    }
}

/// `details.bound_drivers` (`{"0": "ovn"}`; a hierarchical binding has more levels): the
/// driver of the highest level, the one that bound the segment on the host.
fn bottom_driver(r: &Reader<'_>, d: &Map<String, Value>) -> Result<Option<String>, VifError> {
    const PATH: &str = "details.bound_drivers";
    let levels = match d.get("bound_drivers") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(r.err(PATH, Problem::NotObject)),
    };
    let mut bottom: Option<(u8, &str)> = None;
    for (level, driver) in levels {
        let n: u8 = level.parse().map_err(|_| {
            r.err(
                PATH,
                Problem::OutOfRange {
                    value: format!("{level:?}"),
                    min: 0,
                    max: u64::from(u8::MAX),
                },
            )
        })?;
        let name = driver
            .as_str()
            .ok_or_else(|| r.err(PATH, Problem::NotString))?;
        if bottom.is_none_or(|(b, _)| n > b) {
            bottom = Some((n, name));
        }
    }
    Ok(bottom.map(|(_, name)| name.to_owned()))
}

/// Reads the fields of one VIF dict, building errors that name the VIF.
struct Reader<'a> {
    index: usize,
    port: String,
    obj: &'a Map<String, Value>,
}

impl<'a> Reader<'a> {
    fn err(&self, field: &str, problem: Problem) -> VifError {
        field_err(self.index, &self.port, field, problem)
    }

    fn sub(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, VifError> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(_) => Err(self.err(key, Problem::NotObject)),
        }
    }
}

fn opt_str<'a>(
    r: &Reader<'_>,
    obj: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'a str>, VifError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(r.err(path, Problem::NotString)),
    }
}

/// Strict boolean: JSON `true`/`false`, or the strings "true"/"false" in any case.
/// Absent or null gives `default`.
fn opt_bool(
    r: &Reader<'_>,
    obj: &Map<String, Value>,
    key: &str,
    path: &str,
    default: bool,
) -> Result<bool, VifError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(other) => Err(r.err(path, Problem::NotBool(other.to_string()))),
    }
}

/// Integer given as a JSON number or a decimal string, in `min..=max`.
fn opt_int(
    r: &Reader<'_>,
    obj: &Map<String, Value>,
    key: &str,
    path: &str,
    min: u64,
    max: u64,
) -> Result<Option<u64>, VifError> {
    let bad = |v: &Value| {
        r.err(
            path,
            Problem::OutOfRange {
                value: v.to_string(),
                min,
                max,
            },
        )
    };
    let n = match obj.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(v @ Value::Number(n)) => n.as_u64().ok_or_else(|| bad(v))?,
        Some(v @ Value::String(s)) => {
            if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(v));
            }
            s.parse::<u64>().map_err(|_| bad(v))?
        }
        Some(v) => return Err(bad(v)),
    };
    if n < min || n > max {
        return Err(bad(&obj.get(key).cloned().unwrap_or(Value::Null)));
    }
    Ok(Some(n))
}

/// A Linux interface name: 1..=15 bytes, no '/', no whitespace, not "." or "..", printable
/// ASCII only (vireo never passes names to a shell, but refuses anything odd anyway).
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl Vif {
    /// Parse one VIF dict at position `index` of `network_info`.
    pub fn from_value(index: usize, value: &Value) -> Result<Vif, VifError> {
        let obj = value.as_object().ok_or(VifError::NotAnObject { index })?;
        let port_text = match obj.get("id") {
            Some(Value::String(s)) => s.clone(),
            _ => "?".to_owned(),
        };
        let r = Reader {
            index,
            port: port_text,
            obj,
        };

        let id = match obj.get("id") {
            None | Some(Value::Null) => return Err(r.err("id", Problem::Missing)),
            Some(Value::String(s)) => s.parse::<PortId>().map_err(|p| r.err("id", p))?,
            Some(_) => return Err(r.err("id", Problem::NotString)),
        };
        let address = match opt_str(&r, obj, "address", "address")? {
            None => return Err(r.err("address", Problem::Missing)),
            Some(s) => {
                let mac: MacAddress = s
                    .parse()
                    .map_err(|_| r.err("address", Problem::BadMac(s.to_owned())))?;
                if mac.is_multicast() || mac.octets() == [0; 6] {
                    return Err(r.err("address", Problem::BadMac(s.to_owned())));
                }
                mac
            }
        };
        let vif_type = match opt_str(&r, obj, "type", "type")? {
            None => return Err(r.err("type", Problem::Missing)),
            Some(s) => s.parse::<VifType>().map_err(|p| r.err("type", p))?,
        };
        let vnic_type = match opt_str(&r, obj, "vnic_type", "vnic_type")? {
            None => VnicType::Normal,
            Some(s) => s.parse::<VnicType>().map_err(|p| r.err("vnic_type", p))?,
        };
        let active = opt_bool(&r, obj, "active", "active", false)?;
        let preserve_on_delete =
            opt_bool(&r, obj, "preserve_on_delete", "preserve_on_delete", false)?;
        let devname = match opt_str(&r, obj, "devname", "devname")? {
            None => None,
            Some(s) if valid_ifname(s) => Some(s.to_owned()),
            Some(s) => return Err(r.err("devname", Problem::BadDevName(s.to_owned()))),
        };

        let empty = Map::new();
        let d = r.sub("details")?.unwrap_or(&empty);
        let opt_name = |key: &str, path: &str| -> Result<Option<String>, VifError> {
            match opt_str(&r, d, key, path)? {
                None => Ok(None),
                Some(s) if valid_ifname(s) => Ok(Some(s.to_owned())),
                Some(s) => Err(r.err(path, Problem::BadDevName(s.to_owned()))),
            }
        };
        let details = VifDetails {
            ovs_hybrid_plug: opt_bool(&r, d, "ovs_hybrid_plug", "details.ovs_hybrid_plug", false)?,
            port_filter: opt_bool(&r, d, "port_filter", "details.port_filter", false)?,
            vlan: opt_int(&r, d, "vlan", "details.vlan", 0, 4095)?.map(|v| v as u16),
            bridge_name: opt_name("bridge_name", "details.bridge_name")?,
            datapath_type: opt_str(&r, d, "datapath_type", "details.datapath_type")?
                .map(str::to_owned),
            vhostuser_socket: opt_str(&r, d, "vhostuser_socket", "details.vhostuser_socket")?
                .map(str::to_owned),
            vhostuser_mode: opt_str(&r, d, "vhostuser_mode", "details.vhostuser_mode")?
                .map(str::to_owned),
            vhostuser_ovs_plug: opt_bool(
                &r,
                d,
                "vhostuser_ovs_plug",
                "details.vhostuser_ovs_plug",
                false,
            )?,
            physical_interface: opt_name("physical_interface", "details.physical_interface")?,
            macvtap_mode: opt_str(&r, d, "macvtap_mode", "details.macvtap_mode")?
                .map(str::to_owned),
            macvtap_source: opt_name("macvtap_source", "details.macvtap_source")?,
            connectivity: opt_str(&r, d, "connectivity", "details.connectivity")?
                .map(str::to_owned),
            bound_by: bottom_driver(&r, d)?,
        };

        let p = r.sub("profile")?.unwrap_or(&empty);
        let profile = VifProfile {
            pci_slot: match opt_str(&r, p, "pci_slot", "profile.pci_slot")? {
                None => None,
                Some(s) => Some(
                    s.parse()
                        .map_err(|_| r.err("profile.pci_slot", Problem::BadPci(s.to_owned())))?,
                ),
            },
            physical_network: opt_str(&r, p, "physical_network", "profile.physical_network")?
                .map(str::to_owned),
            pci_vendor_info: opt_str(&r, p, "pci_vendor_info", "profile.pci_vendor_info")?
                .map(str::to_owned),
            migrating_to: opt_str(&r, p, "migrating_to", "profile.migrating_to")?
                .map(str::to_owned),
            trusted: opt_bool(&r, p, "trusted", "profile.trusted", false)?,
            raw: p.clone(),
        };

        let n = r.sub("network")?.unwrap_or(&empty);
        let meta = match n.get("meta") {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(m)) => m,
            Some(_) => return Err(r.err("network.meta", Problem::NotObject)),
        };
        let network = Network {
            id: opt_str(&r, n, "id", "network.id")?.map(str::to_owned),
            bridge: match opt_str(&r, n, "bridge", "network.bridge")? {
                None => None,
                Some(s) if valid_ifname(s) => Some(s.to_owned()),
                Some(s) => return Err(r.err("network.bridge", Problem::BadDevName(s.to_owned()))),
            },
            label: opt_str(&r, n, "label", "network.label")?.map(str::to_owned),
            mtu: opt_int(
                &r,
                meta,
                "mtu",
                "network.meta.mtu",
                u64::from(MIN_MTU),
                u64::from(MAX_MTU),
            )?
            .map(|v| v as u32),
            physical_network: opt_str(
                &r,
                meta,
                "physical_network",
                "network.meta.physical_network",
            )?
            .map(str::to_owned),
        };

        Ok(Vif {
            index,
            id,
            address,
            vif_type,
            vnic_type,
            details,
            profile,
            active,
            devname,
            network,
            preserve_on_delete,
            raw: Arc::from(value.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const P1: &str = "3b2c4d5e-0000-4000-8000-000000000001";
    const P2: &str = "3b2c4d5e-0000-4000-8000-000000000002";

    fn ovs(id: &str, mac: &str) -> Value {
        json!({
            "id": id, "address": mac, "type": "ovs",
            "details": {"ovs_hybrid_plug": true, "port_filter": true},
            "network": {"id": "net-1", "bridge": "br-int", "meta": {"mtu": 1450}},
            "devname": "tap3b2c4d5e-00"
        })
    }

    #[test]
    fn parses_a_nova_ovs_vif_with_defaults() {
        let ni = NetworkInfo::from_value(&json!([ovs(P1, "fa:16:3e:00:00:01")])).unwrap();
        let v = &ni.vifs[0];
        assert_eq!(v.id.to_string(), P1);
        assert_eq!(v.vif_type, VifType::Ovs);
        assert_eq!(v.vnic_type, VnicType::Normal);
        assert!(!v.active, "a VIF without `active` counts as not active");
        assert!(v.details.ovs_hybrid_plug);
        assert_eq!(v.network.mtu, Some(1450));
        assert_eq!(v.ovs_bridge(), "br-int");
        assert_eq!(ni.to_value(), json!([ovs(P1, "fa:16:3e:00:00:01")]));
    }

    #[test]
    fn the_bottom_bound_driver_is_read_and_a_bad_map_refused() {
        let mut v = ovs(P1, "fa:16:3e:00:00:01");
        assert_eq!(
            NetworkInfo::from_value(&json!([v.clone()])).unwrap().vifs[0]
                .details
                .bound_by,
            None
        );
        v["details"]["bound_drivers"] = json!({"0": "ovn"});
        let ni = NetworkInfo::from_value(&json!([v.clone()])).unwrap();
        assert_eq!(ni.vifs[0].details.bound_by.as_deref(), Some("ovn"));
        assert_eq!(ni.to_value(), json!([v.clone()]), "kept as received");
        // Hierarchical binding: the highest level bound the host's segment.
        v["details"]["bound_drivers"] = json!({"10": "openvswitch", "2": "cisco_nexus"});
        let ni = NetworkInfo::from_value(&json!([v.clone()])).unwrap();
        assert_eq!(ni.vifs[0].details.bound_by.as_deref(), Some("openvswitch"));
        for bad in [
            json!("ovn"),
            json!({"x": "ovn"}),
            json!({"256": "ovn"}),
            json!({"0": 1}),
        ] {
            v["details"]["bound_drivers"] = bad.clone();
            let err = NetworkInfo::from_value(&json!([v.clone()])).unwrap_err();
            assert!(
                matches!(&err, VifError::Field { field, .. } if field == "details.bound_drivers"),
                "{bad}: {err:?}"
            );
        }
    }

    #[test]
    fn string_false_is_false_and_garbage_is_an_error() {
        let mut v = ovs(P1, "fa:16:3e:00:00:01");
        v["details"]["ovs_hybrid_plug"] = json!("False");
        v["active"] = json!("TRUE");
        let ni = NetworkInfo::from_value(&json!([v.clone()])).unwrap();
        assert!(!ni.vifs[0].details.ovs_hybrid_plug);
        assert!(ni.vifs[0].active);

        v["details"]["ovs_hybrid_plug"] = json!("no");
        let err = NetworkInfo::from_value(&json!([v.clone()])).unwrap_err();
        assert_eq!(
            err,
            VifError::Field {
                index: 0,
                port: P1.into(),
                field: "details.ovs_hybrid_plug".into(),
                problem: Problem::NotBool("\"no\"".into()),
            }
        );
        v["details"]["ovs_hybrid_plug"] = json!(1);
        assert!(NetworkInfo::from_value(&json!([v])).is_err());
    }

    #[test]
    fn errors_name_index_port_and_field() {
        let mut bad = ovs(P2, "fa:16:3e:00:00:02");
        bad["address"] = json!("fa:16:3e:00:00");
        let err = NetworkInfo::from_value(&json!([ovs(P1, "fa:16:3e:00:00:01"), bad])).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("VIF 1") && text.contains(P2) && text.contains("address"),
            "{text}"
        );

        let mut bad = ovs("not-a-uuid", "fa:16:3e:00:00:02");
        bad["id"] = json!("not-a-uuid");
        let err = NetworkInfo::from_value(&json!([bad])).unwrap_err();
        assert!(
            matches!(err, VifError::Field { ref field, problem: Problem::BadUuid(_), .. } if field == "id")
        );
    }

    #[test]
    fn unusable_and_unknown_vif_types_are_errors() {
        for (t, unusable) in [
            ("other", true),
            ("unbound", true),
            ("binding_failed", true),
            ("802.qbh", false),
        ] {
            let mut v = ovs(P1, "fa:16:3e:00:00:01");
            v["type"] = json!(t);
            let err = NetworkInfo::from_value(&json!([v])).unwrap_err();
            let VifError::Field { problem, field, .. } = err else {
                panic!("{err:?}")
            };
            assert_eq!(field, "type");
            assert_eq!(
                matches!(problem, Problem::UnusableVifType(_)),
                unusable,
                "{t}"
            );
        }
    }

    #[test]
    fn duplicates_are_errors() {
        let err = NetworkInfo::from_value(&json!([
            ovs(P1, "fa:16:3e:00:00:01"),
            ovs(P1, "fa:16:3e:00:00:02")
        ]))
        .unwrap_err();
        assert!(matches!(
            err,
            VifError::Field {
                index: 1,
                problem: Problem::Duplicate(0),
                ..
            }
        ));
        let err = NetworkInfo::from_value(&json!([
            ovs(P1, "fa:16:3e:00:00:01"),
            ovs(P2, "fa:16:3e:00:00:01")
        ]))
        .unwrap_err();
        assert!(
            matches!(err, VifError::Field { index: 1, ref field, problem: Problem::Duplicate(0), .. } if field == "address")
        );
    }

    // Found by actors/tests/prop_network_info.rs: a duplicate's error named the port in its
    // canonical spelling, not as given like every other error.
    #[test]
    fn a_duplicate_names_the_port_as_given() {
        let upper = P1.to_uppercase();
        for (second, field) in [
            (ovs(&upper, "fa:16:3e:00:00:02"), "id"),
            (
                ovs(&upper.replace("01", "03"), "FA-16-3E-00-00-01"),
                "address",
            ),
        ] {
            let err =
                NetworkInfo::from_value(&json!([ovs(P1, "fa:16:3e:00:00:01"), second.clone()]))
                    .unwrap_err();
            assert_eq!(
                err,
                VifError::Field {
                    index: 1,
                    port: second["id"].as_str().unwrap().to_owned(),
                    field: field.into(),
                    problem: Problem::Duplicate(0),
                }
            );
        }
    }

    // Found by the `network_info` fuzz target (fuzz/): serde_json's default float parsing can
    // be 1 ULP off, so a float anywhere in a VIF changed each time network_info was stored
    // and read back (the workspace enables serde_json's `float_roundtrip`).
    #[test]
    fn floats_are_stored_back_exactly() {
        let text = format!(
            r#"[{{"id":"{P1}","address":"fa:16:3e:00:00:01","type":"ovs",
                 "network":{{"subnets":[{{"version":6.66666666666e+103}}]}},"x":1.7777777777777777e+39}}]"#
        );
        let doc: Value = serde_json::from_str(&text).unwrap();
        let ni = NetworkInfo::parse(&text).unwrap();
        assert_eq!(ni.to_value(), doc);
        assert_eq!(NetworkInfo::parse(&ni.to_value().to_string()).unwrap(), ni);
        assert_eq!(
            doc[0]["network"]["subnets"][0]["version"].as_f64(),
            Some(6.66666666666e103)
        );
    }

    #[test]
    fn names_with_metacharacters_are_refused() {
        let mut v = ovs(P1, "fa:16:3e:00:00:01");
        v["devname"] = json!("tap;rm -rf /");
        assert!(NetworkInfo::from_value(&json!([v.clone()])).is_err());
        v["devname"] = json!("tap0123456789abcdef");
        assert!(NetworkInfo::from_value(&json!([v])).is_err());
    }

    #[test]
    fn device_names_follow_os_vif() {
        let mut raw = ovs(P1, "fa:16:3e:00:00:01");
        raw.as_object_mut().unwrap().remove("devname");
        raw["network"]["bridge"] = json!(null);
        raw["network"]["id"] = json!("a1b2c3d4-e5f6-4000-8000-000000000009");
        let v = Vif::from_value(0, &raw).unwrap();
        assert_eq!(v.tap_name(), "tap3b2c4d5e-00");
        assert_eq!(v.qbr_name(), "qbr3b2c4d5e-00");
        assert_eq!(v.qvb_name(), "qvb3b2c4d5e-00");
        assert_eq!(v.qvo_name(), "qvo3b2c4d5e-00");
        assert_eq!(v.linux_bridge_name().as_deref(), Some("brqa1b2c3d4-e5"));
        for name in [v.tap_name(), v.qbr_name(), v.linux_bridge_name().unwrap()] {
            assert_eq!(name.len(), NIC_NAME_LEN);
        }
    }

    #[test]
    fn vlan_and_mtu_ranges() {
        let mut v = ovs(P1, "fa:16:3e:00:00:01");
        v["details"]["vlan"] = json!("100");
        assert_eq!(
            NetworkInfo::from_value(&json!([v.clone()])).unwrap().vifs[0]
                .details
                .vlan,
            Some(100)
        );
        v["details"]["vlan"] = json!(4096);
        assert!(NetworkInfo::from_value(&json!([v.clone()])).is_err());
        v["details"]["vlan"] = json!(null);
        v["network"]["meta"]["mtu"] = json!(10);
        assert!(NetworkInfo::from_value(&json!([v])).is_err());
    }

    #[test]
    fn not_a_list_and_not_json() {
        assert_eq!(NetworkInfo::parse("{}"), Err(VifError::NotAList));
        assert!(matches!(NetworkInfo::parse("[1"), Err(VifError::Json(_))));
        assert_eq!(
            NetworkInfo::parse("[1]"),
            Err(VifError::NotAnObject { index: 0 })
        );
    }
}
