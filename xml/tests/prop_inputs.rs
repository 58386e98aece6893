//! Property tests of hostile input to the XML model.
//!
//! - Domains, interfaces and vireo metadata holding strings with XML (`<>&'"`) and shell
//!   (`;|$()`, backticks) metacharacters — including text that would close an element and
//!   open another if it were not escaped — round-trip exactly, and the written document
//!   holds exactly the elements the model has (nothing injected). A sample of these domains
//!   passes libvirt's schema (`virt-xml-validate`).
//! - The same strings set into a live libvirt document with `live::rewrite` come back
//!   exactly, and everything else in the document is unchanged.
//! - Bad values in the k-th interface of a domain (over-long or invalid device names, unknown
//!   interface types, bad MACs and PCI addresses) are the typed error naming
//!   `domain/devices/interface[k]/...`; never a panic.
//! - Interfaces sharing a MAC are refused by a MAC-selected rewrite as ambiguous.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::json;
use vireo_xml::live::{rewrite, Edit, Selector};
use vireo_xml::types::ValueError;
use vireo_xml::*;

/// Text with XML and shell metacharacters, whitespace, markup-looking runs and Unicode.
fn hostile() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            3 => "[<>&'\"]",
            3 => "[;|$()`\\\\]",
            2 => select(vec!["</name>", "<evil/>", "]]>", "&amp;", "&#x3c;", "<!--", "-->", "<![CDATA["]).prop_map(str::to_owned),
            2 => "[a-z0-9 ._/-]",
            1 => "\\PC",
        ],
        1..20,
    )
    .prop_map(|v| v.concat())
}

/// A device name the kernel accepts that still holds XML and shell metacharacters.
fn hostile_dev() -> impl Strategy<Value = DeviceName> {
    "[a-z<>&'\";|$()`]{1,15}".prop_filter_map("valid", |s| DeviceName::new(s).ok())
}

fn hostile_interface(n: u8) -> impl Strategy<Value = Interface> {
    (
        hostile(),
        hostile(),
        hostile_dev(),
        hostile_dev(),
        any::<bool>(),
    )
        .prop_map(move |(path, alias, bridge, target, vhost)| Interface {
            mac: Some(mac(n)),
            alias: Some(format!("ua-{alias}")),
            ..Interface::new(if vhost {
                InterfaceKind::VhostUser {
                    path: format!("/run/{path}"),
                    mode: VhostUserMode::Server,
                    target: Some(target),
                }
            } else {
                InterfaceKind::Bridge {
                    bridge,
                    virtualport: None,
                    target: Some(target),
                }
            })
        })
}

fn hostile_metadata() -> impl Strategy<Value = VireoMetadata> {
    (hostile(), hostile(), hostile(), hostile(), hostile()).prop_map(
        |(name, key, value, label, data)| {
            let mut m = metadata();
            m.flavor.name = name;
            m.flavor.extra_specs.insert(key, value);
            m.network_info = json!([{"id": PORT1, "address": "fa:16:3e:00:00:01", "type": "ovs",
                                 "network": {"label": label}}]);
            if let Some(op) = &mut m.operation {
                op.data = json!({"note": data});
            }
            m
        },
    )
}

fn hostile_domain() -> impl Strategy<Value = Domain> {
    (
        hostile().prop_filter_map("valid domain name", |s| DomainName::new(s).ok()),
        proptest::collection::vec(any::<u8>(), 0..4),
        hostile_metadata(),
        hostile(),
    )
        .prop_flat_map(|(name, macs, meta, cmdline)| {
            let ifaces: Vec<_> = (0..macs.len() as u8).map(hostile_interface).collect();
            (Just(name), ifaces, Just(meta), Just(cmdline))
        })
        .prop_map(|(name, ifaces, meta, cmdline)| {
            let mut d = Domain::new(name);
            d.uuid = Some(meta.instance_uuid);
            d.metadata = Some(meta);
            d.os.cmdline = Some(cmdline);
            d.devices.interfaces = ifaces;
            d
        })
}

/// Count the elements named `name` anywhere in `xml` (a well-formedness check too).
fn count_elements(xml: &str, name: &[u8]) -> usize {
    let mut r = quick_xml::Reader::from_str(xml);
    let mut n = 0;
    loop {
        match r.read_event().expect("well-formed") {
            quick_xml::events::Event::Start(e) | quick_xml::events::Event::Empty(e)
                if e.local_name().as_ref() == name =>
            {
                n += 1
            }
            quick_xml::events::Event::Eof => return n,
            _ => {}
        }
    }
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(fixtures_dir().join(name)).unwrap()
}

/// An interface element with one bad value, the path (under the interface) that must be
/// named, and a check of the error kind.
#[derive(Debug, Clone)]
struct BadInterface {
    xml: String,
    place: &'static str,
    kind: fn(&XmlError) -> bool,
}

fn bad_interface() -> impl Strategy<Value = BadInterface> {
    fn dev_name(e: &XmlError) -> bool {
        matches!(
            e,
            XmlError::Invalid {
                source: ValueError::DeviceName(_),
                ..
            }
        )
    }
    prop_oneof![
        // Over-long target (tap) names.
        "[a-z0-9_.-]{16,48}".prop_map(|t| BadInterface {
            xml: format!("<interface type='ethernet'><target dev='{t}'/></interface>"),
            place: "target/@dev",
            kind: dev_name,
        }),
        // Bridge names with characters a Linux name may not hold.
        "[a-z]{0,5}[/: \t][a-z;|$`<]{0,5}".prop_map(|b| BadInterface {
            xml: format!(
                "<interface type='bridge'><source bridge='{}'/></interface>",
                b.replace('<', "&lt;")
            ),
            place: "source/@bridge",
            kind: dev_name,
        }),
        // Unknown interface types, metacharacters included.
        "[a-z;|$()`<&]{1,12}"
            .prop_filter("unknown type", |t| {
                ![
                    "bridge",
                    "ethernet",
                    "hostdev",
                    "direct",
                    "vhostuser",
                    "vdpa",
                    "network",
                ]
                .contains(&t.as_str())
            })
            .prop_map(|t| BadInterface {
                xml: format!(
                    "<interface type='{}'/>",
                    t.replace('&', "&amp;").replace('<', "&lt;")
                ),
                place: "@type",
                kind: |e| matches!(e, XmlError::Unsupported { .. }),
            }),
        // Bad MACs.
        prop_oneof![
            "[0-9a-f]{2}(:[0-9a-f]{2}){4}",
            "[0-9a-f]{2}(:[0-9a-f]{2}){6}",
            "[g-z]{2}(:[0-9a-f]{2}){5}",
            "[;|$`]{1,17}"
        ]
        .prop_map(|m| BadInterface {
            xml: format!("<interface type='ethernet'><mac address='{m}'/></interface>"),
            place: "mac/@address",
            kind: |e| matches!(
                e,
                XmlError::Invalid {
                    source: ValueError::Mac(_),
                    ..
                }
            ),
        }),
        // PCI slots and functions out of range.
        (32u32..4096, 8u32..64).prop_map(|(slot, function)| BadInterface {
            xml: format!(
                "<interface type='hostdev'><source><address type='pci' domain='0x0000' \
                 bus='0x81' slot='{slot:#x}' function='{function:#x}'/></source></interface>"
            ),
            place: "source/address/@slot",
            kind: |e| matches!(
                e,
                XmlError::Invalid {
                    source: ValueError::Pci(_),
                    ..
                }
            ),
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn hostile_strings_round_trip_without_injection(d in hostile_domain()) {
        let xml = d.to_xml().unwrap();
        prop_assert_eq!(Domain::from_xml(&xml).unwrap(), d.clone());
        prop_assert_eq!(count_elements(&xml, b"interface"), d.devices.interfaces.len());
        prop_assert_eq!(count_elements(&xml, b"name"), 1);
        prop_assert_eq!(count_elements(&xml, b"evil"), 0);
        prop_assert_eq!(count_elements(&xml, b"extra_spec"), d.metadata.as_ref().unwrap().flavor.extra_specs.len());
        for i in &d.devices.interfaces {
            prop_assert_eq!(&Interface::from_xml(&i.to_xml().unwrap()).unwrap(), i);
        }
        let m = d.metadata.as_ref().unwrap();
        prop_assert_eq!(&VireoMetadata::from_xml(&m.to_xml().unwrap()).unwrap(), m);
    }

    #[test]
    fn hostile_edits_of_a_live_document_come_back_exactly(
        meta in hostile_metadata(),
        iface in hostile_interface(0x7f),
        live in select(vec!["live-kvm-q35.xml", "live-qemu-q35.xml", "inactive-kvm-q35.xml"]),
    ) {
        let doc = fixture(live);
        let before = Domain::from_xml(&doc).unwrap();
        let out = rewrite(&doc, &[Edit::SetMetadata(meta.clone()), Edit::AddInterface(iface.clone())]).unwrap();
        let after = Domain::from_xml(&out).unwrap();
        let mut want = before.clone();
        want.metadata = Some(meta.clone());
        want.devices.interfaces.push(iface.clone());
        prop_assert_eq!(after, want);
        // Removing the interface and restoring the metadata gives the original domain.
        let back = rewrite(&out, &[
            Edit::RemoveInterface(Selector::Mac(iface.mac.unwrap())),
            Edit::SetMetadata(before.metadata.clone().unwrap()),
        ]).unwrap();
        prop_assert_eq!(Domain::from_xml(&back).unwrap(), before);
        prop_assert_eq!(count_elements(&out, b"evil"), 0);
    }

    #[test]
    fn a_bad_value_in_the_kth_interface_is_named(
        bad in bad_interface(),
        k in 0usize..4,
        n_after in 0usize..3,
    ) {
        // Alone: the interface path.
        let err = Interface::from_xml(&bad.xml).unwrap_err();
        prop_assert!((bad.kind)(&err), "{}: {:?}", bad.xml, err);
        let place = format!("interface/{}", bad.place);
        prop_assert!(err.to_string().starts_with(&format!("{place}:")), "{}: {}", bad.xml, err);

        // In a domain, after k good interfaces: the same error, indexed.
        let good = "<interface type='ethernet'><target dev='tap0' managed='no'/></interface>";
        let devices = format!("{}{}{}", good.repeat(k), bad.xml, good.repeat(n_after));
        let doc = format!(
            "<domain type='kvm'><name>x</name><memory unit='KiB'>1024</memory>\
             <os><type>hvm</type></os><devices>{devices}</devices></domain>"
        );
        let err = Domain::from_xml(&doc).unwrap_err();
        prop_assert!((bad.kind)(&err), "{}: {:?}", doc, err);
        let place = format!("domain/devices/interface[{k}]/{}:", bad.place);
        prop_assert!(err.to_string().starts_with(&place), "{} => {}", doc, err);
    }

    #[test]
    fn interfaces_sharing_a_mac_are_ambiguous_for_a_rewrite(
        n in 2u8..5,
        shared in proptest::collection::btree_set(0u8..5, 2..=2),
    ) {
        let mut d = Domain::new(DomainName::new("vx-dup").unwrap());
        for i in 0..n.max(*shared.last().unwrap() + 1) {
            let m = if shared.contains(&i) { mac(0xaa) } else { mac(i) };
            d.devices.interfaces.push(Interface { mac: Some(m), ..every_interface()[0].1.clone() });
        }
        let xml = d.to_xml().unwrap();
        for edit in [
            Edit::RemoveInterface(Selector::Mac(mac(0xaa))),
            Edit::ReplaceInterface(Selector::Mac(mac(0xaa)), every_interface()[1].1.clone()),
        ] {
            let err = rewrite(&xml, &[edit]).unwrap_err();
            prop_assert!(matches!(err, XmlError::Ambiguous { what: "interface", .. }), "{:?}", err);
        }
    }
}

/// A sample of hostile domains passes libvirt's RNG schema: escaping keeps them valid XML of
/// the right shape, not just something our own parser reads back.
#[test]
fn a_sample_of_hostile_domains_passes_the_schema() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config::default());
    for _ in 0..8 {
        let mut d = hostile_domain().new_tree(&mut runner).unwrap().current();
        // The schema holds device names and vhost-user paths to patterns of its own; the
        // hostile text sits in the name, metadata, cmdline and aliases.
        for (n, i) in d.devices.interfaces.iter_mut().enumerate() {
            i.kind = every_interface()[n % 3].1.kind.clone();
            i.alias = None;
        }
        let xml = d.to_xml().unwrap();
        virt_xml_validate(&xml).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Found by the `metadata_xml` fuzz target (fuzz/): a float in the stored `network_info` came
/// back 1 ULP off (serde_json's default float parsing; the workspace enables
/// `float_roundtrip`).
#[test]
fn floats_in_metadata_json_round_trip_exactly() {
    let mut m = metadata();
    for f in [
        1.777_777_777_777_777_7e39,
        6.666_666_666_66e103,
        5e-324,
        0.1 + 0.2,
    ] {
        m.network_info = json!([{"x": f}]);
        let back = VireoMetadata::from_xml(&m.to_xml().unwrap()).unwrap();
        assert_eq!(back.network_info[0]["x"].as_f64(), Some(f));
    }
}
