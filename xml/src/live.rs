//! Rewriting libvirt's live (or inactive) domain XML in place.
//!
//! [`rewrite`] applies [`Edit`]s — replace, add or remove an `<interface>` selected by MAC or
//! alias, add or remove a PCI `<hostdev>` selected by its host address, point a `<disk>`
//! selected by its guest device at another file, set or remove vireo's metadata element — at
//! the event level with quick-xml's
//! reader: it finds the byte span of the element to change and splices new text in. Every
//! byte outside the edited spans (controllers, graphics, unknown elements and attributes,
//! other applications' metadata, comments, whitespace) is kept exactly as it was.

use std::fmt;
use std::ops::Range;

use quick_xml::events::Event;
use quick_xml::name::ResolveResult;
use quick_xml::NsReader;

use crate::devices::Hostdev;
use crate::error::XmlError;
use crate::interface::Interface;
use crate::metadata::{VireoMetadata, ELEMENT, NAMESPACE_URI};
use crate::types::{MacAddress, PciAddress};
use crate::write::Writer;

/// Which interface an edit is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// The interface with this `<mac address=>`.
    Mac(MacAddress),
    /// The interface with this `<alias name=>` (`net0`, `ua-...`).
    Alias(String),
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::Mac(m) => write!(f, "mac {m}"),
            Selector::Alias(a) => write!(f, "alias {a:?}"),
        }
    }
}

/// One change to a document.
#[derive(Debug, Clone, PartialEq)]
pub enum Edit {
    /// Replace the one interface matching the selector.
    ReplaceInterface(Selector, Interface),
    /// Remove the one interface matching the selector.
    RemoveInterface(Selector),
    /// Add an interface after the last one (or at the end of `<devices>`).
    AddInterface(Interface),
    /// Add a PCI hostdev after the last hostdev (or the last interface, or at the end of
    /// `<devices>`).
    AddHostdev(Hostdev),
    /// Remove the one PCI hostdev with this host address.
    RemoveHostdev(PciAddress),
    /// Set vireo's metadata element (replacing the old one, other metadata untouched).
    SetMetadata(VireoMetadata),
    /// Remove vireo's metadata element if present.
    RemoveMetadata,
    /// Point the file-backed `<disk>` whose `<target dev=>` is `target` at `file`: its
    /// `<source>` becomes `<source file='…'/>` and the `<backingStore>` chain libvirt
    /// reported for the old file goes (whoever opens the new file reads its chain from the
    /// file). A live migration's destination XML, where the destination keeps the disks at
    /// paths of its own.
    SetDiskFile {
        /// The guest device (`vda`).
        target: String,
        /// The file on the host.
        file: String,
    },
}

/// Apply `edits` in order to a domain document.
pub fn rewrite(xml: &str, edits: &[Edit]) -> Result<String, XmlError> {
    let mut doc = xml.to_owned();
    for edit in edits {
        doc = apply(&doc, edit)?;
    }
    Ok(doc)
}

fn apply(xml: &str, edit: &Edit) -> Result<String, XmlError> {
    let scan = scan(xml, true)?;
    let (range, text) = match edit {
        Edit::ReplaceInterface(sel, iface) => (find_interface(xml, &scan, sel)?, iface.to_xml()?),
        Edit::RemoveInterface(sel) => (find_interface(xml, &scan, sel)?, String::new()),
        Edit::AddInterface(iface) => add_device(&scan, scan.interfaces.last(), iface.to_xml()?)?,
        Edit::AddHostdev(hostdev) => add_device(
            &scan,
            scan.hostdevs.last().or(scan.interfaces.last()),
            hostdev.to_xml()?,
        )?,
        Edit::RemoveHostdev(pci) => (find_hostdev(xml, &scan, pci)?, String::new()),
        Edit::SetMetadata(meta) => {
            let mut w = Writer::with_capacity(1024);
            meta.write(&mut w, true)?;
            let new = w.out;
            match (&scan.metadata, &scan.ours) {
                (_, Some(ours)) => (ours.clone(), new),
                (Some(m), None) => match m.end_tag_start {
                    Some(end) => (end..end, new),
                    None => (m.whole.clone(), format!("<metadata>{new}</metadata>")),
                },
                (None, None) => {
                    let at = scan
                        .after_identity
                        .ok_or_else(|| XmlError::missing("domain/name"))?;
                    (at..at, format!("<metadata>{new}</metadata>"))
                }
            }
        }
        Edit::SetDiskFile { target, file } => {
            let span = find_disk(xml, &scan, target)?;
            let new = disk_with_file(&xml[span.clone()], target, file)?;
            (span, new)
        }
        Edit::RemoveMetadata => match &scan.ours {
            Some(ours) => (ours.clone(), String::new()),
            None => return Ok(xml.to_owned()),
        },
    };
    let mut out = String::with_capacity(xml.len() + text.len());
    out.push_str(&xml[..range.start]);
    out.push_str(&text);
    out.push_str(&xml[range.end..]);
    Ok(out)
}

/// Where a new device goes and the text to put there: after `after` (the last device of its
/// kind, or of the kind it follows), else at the end of `<devices>`, else in a new
/// `<devices>` at the end of `<domain>`, where vireo's own writer puts it (the typed model
/// reads a domain without `<devices>` as one without devices; libvirt always writes it).
fn add_device(
    scan: &Scan,
    after: Option<&Range<usize>>,
    new: String,
) -> Result<(Range<usize>, String), XmlError> {
    Ok(match (after, &scan.devices, scan.root_end_tag_start) {
        (Some(last), _, _) => (last.end..last.end, new),
        (None, Some(devices), _) => match devices.end_tag_start {
            Some(end) => (end..end, new),
            None => (devices.whole.clone(), format!("<devices>{new}</devices>")),
        },
        (None, None, Some(end)) => (end..end, format!("<devices>{new}</devices>")),
        (None, None, None) => return Err(XmlError::missing("domain/devices")),
    })
}

fn find_interface(xml: &str, scan: &Scan, sel: &Selector) -> Result<Range<usize>, XmlError> {
    let mut found: Option<Range<usize>> = None;
    for span in &scan.interfaces {
        let (mac, alias) = Interface::peek(&xml[span.clone()])?;
        let hit = match sel {
            Selector::Mac(m) => mac.as_ref() == Some(m),
            Selector::Alias(a) => alias.as_deref() == Some(a.as_str()),
        };
        if hit {
            if found.is_some() {
                return Err(XmlError::Ambiguous {
                    what: "interface",
                    selector: sel.to_string(),
                });
            }
            found = Some(span.clone());
        }
    }
    found.ok_or_else(|| XmlError::NotFound {
        what: "interface",
        selector: sel.to_string(),
    })
}

fn find_hostdev(xml: &str, scan: &Scan, pci: &PciAddress) -> Result<Range<usize>, XmlError> {
    let mut found: Option<Range<usize>> = None;
    for span in &scan.hostdevs {
        if Hostdev::peek_source(&xml[span.clone()])? == Some(*pci) {
            if found.is_some() {
                return Err(XmlError::Ambiguous {
                    what: "hostdev",
                    selector: pci.to_string(),
                });
            }
            found = Some(span.clone());
        }
    }
    found.ok_or_else(|| XmlError::NotFound {
        what: "hostdev",
        selector: pci.to_string(),
    })
}

fn find_disk(xml: &str, scan: &Scan, target: &str) -> Result<Range<usize>, XmlError> {
    let mut found: Option<Range<usize>> = None;
    for span in &scan.disks {
        if disk_target(&xml[span.clone()])?.as_deref() == Some(target) {
            if found.is_some() {
                return Err(XmlError::Ambiguous {
                    what: "disk",
                    selector: target.to_owned(),
                });
            }
            found = Some(span.clone());
        }
    }
    found.ok_or_else(|| XmlError::NotFound {
        what: "disk",
        selector: target.to_owned(),
    })
}

/// An element's start tag and its direct children: (local name, span).
type Children<'a> = (
    quick_xml::events::BytesStart<'a>,
    Vec<(Vec<u8>, Range<usize>)>,
);

/// The direct children of the element `text` is, with the root's start tag.
fn children(text: &str) -> Result<Children<'_>, XmlError> {
    let mut r = NsReader::from_str(text);
    let root = loop {
        match r.read_event()? {
            Event::Start(e) => break e,
            Event::Eof => return Err(XmlError::missing("devices/disk")),
            _ => {}
        }
    };
    let mut out = Vec::new();
    loop {
        let start = pos(&r);
        match r.read_event()? {
            Event::Start(e) => {
                let name = e.local_name().as_ref().to_vec();
                r.read_to_end(e.name())?;
                out.push((name, start..pos(&r)));
            }
            Event::Empty(e) => out.push((e.local_name().as_ref().to_vec(), start..pos(&r))),
            Event::End(_) | Event::Eof => return Ok((root, out)),
            _ => {}
        }
    }
}

fn attribute(
    e: &quick_xml::events::BytesStart<'_>,
    name: &[u8],
) -> Result<Option<String>, XmlError> {
    for a in e.attributes() {
        let a = a.map_err(|e| XmlError::Syntax(e.into()))?;
        if a.key.local_name().as_ref() == name {
            return Ok(Some(a.unescape_value()?.into_owned()));
        }
    }
    Ok(None)
}

/// The `<target dev=>` of a `<disk>` element.
fn disk_target(disk: &str) -> Result<Option<String>, XmlError> {
    let (_, kids) = children(disk)?;
    for (name, span) in kids {
        if name == b"target" {
            let mut r = NsReader::from_str(&disk[span]);
            loop {
                match r.read_event()? {
                    Event::Start(e) | Event::Empty(e) => return attribute(&e, b"dev"),
                    Event::Eof => return Ok(None),
                    _ => {}
                }
            }
        }
    }
    Ok(None)
}

/// `disk` with its `<source>` replaced by one naming `file` and its `<backingStore>` gone.
fn disk_with_file(disk: &str, target: &str, file: &str) -> Result<String, XmlError> {
    let (root, kids) = children(disk)?;
    let kind = attribute(&root, b"type")?;
    if kind.as_deref() != Some("file") {
        return Err(XmlError::unsupported(
            format!("devices/disk[{target}]/@type"),
            kind.as_deref().unwrap_or_default(),
        ));
    }
    let mut w = Writer::with_capacity(file.len() + 24);
    w.open("source");
    w.attr("file", file)?;
    w.close_empty();
    let source = w.out;
    let mut out = String::with_capacity(disk.len() + source.len());
    let mut at = 0;
    let mut replaced = false;
    for (name, span) in kids {
        let text = match name.as_slice() {
            b"source" if !replaced => {
                replaced = true;
                source.as_str()
            }
            b"backingStore" => "",
            _ => continue,
        };
        out.push_str(&disk[at..span.start]);
        out.push_str(text);
        at = span.end;
    }
    if !replaced {
        return Err(XmlError::missing("devices/disk/source"));
    }
    out.push_str(&disk[at..]);
    Ok(out)
}

/// The span of vireo's metadata element in a domain document, if it has one.
pub(crate) fn find_metadata(xml: &str) -> Result<Option<Range<usize>>, XmlError> {
    Ok(scan(xml, false)?.ours)
}

#[derive(Debug)]
struct Container {
    /// The whole element, start tag to end tag.
    whole: Range<usize>,
    /// Where its end tag starts (`None` for an empty element `<x/>`).
    end_tag_start: Option<usize>,
}

#[derive(Debug, Default)]
struct Scan {
    /// Just after `</name>` or `</uuid>`, whichever comes last: where a missing
    /// `<metadata>` goes.
    after_identity: Option<usize>,
    metadata: Option<Container>,
    /// vireo's element inside `<metadata>`.
    ours: Option<Range<usize>>,
    devices: Option<Container>,
    /// Every `<interface>` directly in `<devices>`.
    interfaces: Vec<Range<usize>>,
    /// Every `<hostdev>` directly in `<devices>`.
    hostdevs: Vec<Range<usize>>,
    /// Every `<disk>` directly in `<devices>`.
    disks: Vec<Range<usize>>,
    /// Where `</domain>` starts (when the walk got that far): where a missing `<devices>`
    /// goes.
    root_end_tag_start: Option<usize>,
}

fn pos(r: &NsReader<&[u8]>) -> usize {
    r.buffer_position() as usize
}

/// Walk the top level of a domain document, descending only into `<metadata>` and (when
/// `devices` is set) `<devices>`.
fn scan(xml: &str, devices: bool) -> Result<Scan, XmlError> {
    let mut r = NsReader::from_str(xml);
    let mut s = Scan::default();
    // The root.
    loop {
        match r.read_event()? {
            Event::Start(e) if e.local_name().as_ref() == b"domain" => break,
            Event::Start(e) | Event::Empty(e) => {
                return Err(XmlError::WrongRoot {
                    expected: "domain",
                    found: String::from_utf8_lossy(e.name().as_ref()).into_owned(),
                });
            }
            Event::Eof => {
                return Err(XmlError::WrongRoot {
                    expected: "domain",
                    found: String::new(),
                })
            }
            _ => {}
        }
    }
    loop {
        let start = pos(&r);
        match r.read_event()? {
            Event::Start(e) => {
                let local = e.local_name();
                match local.as_ref() {
                    b"metadata" => {
                        let end_tag_start = scan_metadata(&mut r, &mut s)?;
                        s.metadata = Some(Container {
                            whole: start..pos(&r),
                            end_tag_start: Some(end_tag_start),
                        });
                        if !devices {
                            return Ok(s);
                        }
                    }
                    b"devices" if devices => {
                        let end_tag_start = scan_devices(&mut r, &mut s)?;
                        s.devices = Some(Container {
                            whole: start..pos(&r),
                            end_tag_start: Some(end_tag_start),
                        });
                    }
                    b"name" | b"uuid" => {
                        r.read_to_end(e.name())?;
                        s.after_identity = Some(pos(&r));
                    }
                    _ => {
                        r.read_to_end(e.name())?;
                    }
                }
            }
            Event::Empty(e) => match e.local_name().as_ref() {
                b"metadata" => {
                    s.metadata = Some(Container {
                        whole: start..pos(&r),
                        end_tag_start: None,
                    })
                }
                b"devices" => {
                    s.devices = Some(Container {
                        whole: start..pos(&r),
                        end_tag_start: None,
                    })
                }
                _ => {}
            },
            Event::End(_) => {
                s.root_end_tag_start = Some(start);
                return Ok(s);
            }
            Event::Eof => return Ok(s),
            _ => {}
        }
    }
}

/// Inside `<metadata>`: find vireo's element. Returns where `</metadata>` starts.
fn scan_metadata(r: &mut NsReader<&[u8]>, s: &mut Scan) -> Result<usize, XmlError> {
    loop {
        let start = pos(r);
        let ev = r.read_event()?;
        match ev {
            Event::Start(ref e) | Event::Empty(ref e) => {
                let is_start = matches!(ev, Event::Start(_));
                let (ns, local) = r.resolve_element(e.name());
                let ours = matches!(ns, ResolveResult::Bound(n) if n.as_ref() == NAMESPACE_URI.as_bytes())
                    && local.as_ref() == ELEMENT.as_bytes();
                if is_start {
                    r.read_to_end(e.name())?;
                }
                if ours && s.ours.is_none() {
                    s.ours = Some(start..pos(r));
                }
            }
            Event::End(_) => return Ok(start),
            Event::Eof => return Err(XmlError::missing("domain/metadata end tag")),
            _ => {}
        }
    }
}

/// Inside `<devices>`: record every `<interface>`, `<hostdev>` and `<disk>`. Returns where
/// `</devices>` starts.
fn scan_devices(r: &mut NsReader<&[u8]>, s: &mut Scan) -> Result<usize, XmlError> {
    loop {
        let start = pos(r);
        let ev = r.read_event()?;
        match ev {
            Event::Start(ref e) => {
                let local = e.local_name();
                let list = match local.as_ref() {
                    b"interface" => Some(&mut s.interfaces),
                    b"hostdev" => Some(&mut s.hostdevs),
                    b"disk" => Some(&mut s.disks),
                    _ => None,
                };
                r.read_to_end(e.name())?;
                if let Some(list) = list {
                    list.push(start..pos(r));
                }
            }
            Event::Empty(ref e) if e.local_name().as_ref() == b"interface" => {
                s.interfaces.push(start..pos(r));
            }
            Event::End(_) => return Ok(start),
            Event::Eof => return Err(XmlError::missing("domain/devices end tag")),
            _ => {}
        }
    }
}
