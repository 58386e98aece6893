//! Event prediction: which `network-vif-plugged` event each VIF of an operation produces, and
//! when.
//!
//! This module owns the event model's pure part (docs/EVENT_MODEL.md has the full table and the
//! Neutron/libvirt facts behind every cell). For each VIF, [`predict`] says:
//!
//! - [`Timing::BindTime`]: Neutron sends the event as soon as the port binding lands on (or is
//!   rebound on) this host: register before the binding update, await after it;
//! - [`Timing::PlugTime`]: the event comes once the device is wired on this host: register
//!   before plugging, await after the plug and the (paused) domain start;
//! - [`Timing::None`]: no event will reliably come: do not wait.
//!
//! The rule: an agent-served port is ACTIVE at the later of (binding lands on this host, its
//! L2 agent sees the device wired on this host); an agentless port at bind; if neither changes,
//! nothing is sent. Which one is later depends on what vireo keeps wired, which is the
//! explicit input [`Wiring`]. Combinations vireo cannot use are typed errors
//! ([`PredictError::Unsupported`]). Everything here is a pure function.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::external::EventName;
use crate::vif::{PortId, Vif, VifType, VnicType};

/// Why a prediction could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PredictError {
    /// The VIF's (vif_type, vnic_type) is not something vireo can run.
    #[error("VIF {index} (port {port}): vif_type {vif_type} with vnic_type {vnic_type}: {why}")]
    Unsupported {
        /// Position in `network_info`.
        index: usize,
        /// The port.
        port: PortId,
        /// Its vif_type.
        vif_type: VifType,
        /// Its vnic_type.
        vnic_type: VnicType,
        /// Why.
        why: Unsupported,
    },
    /// The migration's hosts do not fit the operation.
    #[error("invalid migration for {operation}: {why}")]
    InvalidMigration {
        /// The operation's name.
        operation: &'static str,
        /// What is wrong.
        why: &'static str,
    },
}

/// Why a (vif_type, vnic_type) pair is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unsupported {
    /// Bare metal or smart-NIC (Ironic) ports never run on a libvirt host.
    NotOnLibvirt,
    /// Accelerator ports need Cyborg, which vireo does not drive.
    NeedsCyborg,
    /// No Neutron mechanism driver binds this vif_type with this vnic_type.
    NotBoundByNeutron,
    /// A binding Neutron can produce, but vireo has no plugging backend for it.
    NoVireoBackend,
}

impl Unsupported {
    /// Short code (used in docs/EVENT_MODEL.md and by `vireo events explain`).
    pub fn code(&self) -> &'static str {
        match self {
            Unsupported::NotOnLibvirt => "not-on-libvirt",
            Unsupported::NeedsCyborg => "needs-cyborg",
            Unsupported::NotBoundByNeutron => "not-bound-by-neutron",
            Unsupported::NoVireoBackend => "no-vireo-backend",
        }
    }
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unsupported::NotOnLibvirt => "bare metal / smart-NIC ports never run on a libvirt host",
            Unsupported::NeedsCyborg => "accelerator ports need Cyborg, which vireo does not drive",
            Unsupported::NotBoundByNeutron => {
                "no Neutron mechanism driver binds this vif_type with this vnic_type"
            }
            Unsupported::NoVireoBackend => "vireo has no plugging backend for this binding",
        })
    }
}

/// How the device that the port's L2 agent watches comes to exist on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceForm {
    /// libvirt creates the tap when the domain starts and deletes it when the domain stops
    /// (`<interface type='bridge'>`, with `<virtualport type='openvswitch'/>` for OVS).
    #[default]
    LibvirtManaged,
    /// vireo creates the tap (and adds it to its bridge) before the domain and removes it only
    /// when it unplugs the VIF; libvirt uses it as `<interface type='ethernet'>` with
    /// `<target dev=... managed='no'/>` and never deletes it.
    PreCreated,
}

impl DeviceForm {
    /// The name used in docs and on the command line.
    pub fn as_str(&self) -> &'static str {
        match self {
            DeviceForm::LibvirtManaged => "libvirt-managed",
            DeviceForm::PreCreated => "pre-created",
        }
    }
}

impl FromStr for DeviceForm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "libvirt-managed" => Ok(DeviceForm::LibvirtManaged),
            "pre-created" => Ok(DeviceForm::PreCreated),
            other => Err(format!(
                "unknown device form {other:?} (expected libvirt-managed or pre-created)"
            )),
        }
    }
}

/// What vireo keeps wired: the device form its plugging uses for the kinds where there is a
/// choice. OVS hybrid (qbr/qvb/qvo) is always created by vireo; SR-IOV devices are always
/// attached by libvirt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
pub struct Wiring {
    /// OVS native (no hybrid plug): the tap in the integration bridge.
    pub ovs_native: DeviceForm,
    /// Linux bridge: the tap in the `brq...` bridge.
    pub linux_bridge: DeviceForm,
}

/// The kind of a VIF as far as events are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// OVS with hybrid plug: tap → qbr → qvb/qvo veth → br-int; the OVS agent watches qvo.
    OvsHybrid,
    /// OVS native: the tap itself is the OVS port the agent watches.
    OvsNative(DeviceForm),
    /// An `ovs` port bound by ML2/OVN (`bound_drivers`): ovn-controller claims the tap in its
    /// integration bridge and Neutron reports the port up once it did.
    Ovn(DeviceForm),
    /// Linux bridge agent: the tap in the network's bridge.
    LinuxBridge(DeviceForm),
    /// SR-IOV VF (`hw_veb`, vnic `direct` or `macvtap`) served by the SR-IOV NIC agent.
    SriovAgent,
    /// A whole PF (`hostdev_physical`, `direct-physical`): agentless, ACTIVE at bind.
    DirectPhysical,
    /// A VF whose port is managed on a DPU (`remote-managed`): agentless on this host.
    RemoteManaged,
}

impl Kind {
    /// Every kind, in the order of docs/EVENT_MODEL.md.
    pub const ALL: [Kind; 10] = [
        Kind::OvsHybrid,
        Kind::OvsNative(DeviceForm::LibvirtManaged),
        Kind::OvsNative(DeviceForm::PreCreated),
        Kind::Ovn(DeviceForm::LibvirtManaged),
        Kind::Ovn(DeviceForm::PreCreated),
        Kind::LinuxBridge(DeviceForm::LibvirtManaged),
        Kind::LinuxBridge(DeviceForm::PreCreated),
        Kind::SriovAgent,
        Kind::DirectPhysical,
        Kind::RemoteManaged,
    ];

    /// Served by an L2 agent on the host (as opposed to agentless).
    pub fn agent_served(&self) -> bool {
        !matches!(self, Kind::DirectPhysical | Kind::RemoteManaged)
    }

    /// A short label, e.g. `ovs-native (libvirt-managed)`.
    pub fn label(&self) -> String {
        match self {
            Kind::OvsHybrid => "ovs-hybrid".to_owned(),
            Kind::OvsNative(f) => format!("ovs-native ({})", f.as_str()),
            Kind::Ovn(f) => format!("ml2-ovn ({})", f.as_str()),
            Kind::LinuxBridge(f) => format!("linux-bridge ({})", f.as_str()),
            Kind::SriovAgent => "sriov-agent".to_owned(),
            Kind::DirectPhysical => "direct-physical".to_owned(),
            Kind::RemoteManaged => "remote-managed".to_owned(),
        }
    }
}

/// The mechanism driver name ML2/OVN binds with (`bound_drivers`).
pub const OVN_DRIVER: &str = "ovn";

/// Classify a (vif_type, vnic_type) pair; `hybrid` is `details.ovs_hybrid_plug`, `bound_by`
/// the mechanism driver that bound the port (`details.bound_drivers`), when Neutron said.
pub fn classify(
    vif_type: VifType,
    vnic_type: VnicType,
    hybrid: bool,
    bound_by: Option<&str>,
    wiring: &Wiring,
) -> Result<Kind, Unsupported> {
    use VnicType as N;
    match vnic_type {
        N::Baremetal | N::SmartNic => return Err(Unsupported::NotOnLibvirt),
        N::AcceleratorDirect | N::AcceleratorDirectPhysical => {
            return Err(Unsupported::NeedsCyborg)
        }
        _ => {}
    }
    match (vif_type, vnic_type) {
        // ML2/OVN has no hybrid plug: its binding never asks for one.
        (VifType::Ovs, N::Normal) if bound_by == Some(OVN_DRIVER) => {
            Ok(Kind::Ovn(wiring.ovs_native))
        }
        (VifType::Ovs, N::Normal) if hybrid => Ok(Kind::OvsHybrid),
        (VifType::Ovs, N::Normal) => Ok(Kind::OvsNative(wiring.ovs_native)),
        (VifType::Ovs, N::RemoteManaged) => Ok(Kind::RemoteManaged),
        // OVS hardware offload and vDPA: a VF representor os-vif would plug into br-int.
        (VifType::Ovs, N::Direct | N::Vdpa) => Err(Unsupported::NoVireoBackend),
        (VifType::Bridge, N::Normal) => Ok(Kind::LinuxBridge(wiring.linux_bridge)),
        (VifType::HwVeb, N::Direct | N::Macvtap) => Ok(Kind::SriovAgent),
        (VifType::HostdevPhysical, N::DirectPhysical) => Ok(Kind::DirectPhysical),
        // OVS-DPDK vhost-user (and Agilio's virtio-forwarder), routed taps (e.g. Calico) and
        // the macvtap mechanism driver are real bindings vireo does not plug.
        (VifType::Vhostuser, N::Normal | N::VirtioForwarder | N::Vdpa) => {
            Err(Unsupported::NoVireoBackend)
        }
        (VifType::Tap, N::Normal) => Err(Unsupported::NoVireoBackend),
        (VifType::Macvtap, N::Normal) => Err(Unsupported::NoVireoBackend),
        _ => Err(Unsupported::NotBoundByNeutron),
    }
}

/// An operation, as far as events are concerned. Pure data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EventOp {
    /// Build a new instance on this host.
    Spawn,
    /// Destroy and recreate the domain; bindings unchanged.
    HardReboot,
    /// Start a shut-off domain; bindings unchanged.
    PowerOn,
    /// Finish a resize or cold migration on the destination.
    FinishResize {
        /// Source and destination are the same host.
        same_host: bool,
    },
    /// Revert a resize: the instance comes back to `source`, this host.
    RevertResize {
        /// The host the instance returns to (where this runs).
        source: String,
        /// The host it was resized to.
        dest: String,
    },
    /// Live migration, source side: what the source waits for while the destination
    /// pre-creates the instance's devices (pre-live-migration).
    LiveMigration {
        /// This host.
        source: String,
        /// The destination.
        dest: String,
    },
    /// Live migration, destination side, after the migration: the destination port bindings
    /// are activated while the guest already runs here.
    PostLiveMigration {
        /// The host the guest came from.
        source: String,
        /// This host.
        dest: String,
    },
    /// Hot-plug new ports into a running instance (the VIFs given are the new ones).
    AttachInterface,
    /// Set `binding:profile.migrating_to` on ports plugged on this host, binding host
    /// unchanged: Neutron rebinds and re-reports them.
    UpdateBindingProfile,
    /// Clear `binding:profile.migrating_to` again (a live migration rolled back).
    ClearBindingProfile,
}

impl EventOp {
    /// The operation's name as `vireo events explain` takes it.
    pub fn name(&self) -> &'static str {
        match self {
            EventOp::Spawn => "spawn",
            EventOp::HardReboot => "hard-reboot",
            EventOp::PowerOn => "power-on",
            EventOp::FinishResize { .. } => "finish-resize",
            EventOp::RevertResize { .. } => "revert-resize",
            EventOp::LiveMigration { .. } => "live-migration",
            EventOp::PostLiveMigration { .. } => "post-live-migration",
            EventOp::AttachInterface => "attach-interface",
            EventOp::UpdateBindingProfile => "update-binding-profile",
            EventOp::ClearBindingProfile => "clear-binding-profile",
        }
    }

    /// The table column this operation falls in.
    pub fn column(&self) -> Result<Column, PredictError> {
        let distinct = |op: &EventOp, a: &str, b: &str| {
            if a.is_empty() || b.is_empty() {
                return Err(PredictError::InvalidMigration {
                    operation: op.name(),
                    why: "a host name is empty",
                });
            }
            Ok(a != b)
        };
        Ok(match self {
            EventOp::Spawn => Column::Spawn,
            EventOp::HardReboot => Column::HardReboot,
            EventOp::PowerOn => Column::PowerOn,
            EventOp::FinishResize { same_host: false } => Column::FinishResizeCrossHost,
            EventOp::FinishResize { same_host: true } => Column::FinishResizeSameHost,
            EventOp::RevertResize { source, dest } => {
                if distinct(self, source, dest)? {
                    Column::RevertResizeCrossHost
                } else {
                    Column::RevertResizeSameHost
                }
            }
            EventOp::LiveMigration { source, dest }
            | EventOp::PostLiveMigration { source, dest } => {
                if !distinct(self, source, dest)? {
                    return Err(PredictError::InvalidMigration {
                        operation: self.name(),
                        why: "source and destination are the same host",
                    });
                }
                if matches!(self, EventOp::LiveMigration { .. }) {
                    Column::LiveMigrationSource
                } else {
                    Column::PostLiveMigrationDest
                }
            }
            EventOp::AttachInterface => Column::AttachInterface,
            EventOp::UpdateBindingProfile => Column::UpdateBindingProfile,
            EventOp::ClearBindingProfile => Column::ClearBindingProfile,
        })
    }
}

/// A column of the event table: an operation with the host relation resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Column {
    /// [`EventOp::Spawn`].
    Spawn,
    /// [`EventOp::AttachInterface`].
    AttachInterface,
    /// [`EventOp::HardReboot`].
    HardReboot,
    /// [`EventOp::PowerOn`].
    PowerOn,
    /// [`EventOp::FinishResize`] to another host.
    FinishResizeCrossHost,
    /// [`EventOp::FinishResize`] on the same host.
    FinishResizeSameHost,
    /// [`EventOp::RevertResize`] from another host.
    RevertResizeCrossHost,
    /// [`EventOp::RevertResize`] on the same host.
    RevertResizeSameHost,
    /// [`EventOp::LiveMigration`] (source side).
    LiveMigrationSource,
    /// [`EventOp::PostLiveMigration`] (destination side).
    PostLiveMigrationDest,
    /// [`EventOp::UpdateBindingProfile`].
    UpdateBindingProfile,
    /// [`EventOp::ClearBindingProfile`].
    ClearBindingProfile,
}

impl Column {
    /// Every column, in the order of docs/EVENT_MODEL.md.
    pub const ALL: [Column; 12] = [
        Column::Spawn,
        Column::AttachInterface,
        Column::HardReboot,
        Column::PowerOn,
        Column::FinishResizeCrossHost,
        Column::FinishResizeSameHost,
        Column::RevertResizeCrossHost,
        Column::RevertResizeSameHost,
        Column::LiveMigrationSource,
        Column::PostLiveMigrationDest,
        Column::UpdateBindingProfile,
        Column::ClearBindingProfile,
    ];

    /// Whether the VIF's `active` flag matters (only for newly bound ports).
    pub fn uses_active(&self) -> bool {
        matches!(self, Column::Spawn | Column::AttachInterface)
    }
}

/// When the event for one VIF comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Timing {
    /// At the binding update.
    BindTime,
    /// Once the device is wired on this host.
    PlugTime,
    /// No event to wait for.
    None,
}

impl Timing {
    /// `bind-time`, `plug-time` or `none`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Timing::BindTime => "bind-time",
            Timing::PlugTime => "plug-time",
            Timing::None => "none",
        }
    }
}

/// One cell of the table: timing and its one-line reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    /// When the event comes.
    pub timing: Timing,
    /// Why, in one line.
    pub reason: &'static str,
}

const fn cell(timing: Timing, reason: &'static str) -> Cell {
    Cell { timing, reason }
}

mod why {
    pub const ACTIVE: &str =
        "active in network_info: the port is already ACTIVE, no transition to wait for (Nova's rule)";
    pub const NEW_AGENT: &str =
        "newly bound here: ACTIVE once the L2 agent sees the device the plug step wires";
    pub const NEW_AGENTLESS: &str =
        "agentless (no L2 agent reports it): ACTIVE as soon as the binding lands on this host";
    pub const REMOTE_NEW: &str = "remote-managed: the DPU side reports it when the port is bound, before this operation starts; never waited (Nova's rule)";
    pub const HYBRID_KEPT: &str = "binding unchanged; the qvo port the OVS agent watches stays in br-int (only the tap behind qbr is recreated)";
    pub const TAP_KEPT: &str =
        "binding unchanged; the tap vireo pre-created stays in its bridge (libvirt never deletes it)";
    pub const OVS_REWIRED: &str = "binding unchanged, but libvirt deletes and recreates the tap: the OVS agent reports the re-added port DOWN, then up";
    pub const LB_REWIRED: &str = "binding unchanged, but libvirt recreates the tap: the Linux bridge agent sees a new ifindex and reports the port up again";
    pub const SRIOV_POLLED: &str = "binding unchanged; the SR-IOV agent polls VF assignment and misses a quick re-assignment: no reliable event";
    pub const AGENTLESS_UNCHANGED: &str =
        "agentless and the binding does not change: nothing reports the port";
    pub const FINISH_CROSS_AGENT: &str =
        "binding moves to this host: ACTIVE once the agent sees the device the plug step wires here";
    pub const FINISH_CROSS_AGENTLESS: &str =
        "binding moves to this host: agentless, ACTIVE as soon as it is bound";
    pub const SAME_HOST_KEPT: &str =
        "same-host resize: binding unchanged and the devices stay wired through it";
    pub const SAME_DEVICE_SRIOV: &str = "same host: the port keeps its VF (vireo never rewrites pci_slot) and stays wired: no rebind, and the polling agent sees no change";
    pub const SAME_DEVICE_AGENTLESS: &str = "same host: the port keeps its device (vireo never rewrites binding:profile): no rebind, and agentless, nothing reports it";
    pub const REVERT_KEPT: &str = "binding returns to this host where the device stayed wired: the agent re-reports it right after the binding update, before any plug";
    pub const REVERT_REPLUG: &str =
        "binding returns to this host; the device is wired again by the plug step: ACTIVE when the agent sees it";
    pub const REVERT_SRIOV: &str =
        "binding returns to this host; the VF is re-attached when the domain is recreated: ACTIVE when the SR-IOV agent sees it";
    pub const REVERT_SAME_KEPT: &str = "same-host revert: binding unchanged and the devices stay wired through it (only the guest is recreated)";
    pub const LM_SOURCE_AGENT: &str = "the destination agent skips a device whose active binding is elsewhere (Neutron >= Rocky), so pre-wiring sends nothing; wait at post-live-migration";
    pub const LM_SOURCE_SRIOV: &str =
        "the VF is attached on the destination only after the migration; nothing to wait for before it";
    pub const LM_SOURCE_AGENTLESS: &str =
        "agentless: the binding moves only at activation after the migration; nothing to wait for before it";
    pub const POST_LM_WIRED: &str = "destination binding activated with the device already wired here: ACTIVE once the agent processes the activation";
    pub const POST_LM_OVN: &str = "ML2/OVN sets the port DOWN at the activation, ACTIVE again only if OVN's up changes: this chassis claimed it for the migration, so it may not (measured)";
    pub const POST_LM_SRIOV: &str = "the VF is attached here after the activation: ACTIVE when the SR-IOV agent sees it assigned";
    pub const POST_LM_AGENTLESS: &str =
        "agentless: ACTIVE as soon as the destination binding is activated";
    pub const PROFILE_AGENT: &str = "the profile change rebinds the plugged port (DOWN) and its agent re-reports it ~1.5 s later: wait to consume these events";
    pub const PROFILE_AGENTLESS: &str =
        "the profile change rebinds the port; agentless, ACTIVE again at once: wait to consume the event";
    pub const OVN_REWIRED: &str = "binding unchanged, but libvirt deletes and recreates the tap: ovn-controller releases and claims the port again and ML2/OVN reports it DOWN, then up (measured)";
    pub const PROFILE_OVN_SET: &str = "ML2/OVN sets a port whose profile gains migrating_to DOWN, then forces it ACTIVE (measured: vif-plugged ~2 s later): wait to consume it";
    pub const PROFILE_OVN_CLEAR: &str = "ML2/OVN sets a port whose migrating_to is cleared DOWN and leaves it so: only vif-unplugged comes (measured), nothing to wait for";
}

/// The table: timing and reason for one VIF kind in one column. `active` is the VIF's
/// `active` flag from `network_info`; it only matters where [`Column::uses_active`].
pub fn table_cell(column: Column, kind: Kind, active: bool) -> Cell {
    use DeviceForm::{LibvirtManaged as Lm, PreCreated as Pc};
    use Timing::{BindTime as Bind, None as No, PlugTime as Plug};
    match column {
        Column::Spawn | Column::AttachInterface => match kind {
            Kind::RemoteManaged => cell(No, why::REMOTE_NEW),
            _ if active => cell(No, why::ACTIVE),
            Kind::DirectPhysical => cell(Bind, why::NEW_AGENTLESS),
            _ => cell(Plug, why::NEW_AGENT),
        },
        Column::HardReboot | Column::PowerOn => match kind {
            Kind::OvsHybrid => cell(No, why::HYBRID_KEPT),
            Kind::OvsNative(Pc) | Kind::Ovn(Pc) | Kind::LinuxBridge(Pc) => cell(No, why::TAP_KEPT),
            Kind::OvsNative(Lm) => cell(Plug, why::OVS_REWIRED),
            Kind::Ovn(Lm) => cell(Plug, why::OVN_REWIRED),
            Kind::LinuxBridge(Lm) => cell(Plug, why::LB_REWIRED),
            Kind::SriovAgent => cell(No, why::SRIOV_POLLED),
            Kind::DirectPhysical | Kind::RemoteManaged => cell(No, why::AGENTLESS_UNCHANGED),
        },
        Column::FinishResizeCrossHost => match kind {
            Kind::DirectPhysical | Kind::RemoteManaged => cell(Bind, why::FINISH_CROSS_AGENTLESS),
            _ => cell(Plug, why::FINISH_CROSS_AGENT),
        },
        Column::FinishResizeSameHost => match kind {
            Kind::OvsHybrid | Kind::OvsNative(Pc) | Kind::Ovn(Pc) | Kind::LinuxBridge(Pc) => {
                cell(No, why::SAME_HOST_KEPT)
            }
            Kind::OvsNative(Lm) => cell(Plug, why::OVS_REWIRED),
            Kind::Ovn(Lm) => cell(Plug, why::OVN_REWIRED),
            Kind::LinuxBridge(Lm) => cell(Plug, why::LB_REWIRED),
            Kind::SriovAgent => cell(No, why::SAME_DEVICE_SRIOV),
            Kind::DirectPhysical | Kind::RemoteManaged => cell(No, why::SAME_DEVICE_AGENTLESS),
        },
        Column::RevertResizeCrossHost => match kind {
            Kind::OvsHybrid | Kind::OvsNative(Pc) | Kind::Ovn(Pc) | Kind::LinuxBridge(Pc) => {
                cell(Bind, why::REVERT_KEPT)
            }
            Kind::OvsNative(Lm) | Kind::Ovn(Lm) | Kind::LinuxBridge(Lm) => {
                cell(Plug, why::REVERT_REPLUG)
            }
            Kind::SriovAgent => cell(Plug, why::REVERT_SRIOV),
            Kind::DirectPhysical | Kind::RemoteManaged => cell(Bind, why::FINISH_CROSS_AGENTLESS),
        },
        Column::RevertResizeSameHost => match kind {
            Kind::OvsHybrid | Kind::OvsNative(Pc) | Kind::Ovn(Pc) | Kind::LinuxBridge(Pc) => {
                cell(No, why::REVERT_SAME_KEPT)
            }
            Kind::OvsNative(Lm) => cell(Plug, why::OVS_REWIRED),
            Kind::Ovn(Lm) => cell(Plug, why::OVN_REWIRED),
            Kind::LinuxBridge(Lm) => cell(Plug, why::LB_REWIRED),
            Kind::SriovAgent => cell(No, why::SRIOV_POLLED),
            Kind::DirectPhysical | Kind::RemoteManaged => cell(No, why::SAME_DEVICE_AGENTLESS),
        },
        Column::LiveMigrationSource => match kind {
            Kind::SriovAgent => cell(No, why::LM_SOURCE_SRIOV),
            Kind::DirectPhysical | Kind::RemoteManaged => cell(No, why::LM_SOURCE_AGENTLESS),
            _ => cell(No, why::LM_SOURCE_AGENT),
        },
        Column::PostLiveMigrationDest => match kind {
            Kind::SriovAgent => cell(Plug, why::POST_LM_SRIOV),
            Kind::DirectPhysical | Kind::RemoteManaged => cell(Bind, why::POST_LM_AGENTLESS),
            Kind::Ovn(_) => cell(No, why::POST_LM_OVN),
            _ => cell(Bind, why::POST_LM_WIRED),
        },
        Column::UpdateBindingProfile => match kind {
            Kind::DirectPhysical | Kind::RemoteManaged => cell(Bind, why::PROFILE_AGENTLESS),
            Kind::Ovn(_) => cell(Bind, why::PROFILE_OVN_SET),
            _ => cell(Bind, why::PROFILE_AGENT),
        },
        Column::ClearBindingProfile => match kind {
            Kind::DirectPhysical | Kind::RemoteManaged => cell(Bind, why::PROFILE_AGENTLESS),
            Kind::Ovn(_) => cell(No, why::PROFILE_OVN_CLEAR),
            _ => cell(Bind, why::PROFILE_AGENT),
        },
    }
}

/// An event an operation waits for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ExpectedEvent {
    /// Always `network-vif-plugged` for predictions.
    pub name: EventName,
    /// The port id (Nova's `tag`).
    pub tag: PortId,
}

impl ExpectedEvent {
    /// `network-vif-plugged` for `port`.
    pub fn plugged(port: PortId) -> Self {
        ExpectedEvent {
            name: EventName::NetworkVifPlugged,
            tag: port,
        }
    }
}

/// The prediction for one VIF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VifPrediction {
    /// Position in `network_info`.
    pub index: usize,
    /// The port.
    pub port: PortId,
    /// Its kind.
    pub kind: Kind,
    /// When its event comes.
    pub timing: Timing,
    /// Why, in one line.
    pub reason: &'static str,
}

/// The prediction for every VIF of an operation, in `network_info` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prediction {
    /// The column the operation fell in.
    pub column: Column,
    /// One entry per VIF.
    pub vifs: Vec<VifPrediction>,
}

impl Prediction {
    /// The events of the VIFs with `timing`.
    pub fn events(&self, timing: Timing) -> Vec<ExpectedEvent> {
        self.vifs
            .iter()
            .filter(|v| v.timing == timing)
            .map(|v| ExpectedEvent::plugged(v.port))
            .collect()
    }

    /// Events to register before the binding update and await after it.
    pub fn bind_time_events(&self) -> Vec<ExpectedEvent> {
        self.events(Timing::BindTime)
    }

    /// Events to register before plugging and await after the plug.
    pub fn plug_time_events(&self) -> Vec<ExpectedEvent> {
        self.events(Timing::PlugTime)
    }

    /// VIFs with nothing to wait for.
    pub fn not_waited(&self) -> impl Iterator<Item = &VifPrediction> {
        self.vifs.iter().filter(|v| v.timing == Timing::None)
    }
}

/// Predict the events of `operation` for `vifs` given what vireo keeps wired.
pub fn predict(
    operation: &EventOp,
    vifs: &[Vif],
    wiring: &Wiring,
) -> Result<Prediction, PredictError> {
    let column = operation.column()?;
    let mut out = Vec::with_capacity(vifs.len());
    for vif in vifs {
        let kind = classify(
            vif.vif_type,
            vif.vnic_type,
            vif.details.ovs_hybrid_plug,
            vif.details.bound_by.as_deref(),
            wiring,
        )
        .map_err(|why| PredictError::Unsupported {
            index: vif.index,
            port: vif.id,
            vif_type: vif.vif_type,
            vnic_type: vif.vnic_type,
            why,
        })?;
        let c = table_cell(column, kind, vif.active);
        out.push(VifPrediction {
            index: vif.index,
            port: vif.id,
            kind,
            timing: c.timing,
            reason: c.reason,
        });
    }
    Ok(Prediction { column, vifs: out })
}

#[cfg(test)]
mod tests;
