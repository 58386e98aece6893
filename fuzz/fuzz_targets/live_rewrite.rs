//! `live::rewrite` on arbitrary documents: never a panic; refusals name their field; and where
//! the document parses as a domain, a successful edit changes exactly what it says: parsing
//! the result gives the original domain with that one change (metadata set or removed, an
//! interface or hostdev added, removed or replaced, a disk pointed at another file), and a
//! selector matching no or several devices is refused; a disk edit on a disk that is not a
//! file is refused as unsupported.
//!
//! Input: one selector byte (the edit, and which of the document's devices it selects), then
//! the document.

#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use serde_json::json;
use vireo_xml::live::{rewrite, Edit, Selector};
use vireo_xml::*;

const HOSTILE: &str = "<a href=\"x\">&amp;'b'</a> ;|$(id)`id`";

fn metadata() -> VireoMetadata {
    VireoMetadata {
        instance_uuid: uuid::Uuid::from_u128(0x6f1c_1b0e_1111_4222_8333_4444_5555_66f1),
        flavor: Flavor {
            name: HOSTILE.to_owned(),
            vcpus: 2,
            memory_mb: 2048,
            root_gb: 20,
            ephemeral_gb: 5,
            swap_mb: 512,
            extra_specs: BTreeMap::from([("hw:<cpu>".to_owned(), HOSTILE.to_owned())]),
        },
        network_info: json!([{"id": "3b2c4d5e-0000-4000-8000-000000000001",
            "address": "fa:16:3e:00:00:01", "type": "ovs",
            "network": {"label": HOSTILE, "bridge": "br-int"}}]),
        operation: Some(InFlightOperation {
            id: "req-<1>".to_owned(),
            kind: "resize".to_owned(),
            phase: "finish&migrate".to_owned(),
            started_at: 1_764_000_000_000,
            data: json!({"old": HOSTILE}),
        }),
        record: Some(json!({"state": "running", "note": HOSTILE})),
    }
}

fn interface() -> Interface {
    Interface {
        mac: Some(MacAddress([0xfa, 0x16, 0x3e, 0x00, 0x00, 0x7f])),
        alias: Some("ua-<x>&'\"".to_owned()),
        mtu: Some(9000),
        ..Interface::new(InterfaceKind::VhostUser {
            path: "/run/vhu/<sock>&'\";|$(x)".to_owned(),
            mode: VhostUserMode::Server,
            target: None,
        })
    }
}

fn hostdev() -> Hostdev {
    Hostdev::pci(PciAddress {
        domain: 0,
        bus: 0x81,
        slot: 0x1f,
        function: 7,
    })
}

/// The edit for `sel`, choosing among the parsed domain's devices when there is one.
fn edit(sel: u8, orig: Option<&Domain>) -> Edit {
    let pick = usize::from(sel / 8);
    let ifaces = orig.map(|d| d.devices.interfaces.as_slice()).unwrap_or(&[]);
    let iface = ifaces.get(pick % ifaces.len().max(1));
    let mac = Selector::Mac(
        iface
            .and_then(|i| i.mac)
            .unwrap_or(MacAddress([0x52, 0x54, 0x00, 0, 0, 1])),
    );
    match sel % 9 {
        8 => {
            let disks = orig.map(|d| d.devices.disks.as_slice()).unwrap_or(&[]);
            Edit::SetDiskFile {
                target: disks
                    .get(pick % disks.len().max(1))
                    .map_or_else(|| "vda".to_owned(), |k| k.target_dev.clone()),
                file: "/var/lib/vireo/instances/x/disk".to_owned(),
            }
        }
        0 => Edit::SetMetadata(metadata()),
        1 => Edit::RemoveMetadata,
        2 => Edit::AddInterface(interface()),
        3 => Edit::RemoveInterface(mac),
        4 => Edit::ReplaceInterface(mac, interface()),
        5 => Edit::AddHostdev(hostdev()),
        6 => {
            let hds = orig.map(|d| d.devices.hostdevs.as_slice()).unwrap_or(&[]);
            let pci = hds
                .get(pick % hds.len().max(1))
                .map_or(hostdev().source, |h| h.source);
            Edit::RemoveHostdev(pci)
        }
        _ => Edit::RemoveInterface(Selector::Alias(
            iface
                .and_then(|i| i.alias.clone())
                .unwrap_or_else(|| "net0".to_owned()),
        )),
    }
}

/// What parsing the rewritten document must give, or `None` when the edit must be refused
/// (its selector matches no device or several).
fn expected(orig: &Domain, edit: &Edit) -> Option<Domain> {
    let mut d = orig.clone();
    let matching = |sel: &Selector| -> Vec<usize> {
        (0..d.devices.interfaces.len())
            .filter(|&i| {
                let f = &orig.devices.interfaces[i];
                match sel {
                    Selector::Mac(m) => f.mac.as_ref() == Some(m),
                    Selector::Alias(a) => f.alias.as_deref() == Some(a.as_str()),
                }
            })
            .collect()
    };
    match edit {
        Edit::SetMetadata(m) => d.metadata = Some(m.clone()),
        Edit::RemoveMetadata => d.metadata = None,
        Edit::AddInterface(i) => d.devices.interfaces.push(i.clone()),
        Edit::AddHostdev(h) => d.devices.hostdevs.push(h.clone()),
        Edit::RemoveInterface(sel) | Edit::ReplaceInterface(sel, _) => {
            let [i] = matching(sel)[..] else {
                return None;
            };
            match edit {
                Edit::ReplaceInterface(_, new) => d.devices.interfaces[i] = new.clone(),
                _ => {
                    d.devices.interfaces.remove(i);
                }
            }
        }
        Edit::SetDiskFile { target, file } => {
            let hits: Vec<usize> = (0..d.devices.disks.len())
                .filter(|&i| d.devices.disks[i].target_dev == *target)
                .collect();
            let [i] = hits[..] else { return None };
            if !matches!(d.devices.disks[i].source, DiskSource::File { .. }) {
                return None;
            }
            d.devices.disks[i].source = DiskSource::File { path: file.clone() };
        }
        Edit::RemoveHostdev(pci) => {
            let hits: Vec<usize> = (0..d.devices.hostdevs.len())
                .filter(|&i| d.devices.hostdevs[i].source == *pci)
                .collect();
            let [i] = hits[..] else { return None };
            d.devices.hostdevs.remove(i);
        }
    }
    Some(d)
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, text)) = vireo_fuzz::selector_and_text(data) else {
        return;
    };
    vireo_fuzz::bounded(data.len(), || {
        let orig = Domain::from_xml(text).ok();
        let edit = edit(sel, orig.as_ref());
        let out = rewrite(text, std::slice::from_ref(&edit));
        if let Err(e) = &out {
            vireo_fuzz::assert_names_its_field(e);
        }
        let Some(orig) = orig else { return };
        match (expected(&orig, &edit), out) {
            (Some(want), Ok(xml)) => {
                let got = Domain::from_xml(&xml)
                    .unwrap_or_else(|e| panic!("rewritten document refused: {e:?}\n{xml}"));
                assert_eq!(got, want, "{edit:?} changed more than it says\n{xml}");
            }
            (None, Ok(xml)) => panic!("{edit:?} matches no single device yet succeeded\n{xml}"),
            (None, Err(XmlError::NotFound { .. } | XmlError::Ambiguous { .. })) => {}
            // A disk that is not a file (a block device, a network disk) has no file to
            // point elsewhere: a typed refusal naming the disk (found by fuzzing).
            (None, Err(XmlError::Unsupported { .. })) if matches!(edit, Edit::SetDiskFile { .. }) => {}
            // The typed parser does not read namespace declarations; the rewrite resolves them
            // (it keeps foreign elements with their namespaces) and refuses a document that
            // binds them invalidly (e.g. `xmlns:xmlns=`), which libvirt never returns: a typed
            // refusal, not a panic (found by fuzzing).
            (_, Err(XmlError::Syntax(quick_xml::Error::Namespace(_)))) => {}
            (want, Err(e)) => panic!(
                "{edit:?} refused on a valid domain: {e:?} (expected {})",
                want.is_some()
            ),
        }
    });
});
