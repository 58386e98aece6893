//! `Interface::from_xml`, `Hostdev::from_xml` and `Disk::from_xml` on arbitrary text (hot-plug
//! documents and what libvirt reports for one device): never a panic; refusals name their
//! field; whatever is accepted writes back to XML that parses to the same device.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vireo_xml::{Disk, Hostdev, Interface, XmlError};

fn round_trip<T: PartialEq + std::fmt::Debug>(
    parsed: Result<T, XmlError>,
    write: fn(&T) -> Result<String, XmlError>,
    parse: fn(&str) -> Result<T, XmlError>,
) {
    match parsed {
        Ok(v) => {
            let xml = match write(&v) {
                Ok(x) => x,
                Err(XmlError::InvalidChar { .. }) => return,
                Err(e) => panic!("parsed device cannot be written: {e:?} ({v:?})"),
            };
            let back = parse(&xml).unwrap_or_else(|e| panic!("own output refused: {e:?}\n{xml}"));
            assert_eq!(back, v, "round trip changed the device\n{xml}");
        }
        Err(e) => vireo_fuzz::assert_names_its_field(&e),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    vireo_fuzz::bounded(data.len(), || {
        round_trip(
            Interface::from_xml(text),
            Interface::to_xml,
            Interface::from_xml,
        );
        round_trip(Hostdev::from_xml(text), Hostdev::to_xml, Hostdev::from_xml);
        round_trip(Disk::from_xml(text), Disk::to_xml, Disk::from_xml);
    });
});
