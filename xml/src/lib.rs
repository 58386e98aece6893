//! Typed libvirt domain XML: what vireo writes and what libvirt reports back.
//!
//! Pure data, no I/O. vireo builds a [`Domain`] (or a single [`Interface`] / [`Hostdev`] for
//! hot-plug), writes it with `to_xml()`, and reads libvirt's live XML back with
//! `from_xml()` to learn what libvirt assigned (tap names such as `vnet3`, aliases, guest PCI
//! addresses). Everything vireo needs to recover an instance after a restart is in the
//! domain's `<metadata>` under the [`metadata::NAMESPACE_URI`] namespace
//! ([`VireoMetadata`]), so libvirt stays the single source of truth on the host.
//!
//! Invalid input is a typed error ([`XmlError`]), never a panic: bad MACs, UUIDs, PCI
//! addresses, device names and empty domain names are refused when parsed (the model's
//! validated types cannot hold them) and characters XML cannot carry are refused when
//! written. Names and values with XML metacharacters are escaped.
//!
//! # Layout
//! - [`types`]: validated values shared across vireo ([`MacAddress`], [`PciAddress`],
//!   [`DomainName`], [`DeviceName`]).
//! - [`domain`]: [`Domain`] and its parts (os, cpu, features, clock, lifecycle actions).
//! - [`interface`]: [`Interface`], one variant of [`InterfaceKind`] per form a compute host
//!   uses (OVS bridge + virtualport, Linux bridge, ethernet tap, SR-IOV hostdev, macvtap
//!   direct, vhost-user, vDPA, libvirt network). A form only carries the fields libvirt
//!   accepts for it: an OVS virtualport exists only on [`InterfaceKind::Bridge`].
//! - [`devices`]: [`Disk`] (file, block, rbd), [`Hostdev`] (PCI passthrough), [`Serial`],
//!   [`Console`], [`DeviceAddress`].
//! - [`metadata`]: [`VireoMetadata`] (instance uuid, flavor, `network_info`, in-flight
//!   operation), also usable alone with libvirt's get/set metadata API.
//! - [`live`]: rewriting a live document in place ([`live::rewrite`]): replace, add or remove
//!   an interface by MAC or alias, set the vireo metadata; every byte outside the edited
//!   elements is kept as it was.
//! - [`error`]: the crate's one error type, [`XmlError`].
//!
//! # Serialization and parsing
//! Parsing uses serde derive with quick-xml's deserializer into private "wire" structs
//! (every value a string, borrowed from the input unless it held entities), then converts
//! them into the validated model, so every bad value is reported with its element/attribute
//! path. Unknown elements and attributes are
//! ignored. Writing uses a hand-written single-pass writer (compact output, single-quoted
//! attributes): serde's serializer cannot express the model's per-form rules and the hand
//! writer is what meets the speed goal (see `benches/`).
//!
//! A typed round trip `Domain::from_xml(&d.to_xml()?)? == d` holds for every domain the
//! model can hold (property-tested). Live XML holds more than the model (controllers,
//! graphics, ...): parse it to read, use [`live::rewrite`] to change it.
//!
//! # Performance
//! `cargo bench -p vireo-xml` (criterion; `wall/` and thread-`cpu/` clocks). On the shared
//! 2-core development machine at load average 6–8: one OVS interface built and serialized
//! in 0.22–0.35 µs CPU (0.55–0.75 µs wall; goal 1.5 µs); a 4-VIF domain (OVS, hybrid qbr,
//! pre-created tap, SR-IOV VF) built, serialized and parsed back in 24–33 µs CPU (44–71 µs
//! wall; goal 30 µs), 48–65 µs CPU with vireo metadata holding a 4-VIF `network_info`.
//! Writing is cheap (0.15 µs per interface, 3–4 µs per domain with metadata); the cost is
//! quick-xml's serde deserializer (about 20 µs for the 4-VIF domain, against 2.5 µs for the
//! same document deserialized into `IgnoredAny`).
//!
//! # Example
//! ```
//! use vireo_xml::*;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let port: uuid::Uuid = "3b2c4d5e-0000-4000-8000-000000000001".parse()?;
//! let ovs = Interface {
//!     mac: Some("fa:16:3e:00:00:01".parse()?),
//!     model: Some(NicModel::Virtio),
//!     mtu: Some(1450),
//!     ..Interface::new(InterfaceKind::Bridge {
//!         bridge: DeviceName::new("br-int")?,
//!         virtualport: Some(OvsPort { interface_id: port, profile_id: None }),
//!         target: Some(DeviceName::new("tap3b2c4d5e-00")?),
//!     })
//! };
//! let mut domain = Domain::new(DomainName::new("instance-0000002a")?);
//! domain.os.machine = Some("q35".into());
//! domain.devices.interfaces.push(ovs);
//! let xml = domain.to_xml()?;
//! assert_eq!(Domain::from_xml(&xml)?, domain);
//!
//! // Bad input is a typed error.
//! assert!(DomainName::new("").is_err());
//! assert!(matches!(
//!     Interface::from_xml("<interface type='ethernet'><mac address='fa:16'/></interface>"),
//!     Err(XmlError::Invalid { .. })
//! ));
//! # Ok(())
//! # }
//! ```

/// Defines a keyword enum: variants with the exact XML spelling, `as_str`, `parse` and `ALL`.
macro_rules! keywords {
    ($(#[$m:meta])* pub enum $name:ident { $($(#[$vm:meta])* $var:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vm])* $var),+
        }

        impl $name {
            /// Every value.
            pub const ALL: &'static [$name] = &[$($name::$var),+];

            /// The XML spelling.
            pub fn as_str(&self) -> &'static str {
                match self {
                    $($name::$var => $s),+
                }
            }

            /// Parse the XML spelling.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($s => Some($name::$var),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod devices;
pub mod domain;
pub mod error;
pub mod interface;
pub mod live;
pub mod metadata;
mod parse;
pub mod types;
mod write;

pub use devices::{
    CharLog, CharSource, Console, ConsoleTarget, DeviceAddress, Disk, DiskAuth, DiskBus, DiskCache,
    DiskDevice, DiskDriver, DiskFormat, DiskSource, Hostdev, RbdHost, Serial, UnixMode,
};
pub use domain::{
    BootDevice, Clock, ClockOffset, Cpu, CpuMode, CpuTopology, Devices, Domain, DomainType,
    Features, LifecycleAction, Os, TickPolicy, Timer, TimerName,
};
pub use error::XmlError;
pub use interface::{
    Bandwidth, DirectMode, EthernetTarget, Interface, InterfaceKind, NetDriver, NetDriverName,
    NicModel, OvsPort, Rate, VhostUserMode,
};
pub use metadata::{Flavor, InFlightOperation, VireoMetadata};
pub use types::{DeviceName, DomainName, MacAddress, PciAddress};
