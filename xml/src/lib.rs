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
//! (every value a string), then converts them into the validated model, so every bad value
//! is reported with its element/attribute path. Unknown elements and attributes are
//! ignored. Writing uses a hand-written single-pass writer (compact output, single-quoted
//! attributes): serde's serializer cannot express the model's per-form rules and the hand
//! writer is what meets the speed goal (see `benches/`).
//!
//! A typed round trip `Domain::from_xml(&d.to_xml()?)? == d` holds for every domain the
//! model can hold (property-tested). Live XML holds more than the model (controllers,
//! graphics, ...): parse it to read, use [`live::rewrite`] to change it.

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
