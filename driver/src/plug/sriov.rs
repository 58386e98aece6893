//! SR-IOV: the PF/VF topology read from sysfs, and VF settings (MAC, VLAN, trust) applied
//! through the PF.
//!
//! [`SysfsTopology`] reads `<root>/bus/pci/devices/<addr>`: a VF's `physfn` link names its
//! PF, the PF's `virtfnN` links give the VF number, `net/<ifname>` gives netdev names. With
//! `root = /sys` it reads the real host; tests point it at a fabricated tree
//! ([`fabricate_pf`]) because this machine has no SR-IOV hardware.
//!
//! [`VfControl`] applies VF settings: [`NetlinkVfControl`] sends IFLA_VFINFO_LIST through the
//! PF (the real thing; on this machine it has only been run against a non-SR-IOV link, where
//! the kernel answers EOPNOTSUPP), [`RecordingVfControl`] is a fake that records what would be
//! set, for the fabricated tree. Everything SR-IOV in vireo's tests ran against the fabricated
//! tree and the recording fake.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use vireo_actors::vif::valid_ifname;
use vireo_xml::types::PciAddress;

use super::netlink::{Netlink, NetlinkError};

/// A failed SR-IOV lookup or VF operation.
#[derive(Debug, thiserror::Error)]
pub enum SriovError {
    /// No PCI device with that address.
    #[error("no PCI device {0}")]
    NoDevice(PciAddress),
    /// The device is not a VF (it has no `physfn`).
    #[error("{0} is not an SR-IOV VF")]
    NotVf(PciAddress),
    /// The device is a VF where a PF was expected.
    #[error("{0} is a VF, not a PF")]
    NotPf(PciAddress),
    /// The PF lists no `virtfnN` pointing at the VF.
    #[error("PF {pf} has no virtfn entry for {vf}")]
    NoVfIndex {
        /// The PF.
        pf: PciAddress,
        /// The VF.
        vf: PciAddress,
    },
    /// The PF has no network device (not bound to a net driver).
    #[error("PF {0} has no network device")]
    NoNetdev(PciAddress),
    /// sysfs names something that is not a valid interface name or PCI address.
    #[error("sysfs entry {0:?} is not a valid name")]
    BadEntry(String),
    /// Reading sysfs failed.
    #[error("read {0}")]
    Read(PathBuf, #[source] io::Error),
    /// Applying VF settings failed.
    #[error("set VF {vf} of {pf}")]
    Control {
        /// The PF netdev.
        pf: String,
        /// The VF number.
        vf: u32,
        /// The underlying error.
        #[source]
        source: NetlinkError,
    },
    /// The recording fake was told to fail.
    #[error("recording VF control: injected failure for VF {vf} of {pf}")]
    FakeFailure {
        /// The PF netdev.
        pf: String,
        /// The VF number.
        vf: u32,
    },
}

/// Where a VF sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfLocation {
    /// The VF.
    pub vf: PciAddress,
    /// Its PF.
    pub pf: PciAddress,
    /// The PF's netdev (settings go through it).
    pub pf_netdev: String,
    /// The VF number on the PF.
    pub index: u32,
    /// The VF's own netdev, when bound to a net driver (needed for macvtap).
    pub vf_netdev: Option<String>,
}

/// A PF to pass through whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PfLocation {
    /// The PF.
    pub pf: PciAddress,
    /// Its netdev, when bound to a net driver.
    pub netdev: Option<String>,
}

/// VF settings applied through the PF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VfSettings {
    /// VF MAC.
    pub mac: [u8; 6],
    /// VLAN (0 = none).
    pub vlan: u16,
    /// Trusted VF.
    pub trust: bool,
}

impl VfSettings {
    /// What unplug leaves: zero MAC, no VLAN, not trusted.
    pub const RESET: VfSettings = VfSettings {
        mac: [0; 6],
        vlan: 0,
        trust: false,
    };
}

/// Reads the SR-IOV topology under a sysfs root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysfsTopology {
    /// `/sys` on a real host; a fabricated tree in tests.
    pub root: PathBuf,
}

impl SysfsTopology {
    /// The topology under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        SysfsTopology { root: root.into() }
    }

    fn device_dir(&self, pci: PciAddress) -> Result<PathBuf, SriovError> {
        let dir = self.root.join("bus/pci/devices").join(pci.to_string());
        if dir.exists() {
            Ok(dir)
        } else {
            Err(SriovError::NoDevice(pci))
        }
    }

    fn link_target_pci(&self, link: &Path) -> Result<PciAddress, SriovError> {
        let target = std::fs::read_link(link).map_err(|e| SriovError::Read(link.to_owned(), e))?;
        let name = target
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| SriovError::BadEntry(target.display().to_string()))?;
        name.parse()
            .map_err(|_| SriovError::BadEntry(name.to_owned()))
    }

    fn netdev(&self, dir: &Path) -> Result<Option<String>, SriovError> {
        let net = dir.join("net");
        let entries = match std::fs::read_dir(&net) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(SriovError::Read(net, e)),
        };
        let mut names = Vec::new();
        for e in entries {
            let e = e.map_err(|err| SriovError::Read(net.clone(), err))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !valid_ifname(&name) {
                return Err(SriovError::BadEntry(name));
            }
            names.push(name);
        }
        names.sort();
        Ok(names.into_iter().next())
    }

    /// Locate VF `vf`: its PF, VF number and netdevs.
    pub fn locate_vf(&self, vf: PciAddress) -> Result<VfLocation, SriovError> {
        let dir = self.device_dir(vf)?;
        let physfn = dir.join("physfn");
        if std::fs::symlink_metadata(&physfn).is_err() {
            return Err(SriovError::NotVf(vf));
        }
        let pf = self.link_target_pci(&physfn)?;
        let pf_dir = self.device_dir(pf)?;
        let mut index = None;
        let entries =
            std::fs::read_dir(&pf_dir).map_err(|e| SriovError::Read(pf_dir.clone(), e))?;
        for e in entries {
            let e = e.map_err(|err| SriovError::Read(pf_dir.clone(), err))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(n) = name.strip_prefix("virtfn") else {
                continue;
            };
            let Ok(n) = n.parse::<u32>() else {
                continue;
            };
            if self.link_target_pci(&e.path())? == vf {
                index = Some(n);
                break;
            }
        }
        let index = index.ok_or(SriovError::NoVfIndex { pf, vf })?;
        let pf_netdev = self.netdev(&pf_dir)?.ok_or(SriovError::NoNetdev(pf))?;
        Ok(VfLocation {
            vf,
            pf,
            pf_netdev,
            index,
            vf_netdev: self.netdev(&dir)?,
        })
    }

    /// Locate PF `pf` (a device that is not a VF).
    pub fn locate_pf(&self, pf: PciAddress) -> Result<PfLocation, SriovError> {
        let dir = self.device_dir(pf)?;
        if std::fs::symlink_metadata(dir.join("physfn")).is_ok() {
            return Err(SriovError::NotPf(pf));
        }
        Ok(PfLocation {
            pf,
            netdev: self.netdev(&dir)?,
        })
    }
}

/// Applies VF settings through a PF.
#[async_trait]
pub trait VfControl: Send + Sync + fmt::Debug + 'static {
    /// Set VF `vf` of the PF netdev `pf`.
    async fn set_vf(&self, pf: &str, vf: u32, settings: &VfSettings) -> Result<(), SriovError>;
}

/// The real VF control: IFLA_VFINFO_LIST (MAC, VLAN, trust) in one RTM_NEWLINK on the PF.
#[derive(Debug, Clone)]
pub struct NetlinkVfControl {
    netlink: Arc<Netlink>,
}

impl NetlinkVfControl {
    /// Over an open netlink handle.
    pub fn new(netlink: Arc<Netlink>) -> Self {
        NetlinkVfControl { netlink }
    }
}

#[async_trait]
impl VfControl for NetlinkVfControl {
    async fn set_vf(&self, pf: &str, vf: u32, s: &VfSettings) -> Result<(), SriovError> {
        self.netlink
            .set_vf(pf, vf, s.mac, s.vlan, s.trust)
            .await
            .map_err(|source| SriovError::Control {
                pf: pf.to_owned(),
                vf,
                source,
            })
    }
}

/// A FAKE VF control for fabricated sysfs trees (no SR-IOV hardware here): it records every
/// call and keeps the settings each VF would have.
#[derive(Debug, Default)]
pub struct RecordingVfControl {
    state: Mutex<RecordingVfState>,
}

#[derive(Debug, Default)]
struct RecordingVfState {
    calls: Vec<(String, u32, VfSettings)>,
    current: BTreeMap<(String, u32), VfSettings>,
    fail: bool,
}

impl RecordingVfControl {
    /// A fake with no calls.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RecordingVfState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every call, in order.
    pub fn calls(&self) -> Vec<(String, u32, VfSettings)> {
        self.lock().calls.clone()
    }

    /// The settings VF `vf` of `pf` has now, if it was ever set.
    pub fn current(&self, pf: &str, vf: u32) -> Option<VfSettings> {
        self.lock().current.get(&(pf.to_owned(), vf)).copied()
    }

    /// Make every following call fail (or succeed again).
    pub fn set_failing(&self, fail: bool) {
        self.lock().fail = fail;
    }
}

#[async_trait]
impl VfControl for RecordingVfControl {
    async fn set_vf(&self, pf: &str, vf: u32, s: &VfSettings) -> Result<(), SriovError> {
        let mut st = self.lock();
        if st.fail {
            return Err(SriovError::FakeFailure {
                pf: pf.to_owned(),
                vf,
            });
        }
        st.calls.push((pf.to_owned(), vf, *s));
        st.current.insert((pf.to_owned(), vf), *s);
        Ok(())
    }
}

/// The SR-IOV side of a host: topology plus VF control.
#[async_trait]
pub trait SriovHost: Send + Sync + fmt::Debug + 'static {
    /// Locate a VF.
    fn locate_vf(&self, vf: PciAddress) -> Result<VfLocation, SriovError>;
    /// Locate a PF.
    fn locate_pf(&self, pf: PciAddress) -> Result<PfLocation, SriovError>;
    /// Apply settings to VF `vf` of the PF netdev `pf` (from a [`VfLocation`]).
    async fn set_vf(&self, pf: &str, vf: u32, settings: &VfSettings) -> Result<(), SriovError>;
}

/// [`SriovHost`] from a [`SysfsTopology`] and a [`VfControl`].
#[derive(Debug, Clone)]
pub struct SysfsSriov {
    /// The topology reader.
    pub topology: SysfsTopology,
    /// The VF control.
    pub control: Arc<dyn VfControl>,
}

#[async_trait]
impl SriovHost for SysfsSriov {
    fn locate_vf(&self, vf: PciAddress) -> Result<VfLocation, SriovError> {
        self.topology.locate_vf(vf)
    }

    fn locate_pf(&self, pf: PciAddress) -> Result<PfLocation, SriovError> {
        self.topology.locate_pf(pf)
    }

    async fn set_vf(&self, pf: &str, vf: u32, s: &VfSettings) -> Result<(), SriovError> {
        self.control.set_vf(pf, vf, s).await
    }
}

/// Build a FABRICATED sysfs tree under `root`: PF `pf` with netdev `pf_netdev` and VFs
/// `vfs` (address, optional netdev), linked the way the kernel links them (`physfn`,
/// `virtfnN`, `net/<name>`). For tests and benchmarks on machines without SR-IOV.
pub fn fabricate_pf(
    root: &Path,
    pf: PciAddress,
    pf_netdev: &str,
    vfs: &[(PciAddress, Option<&str>)],
) -> io::Result<()> {
    let devices = root.join("bus/pci/devices");
    let pf_dir = devices.join(pf.to_string());
    std::fs::create_dir_all(pf_dir.join("net").join(pf_netdev))?;
    std::fs::write(pf_dir.join("sriov_numvfs"), format!("{}\n", vfs.len()))?;
    for (n, (vf, netdev)) in vfs.iter().enumerate() {
        let vf_dir = devices.join(vf.to_string());
        std::fs::create_dir_all(&vf_dir)?;
        if let Some(nd) = netdev {
            std::fs::create_dir_all(vf_dir.join("net").join(nd))?;
        }
        std::os::unix::fs::symlink(Path::new("..").join(pf.to_string()), vf_dir.join("physfn"))?;
        std::os::unix::fs::symlink(
            Path::new("..").join(vf.to_string()),
            pf_dir.join(format!("virtfn{n}")),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pci(s: &str) -> PciAddress {
        s.parse().unwrap()
    }

    #[test]
    fn reads_a_fabricated_tree() {
        let dir = tempfile::tempdir().unwrap();
        fabricate_pf(
            dir.path(),
            pci("0000:81:00.0"),
            "enp129s0f0",
            &[
                (pci("0000:81:10.0"), Some("enp129s0f0v0")),
                (pci("0000:81:10.2"), None),
            ],
        )
        .unwrap();
        let t = SysfsTopology::new(dir.path());
        let v = t.locate_vf(pci("0000:81:10.2")).unwrap();
        assert_eq!(v.pf, pci("0000:81:00.0"));
        assert_eq!(v.index, 1);
        assert_eq!(v.pf_netdev, "enp129s0f0");
        assert_eq!(v.vf_netdev, None);
        let v0 = t.locate_vf(pci("0000:81:10.0")).unwrap();
        assert_eq!(
            (v0.index, v0.vf_netdev.as_deref()),
            (0, Some("enp129s0f0v0"))
        );
        assert!(matches!(
            t.locate_vf(pci("0000:81:00.0")),
            Err(SriovError::NotVf(_))
        ));
        assert!(matches!(
            t.locate_vf(pci("0000:82:00.0")),
            Err(SriovError::NoDevice(_))
        ));
        assert_eq!(
            t.locate_pf(pci("0000:81:00.0")).unwrap().netdev.as_deref(),
            Some("enp129s0f0")
        );
        assert!(matches!(
            t.locate_pf(pci("0000:81:10.0")),
            Err(SriovError::NotPf(_))
        ));
    }

    #[test]
    fn refuses_odd_names_in_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        fabricate_pf(
            dir.path(),
            pci("0000:81:00.0"),
            "enp129s0f0",
            &[(pci("0000:81:10.0"), Some("bad;name"))],
        )
        .unwrap();
        let t = SysfsTopology::new(dir.path());
        assert!(matches!(
            t.locate_vf(pci("0000:81:10.0")),
            Err(SriovError::BadEntry(n)) if n == "bad;name"
        ));
    }

    #[test]
    fn the_real_sysfs_reads_without_error_for_absent_devices() {
        let t = SysfsTopology::new("/sys");
        assert!(matches!(
            t.locate_vf(pci("ffff:ff:1f.7")),
            Err(SriovError::NoDevice(_))
        ));
    }
}
