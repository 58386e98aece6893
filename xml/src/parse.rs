//! Helpers turning the deserialized wire strings into validated values, with errors that
//! name the element/attribute path.

use std::borrow::Cow;
use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

use serde::de::{Deserialize, Deserializer, Visitor};

use quick_xml::events::Event;
use quick_xml::Reader;

use crate::error::XmlError;
use crate::types::{parse_uuid, DeviceName, MacAddress, PciAddress};

/// A string from the document, borrowed when quick-xml can hand it out unchanged (no
/// entities to resolve), owned otherwise: parsing allocates only for what the model keeps.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Str<'a>(pub(crate) Cow<'a, str>);

impl Str<'_> {
    pub(crate) fn into_string(self) -> String {
        self.0.into_owned()
    }
}

impl Deref for Str<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }

            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// The value of a required field.
pub(crate) fn req<'a>(
    v: Option<Str<'a>>,
    field: impl FnOnce() -> String,
) -> Result<Str<'a>, XmlError> {
    v.ok_or_else(|| XmlError::missing(field()))
}

/// The owned value of an optional field.
pub(crate) fn owned(v: Option<Str<'_>>) -> Option<String> {
    v.map(Str::into_string)
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
    s: Option<Str<'_>>,
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

pub(crate) fn dev(s: Str<'_>, field: impl FnOnce() -> String) -> Result<DeviceName, XmlError> {
    DeviceName::new(s.into_string()).map_err(|e| XmlError::invalid(field(), e))
}

pub(crate) fn opt_dev(
    s: Option<Str<'_>>,
    field: impl FnOnce() -> String,
) -> Result<Option<DeviceName>, XmlError> {
    s.map(|s| dev(s, field)).transpose()
}

/// A PCI address given as libvirt's four attributes (`0x`-prefixed hex or decimal).
pub(crate) fn pci(
    domain: Option<Str<'_>>,
    bus: Option<Str<'_>>,
    slot: Option<Str<'_>>,
    function: Option<Str<'_>>,
    field: &dyn Fn() -> String,
) -> Result<PciAddress, XmlError> {
    let part = |v: Option<Str<'_>>, name: &str, max: u32| -> Result<u32, XmlError> {
        let v = v.ok_or_else(|| XmlError::missing(format!("{}/@{name}", field())))?;
        let n: u32 = num(&v, || format!("{}/@{name}", field()))?;
        if n > max {
            return Err(XmlError::invalid(
                format!("{}/@{name}", field()),
                crate::types::ValueError::Pci(v.into_string()),
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

/// Deserialize `xml` into a wire struct with quick-xml's serde deserializer, refusing first a
/// `<!DOCTYPE>` inside the root element: quick-xml 0.38's deserializer panics
/// (`unreachable!`) on one between text runs of an element (tafia/quick-xml#964, fixed after
/// 0.38.4; found by vireo's `domain_xml` fuzz target). XML allows a DOCTYPE only before the
/// root and libvirt never writes one, so refusing it loses nothing.
pub(crate) fn de<'de, T: Deserialize<'de>>(xml: &'de str) -> Result<T, XmlError> {
    refuse_inner_doctype(xml)?;
    Ok(quick_xml::de::from_str(xml)?)
}

fn refuse_inner_doctype(xml: &str) -> Result<(), XmlError> {
    // Fast path: a DOCTYPE starts with `<!D` (any case); documents without one skip the scan.
    if !xml
        .match_indices("<!")
        .any(|(i, _)| matches!(xml.as_bytes().get(i + 2), Some(b'D' | b'd')))
    {
        return Ok(());
    }
    let mut reader = Reader::from_str(xml);
    let mut in_root = false;
    loop {
        match reader.read_event()? {
            Event::Start(_) | Event::Empty(_) => in_root = true,
            Event::DocType(d) if in_root => {
                return Err(XmlError::unsupported(
                    "<!DOCTYPE> inside the root element",
                    &String::from_utf8_lossy(&d),
                ))
            }
            Event::Eof => return Ok(()),
            _ => {}
        }
    }
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
