//! Live XML captured from `qemu:///system` (see `fixtures/capture.sh`): parsing what libvirt
//! assigned, and rewriting a live document while keeping everything vireo does not model.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use vireo_xml::live::{rewrite, Edit, Selector};
use vireo_xml::*;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(fixtures_dir().join(name)).unwrap()
}

const LIVE: [&str; 2] = ["live-kvm-q35.xml", "live-qemu-q35.xml"];
const ALL: [&str; 4] = [
    "live-kvm-q35.xml",
    "live-qemu-q35.xml",
    "inactive-kvm-q35.xml",
    "inactive-qemu-q35.xml",
];

#[test]
fn live_xml_gives_what_libvirt_assigned() {
    for f in LIVE {
        let xml = fixture(f);
        let d = Domain::from_xml(&xml).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(d.id.is_some(), "{f}: a running domain has an id");
        assert_eq!(d.name.as_str(), "vxfix-dom");
        assert_eq!(d.os.machine.as_deref(), Some("pc-q35-10.0"), "{f}");
        assert_eq!(
            d.devices.emulator.as_deref(),
            Some("/usr/bin/qemu-system-x86_64")
        );
        let ifs = &d.devices.interfaces;
        assert_eq!(ifs.len(), 3, "{f}");

        // OVS: libvirt chose a vnetN tap and kept our port id.
        let InterfaceKind::Bridge {
            bridge,
            virtualport: Some(vp),
            target: Some(tap),
        } = &ifs[0].kind
        else {
            panic!("{f}: {:?}", ifs[0]);
        };
        assert_eq!(bridge.as_str(), "vxfix0");
        assert_eq!(
            vp.interface_id.to_string(),
            "3b2c4d5e-0000-4000-8000-0000000000f1"
        );
        assert!(tap.as_str().starts_with("vnet"), "{f}: {tap}");
        assert_eq!(ifs[0].alias.as_deref(), Some("net0"));
        assert_eq!(ifs[0].mtu, Some(1450));
        assert_eq!(
            ifs[0].address,
            Some(DeviceAddress::Pci("0000:01:00.0".parse().unwrap()))
        );
        // The OVS port libvirt created carries the same names (recorded at capture time).
        let ovs = fixture(&f.replace(".xml", ".ovs.txt"));
        assert!(
            ovs.contains(&format!("name                : {tap}")),
            "{ovs}"
        );
        assert!(
            ovs.contains(&format!("iface-id=\"{}\"", vp.interface_id)),
            "{ovs}"
        );

        // Linux bridge with the tap name we asked for.
        assert!(
            matches!(&ifs[1].kind, InterfaceKind::Bridge { bridge, virtualport: None, target: Some(t) }
            if bridge.as_str() == "vxfixlb0" && t.as_str() == "vxfixlbtap0")
        );
        assert_eq!(ifs[1].alias.as_deref(), Some("net1"));

        // Pre-created tap, not managed by libvirt.
        assert_eq!(
            ifs[2].kind,
            InterfaceKind::Ethernet {
                target: Some(EthernetTarget {
                    dev: dev("vxfixtap0"),
                    managed: Some(false)
                })
            }
        );
        assert_eq!(d.interface_by_mac(&mac(0xf3)), Some(&ifs[2]));

        // Serial console on a pty libvirt allocated.
        let CharSource::Pty { path: Some(pty) } = &d.devices.serials[0].source else {
            panic!("{f}: {:?}", d.devices.serials);
        };
        assert!(pty.starts_with("/dev/pts/"));
        assert_eq!(d.devices.consoles[0].target, Some(ConsoleTarget::Serial));
        assert_eq!(d.devices.consoles[0].alias.as_deref(), Some("serial0"));
    }
}

#[test]
fn vireo_metadata_is_read_and_other_metadata_ignored() {
    for f in ALL {
        let d = Domain::from_xml(&fixture(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        let m = d
            .metadata
            .unwrap_or_else(|| panic!("{f}: no vireo metadata"));
        // The Nova element also has a <flavor name=...>; ours must win by namespace.
        assert_eq!(m.flavor.name, "fixture <tiny> & 'co'", "{f}");
        assert_eq!(m.network_info[0]["network"]["label"], "a<b>&c");
        assert_eq!(Some(m.instance_uuid), d.uuid);
    }
}

#[test]
fn typed_round_trip_of_parsed_live_xml_is_stable() {
    for f in ALL {
        let d = Domain::from_xml(&fixture(f)).unwrap();
        let again = Domain::from_xml(&d.to_xml().unwrap()).unwrap();
        assert_eq!(again, d, "{f}");
    }
}

/// `out` equals `orig` with exactly `orig[start..end]` replaced by something else.
fn only_changed(orig: &str, out: &str, start: usize, end: usize) {
    assert_eq!(&out[..start], &orig[..start]);
    let tail = &orig[end..];
    assert!(out.ends_with(tail), "bytes after the edited span changed");
}

fn span_of(xml: &str, mac: &str) -> (usize, usize) {
    let start = xml.find(&format!("<mac address='{mac}'/>")).unwrap();
    let start = xml[..start].rfind("<interface").unwrap();
    let end = start + xml[start..].find("</interface>").unwrap() + "</interface>".len();
    (start, end)
}

#[test]
fn replace_interface_by_alias_keeps_every_other_byte() {
    for f in ALL {
        let orig = fixture(f);
        let d = Domain::from_xml(&orig).unwrap();
        let mut new = d.devices.interfaces[1].clone();
        new.mtu = Some(9000);
        new.kind = InterfaceKind::Bridge {
            bridge: dev("vxfixlb9"),
            virtualport: None,
            target: Some(dev("vxfixlbtap9")),
        };
        let sel = if f.starts_with("live") {
            Selector::Alias("net1".into())
        } else {
            Selector::Mac(mac(0xf2))
        };
        let out = rewrite(&orig, &[Edit::ReplaceInterface(sel, new.clone())]).unwrap();
        let (start, end) = span_of(&orig, "fa:16:3e:00:00:f2");
        only_changed(&orig, &out, start, end);
        let parsed = Domain::from_xml(&out).unwrap();
        assert_eq!(parsed.devices.interfaces[1], new);
        assert_eq!(parsed.devices.interfaces[0], d.devices.interfaces[0]);
        assert_eq!(parsed.devices.interfaces[2], d.devices.interfaces[2]);
        virt_xml_validate(&out).unwrap();
    }
}

#[test]
fn remove_and_add_interfaces() {
    let orig = fixture("live-kvm-q35.xml");
    let out = rewrite(&orig, &[Edit::RemoveInterface(Selector::Mac(mac(0xf1)))]).unwrap();
    let (start, end) = span_of(&orig, "fa:16:3e:00:00:f1");
    assert_eq!(out, format!("{}{}", &orig[..start], &orig[end..]));
    let d = Domain::from_xml(&out).unwrap();
    assert_eq!(d.devices.interfaces.len(), 2);
    assert!(d.interface_by_mac(&mac(0xf1)).is_none());

    let (_, added) = every_interface().swap_remove(0);
    let out = rewrite(&out, &[Edit::AddInterface(added.clone())]).unwrap();
    let d = Domain::from_xml(&out).unwrap();
    assert_eq!(d.devices.interfaces.len(), 3);
    assert_eq!(
        d.devices.interfaces[2], added,
        "added after the last interface"
    );
    assert!(out.contains("<controller type='usb' index='0' model='qemu-xhci'>"));
    assert!(out.contains("<memballoon model='virtio'>"));
    virt_xml_validate(&out).unwrap();
}

#[test]
fn add_interface_to_a_domain_without_any() {
    let d = Domain::new(DomainName::new("vx-empty").unwrap());
    let xml = d
        .to_xml()
        .unwrap()
        .replace("<devices></devices>", "<devices/>");
    let (_, iface) = every_interface().swap_remove(3);
    let out = rewrite(&xml, &[Edit::AddInterface(iface.clone())]).unwrap();
    assert_eq!(
        Domain::from_xml(&out).unwrap().devices.interfaces,
        vec![iface]
    );
}

// Found by the `live_rewrite` fuzz target: the typed model reads a domain without
// `<devices>` as one without devices, but adding a device to it was refused. The new
// `<devices>` goes at the end of `<domain>`, where vireo's writer puts it, and libvirt takes it.
#[test]
fn add_devices_to_a_domain_without_devices() {
    let conn = TestConn::open();
    let xml = "<domain type='kvm'><name>vx-nodev</name><memory>262144</memory>\
               <os><type>hvm</type></os></domain>";
    assert!(Domain::from_xml(xml).unwrap().devices.interfaces.is_empty());
    let (_, iface) = every_interface().swap_remove(3);
    let out = rewrite(xml, &[Edit::AddInterface(iface.clone())]).unwrap();
    assert!(out.starts_with(xml.trim_end_matches("</domain>")), "{out}");
    assert!(out.ends_with("</devices></domain>"), "{out}");
    assert_eq!(
        Domain::from_xml(&out).unwrap().devices.interfaces,
        vec![iface]
    );
    let pf: PciAddress = "0000:82:00.0".parse().unwrap();
    let out = rewrite(xml, &[Edit::AddHostdev(Hostdev::pci(pf))]).unwrap();
    let d = Domain::from_xml(&conn.define_validated(&out).unwrap()).unwrap();
    let sources: Vec<_> = d.devices.hostdevs.iter().map(|h| h.source).collect();
    assert_eq!(sources, vec![pf]);
    // A document cut before `</domain>` still has nowhere to put them.
    let cut = xml.trim_end_matches("</domain>");
    assert!(matches!(
        rewrite(cut, &[Edit::AddHostdev(Hostdev::pci(pf))]),
        Err(XmlError::Missing { .. })
    ));
}

#[test]
fn selectors_that_match_nothing_or_twice_are_errors() {
    let orig = fixture("live-kvm-q35.xml");
    let err = rewrite(
        &orig,
        &[Edit::RemoveInterface(Selector::Alias("net9".into()))],
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            XmlError::NotFound {
                what: "interface",
                ..
            }
        ),
        "{err}"
    );

    // Give two interfaces the same MAC (libvirt allows it); selecting it is ambiguous.
    let twice = orig.replace("fa:16:3e:00:00:f2", "fa:16:3e:00:00:f1");
    let err = rewrite(&twice, &[Edit::RemoveInterface(Selector::Mac(mac(0xf1)))]).unwrap_err();
    assert!(matches!(err, XmlError::Ambiguous { .. }), "{err}");
    // Nothing was half-applied: rewrite returns a new string or an error.
}

#[test]
fn set_metadata_replaces_only_vireos_element() {
    for f in ALL {
        let orig = fixture(f);
        let mut meta = Domain::from_xml(&orig).unwrap().metadata.unwrap();
        meta.operation = Some(InFlightOperation {
            id: "req-1".into(),
            kind: "resize_revert".into(),
            phase: "binding".into(),
            started_at: 1,
            data: serde_json::json!({"source": "host-a"}),
        });
        let out = rewrite(&orig, &[Edit::SetMetadata(meta.clone())]).unwrap();
        let start = orig.find("<vireo:instance").unwrap();
        let end = orig.find("</vireo:instance>").unwrap() + "</vireo:instance>".len();
        only_changed(&orig, &out, start, end);
        assert!(out.contains("<nova:name>other &amp; app</nova:name>"));
        assert_eq!(Domain::from_xml(&out).unwrap().metadata, Some(meta));

        let removed = rewrite(&out, &[Edit::RemoveMetadata]).unwrap();
        assert_eq!(Domain::from_xml(&removed).unwrap().metadata, None);
        assert!(removed.contains("<nova:instance"));
        virt_xml_validate(&removed).unwrap();
    }
}

#[test]
fn set_metadata_where_there_is_none() {
    let d = Domain::new(DomainName::new("vx-nometa").unwrap());
    let xml = d.to_xml().unwrap();
    let out = rewrite(&xml, &[Edit::SetMetadata(metadata())]).unwrap();
    assert_eq!(Domain::from_xml(&out).unwrap().metadata, Some(metadata()));
    virt_xml_validate(&out).unwrap();
    // An empty <metadata/> is filled in.
    let empty = xml.replace("</name>", "</name><metadata/>");
    let out = rewrite(&empty, &[Edit::SetMetadata(metadata())]).unwrap();
    assert_eq!(Domain::from_xml(&out).unwrap().metadata, Some(metadata()));
}

#[test]
fn rewritten_inactive_xml_is_accepted_by_libvirt() {
    let conn = TestConn::open();
    let orig = fixture("inactive-kvm-q35.xml");
    let (_, vf) = every_interface().swap_remove(4);
    let out = rewrite(
        &orig,
        &[
            Edit::RemoveInterface(Selector::Mac(mac(0xf3))),
            Edit::AddInterface(vf.clone()),
            Edit::SetMetadata(metadata()),
        ],
    )
    .unwrap();
    let back = conn.define_validated(&out).unwrap();
    let d = Domain::from_xml(&back).unwrap();
    assert_eq!(d.metadata, Some(metadata()));
    let mut got = d.interface_by_mac(&mac(5)).unwrap().clone();
    strip_assigned(&mut got, &vf);
    assert_eq!(got, vf);
}

#[test]
fn interleaved_device_kinds_and_unknown_elements_parse() {
    // libvirt groups devices by kind, but a hand-written document need not.
    let xml = "<domain type='kvm' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>\
        <name>vx-mixed</name><unknown-top a='1'><deep/></unknown-top>\
        <memory unit='MiB'>256</memory><os><type>hvm</type></os><devices>\
        <interface type='ethernet'><mac address='fa:16:3e:00:00:01'/><future-option x='y'/></interface>\
        <serial type='pty'><target port='0'/></serial>\
        <interface type='bridge' extra='attr'><mac address='fa:16:3e:00:00:02'/><source bridge='br0'/></interface>\
        <video><model type='vga'/></video>\
        <interface type='ethernet'><mac address='fa:16:3e:00:00:03'/></interface>\
        </devices><qemu:commandline><qemu:arg value='-S'/></qemu:commandline></domain>";
    let d = Domain::from_xml(xml).unwrap();
    assert_eq!(d.memory_kib, 256 * 1024);
    let macs: Vec<_> = d
        .devices
        .interfaces
        .iter()
        .map(|i| i.mac.unwrap())
        .collect();
    assert_eq!(macs, vec![mac(1), mac(2), mac(3)]);
    assert_eq!(d.devices.serials.len(), 1);
    // And a rewrite keeps the unknown parts.
    let out = rewrite(xml, &[Edit::RemoveInterface(Selector::Mac(mac(2)))]).unwrap();
    assert!(out.contains("<video><model type='vga'/></video>"));
    assert!(out.contains("<qemu:commandline><qemu:arg value='-S'/></qemu:commandline>"));
    assert!(out.contains("<future-option x='y'/>"));
    assert_eq!(Domain::from_xml(&out).unwrap().devices.interfaces.len(), 2);
}

#[test]
fn metadata_namespace_declared_on_an_ancestor() {
    let ns = vireo_xml::metadata::NAMESPACE_URI;
    let inner = metadata().to_xml().unwrap();
    // Prefix every element of the unprefixed fragment and declare the prefix on <domain>.
    let prefixed = inner
        .replace("</", "</v:")
        .replace('<', "<v:")
        .replace("<v:/v:", "</v:");
    let xml = format!(
        "<domain type='kvm' xmlns:v='{ns}'><name>x</name><metadata>{prefixed}\
         <v:instance-not-ours/></metadata><memory>1</memory><os><type>hvm</type></os></domain>"
    );
    assert_eq!(Domain::from_xml(&xml).unwrap().metadata, Some(metadata()));
    // The same element in another namespace is not vireo's.
    let other = xml.replace(ns, "http://example.invalid/other");
    assert_eq!(Domain::from_xml(&other).unwrap().metadata, None);
}

#[test]
fn add_and_remove_pci_hostdevs() {
    let conn = TestConn::open();
    let orig = fixture("inactive-kvm-q35.xml");
    let pf: PciAddress = "0000:82:00.0".parse().unwrap();
    let vf: PciAddress = "0000:82:10.1".parse().unwrap();
    let out = rewrite(
        &orig,
        &[
            Edit::AddHostdev(Hostdev::pci(pf)),
            Edit::AddHostdev(Hostdev::pci(vf)),
        ],
    )
    .unwrap();
    let d = Domain::from_xml(&conn.define_validated(&out).unwrap()).unwrap();
    let sources: Vec<_> = d.devices.hostdevs.iter().map(|h| h.source).collect();
    assert_eq!(sources, vec![pf, vf]);

    let out = rewrite(&out, &[Edit::RemoveHostdev(pf)]).unwrap();
    let d = Domain::from_xml(&out).unwrap();
    assert_eq!(d.devices.hostdevs, vec![Hostdev::pci(vf)]);
    let err = rewrite(&out, &[Edit::RemoveHostdev(pf)]).unwrap_err();
    assert!(
        matches!(
            err,
            XmlError::NotFound {
                what: "hostdev",
                ..
            }
        ),
        "{err}"
    );
    // Everything else is untouched.
    let back = rewrite(&out, &[Edit::RemoveHostdev(vf)]).unwrap();
    assert_eq!(back, orig);
}

/// A live domain with two disks as libvirt 9 reports them: a qcow2 overlay with its backing
/// chain and a read-only config-drive CD-ROM.
const LIVE_DISKS: &str = "<domain type='kvm' id='3'><name>vx-disks</name>\
    <uuid>2f1e4d3c-5b6a-4789-8abc-def012345678</uuid>\
    <memory unit='KiB'>131072</memory><os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type></os>\
    <devices>\
    <disk type='file' device='disk'>\
      <driver name='qemu' type='qcow2' cache='none'/>\
      <source file='/var/lib/vireo-a/instances/u/disk' index='2'/>\
      <backingStore type='file' index='3'><format type='raw'/>\
        <source file='/var/lib/vireo-a/_base/img'/><backingStore/></backingStore>\
      <target dev='vda' bus='virtio'/><alias name='virtio-disk0'/>\
      <address type='pci' domain='0x0000' bus='0x04' slot='0x00' function='0x0'/>\
    </disk>\
    <disk type='file' device='cdrom'>\
      <driver name='qemu' type='raw'/>\
      <source file='/var/lib/vireo-a/instances/u/disk.config' index='1'/>\
      <backingStore/><target dev='sda' bus='sata'/><readonly/><alias name='sata0-0-0'/>\
      <address type='drive' controller='0' bus='0' target='0' unit='0'/>\
    </disk>\
    <disk type='block' device='disk'><source dev='/dev/sdz'/><target dev='vdz' bus='virtio'/></disk>\
    </devices></domain>";

#[test]
fn set_disk_file_points_one_disk_elsewhere_and_drops_its_backing_chain() {
    let out = rewrite(
        LIVE_DISKS,
        &[
            Edit::SetDiskFile {
                target: "vda".into(),
                file: "/srv/b/instances/u/disk".into(),
            },
            Edit::SetDiskFile {
                target: "sda".into(),
                file: "/srv/b/instances/u/it's.config".into(),
            },
        ],
    )
    .unwrap();
    let d = Domain::from_xml(&out).unwrap();
    let files: Vec<_> = d
        .devices
        .disks
        .iter()
        .map(|k| match &k.source {
            DiskSource::File { path } => path.clone(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(files[0], "/srv/b/instances/u/disk");
    assert_eq!(files[1], "/srv/b/instances/u/it's.config");
    // The old chain is gone (whoever opens the new file reads it from the file), the rest of
    // each disk stays byte for byte.
    assert!(!out.contains("_base"), "{out}");
    assert!(!out.contains("backingStore"), "{out}");
    assert!(!out.contains("/var/lib/vireo-a"), "{out}");
    for kept in [
        "<driver name='qemu' type='qcow2' cache='none'/>",
        "<target dev='vda' bus='virtio'/><alias name='virtio-disk0'/>",
        "<readonly/><alias name='sata0-0-0'/>",
        "<disk type='block' device='disk'><source dev='/dev/sdz'/>",
    ] {
        assert!(out.contains(kept), "{kept} lost: {out}");
    }
    virt_xml_validate(&out).unwrap();
}

#[test]
fn set_disk_file_refuses_a_missing_target_and_a_disk_that_is_not_a_file() {
    let missing = rewrite(
        LIVE_DISKS,
        &[Edit::SetDiskFile {
            target: "vdq".into(),
            file: "/x".into(),
        }],
    )
    .unwrap_err();
    assert!(
        matches!(missing, XmlError::NotFound { what: "disk", .. }),
        "{missing}"
    );
    let block = rewrite(
        LIVE_DISKS,
        &[Edit::SetDiskFile {
            target: "vdz".into(),
            file: "/x".into(),
        }],
    )
    .unwrap_err();
    assert!(matches!(block, XmlError::Unsupported { .. }), "{block}");
}
