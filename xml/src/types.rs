//! Small validated value types shared by the XML model and the rest of vireo.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value that failed validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Not six colon-separated hex octets.
    #[error("invalid MAC address {0:?}")]
    Mac(String),
    /// Not `DDDD:BB:SS.F`.
    #[error("invalid PCI address {0:?}")]
    Pci(String),
    /// Not a UUID.
    #[error("invalid UUID {0:?}")]
    Uuid(String),
    /// Empty, blank, or holding a control character.
    #[error("invalid domain name {0:?}")]
    DomainName(String),
    /// Not a Linux network device name (1..=15 bytes, no `/`, `:`, whitespace or control).
    #[error("invalid device name {0:?}")]
    DeviceName(String),
}

/// Parse a UUID in any form the `uuid` crate accepts (libvirt prints it hyphenated).
pub fn parse_uuid(s: &str) -> Result<uuid::Uuid, ValueError> {
    uuid::Uuid::parse_str(s).map_err(|_| ValueError::Uuid(s.to_owned()))
}

/// A libvirt domain name: not empty or blank, no control characters (libvirt refuses a
/// newline; XML cannot carry the others). Any other character, XML metacharacters and
/// non-ASCII included, is allowed and escaped on output.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainName(String);

impl DomainName {
    /// Validate a name.
    pub fn new(name: impl Into<String>) -> Result<Self, ValueError> {
        let name = name.into();
        if name.trim().is_empty() || name.chars().any(char::is_control) {
            return Err(ValueError::DomainName(name));
        }
        Ok(DomainName(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for DomainName {
    type Err = ValueError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DomainName::new(s)
    }
}

impl fmt::Display for DomainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for DomainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DomainName({:?})", self.0)
    }
}

impl AsRef<str> for DomainName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A Linux network device name as the kernel accepts it (`dev_valid_name`): 1..=15 bytes,
/// not `.` or `..`, no `/`, `:`, whitespace or control characters. Used for bridges, taps,
/// macvtap lower devices and the `target dev` libvirt reports (`vnet3`).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceName(String);

/// Longest Linux interface name (IFNAMSIZ - 1).
pub const MAX_DEVICE_NAME_LEN: usize = 15;

impl DeviceName {
    /// Validate a device name.
    pub fn new(name: impl Into<String>) -> Result<Self, ValueError> {
        let name = name.into();
        let ok = !name.is_empty()
            && name.len() <= MAX_DEVICE_NAME_LEN
            && name != "."
            && name != ".."
            && !name
                .chars()
                .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
        if ok {
            Ok(DeviceName(name))
        } else {
            Err(ValueError::DeviceName(name))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for DeviceName {
    type Err = ValueError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeviceName::new(s)
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceName({:?})", self.0)
    }
}

impl AsRef<str> for DeviceName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// An Ethernet MAC address, printed as `aa:bb:cc:dd:ee:ff` (lower case).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddress(pub [u8; 6]);

impl MacAddress {
    /// The octets.
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// True for a multicast (group) address, which no VIF may use.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }
}

impl FromStr for MacAddress {
    type Err = ValueError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ValueError::Mac(s.to_owned());
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for octet in &mut out {
            let part = parts.next().ok_or_else(err)?;
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            *octet = u8::from_str_radix(part, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(MacAddress(out))
    }
}

impl fmt::Display for MacAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl fmt::Debug for MacAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddress({self})")
    }
}

impl Serialize for MacAddress {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddress {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A PCI address `domain:bus:slot.function`, e.g. `0000:81:00.1`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddress {
    /// PCI domain (16 bits).
    pub domain: u16,
    /// Bus number.
    pub bus: u8,
    /// Slot (device) number, 0..=31.
    pub slot: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

impl FromStr for PciAddress {
    type Err = ValueError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ValueError::Pci(s.to_owned());
        let hex = |p: &str, max_len: usize| -> Result<u32, ValueError> {
            if p.is_empty() || p.len() > max_len || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            u32::from_str_radix(p, 16).map_err(|_| err())
        };
        let (rest, function) = s.rsplit_once('.').ok_or_else(err)?;
        let mut parts = rest.split(':');
        let (d, b, sl) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(d), Some(b), Some(sl), None) => (d, b, sl),
            _ => return Err(err()),
        };
        let domain = hex(d, 4)?;
        let bus = hex(b, 2)?;
        let slot = hex(sl, 2)?;
        let function = hex(function, 1)?;
        if slot > 0x1f || function > 7 {
            return Err(err());
        }
        Ok(PciAddress {
            domain: domain as u16,
            bus: bus as u8,
            slot: slot as u8,
            function: function as u8,
        })
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.slot, self.function
        )
    }
}

impl fmt::Debug for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PciAddress({self})")
    }
}

impl Serialize for PciAddress {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PciAddress {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parses_and_prints_lower_case() {
        let m: MacAddress = "FA:16:3E:0a:0B:ff".parse().unwrap();
        assert_eq!(m.to_string(), "fa:16:3e:0a:0b:ff");
        assert!(!m.is_multicast());
        assert!("01:00:5e:00:00:01"
            .parse::<MacAddress>()
            .unwrap()
            .is_multicast());
    }

    #[test]
    fn bad_macs_are_errors() {
        for bad in [
            "",
            "fa:16:3e:0a:0b",
            "fa:16:3e:0a:0b:ff:00",
            "fa:16:3e:0a:0b:f",
            "fa:16:3e:0a:0b:fff",
            "zz:16:3e:0a:0b:ff",
            "fa:16:3e:0a:0b:+f",
            "fa163e0a0bff",
        ] {
            assert_eq!(
                bad.parse::<MacAddress>(),
                Err(ValueError::Mac(bad.into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn pci_parses_and_prints() {
        let p: PciAddress = "0000:81:00.1".parse().unwrap();
        assert_eq!(
            p,
            PciAddress {
                domain: 0,
                bus: 0x81,
                slot: 0,
                function: 1
            }
        );
        assert_eq!(p.to_string(), "0000:81:00.1");
    }

    #[test]
    fn domain_names() {
        assert_eq!(
            DomainName::new("a <b> & 'c' \"d\" é").unwrap().as_str(),
            "a <b> & 'c' \"d\" é"
        );
        for bad in ["", "   ", "a\nb", "a\u{1}b", "tab\there"] {
            assert_eq!(
                DomainName::new(bad),
                Err(ValueError::DomainName(bad.into())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn device_names() {
        for ok in [
            "vnet3",
            "tap3b2c4d5e-00",
            "br-int",
            "a.b_c",
            "123456789012345",
        ] {
            assert_eq!(DeviceName::new(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a:b",
            "a b",
            "1234567890123456",
            "a\u{7f}",
        ] {
            assert_eq!(
                DeviceName::new(bad),
                Err(ValueError::DeviceName(bad.into())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn uuids() {
        let u = parse_uuid("6f1c1b0e-1111-4222-8333-444455556666").unwrap();
        assert_eq!(u.to_string(), "6f1c1b0e-1111-4222-8333-444455556666");
        assert_eq!(parse_uuid("nope"), Err(ValueError::Uuid("nope".into())));
    }

    #[test]
    fn bad_pci_addresses_are_errors() {
        for bad in [
            "",
            "0000:81:00",
            "81:00.1",
            "0000:81:20.0",
            "0000:81:00.8",
            "0000:181:00.1",
            "x000:81:00.1",
            "0000:81:00.1.2",
        ] {
            assert!(bad.parse::<PciAddress>().is_err(), "{bad}");
        }
    }
}
