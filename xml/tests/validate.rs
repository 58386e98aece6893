//! Every generated interface form and whole domains, checked by real libvirt: the RNG
//! schemas (`virt-xml-validate`) and `virDomainDefineXMLFlags(VALIDATE)` on a private
//! `test:///` connection, whose output is parsed back and compared.
//!
//! Facts checked here (libvirt 11.3): the test driver is happy with a node file holding just
//! `<node/>`; it defines domains of type `kvm` and `qemu` as well as `test` (it does not
//! check the hypervisor type), so the very documents vireo gives qemu:///system are used.
//! It assigns a target name (`testnet0`) to interfaces that have none. Needs
//! `virt-xml-validate` (libvirt-clients) and `xmllint` (libxml2-utils); no daemon.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use vireo_xml::*;

fn with_interface(name: &str, iface: &Interface) -> Domain {
    let mut d = Domain::new(DomainName::new(name).unwrap());
    d.os.machine = Some("q35".into());
    d.devices.interfaces.push(iface.clone());
    d
}

#[test]
fn every_interface_form_passes_the_schema() {
    for (form, iface) in every_interface() {
        let xml = with_interface(&format!("vx-schema-{form}"), &iface)
            .to_xml()
            .unwrap();
        virt_xml_validate(&xml).unwrap_or_else(|e| panic!("{form}: {e}"));
    }
}

#[test]
fn every_interface_form_is_accepted_by_libvirt_and_comes_back_equal() {
    let conn = TestConn::open();
    for (form, iface) in every_interface() {
        let xml = with_interface(&format!("vx-define-{form}"), &iface)
            .to_xml()
            .unwrap();
        let back = conn
            .define_validated(&xml)
            .unwrap_or_else(|e| panic!("{form}: {e}\n{xml}"));
        let parsed = Domain::from_xml(&back).unwrap_or_else(|e| panic!("{form}: {e}\n{back}"));
        assert_eq!(parsed.devices.interfaces.len(), 1, "{form}");
        let mut got = parsed.devices.interfaces[0].clone();
        // The test driver may assign a guest address and a target name (`testnet0`) where we
        // gave none; the rest must be what we wrote.
        strip_assigned(&mut got, &iface);
        assert_eq!(got, iface, "{form}: libvirt gave back\n{back}");
    }
}

#[test]
fn whole_domain_passes_the_schema_for_each_type() {
    for kind in DomainType::ALL {
        let xml = full_domain("vx-schema-full", *kind).to_xml().unwrap();
        virt_xml_validate(&xml).unwrap_or_else(|e| panic!("{kind}: {e}"));
    }
}

#[test]
fn whole_domain_is_accepted_by_libvirt_and_comes_back_equal() {
    let conn = TestConn::open();
    for kind in DomainType::ALL {
        let ours = full_domain(&format!("vx-define-full-{kind}"), *kind);
        let xml = ours.to_xml().unwrap();
        let back = conn
            .define_validated(&xml)
            .unwrap_or_else(|e| panic!("{kind}: {e}\n{xml}"));
        let mut parsed = Domain::from_xml(&back).unwrap_or_else(|e| panic!("{e}\n{back}"));
        for (got, ours) in parsed
            .devices
            .interfaces
            .iter_mut()
            .zip(&ours.devices.interfaces)
        {
            strip_assigned(got, ours);
        }
        for h in &mut parsed.devices.hostdevs {
            h.address = None;
        }
        for d in &mut parsed.devices.disks {
            d.address = None;
        }
        assert_eq!(parsed.metadata, ours.metadata);
        assert_eq!(parsed.devices.interfaces, ours.devices.interfaces);
        assert_eq!(parsed.devices.hostdevs, ours.devices.hostdevs);
        assert_eq!(parsed.devices.disks, ours.devices.disks);
        assert_eq!(parsed.name, ours.name);
        assert_eq!(parsed.uuid, ours.uuid);
        assert_eq!(parsed.memory_kib, ours.memory_kib);
        assert_eq!(parsed.cpu, ours.cpu);
        assert_eq!(parsed.os, ours.os);
        assert_eq!(parsed.clock, ours.clock);
    }
}

#[test]
fn names_and_values_with_metacharacters_survive_libvirt() {
    let conn = TestConn::open();
    let mut d = full_domain("vx <meta> & 'q' \"d\" é", DomainType::Kvm);
    if let Some(m) = &mut d.metadata {
        m.flavor.name = " lead & trail ".into();
        m.flavor
            .extra_specs
            .insert("k<&>".into(), "v\t'\"\n".into());
    }
    let xml = d.to_xml().unwrap();
    virt_xml_validate(&xml).unwrap();
    let back = conn.define_validated(&xml).unwrap();
    let parsed = Domain::from_xml(&back).unwrap();
    assert_eq!(parsed.name, d.name);
    assert_eq!(parsed.metadata, d.metadata);
}

#[test]
fn metadata_namespace_is_accepted_by_libvirts_metadata_api() {
    let conn = TestConn::open();
    let mut d = Domain::new(DomainName::new("vx-meta-api").unwrap());
    d.domain_type = DomainType::Test;
    let dom = conn
        .conn
        .define_domain_xml_flags(&d.to_xml().unwrap(), virt::sys::VIR_DOMAIN_DEFINE_VALIDATE)
        .unwrap();
    let meta = metadata();
    dom.set_metadata(
        virt::sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
        Some(&meta.to_xml().unwrap()),
        Some(metadata::NAMESPACE_PREFIX),
        Some(metadata::NAMESPACE_URI),
        0,
    )
    .unwrap();
    // What virDomainGetMetadata returns parses back.
    let got = dom
        .metadata(
            virt::sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            Some(metadata::NAMESPACE_URI),
            0,
        )
        .unwrap();
    assert_eq!(VireoMetadata::from_xml(&got).unwrap(), meta);
    // And the whole domain document carries it under the namespace.
    let parsed = Domain::from_xml(&dom.xml_desc(0).unwrap()).unwrap();
    assert_eq!(parsed.metadata, Some(meta));
    dom.undefine().unwrap();
}
