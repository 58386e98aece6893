//! VIF plugging: the [`VifPlugger`] trait, the plain data it takes and returns, the dispatch
//! from a VIF's `vif_type`/`vnic_type` to a [`PlugKind`], the ordered [`PlugStep`]s of each
//! kind, and the [`StaticPlugger`] of the `test:///` tier. The test doubles (a recording,
//! fault-injecting plugger and the fault seam host pluggers check) are in `plug::testing`, behind
//! the `test-support` feature.
//!
//! A plugger prepares the host devices a VIF needs before the domain starts (or before a live
//! migration reaches this host) and removes them afterwards. Its [`Plugged`] answer tells the
//! domain XML what to reference ([`Attachment`]) and lists what the call created.
//!
//! Contract every plugger keeps:
//! - plug twice = one set of devices; the second call creates nothing;
//! - unplug of something already gone (or half there) succeeds;
//! - a plug that fails part-way removes what that call created before returning the error.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use tokio::sync::broadcast;
use uuid::Uuid;
use vireo_xml::types::PciAddress;

use crate::vif::{PortId, Vif, VifType, VnicType};
use crate::wiring::{WiringChange, WiringSource};

#[cfg(any(test, feature = "test-support"))]
pub mod testing;

/// The underlying error of a failed host operation, shared so [`PlugError`] stays `Clone`.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Wrap any error as a [`Cause`].
pub fn cause<E: std::error::Error + Send + Sync + 'static>(e: E) -> Cause {
    Arc::new(e)
}

/// How the domain XML references the VIF's tap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DomainForm {
    /// libvirt creates the tap and attaches it (`<interface type='bridge'>`, with
    /// `<virtualport type='openvswitch'>` for OVS). The plugger prepares everything else.
    LibvirtManaged,
    /// vireo creates a persistent tap and wires it before the domain exists
    /// (`<interface type='ethernet'>` with `<target dev=... managed='no'/>`): this is what lets
    /// a destination host be wired before a live migration starts.
    PreCreated,
}

impl DomainForm {
    /// Both forms.
    pub const ALL: [DomainForm; 2] = [DomainForm::LibvirtManaged, DomainForm::PreCreated];
}

/// The instance a plug call is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlugContext {
    /// The instance uuid (goes to OVS `external_ids:vm-uuid`).
    pub instance_uuid: Uuid,
    /// The libvirt domain name.
    pub instance_name: String,
    /// Which domain form the devices are prepared for.
    pub form: DomainForm,
}

/// What kind of host plumbing a VIF needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PlugKind {
    /// OVS, tap directly on the integration bridge.
    OvsNative,
    /// OVS hybrid: tap → `qbr` Linux bridge → `qvb`/`qvo` veth → integration bridge.
    OvsHybrid,
    /// Linux bridge (`brq<net id>` or the bridge the VIF names).
    LinuxBridge,
    /// A plain tap, no bridge (routed networking).
    Tap,
    /// SR-IOV VF given to the guest (`hw_veb`, vnic `direct`).
    SriovVf,
    /// A macvtap libvirt creates on top of an SR-IOV VF (`hw_veb`, vnic `macvtap`).
    SriovMacvtap,
    /// A whole PF given to the guest (`hostdev_physical`, vnic `direct-physical`).
    SriovPf,
    /// The macvtap mechanism driver: a macvtap on a physical interface (`macvtap`).
    Macvtap,
}

impl PlugKind {
    /// Every kind.
    pub const ALL: [PlugKind; 8] = [
        PlugKind::OvsNative,
        PlugKind::OvsHybrid,
        PlugKind::LinuxBridge,
        PlugKind::Tap,
        PlugKind::SriovVf,
        PlugKind::SriovMacvtap,
        PlugKind::SriovPf,
        PlugKind::Macvtap,
    ];

    /// The kind for a (vif_type, vnic_type, ovs_hybrid_plug) triple, or `None` when vireo
    /// cannot plug it (vhost-user, vDPA, OVS hardware offload, bare metal, ...).
    pub fn select(vif_type: VifType, vnic_type: VnicType, hybrid: bool) -> Option<PlugKind> {
        Some(match (vif_type, vnic_type) {
            (VifType::Ovs, VnicType::Normal) if hybrid => PlugKind::OvsHybrid,
            (VifType::Ovs, VnicType::Normal) => PlugKind::OvsNative,
            (VifType::Bridge, VnicType::Normal) => PlugKind::LinuxBridge,
            (VifType::Tap, VnicType::Normal) => PlugKind::Tap,
            (VifType::HwVeb, VnicType::Direct) => PlugKind::SriovVf,
            (VifType::HwVeb, VnicType::Macvtap) => PlugKind::SriovMacvtap,
            (VifType::HostdevPhysical, VnicType::DirectPhysical) => PlugKind::SriovPf,
            (VifType::Macvtap, VnicType::Normal | VnicType::Macvtap) => PlugKind::Macvtap,
            _ => return None,
        })
    }

    /// The kind for a VIF, or [`PlugError::Unsupported`].
    pub fn for_vif(vif: &Vif) -> Result<PlugKind, PlugError> {
        Self::select(vif.vif_type, vif.vnic_type, vif.details.ovs_hybrid_plug).ok_or(
            PlugError::Unsupported {
                port: vif.id,
                vif_type: vif.vif_type,
                vnic_type: vif.vnic_type,
            },
        )
    }

    /// The host steps a plug of this kind takes, in order. Every plugger runs them in this
    /// order; with the `test-support` feature each checks its fault plan before each one.
    pub fn plug_steps(self, form: DomainForm) -> &'static [PlugStep] {
        use PlugStep::*;
        let pre = form == DomainForm::PreCreated;
        match self {
            PlugKind::OvsNative if pre => &[CreateTap, ConfigureTap, OvsTransact, OvsWait],
            PlugKind::OvsNative => &[OvsTransact, OvsWait],
            PlugKind::OvsHybrid if pre => &[
                EnsureLinuxBridge,
                CreateVeth,
                EnslaveVeth,
                OvsTransact,
                OvsWait,
                CreateTap,
                ConfigureTap,
                EnslaveTap,
            ],
            PlugKind::OvsHybrid => &[
                EnsureLinuxBridge,
                CreateVeth,
                EnslaveVeth,
                OvsTransact,
                OvsWait,
            ],
            PlugKind::LinuxBridge if pre => {
                &[EnsureLinuxBridge, CreateTap, ConfigureTap, EnslaveTap]
            }
            PlugKind::LinuxBridge => &[EnsureLinuxBridge],
            PlugKind::Tap if pre => &[CreateTap, ConfigureTap],
            PlugKind::Tap => &[],
            PlugKind::SriovVf | PlugKind::SriovMacvtap => &[LocateDevice, SetVf],
            PlugKind::SriovPf | PlugKind::Macvtap => &[LocateDevice],
        }
    }

    /// The host steps an unplug of this kind takes, in order.
    pub fn unplug_steps(self, form: DomainForm) -> &'static [PlugStep] {
        use PlugStep::*;
        let pre = form == DomainForm::PreCreated;
        match self {
            PlugKind::OvsNative if pre => &[DeleteOvsPort, DeleteTap],
            PlugKind::OvsNative => &[DeleteOvsPort],
            PlugKind::OvsHybrid if pre => {
                &[DeleteTap, DeleteOvsPort, DeleteVeth, DeleteLinuxBridge]
            }
            PlugKind::OvsHybrid => &[DeleteOvsPort, DeleteVeth, DeleteLinuxBridge],
            // The network's bridge is shared by every port of the network (like the OVS
            // integration bridge): unplug never deletes it.
            PlugKind::LinuxBridge if pre => &[DeleteTap],
            PlugKind::LinuxBridge => &[],
            PlugKind::Tap if pre => &[DeleteTap],
            PlugKind::Tap => &[],
            PlugKind::SriovVf | PlugKind::SriovMacvtap => &[LocateDevice, ResetVf],
            PlugKind::SriovPf | PlugKind::Macvtap => &[],
        }
    }
}

impl fmt::Display for PlugKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PlugKind::OvsNative => "ovs",
            PlugKind::OvsHybrid => "ovs-hybrid",
            PlugKind::LinuxBridge => "linux-bridge",
            PlugKind::Tap => "tap",
            PlugKind::SriovVf => "sriov-vf",
            PlugKind::SriovMacvtap => "sriov-macvtap",
            PlugKind::SriovPf => "sriov-pf",
            PlugKind::Macvtap => "macvtap",
        })
    }
}

/// One host operation of a plug or unplug (see [`PlugKind::plug_steps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PlugStep {
    /// Find the device the VIF uses (SR-IOV VF/PF in sysfs, macvtap lower device).
    LocateDevice,
    /// Create the persistent tap.
    CreateTap,
    /// Set the tap's MTU and MAC and bring it up.
    ConfigureTap,
    /// Create (or find) the Linux bridge and bring it up.
    EnsureLinuxBridge,
    /// Create the `qvb`/`qvo` veth pair.
    CreateVeth,
    /// Put `qvb` into the `qbr` bridge.
    EnslaveVeth,
    /// Put the tap into its Linux bridge.
    EnslaveTap,
    /// The OVSDB transaction (ensure bridge, add port, Interface external_ids, MTU).
    OvsTransact,
    /// Wait for ovs-vswitchd to apply it and check the Interface got an OpenFlow port.
    OvsWait,
    /// Set the VF's MAC, VLAN and trust through the PF.
    SetVf,
    /// Unplug: delete the tap.
    DeleteTap,
    /// Unplug: delete the OVS port.
    DeleteOvsPort,
    /// Unplug: delete the veth pair.
    DeleteVeth,
    /// Unplug: delete the per-VIF Linux bridge (hybrid `qbr`).
    DeleteLinuxBridge,
    /// Unplug: reset the VF's MAC, VLAN and trust.
    ResetVf,
}

/// macvtap modes libvirt accepts for `<source mode=...>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MacvtapMode {
    /// Traffic between macvtaps of one device stays local.
    #[default]
    Bridge,
    /// Traffic goes out to the adjacent switch.
    Vepa,
    /// No traffic between macvtaps of one device.
    Private,
    /// The whole device given to one macvtap (SR-IOV VF macvtap).
    Passthrough,
}

impl MacvtapMode {
    /// libvirt's name.
    pub fn as_str(&self) -> &'static str {
        match self {
            MacvtapMode::Bridge => "bridge",
            MacvtapMode::Vepa => "vepa",
            MacvtapMode::Private => "private",
            MacvtapMode::Passthrough => "passthrough",
        }
    }
}

impl FromStr for MacvtapMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        [
            MacvtapMode::Bridge,
            MacvtapMode::Vepa,
            MacvtapMode::Private,
            MacvtapMode::Passthrough,
        ]
        .into_iter()
        .find(|m| m.as_str() == s)
        .ok_or_else(|| s.to_owned())
    }
}

/// What the domain XML must reference for the VIF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attachment {
    /// `<interface type='bridge'>`: libvirt creates `tap` and attaches it to `bridge`. With
    /// `ovs_interface_id` the bridge is an OVS bridge and the interface needs
    /// `<virtualport type='openvswitch'><parameters interfaceid=.../>`.
    Bridge {
        /// The bridge (OVS integration bridge, `qbr...`, `brq...`).
        bridge: String,
        /// The tap libvirt creates (`<target dev=...>`).
        tap: String,
        /// The OVS `iface-id` libvirt must set, for an OVS bridge.
        ovs_interface_id: Option<PortId>,
    },
    /// `<interface type='ethernet'>` with `<target dev=tap>`. When `precreated`, vireo created
    /// and wired the tap and the target needs `managed='no'`; otherwise libvirt creates it.
    Ethernet {
        /// The tap.
        tap: String,
        /// vireo created the tap (`managed='no'`).
        precreated: bool,
    },
    /// `<interface type='hostdev' managed='yes'>`: an SR-IOV VF.
    HostdevVf {
        /// The VF's PCI address.
        pci: PciAddress,
        /// VLAN tag (0 = none) for `<vlan><tag id=.../>`.
        vlan: u16,
    },
    /// `<hostdev mode='subsystem' type='pci' managed='yes'>`: a whole PF.
    HostdevPf {
        /// The PF's PCI address.
        pci: PciAddress,
    },
    /// `<interface type='direct'>`: a macvtap libvirt creates on `dev`.
    Direct {
        /// The lower device (VF netdev, physical interface).
        dev: String,
        /// The macvtap mode.
        mode: MacvtapMode,
    },
}

impl Attachment {
    /// The host device the guest NIC sits on (tap, lower device, or PCI address).
    pub fn device(&self) -> String {
        match self {
            Attachment::Bridge { tap, .. } | Attachment::Ethernet { tap, .. } => tap.clone(),
            Attachment::HostdevVf { pci, .. } | Attachment::HostdevPf { pci } => pci.to_string(),
            Attachment::Direct { dev, .. } => dev.clone(),
        }
    }
}

/// A host object a plug call created.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostDevice {
    /// A persistent tap.
    Tap(String),
    /// A Linux bridge.
    LinuxBridge(String),
    /// A veth pair.
    VethPair {
        /// The end in the Linux bridge (`qvb...`).
        bridge_end: String,
        /// The end on OVS (`qvo...`).
        ovs_end: String,
    },
    /// An OVS bridge (created with the configured datapath type).
    OvsBridge(String),
    /// An OVS port with its Interface.
    OvsPort {
        /// The bridge.
        bridge: String,
        /// The port (and Interface) name.
        port: String,
    },
    /// VF settings applied through the PF.
    VfSettings {
        /// The PF netdev.
        pf: String,
        /// The VF number.
        vf: u32,
    },
}

/// The result of a successful plug.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plugged {
    /// The port.
    pub port: PortId,
    /// What kind of plumbing was prepared.
    pub kind: PlugKind,
    /// What the domain XML must reference.
    pub attachment: Attachment,
    /// The MTU applied (`network.meta.mtu`), for `<mtu size=...>`.
    pub mtu: Option<u32>,
    /// What this call created (empty when everything was already there).
    pub created: Vec<HostDevice>,
}

/// Why a plug or unplug failed. Every variant names the port; operations on a device name it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PlugError {
    /// vireo has no plugging for this vif_type/vnic_type combination.
    #[error("port {port}: cannot plug vif_type {vif_type} with vnic_type {vnic_type}")]
    Unsupported {
        /// The port.
        port: PortId,
        /// Its vif_type.
        vif_type: VifType,
        /// Its vnic_type.
        vnic_type: VnicType,
    },
    /// A field this kind needs is absent.
    #[error("port {port}: `{field}` is required for this VIF kind")]
    Missing {
        /// The port.
        port: PortId,
        /// The field (dotted path).
        field: &'static str,
    },
    /// A device name is invalid or outside what vireo may create or delete.
    #[error("port {port}: device name {name:?} refused: {reason}")]
    InvalidName {
        /// The port.
        port: PortId,
        /// The name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// A field holds a value vireo does not accept.
    #[error("port {port}: `{field}` has an invalid value {value:?}")]
    InvalidValue {
        /// The port.
        port: PortId,
        /// The field (dotted path or config key).
        field: &'static str,
        /// The value.
        value: String,
    },
    /// A device with the name exists but is not the kind vireo would create there.
    #[error("port {port}: device {device} exists and is a {found}, not a {wanted}")]
    NameTaken {
        /// The port.
        port: PortId,
        /// The device.
        device: String,
        /// Its kind as found.
        found: String,
        /// The kind vireo wanted.
        wanted: &'static str,
    },
    /// Locating the device (sysfs topology, lower interface) failed.
    #[error("port {port}: locate device {device}")]
    Locate {
        /// The port.
        port: PortId,
        /// The device (PCI address or interface name).
        device: String,
        /// The underlying error.
        #[source]
        source: Cause,
    },
    /// Looking up a link failed.
    #[error("port {port}: look up link {device}")]
    LookupLink {
        /// The port.
        port: PortId,
        /// The link.
        device: String,
        /// The underlying error.
        #[source]
        source: Cause,
    },
    /// Creating the tap failed.
    #[error("port {port}: create tap {device}")]
    CreateTap {
        /// The port.
        port: PortId,
        /// The tap.
        device: String,
        /// The underlying error.
        #[source]
        source: Cause,
    },
    /// Setting MTU, MAC or up state of a link failed.
    #[error("port {port}: configure link {device}")]
    ConfigureLink {
        /// The port.
        port: PortId,
        /// The link.
        device: String,
        /// The underlying error.
        #[source]
        source: Cause,
    },
    /// Creating a Linux bridge failed.
    #[error("port {port}: create bridge {device}")]
    CreateBridge {
        /// The port.
        port: PortId,
        /// The bridge.
        device: String,
        /// The underlying error.
        #[source]
        source: Cause,
    },
    /// Creating the veth pair failed.
    #[error("port {port}: create veth pair {device}")]
    CreateVeth {
        /// The port.
        port: PortId,
        /// The bridge-side end.
        device: String,
        /// The underlying error.
        #[source]
        source: Cause,
    },
    /// Putting a device into a bridge failed.
    #[error("port {port}: enslave {device} to {bridge}")]
    Enslave {
        /// The port.
        port: PortId,
        /// The device.
        device: String,
        /// The bridge.
        bridge: String,
        /// The underlying error.
        #[source]
        source: Cause,
    },
    /// The OVSDB transaction failed.
    #[error("port {port}: OVSDB transaction for {device}")]
    OvsTransact {
        /// The port.
        port: PortId,
        /// The OVS port (or bridge).
        device: String,
        /// The underlying error.
        #[source]
        source: Cause,
    },
    /// Waiting for ovs-vswitchd to apply the change failed.
    #[error("port {port}: wait for ovs-vswitchd to apply {device}")]
    OvsWait {
        /// The port.
        port: PortId,
        /// The OVS port.
        device: String,
        /// The underlying error.
        #[source]
        source: Cause,
    },
    /// ovs-vswitchd could not open the Interface (no OpenFlow port).
    #[error("port {port}: OVS interface {device} has no OpenFlow port: {error}")]
    OvsInterface {
        /// The port.
        port: PortId,
        /// The Interface.
        device: String,
        /// The Interface's `error` column.
        error: String,
    },
    /// Setting VF parameters through the PF failed.
    #[error("port {port}: set VF {vf} of {device}")]
    SetVf {
        /// The port.
        port: PortId,
        /// The PF netdev.
        device: String,
        /// The VF number.
        vf: u32,
        /// The underlying error.
        #[source]
        source: Cause,
    },
    /// Deleting a device failed.
    #[error("port {port}: delete {device}")]
    Delete {
        /// The port.
        port: PortId,
        /// The device.
        device: String,
        /// The underlying error.
        #[source]
        source: Cause,
    },
    /// A failure injected by a test (`plug::testing::FaultPlan`, feature `test-support`).
    #[error("port {port}: injected failure at {step:?}")]
    Injected {
        /// The port.
        port: PortId,
        /// The step.
        step: PlugStep,
    },
}

impl PlugError {
    /// The port the failure is about.
    pub fn port(&self) -> PortId {
        match self {
            PlugError::Unsupported { port, .. }
            | PlugError::Missing { port, .. }
            | PlugError::InvalidName { port, .. }
            | PlugError::InvalidValue { port, .. }
            | PlugError::NameTaken { port, .. }
            | PlugError::Locate { port, .. }
            | PlugError::LookupLink { port, .. }
            | PlugError::CreateTap { port, .. }
            | PlugError::ConfigureLink { port, .. }
            | PlugError::CreateBridge { port, .. }
            | PlugError::CreateVeth { port, .. }
            | PlugError::Enslave { port, .. }
            | PlugError::OvsTransact { port, .. }
            | PlugError::OvsWait { port, .. }
            | PlugError::OvsInterface { port, .. }
            | PlugError::SetVf { port, .. }
            | PlugError::Delete { port, .. }
            | PlugError::Injected { port, .. } => *port,
        }
    }
}

/// Plugs and unplugs VIFs on a host, and reports what is wired.
#[async_trait]
pub trait VifPlugger: Send + Sync + fmt::Debug + 'static {
    /// Prepare the host devices of `vif` for a domain of form `ctx.form`. Idempotent; on
    /// failure nothing this call created is left.
    async fn plug(&self, ctx: &PlugContext, vif: &Vif) -> Result<Plugged, PlugError>;
    /// Remove the host devices of `vif`. Succeeds when they are already (partly) gone.
    async fn unplug(&self, ctx: &PlugContext, vif: &Vif) -> Result<(), PlugError>;
    /// What is wired on this host.
    fn wiring(&self) -> Arc<dyn WiringSource>;
    /// libvirt created the devices of these ports (their domain started, or an interface was
    /// hot-plugged). A host plugger has nothing to do — its watcher sees libvirt's taps come —
    /// which is the default; the static plugger emulates them.
    async fn devices_attached(&self, _ports: &[PortId]) {}
    /// libvirt removed the devices of these ports (their domain stopped, or an interface was
    /// hot-unplugged). Default: nothing, as for [`VifPlugger::devices_attached`].
    async fn devices_detached(&self, _ports: &[PortId]) {}
}

fn libvirt_made(p: &Plugged) -> bool {
    matches!(
        (p.kind, &p.attachment),
        (
            PlugKind::OvsNative | PlugKind::LinuxBridge,
            Attachment::Bridge { .. }
        ) | (
            PlugKind::Tap,
            Attachment::Ethernet {
                precreated: false,
                ..
            }
        )
    )
}

/// The plugger of the `test:///` tier (the embedded default: libvirt's test driver creates no
/// devices). It creates nothing on the host: a plug computes the VIF's [`static_attachment`]
/// (what a host plugger would return, except for SR-IOV macvtap, whose VF netdev name it
/// cannot read from sysfs: it makes one up as `vf<bus><slot><function>` in hex) and keeps the
/// set of plugged ports in memory. It keeps the plugger contract (idempotent plug and unplug)
/// and is a [`WiringSource`] so the embedded network service can follow it: a device the
/// plugger would make is wired at plug; a device libvirt makes (the tap of a libvirt-managed
/// OVS native or Linux-bridge port, or of a plain tap port) is wired while the domain runs —
/// between [`VifPlugger::devices_attached`] and [`VifPlugger::devices_detached`] — exactly
/// when real libvirt has it. Unplug unwires.
///
/// Tests use `plug::testing::RecordingPlugger` (feature `test-support`): this plugger plus a
/// call log and fault injection.
#[derive(Debug, Clone)]
pub struct StaticPlugger {
    state: Arc<Mutex<StaticState>>,
    wiring: Arc<StaticWiring>,
}

#[derive(Debug, Default)]
struct StaticState {
    plugged: BTreeMap<PortId, Plugged>,
    /// Ports whose libvirt-made devices exist (their domain runs).
    attached: BTreeSet<PortId>,
}

/// How a [`StaticPlugger`] call that succeeded ended, for a wrapper that observes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StaticOutcome {
    /// It changed the plugged state.
    Done,
    /// Nothing to do: already plugged (plug) or already gone (unplug).
    AlreadyDone,
}

impl Default for StaticPlugger {
    fn default() -> Self {
        Self::new()
    }
}

impl StaticPlugger {
    /// A plugger with nothing plugged.
    pub fn new() -> Self {
        StaticPlugger {
            state: Arc::default(),
            wiring: Arc::new(StaticWiring::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, StaticState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ports plugged right now.
    pub fn plugged(&self) -> BTreeSet<PortId> {
        self.lock().plugged.keys().copied().collect()
    }

    /// What a port was plugged as, when it is plugged.
    pub fn plugged_as(&self, port: PortId) -> Option<Plugged> {
        self.lock().plugged.get(&port).cloned()
    }

    /// [`VifPlugger::plug`], calling `check` before each of the kind's [`PlugStep`]s (a
    /// failure there fails the plug with nothing plugged) and `done` once the call is decided,
    /// before its wiring change is sent. No lock is held while either runs.
    pub(crate) fn plug_with(
        &self,
        ctx: &PlugContext,
        vif: &Vif,
        mut check: impl FnMut(PlugStep) -> Result<(), PlugError>,
        done: impl FnOnce(StaticOutcome),
    ) -> Result<Plugged, PlugError> {
        let kind = PlugKind::for_vif(vif)?;
        let attachment = static_attachment(vif, kind, ctx.form)?;
        let existing = self.lock().plugged.get(&vif.id).cloned();
        if let Some(existing) = existing {
            if existing.attachment == attachment {
                done(StaticOutcome::AlreadyDone);
                return Ok(Plugged {
                    created: Vec::new(),
                    ..existing
                });
            }
        }
        for step in kind.plug_steps(ctx.form) {
            check(*step)?;
        }
        let plugged = Plugged {
            port: vif.id,
            kind,
            mtu: vif.network.mtu,
            created: Vec::new(),
            attachment,
        };
        let wired = {
            let mut st = self.lock();
            st.plugged.insert(vif.id, plugged.clone());
            !libvirt_made(&plugged) || st.attached.contains(&vif.id)
        };
        done(StaticOutcome::Done);
        if wired {
            self.wiring.set(vif.id, plugged.attachment.device(), true);
        }
        Ok(plugged)
    }

    /// [`VifPlugger::unplug`], with `check` and `done` as in [`StaticPlugger::plug_with`]; a
    /// failed check keeps the port plugged.
    pub(crate) fn unplug_with(
        &self,
        ctx: &PlugContext,
        vif: &Vif,
        mut check: impl FnMut(PlugStep) -> Result<(), PlugError>,
        done: impl FnOnce(StaticOutcome),
    ) -> Result<(), PlugError> {
        let kind = PlugKind::for_vif(vif)?;
        let existing = self.lock().plugged.get(&vif.id).cloned();
        let Some(existing) = existing else {
            done(StaticOutcome::AlreadyDone);
            return Ok(());
        };
        for step in kind.unplug_steps(ctx.form) {
            check(*step)?;
        }
        self.lock().plugged.remove(&vif.id);
        done(StaticOutcome::Done);
        self.wiring.set(vif.id, existing.attachment.device(), false);
        Ok(())
    }

    fn libvirt_devices(&self, ports: &[PortId], attached: bool) {
        let changed: Vec<(PortId, String)> = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let mut out = Vec::new();
            for p in ports {
                let now = if attached {
                    st.attached.insert(*p)
                } else {
                    st.attached.remove(p)
                };
                if now {
                    if let Some(pl) = st.plugged.get(p).filter(|pl| libvirt_made(pl)) {
                        out.push((pl.port, pl.attachment.device()));
                    }
                }
            }
            out
        };
        for (port, dev) in changed {
            self.wiring.set(port, dev, attached);
        }
    }
}

/// The attachment a VIF of `kind` gets in domain form `form`, from the VIF alone. Host
/// pluggers use it for every kind whose attachment needs no host lookup.
pub fn static_attachment(
    vif: &Vif,
    kind: PlugKind,
    form: DomainForm,
) -> Result<Attachment, PlugError> {
    let tap = vif.tap_name();
    let pre = form == DomainForm::PreCreated;
    Ok(match kind {
        PlugKind::OvsNative | PlugKind::OvsHybrid | PlugKind::LinuxBridge | PlugKind::Tap
            if pre =>
        {
            Attachment::Ethernet {
                tap,
                precreated: true,
            }
        }
        PlugKind::OvsNative => Attachment::Bridge {
            bridge: vif.ovs_bridge().to_owned(),
            tap,
            ovs_interface_id: Some(vif.id),
        },
        PlugKind::OvsHybrid => Attachment::Bridge {
            bridge: vif.qbr_name(),
            tap,
            ovs_interface_id: None,
        },
        PlugKind::LinuxBridge => Attachment::Bridge {
            bridge: vif.linux_bridge_name().ok_or(PlugError::Missing {
                port: vif.id,
                field: "network.bridge or network.id",
            })?,
            tap,
            ovs_interface_id: None,
        },
        PlugKind::Tap => Attachment::Ethernet {
            tap,
            precreated: false,
        },
        PlugKind::SriovVf => Attachment::HostdevVf {
            pci: pci_slot(vif)?,
            vlan: vif.details.vlan.unwrap_or(0),
        },
        PlugKind::SriovPf => Attachment::HostdevPf {
            pci: pci_slot(vif)?,
        },
        PlugKind::SriovMacvtap => {
            let pci = pci_slot(vif)?;
            Attachment::Direct {
                dev: format!("vf{:02x}{:02x}{:x}", pci.bus, pci.slot, pci.function),
                mode: MacvtapMode::Passthrough,
            }
        }
        PlugKind::Macvtap => Attachment::Direct {
            dev: vif
                .details
                .physical_interface
                .clone()
                .ok_or(PlugError::Missing {
                    port: vif.id,
                    field: "details.physical_interface",
                })?,
            mode: macvtap_mode(vif)?,
        },
    })
}

/// `profile.pci_slot`, required by the SR-IOV kinds.
pub fn pci_slot(vif: &Vif) -> Result<PciAddress, PlugError> {
    vif.profile.pci_slot.ok_or(PlugError::Missing {
        port: vif.id,
        field: "profile.pci_slot",
    })
}

/// `details.macvtap_mode` (default `bridge`).
pub fn macvtap_mode(vif: &Vif) -> Result<MacvtapMode, PlugError> {
    match vif.details.macvtap_mode.as_deref() {
        None => Ok(MacvtapMode::Bridge),
        Some(m) => m.parse().map_err(|value| PlugError::InvalidValue {
            port: vif.id,
            field: "details.macvtap_mode",
            value,
        }),
    }
}

#[async_trait]
impl VifPlugger for StaticPlugger {
    async fn plug(&self, ctx: &PlugContext, vif: &Vif) -> Result<Plugged, PlugError> {
        self.plug_with(ctx, vif, |_| Ok(()), |_| {})
    }

    async fn unplug(&self, ctx: &PlugContext, vif: &Vif) -> Result<(), PlugError> {
        self.unplug_with(ctx, vif, |_| Ok(()), |_| {})
    }

    fn wiring(&self) -> Arc<dyn WiringSource> {
        self.wiring.clone()
    }

    async fn devices_attached(&self, ports: &[PortId]) {
        self.libvirt_devices(ports, true);
    }

    async fn devices_detached(&self, ports: &[PortId]) {
        self.libvirt_devices(ports, false);
    }
}

/// The [`WiringSource`] of the [`StaticPlugger`].
#[derive(Debug)]
pub struct StaticWiring {
    tx: broadcast::Sender<WiringChange>,
    wired: Mutex<BTreeSet<PortId>>,
}

impl StaticWiring {
    fn new() -> Self {
        StaticWiring {
            tx: broadcast::channel(1024).0,
            wired: Mutex::default(),
        }
    }

    fn set(&self, port: PortId, device: String, wired: bool) {
        let changed = {
            let mut set = self.wired.lock().unwrap_or_else(|p| p.into_inner());
            if wired {
                set.insert(port)
            } else {
                set.remove(&port)
            }
        };
        if changed {
            // No receiver is not an error: nobody is listening yet.
            let _ = self.tx.send(WiringChange {
                port,
                device,
                wired,
            });
        }
    }
}

impl WiringSource for StaticWiring {
    fn subscribe(&self) -> broadcast::Receiver<WiringChange> {
        self.tx.subscribe()
    }

    fn wired(&self) -> Vec<PortId> {
        self.wired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vif::NetworkInfo;
    use serde_json::json;

    const P1: &str = "3b2c4d5e-0000-4000-8000-000000000001";

    fn vif(v: serde_json::Value) -> Vif {
        NetworkInfo::from_value(&json!([v])).unwrap().vifs.remove(0)
    }

    fn ovs(hybrid: bool) -> Vif {
        vif(json!({
            "id": P1, "address": "fa:16:3e:00:00:01", "type": "ovs",
            "details": {"ovs_hybrid_plug": hybrid},
            "network": {"id": "net-1", "bridge": "br-int", "meta": {"mtu": 1450}}
        }))
    }

    #[test]
    fn select_covers_every_type_pair() {
        let supported = [
            (VifType::Ovs, VnicType::Normal, false, PlugKind::OvsNative),
            (VifType::Ovs, VnicType::Normal, true, PlugKind::OvsHybrid),
            (
                VifType::Bridge,
                VnicType::Normal,
                false,
                PlugKind::LinuxBridge,
            ),
            (VifType::Tap, VnicType::Normal, false, PlugKind::Tap),
            (VifType::HwVeb, VnicType::Direct, false, PlugKind::SriovVf),
            (
                VifType::HwVeb,
                VnicType::Macvtap,
                false,
                PlugKind::SriovMacvtap,
            ),
            (
                VifType::HostdevPhysical,
                VnicType::DirectPhysical,
                false,
                PlugKind::SriovPf,
            ),
            (VifType::Macvtap, VnicType::Normal, false, PlugKind::Macvtap),
            (
                VifType::Macvtap,
                VnicType::Macvtap,
                false,
                PlugKind::Macvtap,
            ),
        ];
        let mut seen = BTreeSet::new();
        for t in VifType::ALL {
            for n in VnicType::ALL {
                for h in [false, true] {
                    let want = supported
                        .iter()
                        .find(|(st, sn, sh, _)| {
                            *st == t && *sn == n && (*sh == h || *st != VifType::Ovs)
                        })
                        .map(|s| s.3);
                    assert_eq!(PlugKind::select(t, n, h), want, "{t} {n} hybrid={h}");
                    if let Some(k) = want {
                        seen.insert(k);
                    }
                }
            }
        }
        assert_eq!(seen.len(), PlugKind::ALL.len(), "every kind is reachable");
    }

    #[test]
    fn every_kind_and_form_has_consistent_steps() {
        for kind in PlugKind::ALL {
            for form in DomainForm::ALL {
                let plug = kind.plug_steps(form);
                let unplug = kind.unplug_steps(form);
                let has = |s: &[PlugStep], x| s.contains(&x);
                // What plug creates, unplug removes.
                assert_eq!(
                    has(plug, PlugStep::CreateTap),
                    has(unplug, PlugStep::DeleteTap)
                );
                assert_eq!(
                    has(plug, PlugStep::OvsTransact),
                    has(unplug, PlugStep::DeleteOvsPort),
                    "{kind} {form:?}"
                );
                // The per-VIF qbr goes; a network's bridge stays.
                assert_eq!(
                    has(plug, PlugStep::EnsureLinuxBridge) && kind == PlugKind::OvsHybrid,
                    has(unplug, PlugStep::DeleteLinuxBridge),
                    "{kind} {form:?}"
                );
                assert_eq!(
                    has(plug, PlugStep::CreateVeth),
                    has(unplug, PlugStep::DeleteVeth)
                );
                assert_eq!(has(plug, PlugStep::SetVf), has(unplug, PlugStep::ResetVf));
                // Only the pre-created form creates a tap, and only tap-based kinds.
                if has(plug, PlugStep::CreateTap) {
                    assert_eq!(form, DomainForm::PreCreated);
                }
                // Steps never repeat.
                let set: BTreeSet<_> = plug.iter().collect();
                assert_eq!(set.len(), plug.len());
            }
        }
    }

    #[test]
    fn attachments_follow_the_form() {
        let v = ovs(false);
        assert_eq!(
            static_attachment(&v, PlugKind::OvsNative, DomainForm::LibvirtManaged).unwrap(),
            Attachment::Bridge {
                bridge: "br-int".into(),
                tap: "tap3b2c4d5e-00".into(),
                ovs_interface_id: Some(v.id),
            }
        );
        assert_eq!(
            static_attachment(&v, PlugKind::OvsNative, DomainForm::PreCreated).unwrap(),
            Attachment::Ethernet {
                tap: "tap3b2c4d5e-00".into(),
                precreated: true,
            }
        );
        let h = ovs(true);
        assert_eq!(
            static_attachment(&h, PlugKind::OvsHybrid, DomainForm::LibvirtManaged).unwrap(),
            Attachment::Bridge {
                bridge: "qbr3b2c4d5e-00".into(),
                tap: "tap3b2c4d5e-00".into(),
                ovs_interface_id: None,
            }
        );
        let err = static_attachment(&h, PlugKind::SriovVf, DomainForm::LibvirtManaged);
        assert!(matches!(
            err,
            Err(PlugError::Missing {
                field: "profile.pci_slot",
                ..
            })
        ));
    }

    #[test]
    fn unsupported_kinds_are_typed_errors() {
        let v = vif(json!({"id": P1, "address": "fa:16:3e:00:00:01", "type": "vhostuser"}));
        let err = PlugKind::for_vif(&v).unwrap_err();
        assert!(matches!(
            err,
            PlugError::Unsupported {
                vif_type: VifType::Vhostuser,
                ..
            }
        ));
        assert_eq!(err.port(), v.id);
        assert!(err.to_string().contains(P1));
    }

    #[test]
    fn macvtap_mode_is_validated() {
        let mut v = vif(json!({
            "id": P1, "address": "fa:16:3e:00:00:01", "type": "macvtap",
            "details": {"physical_interface": "eth1", "macvtap_mode": "vepa"}
        }));
        assert_eq!(
            static_attachment(&v, PlugKind::Macvtap, DomainForm::LibvirtManaged).unwrap(),
            Attachment::Direct {
                dev: "eth1".into(),
                mode: MacvtapMode::Vepa
            }
        );
        v.details.macvtap_mode = Some("sideways".into());
        assert!(matches!(
            macvtap_mode(&v),
            Err(PlugError::InvalidValue { ref value, .. }) if value == "sideways"
        ));
    }
}
