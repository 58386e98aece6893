//! Helpers turning the deserialized wire strings into validated values, with errors that
//! name the element/attribute path.

use std::str::FromStr;

use quick_xml::events::Event;
use quick_xml::Reader;

use crate::error::XmlError;
use crate::types::{parse_uuid, DeviceName, MacAddress, PciAddress};

/// The value of a required field.
pub(crate) fn req(v: Option<String>, field: impl FnOnce() -> String) -> Result<String, XmlError> {
    v.ok_or_else(|| XmlError::missing(field()))
}

/// A decimal number (libvirt also accepts `0x` hex for some numbers; so do we).
pub(crate) fn num<T: FromStr + TryFrom<u64>>(
    s: &str,
    field: impl FnOnce() -> String,
) -> Result<T, XmlError> {
    let t = s.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16)
            .ok()
            .and_then(|v| T::try_from(v).ok()),
        None => t.parse::<T>().ok(),
    };
    parsed.ok_or_else(|| XmlError::number(field(), s))
}

pub(crate) fn opt_num<T: FromStr + TryFrom<u64>>(
    s: Option<String>,
    field: impl FnOnce() -> String,
) -> Result<Option<T>, XmlError> {
    s.map(|s| num(&s, field)).transpose()
}

/// `yes`/`no` (libvirt's spelling for `managed`).
pub(crate) fn yes_no(s: &str, field: impl FnOnce() -> String) -> Result<bool, XmlError> {
    match s {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(XmlError::unsupported(field(), s)),
    }
}

/// `on`/`off` (libvirt's spelling for `state`, `append`).
pub(crate) fn on_off(s: &str, field: impl FnOnce() -> String) -> Result<bool, XmlError> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(XmlError::unsupported(field(), s)),
    }
}

pub(crate) fn keyword<T>(
    s: &str,
    parse: fn(&str) -> Option<T>,
    field: impl FnOnce() -> String,
) -> Result<T, XmlError> {
    parse(s).ok_or_else(|| XmlError::unsupported(field(), s))
}

pub(crate) fn mac(s: &str, field: impl FnOnce() -> String) -> Result<MacAddress, XmlError> {
    s.parse().map_err(|e| XmlError::invalid(field(), e))
}

pub(crate) fn uuid(s: &str, field: impl FnOnce() -> String) -> Result<uuid::Uuid, XmlError> {
    parse_uuid(s.trim()).map_err(|e| XmlError::invalid(field(), e))
}

pub(crate) fn dev(s: String, field: impl FnOnce() -> String) -> Result<DeviceName, XmlError> {
    DeviceName::new(s).map_err(|e| XmlError::invalid(field(), e))
}

pub(crate) fn opt_dev(
    s: Option<String>,
    field: impl FnOnce() -> String,
) -> Result<Option<DeviceName>, XmlError> {
    s.map(|s| dev(s, field)).transpose()
}

/// A PCI address given as libvirt's four attributes (`0x`-prefixed hex or decimal).
pub(crate) fn pci(
    domain: Option<String>,
    bus: Option<String>,
    slot: Option<String>,
    function: Option<String>,
    field: &dyn Fn() -> String,
) -> Result<PciAddress, XmlError> {
    let part = |v: Option<String>, name: &str, max: u32| -> Result<u32, XmlError> {
        let v = v.ok_or_else(|| XmlError::missing(format!("{}/@{name}", field())))?;
        let n: u32 = num(&v, || format!("{}/@{name}", field()))?;
        if n > max {
            return Err(XmlError::invalid(
                format!("{}/@{name}", field()),
                crate::types::ValueError::Pci(v),
            ));
        }
        Ok(n)
    };
    // A missing domain means domain 0, as in libvirt.
    let domain = match domain {
        None => 0,
        d => part(d, "domain", 0xffff)?,
    };
    Ok(PciAddress {
        domain: domain as u16,
        bus: part(bus, "bus", 0xff)? as u8,
        slot: part(slot, "slot", 0x1f)? as u8,
        function: part(function, "function", 7)? as u8,
    })
}

/// Check that the document's root element is `expected`.
pub(crate) fn check_root(xml: &str, expected: &'static str) -> Result<(), XmlError> {
    let mut reader = Reader::from_str(xml);
    loop {
        match reader.read_event()? {
            Event::Start(e) | Event::Empty(e) => {
                if e.local_name().as_ref() == expected.as_bytes() {
                    return Ok(());
                }
                return Err(XmlError::WrongRoot {
                    expected,
                    found: String::from_utf8_lossy(e.name().as_ref()).into_owned(),
                });
            }
            Event::Eof => {
                return Err(XmlError::WrongRoot {
                    expected,
                    found: String::new(),
                })
            }
            _ => {}
        }
    }
}
