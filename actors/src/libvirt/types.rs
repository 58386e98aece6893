//! Plain data the libvirt layer hands out: domain identity, state, info, and the scope of a
//! change. Nothing here holds a libvirt object: domains are always looked up again by UUID.

use uuid::Uuid;
use virt::domain::DomainState as VirtState;
use virt::sys;

/// A domain's identity as libvirt reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DomainId {
    /// The domain's UUID (vireo uses the instance UUID).
    pub uuid: Uuid,
    /// The domain's name.
    pub name: String,
}

/// A domain's state (`virDomainState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DomainState {
    /// `VIR_DOMAIN_NOSTATE`.
    NoState,
    /// `VIR_DOMAIN_RUNNING`.
    Running,
    /// `VIR_DOMAIN_BLOCKED`.
    Blocked,
    /// `VIR_DOMAIN_PAUSED`.
    Paused,
    /// `VIR_DOMAIN_SHUTDOWN`: being shut down.
    ShuttingDown,
    /// `VIR_DOMAIN_SHUTOFF`.
    Shutoff,
    /// `VIR_DOMAIN_CRASHED`.
    Crashed,
    /// `VIR_DOMAIN_PMSUSPENDED`.
    PmSuspended,
    /// A value this libvirt binding does not know.
    Unknown(u32),
}

impl DomainState {
    /// From libvirt's raw `virDomainState`.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            sys::VIR_DOMAIN_NOSTATE => Self::NoState,
            sys::VIR_DOMAIN_RUNNING => Self::Running,
            sys::VIR_DOMAIN_BLOCKED => Self::Blocked,
            sys::VIR_DOMAIN_PAUSED => Self::Paused,
            sys::VIR_DOMAIN_SHUTDOWN => Self::ShuttingDown,
            sys::VIR_DOMAIN_SHUTOFF => Self::Shutoff,
            sys::VIR_DOMAIN_CRASHED => Self::Crashed,
            sys::VIR_DOMAIN_PMSUSPENDED => Self::PmSuspended,
            other => Self::Unknown(other),
        }
    }

    pub(crate) fn from_virt(state: virt::domain::DomainStateEnum) -> Self {
        match state {
            virt::enumutil::Enum::Known(known) => match known {
                VirtState::NoState => Self::NoState,
                VirtState::Running => Self::Running,
                VirtState::Blocked => Self::Blocked,
                VirtState::Paused => Self::Paused,
                VirtState::Shutdown => Self::ShuttingDown,
                VirtState::Shutoff => Self::Shutoff,
                VirtState::Crashed => Self::Crashed,
                VirtState::PMSuspended => Self::PmSuspended,
            },
            virt::enumutil::Enum::Unknown(raw) => Self::from_raw(raw),
        }
    }
}

/// How far the domain's current job (a migration) is, from `virDomainGetJobInfo`; a figure
/// the hypervisor does not report is None. Bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobProgress {
    /// A job runs (`VIR_DOMAIN_JOB_NONE` is false).
    pub active: bool,
    /// Everything the job moves.
    pub data_total: Option<u64>,
    /// What is left of it.
    pub data_remaining: Option<u64>,
    /// Guest memory to move.
    pub mem_total: Option<u64>,
    /// Guest memory left.
    pub mem_remaining: Option<u64>,
    /// Disk data to move (block migration).
    pub disk_total: Option<u64>,
    /// Disk data left.
    pub disk_remaining: Option<u64>,
}

/// `virDomainGetInfo`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DomainInfo {
    /// The state.
    pub state: DomainState,
    /// Maximum memory, KiB.
    pub max_mem_kib: u64,
    /// Current memory, KiB.
    pub mem_kib: u64,
    /// Number of virtual CPUs.
    pub vcpus: u32,
    /// CPU time used, nanoseconds.
    pub cpu_time_ns: u64,
}

impl From<virt::domain::DomainInfo> for DomainInfo {
    fn from(info: virt::domain::DomainInfo) -> Self {
        Self {
            state: DomainState::from_virt(info.state),
            max_mem_kib: info.max_mem,
            mem_kib: info.memory,
            vcpus: info.nr_virt_cpu,
            cpu_time_ns: info.cpu_time,
        }
    }
}

/// The host as its libvirt driver describes it (`virNodeGetInfo`, `virConnectGetType`,
/// `virConnectGetVersion`, `virConnectGetHostname`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// The driver's hypervisor type (`QEMU`, `TEST`, ...).
    pub hypervisor_type: String,
    /// The hypervisor's version, libvirt's encoding (major * 1,000,000 + minor * 1,000 +
    /// release), as Nova reports it.
    pub hypervisor_version: u64,
    /// The host name libvirt reports.
    pub hostname: String,
    /// CPU model (`x86_64`, ...).
    pub cpu_model: String,
    /// CPU frequency, MHz.
    pub cpu_mhz: u32,
    /// Active logical CPUs.
    pub cpus: u32,
    /// NUMA nodes, sockets per node, cores per socket, threads per core.
    pub topology: [u32; 4],
    /// Memory, KiB.
    pub memory_kib: u64,
}

/// One domain in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainSummary {
    /// The UUID.
    pub uuid: Uuid,
    /// The name.
    pub name: String,
    /// True when the domain runs (or is paused).
    pub active: bool,
    /// Its state.
    pub state: DomainState,
}

/// Which definition a change affects (`virDomainModificationImpact`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Affect {
    /// `VIR_DOMAIN_AFFECT_CURRENT`: the live domain if it runs, else the persistent config.
    Current,
    /// `VIR_DOMAIN_AFFECT_LIVE`: the running domain only.
    Live,
    /// `VIR_DOMAIN_AFFECT_CONFIG`: the persistent config only.
    Config,
    /// Both the running domain and the persistent config.
    LiveAndConfig,
}

impl Affect {
    /// The `VIR_DOMAIN_AFFECT_*` flags.
    pub fn flags(self) -> u32 {
        match self {
            Self::Current => sys::VIR_DOMAIN_AFFECT_CURRENT,
            Self::Live => sys::VIR_DOMAIN_AFFECT_LIVE,
            Self::Config => sys::VIR_DOMAIN_AFFECT_CONFIG,
            Self::LiveAndConfig => sys::VIR_DOMAIN_AFFECT_LIVE | sys::VIR_DOMAIN_AFFECT_CONFIG,
        }
    }
}

/// A metadata element to store in a domain (`virDomainSetMetadata` with
/// `VIR_DOMAIN_METADATA_ELEMENT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// The XML fragment: one element (its namespace is set by libvirt from `uri`).
    pub xml: String,
    /// The namespace prefix libvirt uses when writing the element.
    pub key: String,
    /// The namespace URI that identifies the element.
    pub uri: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_from_raw() {
        let all = [
            (sys::VIR_DOMAIN_NOSTATE, DomainState::NoState),
            (sys::VIR_DOMAIN_RUNNING, DomainState::Running),
            (sys::VIR_DOMAIN_BLOCKED, DomainState::Blocked),
            (sys::VIR_DOMAIN_PAUSED, DomainState::Paused),
            (sys::VIR_DOMAIN_SHUTDOWN, DomainState::ShuttingDown),
            (sys::VIR_DOMAIN_SHUTOFF, DomainState::Shutoff),
            (sys::VIR_DOMAIN_CRASHED, DomainState::Crashed),
            (sys::VIR_DOMAIN_PMSUSPENDED, DomainState::PmSuspended),
            (77, DomainState::Unknown(77)),
        ];
        for (raw, state) in all {
            assert_eq!(DomainState::from_raw(raw), state);
            assert_eq!(
                DomainState::from_virt(virt::domain::DomainStateEnum::from_raw(raw)),
                state
            );
        }
    }

    #[test]
    fn affect_flags() {
        assert_eq!(Affect::Current.flags(), 0);
        assert_eq!(Affect::Live.flags(), 1);
        assert_eq!(Affect::Config.flags(), 2);
        assert_eq!(Affect::LiveAndConfig.flags(), 3);
    }
}
