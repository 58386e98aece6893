//! The serializer's hot path: a compact XML writer into one `String`.
//!
//! Elements are written in one pass with escaping and validation done together: `<>&'"`
//! become entities; in attributes tab, newline and carriage return become character
//! references (so parsers do not normalise them to spaces); in text a carriage return and
//! any leading or trailing whitespace become character references (so parsers that trim
//! text, quick-xml's deserializer among them, give the value back unchanged). Characters
//! XML 1.0 cannot carry at all are an [`XmlError::InvalidChar`].

use uuid::Uuid;

use crate::error::XmlError;
use crate::types::{MacAddress, PciAddress};

/// Writes elements into a string. Attribute values use single quotes, as libvirt does.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    pub(crate) out: String,
    /// The element whose start tag or text is being written (for error messages).
    element: &'static str,
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl Writer {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Writer {
            out: String::with_capacity(n),
            element: "",
        }
    }

    /// `<name` (attributes may follow).
    pub(crate) fn open(&mut self, name: &'static str) {
        self.element = name;
        self.out.push('<');
        self.out.push_str(name);
    }

    /// `>` after the attributes.
    pub(crate) fn close_start(&mut self) {
        self.out.push('>');
    }

    /// `/>` after the attributes.
    pub(crate) fn close_empty(&mut self) {
        self.out.push_str("/>");
    }

    /// `</name>`.
    pub(crate) fn end(&mut self, name: &'static str) {
        self.out.push_str("</");
        self.out.push_str(name);
        self.out.push('>');
    }

    /// An attribute whose value needs escaping.
    pub(crate) fn attr(&mut self, name: &'static str, value: &str) -> Result<(), XmlError> {
        self.attr_start(name);
        escape(&mut self.out, value, true).map_err(|ch| XmlError::InvalidChar {
            element: self.element,
            attribute: Some(name),
            ch,
        })?;
        self.out.push('\'');
        Ok(())
    }

    /// An attribute whose value is known to need no escaping (keywords, numbers).
    pub(crate) fn attr_raw(&mut self, name: &'static str, value: &str) {
        self.attr_start(name);
        self.out.push_str(value);
        self.out.push('\'');
    }

    pub(crate) fn attr_u64(&mut self, name: &'static str, value: u64) {
        self.attr_start(name);
        push_u64(&mut self.out, value);
        self.out.push('\'');
    }

    pub(crate) fn attr_bool(&mut self, name: &'static str, value: bool, yes: &str, no: &str) {
        self.attr_raw(name, if value { yes } else { no });
    }

    pub(crate) fn attr_mac(&mut self, name: &'static str, mac: &MacAddress) {
        self.attr_start(name);
        for (i, b) in mac.octets().iter().enumerate() {
            if i > 0 {
                self.out.push(':');
            }
            self.out.push(HEX[usize::from(b >> 4)] as char);
            self.out.push(HEX[usize::from(b & 0xf)] as char);
        }
        self.out.push('\'');
    }

    pub(crate) fn attr_uuid(&mut self, name: &'static str, uuid: &Uuid) {
        let mut buf = Uuid::encode_buffer();
        let s = uuid.hyphenated().encode_lower(&mut buf);
        self.attr_raw(name, s);
    }

    fn attr_hex(&mut self, name: &'static str, value: u64, digits: u32) {
        self.attr_start(name);
        self.out.push_str("0x");
        for i in (0..digits).rev() {
            self.out
                .push(HEX[((value >> (4 * i)) & 0xf) as usize] as char);
        }
        self.out.push('\'');
    }

    /// `domain='0x0000' bus='0x00' slot='0x00' function='0x0'`, as libvirt writes them.
    pub(crate) fn attrs_pci(&mut self, pci: &PciAddress) {
        self.attr_hex("domain", u64::from(pci.domain), 4);
        self.attr_hex("bus", u64::from(pci.bus), 2);
        self.attr_hex("slot", u64::from(pci.slot), 2);
        self.attr_hex("function", u64::from(pci.function), 1);
    }

    fn attr_start(&mut self, name: &'static str) {
        self.out.push(' ');
        self.out.push_str(name);
        self.out.push_str("='");
    }

    /// Escaped text content of the current element.
    pub(crate) fn text(&mut self, value: &str) -> Result<(), XmlError> {
        let element = self.element;
        push_text(&mut self.out, value).map_err(|ch| XmlError::InvalidChar {
            element,
            attribute: None,
            ch,
        })
    }

    /// `<name>text</name>`.
    pub(crate) fn text_elem(&mut self, name: &'static str, value: &str) -> Result<(), XmlError> {
        self.open(name);
        self.close_start();
        self.text(value)?;
        self.end(name);
        Ok(())
    }

    /// `<name>number</name>`.
    pub(crate) fn u64_elem(&mut self, name: &'static str, value: u64) {
        self.open(name);
        self.close_start();
        push_u64(&mut self.out, value);
        self.end(name);
    }

    /// Markup known to be well-formed.
    pub(crate) fn raw(&mut self, s: &str) {
        self.out.push_str(s);
    }
}

pub(crate) fn push_u64(out: &mut String, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for &b in &buf[i..] {
        out.push(b as char);
    }
}

/// Escape `s` into `out`. In attribute mode tab, newline and CR become character
/// references. Returns the first character XML cannot carry.
fn escape(out: &mut String, s: &str, attr: bool) -> Result<(), char> {
    let bytes = s.as_bytes();
    let mut last = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let rep = match b {
            b'<' => "&lt;",
            b'>' => "&gt;",
            b'&' => "&amp;",
            b'\'' if attr => "&apos;",
            b'"' if attr => "&quot;",
            b'\r' => "&#13;",
            b'\t' if attr => "&#9;",
            b'\n' if attr => "&#10;",
            b'\t' | b'\n' => continue,
            0..=0x1f => return Err(char::from(b)),
            // NEL (U+0085, C2 85) and LINE SEPARATOR (U+2028, E2 80 A8) are line ends that
            // quick-xml (following XML 1.1) normalises to '\n': keep them as references.
            0xC2 if bytes.get(i + 1) == Some(&0x85) => {
                out.push_str(&s[last..i]);
                out.push_str("&#x85;");
                last = i + 2;
                continue;
            }
            0xE2 if bytes.get(i + 1) == Some(&0x80) && bytes.get(i + 2) == Some(&0xA8) => {
                out.push_str(&s[last..i]);
                out.push_str("&#x2028;");
                last = i + 3;
                continue;
            }
            // U+FFFE and U+FFFF are EF BF BE / EF BF BF in UTF-8.
            0xEF if bytes.get(i + 1) == Some(&0xBF)
                && matches!(bytes.get(i + 2), Some(0xBE | 0xBF)) =>
            {
                return Err(if bytes[i + 2] == 0xBE {
                    '\u{FFFE}'
                } else {
                    '\u{FFFF}'
                });
            }
            _ => continue,
        };
        out.push_str(&s[last..i]);
        out.push_str(rep);
        last = i + 1;
    }
    out.push_str(&s[last..]);
    Ok(())
}

/// Text content: leading and trailing whitespace as character references, the rest escaped.
fn push_text(out: &mut String, s: &str) -> Result<(), char> {
    let is_ws = |c: char| matches!(c, ' ' | '\t' | '\n' | '\r');
    let core = s.trim_matches(is_ws);
    if core.len() == s.len() {
        return escape(out, s, false);
    }
    let lead = &s[..s.len() - s.trim_start_matches(is_ws).len()];
    let tail = if core.is_empty() {
        ""
    } else {
        &s[lead.len() + core.len()..]
    };
    let ws_ref = |out: &mut String, c: char| {
        out.push_str(match c {
            ' ' => "&#32;",
            '\t' => "&#9;",
            '\n' => "&#10;",
            _ => "&#13;",
        })
    };
    lead.chars().for_each(|c| ws_ref(out, c));
    escape(out, core, false)?;
    tail.chars().for_each(|c| ws_ref(out, c));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Result<String, char> {
        let mut out = String::new();
        push_text(&mut out, s).map(|()| out)
    }

    fn attr(s: &str) -> Result<String, char> {
        let mut out = String::new();
        escape(&mut out, s, true).map(|()| out)
    }

    #[test]
    fn escapes_metacharacters() {
        assert_eq!(
            attr("a<b>&'\"é\t\n\r").unwrap(),
            "a&lt;b&gt;&amp;&apos;&quot;é&#9;&#10;&#13;"
        );
        assert_eq!(text("x<y\nz \"q\" 'a'").unwrap(), "x&lt;y\nz \"q\" 'a'");
    }

    #[test]
    fn text_keeps_edge_whitespace_as_references() {
        assert_eq!(text(" a b\t").unwrap(), "&#32;a b&#9;");
        assert_eq!(text("  ").unwrap(), "&#32;&#32;");
        assert_eq!(text("").unwrap(), "");
    }

    #[test]
    fn refuses_what_xml_cannot_carry() {
        assert_eq!(attr("a\u{1}"), Err('\u{1}'));
        assert_eq!(text("a\u{1b}b"), Err('\u{1b}'));
        assert_eq!(text("\u{FFFE}"), Err('\u{FFFE}'));
        assert_eq!(attr("x\u{FFFF}"), Err('\u{FFFF}'));
        assert_eq!(attr("\u{FFFD}").unwrap(), "\u{FFFD}");
        assert_eq!(text("a\u{2028}b\u{85}c").unwrap(), "a&#x2028;b&#x85;c");
        assert_eq!(attr("\u{2029}").unwrap(), "\u{2029}");
    }

    #[test]
    fn numbers_and_addresses() {
        let mut out = String::new();
        for v in [0, 7, 10, 1450, u64::MAX] {
            out.clear();
            push_u64(&mut out, v);
            assert_eq!(out, v.to_string());
        }
        let mut w = Writer::default();
        w.attrs_pci(&"0000:81:1f.7".parse().unwrap());
        w.attr_mac("address", &"FA:16:3E:0A:0B:FF".parse().unwrap());
        assert_eq!(
            w.out,
            " domain='0x0000' bus='0x81' slot='0x1f' function='0x7' address='fa:16:3e:0a:0b:ff'"
        );
    }
}
