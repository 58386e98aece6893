//! Bad input is a typed error naming where it is, never a panic.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use vireo_xml::types::ValueError;
use vireo_xml::*;

#[test]
fn characters_xml_cannot_carry_are_refused_on_write() {
    let mut d = Domain::new(DomainName::new("ok").unwrap());
    d.os.cmdline = Some("console=ttyS0\u{1b}[0m".into());
    let err = d.to_xml().unwrap_err();
    assert!(
        matches!(
            err,
            XmlError::InvalidChar {
                element: "cmdline",
                attribute: None,
                ch: '\u{1b}'
            }
        ),
        "{err}"
    );

    let (_, mut i) = every_interface().swap_remove(6);
    i.kind = InterfaceKind::VhostUser {
        path: "/run/x\u{0}".into(),
        mode: VhostUserMode::Client,
        target: None,
    };
    let err = i.to_xml().unwrap_err();
    assert!(
        matches!(
            err,
            XmlError::InvalidChar {
                element: "source",
                attribute: Some("path"),
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "<source> @path: character '\\0' cannot be written in XML"
    );

    let mut m = metadata();
    m.flavor.name = "\u{FFFF}".into();
    assert!(matches!(m.to_xml(), Err(XmlError::InvalidChar { .. })));
}

#[test]
fn vlan_out_of_range_is_refused_on_write() {
    let (_, mut i) = every_interface().swap_remove(4);
    i.vlan = Some(4096);
    assert!(matches!(i.to_xml(), Err(XmlError::Number { .. })));
}

#[test]
fn invalid_values_name_their_place() {
    type Case = (&'static str, &'static str, fn(&XmlError) -> bool);
    let cases: [Case; 9] = [
        (
            "<interface type='bridge'><source bridge='br/int'/></interface>",
            "interface/source/@bridge",
            |e| {
                matches!(
                    e,
                    XmlError::Invalid {
                        source: ValueError::DeviceName(_),
                        ..
                    }
                )
            },
        ),
        (
            "<interface type='bridge'><source bridge='br0'/><virtualport type='openvswitch'>\
             <parameters interfaceid='nope'/></virtualport></interface>",
            "interface/virtualport/parameters/@interfaceid",
            |e| {
                matches!(
                    e,
                    XmlError::Invalid {
                        source: ValueError::Uuid(_),
                        ..
                    }
                )
            },
        ),
        (
            "<interface type='hostdev'><source><address type='pci' domain='0x0000' bus='0x100' \
             slot='0x00' function='0x0'/></source></interface>",
            "interface/source/address/@bus",
            |e| {
                matches!(
                    e,
                    XmlError::Invalid {
                        source: ValueError::Pci(_),
                        ..
                    }
                )
            },
        ),
        (
            "<interface type='user'/>",
            "interface/@type",
            |e| matches!(e, XmlError::Unsupported { value, .. } if value == "user"),
        ),
        (
            "<interface type='bridge'/>",
            "interface/source/@bridge",
            |e| matches!(e, XmlError::Missing { .. }),
        ),
        (
            "<interface type='ethernet'><mtu size='big'/></interface>",
            "interface/mtu/@size",
            |e| matches!(e, XmlError::Number { .. }),
        ),
        (
            "<interface type='ethernet'><vlan><tag id='4096'/></vlan></interface>",
            "interface/vlan/tag/@id",
            |e| matches!(e, XmlError::Number { .. }),
        ),
        (
            "<interface type='ethernet'><target dev='t0' managed='maybe'/></interface>",
            "interface/target/@managed",
            |e| matches!(e, XmlError::Unsupported { .. }),
        ),
        (
            "<interface type='direct'><source dev='eth0' mode='weird'/></interface>",
            "interface/source/@mode",
            |e| matches!(e, XmlError::Unsupported { .. }),
        ),
    ];
    for (xml, place, ok) in cases {
        let err = Interface::from_xml(xml).unwrap_err();
        assert!(ok(&err), "{xml}: {err:?}");
        assert!(err.to_string().starts_with(place), "{xml}: {err}");
    }
}

#[test]
fn domain_level_errors() {
    let base = "<domain type='kvm'><name>x</name><memory unit='KiB'>1</memory>\
                <os><type>hvm</type></os><devices>DEV</devices></domain>";
    let err = Domain::from_xml(&base.replace(
        "DEV",
        "<interface type='ethernet'/><interface type='bridge'/>",
    ))
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "domain/devices/interface[1]/source/@bridge: missing"
    );

    let err = Domain::from_xml(&base.replace("type='kvm'", "type='xen'")).unwrap_err();
    assert!(matches!(err, XmlError::Unsupported { ref value, .. } if value == "xen"));

    let err = Domain::from_xml(&base.replace("<type>hvm</type>", "<type>exe</type>")).unwrap_err();
    assert!(matches!(err, XmlError::Unsupported { .. }), "{err}");

    let err = Domain::from_xml(&base.replace("unit='KiB'", "unit='parsec'")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "domain/memory/@unit: unsupported value \"parsec\""
    );

    let d = Domain::from_xml(
        &base
            .replace("unit='KiB'>1<", "unit='GiB'>2<")
            .replace("DEV", ""),
    )
    .unwrap();
    assert_eq!(d.memory_kib, 2 * 1024 * 1024);

    let err = Domain::from_xml("<interface type='ethernet'/>").unwrap_err();
    assert!(matches!(
        err,
        XmlError::WrongRoot {
            expected: "domain",
            ..
        }
    ));
    let err = Domain::from_xml("<domain type='kvm'><name>x</name").unwrap_err();
    assert!(
        matches!(err, XmlError::Syntax(_) | XmlError::Decode(_)),
        "{err:?}"
    );
    let err = Domain::from_xml("").unwrap_err();
    assert!(matches!(err, XmlError::WrongRoot { .. }), "{err:?}");
}

#[test]
fn foreign_metadata_root_is_refused() {
    let xml = "<x:instance xmlns:x='http://openstack.org/xmlns/libvirt/nova/1.1'>\
               <x:uuid>6f1c1b0e-1111-4222-8333-444455556666</x:uuid></x:instance>";
    assert!(matches!(
        VireoMetadata::from_xml(xml),
        Err(XmlError::WrongRoot { .. })
    ));
    let mut bad = metadata().to_xml().unwrap();
    bad = bad.replace("<network_info>[", "<network_info>[[");
    assert!(matches!(
        VireoMetadata::from_xml(&bad),
        Err(XmlError::Json {
            field: "network_info",
            ..
        })
    ));
}

// Found by the `domain_xml` fuzz target (fuzz/): quick-xml 0.38.4's deserializer panics
// (`unreachable!`) on a DOCTYPE between text runs of an element.
#[test]
fn a_doctype_inside_the_document_is_a_typed_error_not_a_panic() {
    let ns = metadata::NAMESPACE_URI;
    for (xml, parse) in [
        (
            "<domain><uuid>6<!DOCTYPEa>".to_owned(),
            (|x: &str| Domain::from_xml(x).map(drop)) as fn(&str) -> Result<(), XmlError>,
        ),
        (
            "<domain type='kvm'><name>a<!doctype b>c</name></domain>".to_owned(),
            |x| Domain::from_xml(x).map(drop),
        ),
        (
            format!("<vireo:instance xmlns:vireo='{ns}'><uuid>-<!DOCTYPE\">"),
            |x| VireoMetadata::from_xml(x).map(drop),
        ),
        (
            "<interface type='ethernet'><alias name='x'/>a<!DOCTYPE x>b</interface>".to_owned(),
            |x| Interface::from_xml(x).map(drop),
        ),
    ] {
        let err = parse(&xml).unwrap_err();
        assert!(
            matches!(err, XmlError::Unsupported { ref field, .. } if field.contains("DOCTYPE")),
            "{xml}: {err:?}"
        );
    }
    // A DOCTYPE before the root is valid XML and still accepted.
    let d = Domain::new(DomainName::new("dt").unwrap());
    let xml = format!("<!DOCTYPE domain>\n{}", d.to_xml().unwrap());
    assert_eq!(Domain::from_xml(&xml).unwrap(), d);
}

// Found by the `device_xml` fuzz target: an empty `<bandwidth/>` parsed as `Some(empty)`, which
// the writer omits, so the round trip changed the interface.
#[test]
fn an_empty_bandwidth_is_no_bandwidth() {
    for inner in [
        "<bandwidth/>",
        "<bandwidth></bandwidth>",
        "<bandwidth><x/></bandwidth>",
    ] {
        let xml = format!("<interface type='ethernet'>{inner}</interface>");
        let i = Interface::from_xml(&xml).unwrap();
        assert_eq!(i.bandwidth, None, "{xml}");
        assert_eq!(Interface::from_xml(&i.to_xml().unwrap()).unwrap(), i);
    }
}
