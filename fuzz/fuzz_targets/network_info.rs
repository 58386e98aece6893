//! `NetworkInfo::parse` on arbitrary text: never a panic; an accepted document keeps every
//! VIF, in order, valid and unique, stores back exactly as received, and maps to libvirt
//! devices whose XML round-trips; a refused one gets the error that names the VIF index,
//! its port and the field's path, and that path holds the offending value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use vireo_actors::vif::{valid_ifname, NetworkInfo, Problem, VifError, MAX_MTU, MIN_MTU};
use vireo_actors::vif_config::{interface_for, DeviceConfig, DomainForm, InterfaceOptions};
use vireo_xml::{Hostdev, Interface, XmlError};

/// Every field path the parser may name.
const FIELDS: &[&str] = &[
    "id",
    "address",
    "type",
    "vnic_type",
    "active",
    "preserve_on_delete",
    "devname",
    "details",
    "details.ovs_hybrid_plug",
    "details.port_filter",
    "details.vlan",
    "details.bridge_name",
    "details.datapath_type",
    "details.vhostuser_socket",
    "details.vhostuser_mode",
    "details.vhostuser_ovs_plug",
    "details.physical_interface",
    "details.macvtap_mode",
    "details.macvtap_source",
    "details.connectivity",
    "profile",
    "profile.pci_slot",
    "profile.physical_network",
    "profile.pci_vendor_info",
    "profile.migrating_to",
    "profile.trusted",
    "network",
    "network.meta",
    "network.id",
    "network.bridge",
    "network.label",
    "network.meta.mtu",
    "network.meta.physical_network",
];

fn at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

fn check_accepted(ni: &NetworkInfo, doc: &Value) {
    let list = doc.as_array().expect("accepted network_info is a list");
    assert_eq!(ni.vifs.len(), list.len(), "every VIF comes back");
    assert_eq!(&ni.to_value(), doc, "stored back exactly as received");
    for (i, v) in ni.vifs.iter().enumerate() {
        assert_eq!(v.index, i);
        assert!(!v.address.is_multicast() && v.address.octets() != [0; 6]);
        for (j, w) in ni.vifs.iter().enumerate().take(i) {
            assert_ne!(v.id, w.id, "VIFs {j} and {i} share a port id");
            assert_ne!(v.address, w.address, "VIFs {j} and {i} share a MAC");
        }
        for name in [
            v.devname.as_deref(),
            v.details.bridge_name.as_deref(),
            v.details.physical_interface.as_deref(),
            v.details.macvtap_source.as_deref(),
            v.network.bridge.as_deref(),
        ]
        .into_iter()
        .flatten()
        {
            assert!(valid_ifname(name), "accepted device name {name:?}");
        }
        assert!(v.details.vlan.is_none_or(|t| t <= 4095));
        assert!(v
            .network
            .mtu
            .is_none_or(|m| (MIN_MTU..=MAX_MTU).contains(&m)));
        for name in [v.tap_name(), v.qbr_name(), v.qvb_name(), v.qvo_name()] {
            assert!(valid_ifname(&name), "derived device name {name:?}");
        }
        if let Some(b) = v.linux_bridge_name() {
            assert!(valid_ifname(&b), "derived bridge name {b:?}");
        }
        for form in [DomainForm::LibvirtManaged, DomainForm::PreCreated] {
            check_device(interface_for(v, form, &InterfaceOptions::default()));
        }
    }
    // Parsing what is stored gives the same model.
    let again = NetworkInfo::parse(&ni.to_value().to_string()).expect("stored form parses");
    assert_eq!(&again, ni);
}

fn check_device<E: std::fmt::Debug>(dc: Result<DeviceConfig, E>) {
    let Ok(dc) = dc else { return };
    let xml = match dc.to_xml() {
        Ok(x) => x,
        // A value from network_info that XML cannot carry (a control character).
        Err(XmlError::InvalidChar { .. }) => return,
        Err(e) => panic!("device from an accepted VIF cannot be written: {e:?} ({dc:?})"),
    };
    match &dc {
        DeviceConfig::Interface(i) => {
            assert_eq!(
                &Interface::from_xml(&xml).expect("own interface XML"),
                i,
                "{xml}"
            )
        }
        DeviceConfig::Hostdev(h) => {
            assert_eq!(
                &Hostdev::from_xml(&xml).expect("own hostdev XML"),
                h,
                "{xml}"
            )
        }
    }
}

fn check_refused(e: &VifError, text: &str) {
    let doc: Option<Value> = serde_json::from_str(text).ok();
    match e {
        VifError::Json(_) => assert!(doc.is_none(), "valid JSON refused as invalid: {e}"),
        VifError::NotAList => assert!(doc.is_some_and(|d| !d.is_array())),
        VifError::NotAnObject { index } => {
            let doc = doc.expect("JSON");
            assert!(!doc[*index].is_object());
            assert!(*index < doc.as_array().map_or(0, Vec::len));
        }
        VifError::Field {
            index,
            port,
            field,
            problem,
        } => {
            let doc = doc.expect("field errors come from valid JSON");
            let list = doc.as_array().expect("a list");
            let vif = list.get(*index).expect("the index names a VIF");
            assert!(
                FIELDS.contains(&field.as_str()),
                "unknown field path {field:?}"
            );
            let want_port = vif.get("id").and_then(Value::as_str).unwrap_or("?");
            assert_eq!(port, want_port, "the port is the VIF's id as given");
            let value = at(vif, field);
            match problem {
                Problem::Missing => assert!(value.is_none_or(Value::is_null), "{e}"),
                Problem::Duplicate(first) => {
                    assert!(first < index, "{e}");
                    assert!(field == "id" || field == "address", "{e}");
                }
                _ => assert!(value.is_some_and(|v| !v.is_null()), "{e}: no value at path"),
            }
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("VIF {index} ")) && msg.contains(field.as_str()),
                "{msg}"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    vireo_fuzz::bounded(data.len(), || match NetworkInfo::parse(text) {
        Ok(ni) => {
            let doc: Value = serde_json::from_str(text).expect("accepted text is JSON");
            check_accepted(&ni, &doc);
        }
        Err(e) => check_refused(&e, text),
    });
});
