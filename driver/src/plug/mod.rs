//! Host VIF plugging: [`HostPlugger`], the real [`VifPlugger`].
//!
//! It dispatches on [`PlugKind`] (from `vif_type`, `vnic_type` and `ovs_hybrid_plug`) to
//! [`ovs`] (native, both domain forms), [`hybrid`], [`linuxbridge`], [`sriov`] (VF, VF
//! macvtap, PF) and the plain tap / macvtap kinds, runs each kind's [`PlugStep`]s in order
//! (with the `test-support` feature, checking a fault plan before each), and on a failure removes what the call created,
//! newest first. Links go through netlink ([`netlink`]), taps through the TUNSETIFF ioctl
//! ([`tap`]), OVS through OVSDB JSON-RPC ([`ovsdb`]). [`watcher`] is the host's
//! [`WiringSource`]; [`leak`] lists what vireo (or a test) left on the host.
//!
//! # What ran where
//! - OVS native (both domain forms), OVS hybrid (both forms), Linux bridge (both forms) and
//!   the plain tap: tested on real OVS 3.1 (userspace datapath, `datapath_type=netdev`
//!   bridges), real kernel bridges, veths and taps, with real qemu:///system KVM domains
//!   attached where the form allows; results checked with `ovs-vsctl`, `ip -d -j link` and
//!   sysfs.
//! - SR-IOV (VF, VF macvtap, PF passthrough): tested ONLY against a fabricated sysfs tree
//!   ([`sriov::fabricate_pf`]) with the recording VF control ([`sriov::RecordingVfControl`]);
//!   this machine has no VFs. The real netlink VF control has only been shown to reach the
//!   kernel (a non-SR-IOV link answers EOPNOTSUPP to its request).
//! - macvtap (the mechanism driver and VF macvtap): only up to what libvirt is given; this
//!   machine cannot create macvtaps.
//! - The kernel OVS datapath (`datapath_type=system`) is untested here (no kernel modules).
//!
//! # Domain forms
//! See [`DomainForm`]: libvirt-managed leaves tap creation to libvirt; pre-created makes vireo
//! create a persistent tap and wire it before any domain exists (the destination side of a
//! live migration). Network bridges (OVS integration bridge, `brq...`) are created when
//! missing and never deleted by unplug; per-VIF devices (`tap`, `qbr`, `qvb`, `qvo`, the OVS
//! port) are.

pub mod hybrid;
pub mod leak;
pub mod linuxbridge;
pub mod names;
pub mod netlink;
pub mod ovs;
pub mod ovsdb;
pub mod sriov;
pub mod tap;
pub mod watcher;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use tracing::Instrument;
#[cfg(feature = "test-support")]
use vireo_actors::plug::testing::FaultPlan;
use vireo_actors::plug::{
    cause, static_attachment, Attachment, DomainForm, HostDevice, PlugContext, PlugError, PlugKind,
    PlugStep, Plugged, VifPlugger,
};
use vireo_actors::vif::{PortId, Vif};
use vireo_actors::wiring::WiringSource;

use self::netlink::{Netlink, NetlinkError, KIND_BRIDGE, KIND_TUN};
use self::ovsdb::{OvsdbAddr, OvsdbError, Vswitch};
use self::sriov::{NetlinkVfControl, SriovHost, SysfsSriov, SysfsTopology};
use self::watcher::HostWiring;

/// OVS datapath type for bridges vireo creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatapathType {
    /// The kernel datapath.
    #[default]
    System,
    /// The userspace datapath.
    Netdev,
}

impl DatapathType {
    /// OVSDB's value.
    pub fn as_str(&self) -> &'static str {
        match self {
            DatapathType::System => "system",
            DatapathType::Netdev => "netdev",
        }
    }
}

/// Host plugger configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlugConfig {
    /// Where ovsdb-server listens: `unix:PATH` (or an absolute path) or `tcp:HOST:PORT`
    /// (os-vif's `ovsdb_connection`; `ovsdb_socket` is accepted as the older name).
    #[serde(alias = "ovsdb_socket")]
    pub ovsdb_connection: OvsdbAddr,
    /// Datapath type of OVS bridges vireo creates when the VIF's
    /// `details.datapath_type` does not say.
    pub datapath_type: DatapathType,
    /// sysfs root for the SR-IOV topology.
    pub sysfs_root: PathBuf,
    /// How long to wait for ovs-vswitchd to apply a change, in milliseconds.
    pub ovs_timeout_ms: u64,
}

impl Default for PlugConfig {
    fn default() -> Self {
        PlugConfig {
            ovsdb_connection: OvsdbAddr::Unix(PathBuf::from("/var/run/openvswitch/db.sock")),
            datapath_type: DatapathType::System,
            sysfs_root: PathBuf::from("/sys"),
            ovs_timeout_ms: 10_000,
        }
    }
}

/// Why the host plugger could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Not called from within a tokio runtime (the plugger spawns its tasks there).
    #[error("the host plugger must start inside a tokio runtime")]
    NoRuntime,
    /// Opening a netlink socket failed.
    #[error("open netlink")]
    Netlink(#[source] NetlinkError),
}

/// The real plugger. Needs a tokio runtime (it spawns its netlink and watcher tasks on it)
/// and CAP_NET_ADMIN.
pub struct HostPlugger {
    cfg: PlugConfig,
    netlink: Arc<Netlink>,
    vswitch: tokio::sync::Mutex<Option<Arc<Vswitch>>>,
    sriov: Arc<dyn SriovHost>,
    wiring: Arc<HostWiring>,
    /// The fault seam; only with the `test-support` feature.
    #[cfg(feature = "test-support")]
    faults: Arc<FaultPlan>,
}

impl std::fmt::Debug for HostPlugger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPlugger")
            .field("cfg", &self.cfg)
            .field("sriov", &self.sriov)
            .finish_non_exhaustive()
    }
}

impl HostPlugger {
    /// Start with the real SR-IOV side (sysfs at `cfg.sysfs_root`, VF settings through
    /// netlink).
    pub fn start(cfg: PlugConfig) -> Result<Self, StartError> {
        tokio::runtime::Handle::try_current().map_err(|_| StartError::NoRuntime)?;
        let netlink = Arc::new(Netlink::open().map_err(StartError::Netlink)?);
        let sriov = Arc::new(SysfsSriov {
            topology: SysfsTopology::new(cfg.sysfs_root.clone()),
            control: Arc::new(NetlinkVfControl::new(netlink.clone())),
        });
        Self::start_inner(cfg, netlink, sriov)
    }

    /// Start with a given SR-IOV side (a fabricated tree with a recording VF control in
    /// tests).
    pub fn start_with_sriov(
        cfg: PlugConfig,
        sriov: Arc<dyn SriovHost>,
    ) -> Result<Self, StartError> {
        tokio::runtime::Handle::try_current().map_err(|_| StartError::NoRuntime)?;
        let netlink = Arc::new(Netlink::open().map_err(StartError::Netlink)?);
        Self::start_inner(cfg, netlink, sriov)
    }

    fn start_inner(
        cfg: PlugConfig,
        netlink: Arc<Netlink>,
        sriov: Arc<dyn SriovHost>,
    ) -> Result<Self, StartError> {
        let wiring = HostWiring::start(cfg.ovsdb_connection.clone(), netlink.clone())
            .map_err(StartError::Netlink)?;
        Ok(HostPlugger {
            cfg,
            netlink,
            vswitch: tokio::sync::Mutex::new(None),
            sriov,
            wiring,
            #[cfg(feature = "test-support")]
            faults: Arc::default(),
        })
    }

    /// The fault seam (empty unless a test arms it). Only with the `test-support` feature.
    #[cfg(feature = "test-support")]
    pub fn faults(&self) -> &FaultPlan {
        &self.faults
    }

    /// The watcher, with its host-specific methods.
    pub fn host_wiring(&self) -> &Arc<HostWiring> {
        &self.wiring
    }

    /// The netlink handle.
    pub fn netlink(&self) -> &Arc<Netlink> {
        &self.netlink
    }

    /// The configuration.
    pub fn config(&self) -> &PlugConfig {
        &self.cfg
    }

    fn ovs_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.ovs_timeout_ms)
    }

    /// The OVSDB connection, (re)connecting when needed.
    pub async fn vswitch(&self) -> Result<Arc<Vswitch>, OvsdbError> {
        let mut guard = self.vswitch.lock().await;
        if let Some(v) = guard.as_ref() {
            if !v.is_closed() {
                return Ok(v.clone());
            }
        }
        let v = Arc::new(Vswitch::connect(&self.cfg.ovsdb_connection).await?);
        *guard = Some(v.clone());
        Ok(v)
    }

    async fn plug_inner(&self, ctx: &PlugContext, vif: &Vif) -> Result<Plugged, PlugError> {
        let kind = PlugKind::for_vif(vif)?;
        let mut run = Run {
            p: self,
            port: vif.id,
            created: Vec::new(),
        };
        let result = match kind {
            PlugKind::OvsNative => ovs::plug(&mut run, ctx, vif).await,
            PlugKind::OvsHybrid => hybrid::plug(&mut run, ctx, vif).await,
            PlugKind::LinuxBridge => linuxbridge::plug(&mut run, ctx, vif).await,
            PlugKind::Tap => plug_tap(&mut run, ctx, vif).await,
            PlugKind::SriovVf | PlugKind::SriovMacvtap | PlugKind::SriovPf => {
                sriov_plug(&mut run, kind, ctx, vif).await
            }
            PlugKind::Macvtap => plug_macvtap(&mut run, ctx, vif).await,
        };
        match result {
            Ok(attachment) => Ok(Plugged {
                port: vif.id,
                kind,
                attachment,
                mtu: vif.network.mtu,
                created: run.created,
            }),
            Err(e) => {
                tracing::warn!(error = %e, created = ?run.created, "plug failed, rolling back");
                run.rollback().await;
                if kind == PlugKind::LinuxBridge {
                    self.wiring.forget_bridge_tap(&vif.tap_name());
                }
                Err(e)
            }
        }
    }

    async fn unplug_inner(&self, ctx: &PlugContext, vif: &Vif) -> Result<(), PlugError> {
        let kind = PlugKind::for_vif(vif)?;
        let run = Run {
            p: self,
            port: vif.id,
            created: Vec::new(),
        };
        match kind {
            PlugKind::OvsNative => ovs::unplug(&run, ctx, vif).await,
            PlugKind::OvsHybrid => hybrid::unplug(&run, ctx, vif).await,
            PlugKind::LinuxBridge => linuxbridge::unplug(&run, ctx, vif).await,
            PlugKind::Tap => {
                if ctx.form == DomainForm::PreCreated {
                    run.delete_tap(vif).await
                } else {
                    Ok(())
                }
            }
            PlugKind::SriovVf | PlugKind::SriovMacvtap => sriov_unplug(&run, vif).await,
            PlugKind::SriovPf | PlugKind::Macvtap => Ok(()),
        }
    }
}

#[async_trait]
impl VifPlugger for HostPlugger {
    async fn plug(&self, ctx: &PlugContext, vif: &Vif) -> Result<Plugged, PlugError> {
        let span = tracing::info_span!("plug", instance = %ctx.instance_uuid, port = %vif.id,
            form = ?ctx.form);
        self.plug_inner(ctx, vif).instrument(span).await
    }

    async fn unplug(&self, ctx: &PlugContext, vif: &Vif) -> Result<(), PlugError> {
        let span = tracing::info_span!("unplug", instance = %ctx.instance_uuid, port = %vif.id,
            form = ?ctx.form);
        self.unplug_inner(ctx, vif).instrument(span).await
    }

    fn wiring(&self) -> Arc<dyn WiringSource> {
        self.wiring.clone()
    }
}

/// One plug or unplug call: the plugger, the port, and what the call created so far.
pub(crate) struct Run<'a> {
    p: &'a HostPlugger,
    port: PortId,
    created: Vec<HostDevice>,
}

impl Run<'_> {
    /// Check the fault seam before `step` (`test-support` only).
    #[cfg(feature = "test-support")]
    fn step(&self, step: PlugStep) -> Result<(), PlugError> {
        self.p.faults.check(step, self.port)
    }

    /// Without `test-support` there is no fault seam: every step may run.
    #[cfg(not(feature = "test-support"))]
    #[inline(always)]
    fn step(&self, _step: PlugStep) -> Result<(), PlugError> {
        Ok(())
    }

    fn lookup_err(&self, device: &str) -> impl FnOnce(NetlinkError) -> PlugError {
        let port = self.port;
        let device = device.to_owned();
        move |e| PlugError::LookupLink {
            port,
            device,
            source: cause(e),
        }
    }

    /// CreateTap + ConfigureTap: the persistent tap `tap` with `mtu` and the host-side MAC
    /// libvirt would give it (the guest MAC with first octet 0xfe).
    async fn ensure_tap(&mut self, vif: &Vif, tap: &str) -> Result<u32, PlugError> {
        self.step(PlugStep::CreateTap)?;
        let nl = &self.p.netlink;
        let existing = nl.link(tap).await.map_err(self.lookup_err(tap))?;
        let link = match existing {
            Some(l) if l.kind.as_deref() == Some(KIND_TUN) => l,
            Some(l) => {
                return Err(PlugError::NameTaken {
                    port: self.port,
                    device: tap.to_owned(),
                    found: l.kind.unwrap_or_else(|| "device".into()),
                    wanted: KIND_TUN,
                })
            }
            None => {
                tap::create_persistent_tap(tap)
                    .await
                    .map_err(|e| PlugError::CreateTap {
                        port: self.port,
                        device: tap.to_owned(),
                        source: cause(e),
                    })?;
                self.created.push(HostDevice::Tap(tap.to_owned()));
                nl.link(tap)
                    .await
                    .map_err(self.lookup_err(tap))?
                    .ok_or_else(|| PlugError::CreateTap {
                        port: self.port,
                        device: tap.to_owned(),
                        source: cause(NetlinkError::NoSuchLink(tap.to_owned())),
                    })?
            }
        };
        self.step(PlugStep::ConfigureTap)?;
        let mut mac = vif.address.octets();
        mac[0] = 0xfe;
        nl.configure(tap, link.index, vif.network.mtu, Some(mac))
            .await
            .map_err(|e| PlugError::ConfigureLink {
                port: self.port,
                device: tap.to_owned(),
                source: cause(e),
            })?;
        Ok(link.index)
    }

    /// EnsureLinuxBridge: find or create the Linux bridge `name` (up, STP off); the ifindex.
    async fn ensure_linux_bridge(
        &mut self,
        name: &str,
        mtu: Option<u32>,
    ) -> Result<u32, PlugError> {
        self.step(PlugStep::EnsureLinuxBridge)?;
        let nl = &self.p.netlink;
        let check = |l: netlink::Link, port: PortId| -> Result<u32, PlugError> {
            if l.kind.as_deref() == Some(KIND_BRIDGE) {
                Ok(l.index)
            } else {
                Err(PlugError::NameTaken {
                    port,
                    device: name.to_owned(),
                    found: l.kind.unwrap_or_else(|| "device".into()),
                    wanted: KIND_BRIDGE,
                })
            }
        };
        if let Some(l) = nl.link(name).await.map_err(self.lookup_err(name))? {
            return check(l, self.port);
        }
        match nl.create_bridge(name, mtu).await {
            Ok(()) => {
                self.created.push(HostDevice::LinuxBridge(name.to_owned()));
                disable_ipv6(name);
            }
            // Created concurrently by another plug: fine if it is a bridge.
            Err(e) if e.errno() == Some(libc::EEXIST) => {}
            Err(e) => {
                return Err(PlugError::CreateBridge {
                    port: self.port,
                    device: name.to_owned(),
                    source: cause(e),
                })
            }
        }
        let l = nl
            .link(name)
            .await
            .map_err(self.lookup_err(name))?
            .ok_or_else(|| PlugError::CreateBridge {
                port: self.port,
                device: name.to_owned(),
                source: cause(NetlinkError::NoSuchLink(name.to_owned())),
            })?;
        check(l, self.port)
    }

    /// Enslave `dev` to the bridge with ifindex `bridge_index` unless it already is.
    async fn enslave(
        &self,
        step: PlugStep,
        dev: &str,
        bridge: &str,
        bridge_index: u32,
    ) -> Result<(), PlugError> {
        self.step(step)?;
        let enslave_err = |source| PlugError::Enslave {
            port: self.port,
            device: dev.to_owned(),
            bridge: bridge.to_owned(),
            source,
        };
        let link = self
            .p
            .netlink
            .link(dev)
            .await
            .map_err(self.lookup_err(dev))?
            .ok_or_else(|| enslave_err(cause(NetlinkError::NoSuchLink(dev.to_owned()))))?;
        if link.master == Some(bridge_index) {
            return Ok(());
        }
        self.p
            .netlink
            .set_master(dev, link.index, bridge_index)
            .await
            .map_err(|e| enslave_err(cause(e)))
    }

    /// OvsTransact + OvsWait: ensure the bridge and (when `port` is set) the port with the
    /// os-vif `external_ids`, in one transaction; wait for ovs-vswitchd; check the ofport.
    async fn ensure_ovs(
        &mut self,
        ctx: &PlugContext,
        vif: &Vif,
        bridge: &str,
        port: Option<&str>,
    ) -> Result<(), PlugError> {
        self.step(PlugStep::OvsTransact)?;
        let device = port.unwrap_or(bridge).to_owned();
        let datapath = match vif.details.datapath_type.as_deref() {
            None => self.p.cfg.datapath_type.as_str(),
            Some("system") => "system",
            Some("netdev") => "netdev",
            Some(other) => {
                return Err(PlugError::InvalidValue {
                    port: self.port,
                    field: "details.datapath_type",
                    value: other.to_owned(),
                })
            }
        };
        let tx_err = |e: OvsdbError| PlugError::OvsTransact {
            port: vif.id,
            device: device.clone(),
            source: cause(e),
        };
        let vs = self.p.vswitch().await.map_err(tx_err)?;
        let spec = ovsdb::PortSpec {
            bridge: bridge.to_owned(),
            datapath_type: datapath.to_owned(),
            port: port.map(str::to_owned),
            external_ids: ovs::external_ids(ctx, vif),
            mtu: vif.network.mtu,
        };
        let ensured = vs.ensure(&spec).await.map_err(tx_err)?;
        if ensured.bridge_created {
            self.created.push(HostDevice::OvsBridge(bridge.to_owned()));
        }
        if ensured.port_created {
            if let Some(p) = port {
                self.created.push(HostDevice::OvsPort {
                    bridge: bridge.to_owned(),
                    port: p.to_owned(),
                });
            }
        }
        self.step(PlugStep::OvsWait)?;
        let wait_err = |e: OvsdbError| PlugError::OvsWait {
            port: vif.id,
            device: device.clone(),
            source: cause(e),
        };
        vs.wait_applied(ensured.cfg, self.p.ovs_timeout())
            .await
            .map_err(wait_err)?;
        if let Some(p) = port {
            let st = vs.interface(p).await.map_err(wait_err)?;
            let ok = st.as_ref().and_then(|s| s.ofport).is_some_and(|o| o > 0);
            if !ok {
                return Err(PlugError::OvsInterface {
                    port: vif.id,
                    device: p.to_owned(),
                    error: st
                        .and_then(|s| s.error)
                        .unwrap_or_else(|| "no ofport assigned".into()),
                });
            }
        }
        Ok(())
    }

    /// DeleteOvsPort: remove the OVS port `name` if present and wait for ovs-vswitchd.
    async fn delete_ovs_port(&self, name: &str) -> Result<(), PlugError> {
        self.step(PlugStep::DeleteOvsPort)?;
        let err = |e: OvsdbError| PlugError::Delete {
            port: self.port,
            device: name.to_owned(),
            source: cause(e),
        };
        let vs = self.p.vswitch().await.map_err(err)?;
        if let Some(cfg) = vs.delete_port(name).await.map_err(err)? {
            vs.wait_applied(cfg, self.p.ovs_timeout())
                .await
                .map_err(err)?;
        }
        Ok(())
    }

    /// Delete `name` when it is a link of `kind`; a link of another kind is not the one
    /// vireo made under that name (plug refuses it with `NameTaken`) and is left alone.
    async fn delete_link_of_kind(
        &self,
        step: PlugStep,
        name: &str,
        kind: &str,
    ) -> Result<(), PlugError> {
        self.step(step)?;
        match self
            .p
            .netlink
            .link(name)
            .await
            .map_err(self.lookup_err(name))?
        {
            None => Ok(()),
            Some(l) if l.kind.as_deref() == Some(kind) => self
                .p
                .netlink
                .delete(name)
                .await
                .map(|_| ())
                .map_err(|e| PlugError::Delete {
                    port: self.port,
                    device: name.to_owned(),
                    source: cause(e),
                }),
            Some(l) => {
                tracing::warn!(device = name, found = ?l.kind, wanted = kind,
                    "not deleting a device of another kind");
                Ok(())
            }
        }
    }

    /// DeleteTap of the VIF's tap (refused unless it is a `tap...` name).
    async fn delete_tap(&self, vif: &Vif) -> Result<(), PlugError> {
        let tap = names::owned(vif.id, &vif.tap_name(), "tap")?;
        // A device of another kind under the tap's name is not the one vireo made (plug
        // refused it): a failed build's unplug must leave it where it is.
        self.delete_link_of_kind(PlugStep::DeleteTap, &tap, KIND_TUN)
            .await
    }

    async fn delete_bridge_if_empty(&self, name: &str) -> Result<(), String> {
        let nl = &self.p.netlink;
        let Some(link) = nl.link(name).await.map_err(|e| e.to_string())? else {
            return Ok(());
        };
        let ports = nl.ports_of(link.index).await.map_err(|e| e.to_string())?;
        if !ports.is_empty() {
            tracing::info!(bridge = name, "rollback keeps a bridge another port joined");
            return Ok(());
        }
        nl.delete(name).await.map(|_| ()).map_err(|e| e.to_string())
    }

    /// Undo what this call created, newest first. Failures are logged; the plug's own error
    /// is what the caller gets.
    async fn rollback(&mut self) {
        while let Some(dev) = self.created.pop() {
            let res: Result<(), String> = match &dev {
                HostDevice::Tap(n) => self
                    .p
                    .netlink
                    .delete(n)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                // A bridge this call created may have been joined meanwhile by another
                // VIF of the same network: remove it only while it is empty.
                HostDevice::LinuxBridge(n) => self.delete_bridge_if_empty(n).await,
                HostDevice::VethPair { bridge_end, .. } => self
                    .p
                    .netlink
                    .delete(bridge_end)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                HostDevice::OvsPort { port, .. } => match self.p.vswitch().await {
                    Ok(vs) => match vs.delete_port(port).await {
                        Ok(Some(cfg)) => vs
                            .wait_applied(cfg, self.p.ovs_timeout())
                            .await
                            .map_err(|e| e.to_string()),
                        Ok(None) => Ok(()),
                        Err(e) => Err(e.to_string()),
                    },
                    Err(e) => Err(e.to_string()),
                },
                HostDevice::OvsBridge(b) => match self.p.vswitch().await {
                    Ok(vs) => match vs.delete_bridge(b).await {
                        Ok(Some(cfg)) => vs
                            .wait_applied(cfg, self.p.ovs_timeout())
                            .await
                            .map_err(|e| e.to_string()),
                        Ok(None) => Ok(()),
                        Err(e) => Err(e.to_string()),
                    },
                    Err(e) => Err(e.to_string()),
                },
                HostDevice::VfSettings { pf, vf } => self
                    .p
                    .sriov
                    .set_vf(pf, *vf, &sriov::VfSettings::RESET)
                    .await
                    .map_err(|e| e.to_string()),
            };
            if let Err(e) = res {
                tracing::error!(device = ?dev, error = %e, "rollback could not remove a device");
            }
        }
    }
}

/// Run every unplug step even when one fails; the first failure is returned.
pub(crate) fn first_error(results: Vec<Result<(), PlugError>>) -> Result<(), PlugError> {
    results
        .into_iter()
        .collect::<Result<Vec<()>, _>>()
        .map(|_| ())
}

/// Keep a Linux bridge from getting IPv6 addresses (as os-vif does). Best effort: the file
/// is absent when IPv6 is disabled.
fn disable_ipv6(name: &str) {
    let path = PathBuf::from("/proc/sys/net/ipv6/conf")
        .join(name)
        .join("disable_ipv6");
    if let Err(e) = std::fs::write(&path, b"1") {
        tracing::debug!(bridge = name, error = %e, "could not disable IPv6");
    }
}

/// The plain tap kind: pre-created → vireo makes the tap; libvirt-managed → libvirt does.
async fn plug_tap(
    run: &mut Run<'_>,
    ctx: &PlugContext,
    vif: &Vif,
) -> Result<Attachment, PlugError> {
    let tap = names::owned(vif.id, &vif.tap_name(), "tap")?;
    if ctx.form == DomainForm::PreCreated {
        run.ensure_tap(vif, &tap).await?;
    }
    static_attachment(vif, PlugKind::Tap, ctx.form)
}

/// The macvtap mechanism driver: libvirt creates the macvtap; the lower device must exist.
async fn plug_macvtap(
    run: &mut Run<'_>,
    ctx: &PlugContext,
    vif: &Vif,
) -> Result<Attachment, PlugError> {
    let attachment = static_attachment(vif, PlugKind::Macvtap, ctx.form)?;
    let dev = names::ifname(vif.id, &attachment.device())?;
    run.step(PlugStep::LocateDevice)?;
    let found = run
        .p
        .netlink
        .link(&dev)
        .await
        .map_err(run.lookup_err(&dev))?;
    if found.is_none() {
        return Err(PlugError::Locate {
            port: vif.id,
            device: dev.clone(),
            source: cause(NetlinkError::NoSuchLink(dev)),
        });
    }
    Ok(attachment)
}

async fn sriov_plug(
    run: &mut Run<'_>,
    kind: PlugKind,
    ctx: &PlugContext,
    vif: &Vif,
) -> Result<Attachment, PlugError> {
    let pci = vireo_actors::plug::pci_slot(vif)?;
    run.step(PlugStep::LocateDevice)?;
    let locate_err = |e: sriov::SriovError| PlugError::Locate {
        port: vif.id,
        device: pci.to_string(),
        source: cause(e),
    };
    if kind == PlugKind::SriovPf {
        run.p.sriov.locate_pf(pci).map_err(locate_err)?;
        return static_attachment(vif, kind, ctx.form);
    }
    let loc = run.p.sriov.locate_vf(pci).map_err(locate_err)?;
    let pf = names::ifname(vif.id, &loc.pf_netdev)?;
    let attachment = if kind == PlugKind::SriovMacvtap {
        let dev = loc.vf_netdev.clone().ok_or_else(|| PlugError::Locate {
            port: vif.id,
            device: pci.to_string(),
            source: cause(sriov::SriovError::NoNetdev(pci)),
        })?;
        Attachment::Direct {
            dev: names::ifname(vif.id, &dev)?,
            mode: vireo_actors::plug::MacvtapMode::Passthrough,
        }
    } else {
        static_attachment(vif, kind, ctx.form)?
    };
    run.step(PlugStep::SetVf)?;
    let settings = sriov::VfSettings {
        mac: vif.address.octets(),
        vlan: vif.details.vlan.unwrap_or(0),
        trust: vif.profile.trusted,
    };
    run.p
        .sriov
        .set_vf(&pf, loc.index, &settings)
        .await
        .map_err(|e| PlugError::SetVf {
            port: vif.id,
            device: pf.clone(),
            vf: loc.index,
            source: cause(e),
        })?;
    run.created
        .push(HostDevice::VfSettings { pf, vf: loc.index });
    Ok(attachment)
}

async fn sriov_unplug(run: &Run<'_>, vif: &Vif) -> Result<(), PlugError> {
    let pci = vireo_actors::plug::pci_slot(vif)?;
    run.step(PlugStep::LocateDevice)?;
    let loc = match run.p.sriov.locate_vf(pci) {
        Ok(l) => l,
        // The VF is gone (device removed, VFs disabled): nothing to reset.
        Err(sriov::SriovError::NoDevice(_)) => return Ok(()),
        Err(e) => {
            return Err(PlugError::Locate {
                port: vif.id,
                device: pci.to_string(),
                source: cause(e),
            })
        }
    };
    run.step(PlugStep::ResetVf)?;
    run.p
        .sriov
        .set_vf(&loc.pf_netdev, loc.index, &sriov::VfSettings::RESET)
        .await
        .map_err(|e| PlugError::SetVf {
            port: vif.id,
            device: loc.pf_netdev.clone(),
            vf: loc.index,
            source: cause(e),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_strict_and_defaults() {
        let c: PlugConfig = toml::from_str("datapath_type = \"netdev\"").unwrap();
        assert_eq!(c.datapath_type, DatapathType::Netdev);
        assert_eq!(
            c.ovsdb_connection.to_string(),
            "unix:/var/run/openvswitch/db.sock"
        );
        let c: PlugConfig = toml::from_str("ovsdb_connection = \"tcp:127.0.0.1:6640\"").unwrap();
        assert_eq!(c.ovsdb_connection.to_string(), "tcp:127.0.0.1:6640");
        let c: PlugConfig = toml::from_str("ovsdb_socket = \"/run/db.sock\"").unwrap();
        assert_eq!(c.ovsdb_connection.to_string(), "unix:/run/db.sock");
        assert!(toml::from_str::<PlugConfig>("ovsdb_connection = \"db.sock\"").is_err());
        assert!(toml::from_str::<PlugConfig>("bogus = 1").is_err());
        assert!(toml::from_str::<PlugConfig>("datapath_type = \"dpdk\"").is_err());
    }

    #[test]
    fn first_error_keeps_the_first() {
        let p = PortId(uuid::Uuid::from_u128(1));
        let e = |step| Err(PlugError::Injected { port: p, step });
        let r = first_error(vec![
            Ok(()),
            e(PlugStep::DeleteTap),
            e(PlugStep::DeleteVeth),
        ]);
        assert!(matches!(
            r,
            Err(PlugError::Injected {
                step: PlugStep::DeleteTap,
                ..
            })
        ));
        assert!(first_error(vec![Ok(()), Ok(())]).is_ok());
    }
}
