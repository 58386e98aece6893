//! Typed libvirt domain XML.
//!
//! # Layout
//! Pure data, no I/O: builds the domain XML vireo writes and parses the live XML libvirt
//! returns (tap names libvirt assigned, PCI addresses, aliases).
//! - [`types`]: validated values shared across vireo (MAC and PCI addresses).

pub mod types;
