//! `VireoMetadata::from_xml` on arbitrary text (what `virDomainGetMetadata` returns, or the
//! prefixed element): never a panic; refusals name their field; accepted metadata writes
//! back to a fragment that parses to the same value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vireo_xml::{VireoMetadata, XmlError};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    vireo_fuzz::bounded(data.len(), || match VireoMetadata::from_xml(text) {
        Ok(m) => {
            let xml = match m.to_xml() {
                Ok(x) => x,
                Err(XmlError::InvalidChar { .. }) => return,
                Err(e) => panic!("parsed metadata cannot be written: {e:?}"),
            };
            let back = VireoMetadata::from_xml(&xml)
                .unwrap_or_else(|e| panic!("own output refused: {e:?}\n{xml}"));
            assert_eq!(back, m, "round trip changed the metadata\n{xml}");
        }
        Err(e) => vireo_fuzz::assert_names_its_field(&e),
    });
});
