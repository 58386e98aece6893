//! The `vireo events explain` input document (`explain_input`): never a panic; an accepted
//! document predicts every VIF once, in order, and agrees with `predict_json` run on its
//! `network_info` (a third path to the same prediction).

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use vireo::cli::explain::{explain_input, ExplainError};
use vireo_actors::predict::predict_json;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    vireo_fuzz::bounded(data.len(), || match explain_input(text) {
        Ok(e) => {
            assert_eq!(e.prediction.vifs.len(), e.vifs.len());
            for (i, (v, p)) in e.vifs.iter().zip(&e.prediction.vifs).enumerate() {
                assert_eq!((v.index, p.index, v.id), (i, i, p.port));
            }
            let doc: Value = serde_json::from_str(text).expect("accepted text is JSON");
            let lean = predict_json(&e.operation, &doc["network_info"].to_string(), &e.wiring);
            assert_eq!(lean.as_ref(), Ok(&e.prediction), "predict_json disagrees");
        }
        Err(ExplainError::UnknownOperation(op)) => {
            assert!(!vireo::cli::explain::OPERATIONS.contains(&op.as_str()));
        }
        Err(_) => {}
    });
});
