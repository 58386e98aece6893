//! Differential: `predict_json` (the lean parser) against `NetworkInfo::parse` + `predict`.
//!
//! Input: one selector byte (operation and wiring, see `vireo_fuzz::operation`), then the
//! `network_info` text. Contract checked:
//! - where the full parser accepts the text, both give exactly the same result (the same
//!   prediction, or the same typed error);
//! - where `predict_json` refuses `network_info` (or a VIF's binding), the full path refuses
//!   it too: the lean parser reads a subset of the fields with the same rules, so it can
//!   only accept more, never less.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vireo_actors::predict::{predict, predict_json, PredictError};
use vireo_actors::vif::NetworkInfo;

fuzz_target!(|data: &[u8]| {
    let Some((sel, text)) = vireo_fuzz::selector_and_text(data) else {
        return;
    };
    let op = vireo_fuzz::operation(sel);
    let wiring = vireo_fuzz::wiring(sel);
    vireo_fuzz::bounded(data.len(), || {
        let lean = predict_json(&op, text, &wiring);
        let parsed = NetworkInfo::parse(text);
        let accepted = parsed.is_ok();
        let full = parsed
            .map_err(PredictError::NetworkInfo)
            .and_then(|ni| predict(&op, &ni.vifs, &wiring));
        if accepted {
            assert_eq!(
                lean, full,
                "predict_json disagrees on accepted network_info"
            );
        }
        if let Err(PredictError::NetworkInfo(_) | PredictError::Unsupported { .. }) = &lean {
            assert!(
                full.is_err(),
                "predict_json refused what the full path accepts: {lean:?}"
            );
        }
    });
});
