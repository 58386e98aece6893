//! `Domain::from_xml` on arbitrary text: never a panic; refusals name their field; an accepted
//! domain is written back (or refused as holding a character XML cannot carry) and the
//! written document parses to the same domain and writes to the same text.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vireo_xml::{Domain, XmlError};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    vireo_fuzz::bounded(data.len(), || match Domain::from_xml(text) {
        Ok(d) => {
            let xml = match d.to_xml() {
                Ok(x) => x,
                Err(XmlError::InvalidChar { .. }) => return,
                Err(e) => panic!("parsed domain cannot be written: {e:?}"),
            };
            let back = Domain::from_xml(&xml)
                .unwrap_or_else(|e| panic!("own output refused: {e:?}\n{xml}"));
            assert_eq!(back, d, "round trip changed the domain\n{xml}");
            assert_eq!(back.to_xml().ok().as_deref(), Some(xml.as_str()));
        }
        Err(e) => vireo_fuzz::assert_names_its_field(&e),
    });
});
