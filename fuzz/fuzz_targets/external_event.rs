//! Nova's external event (`ExternalEvent`, one event, and the `{"events": [...]}` body of
//! `POST /os-server-external-events`) through serde: never a panic; an accepted event
//! serializes to JSON that parses back to the same event; the status defaults to `completed`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use vireo_actors::external::{EventStatus, ExternalEvent};

fn check(e: &ExternalEvent, raw: &Value) {
    let text = serde_json::to_string(e).expect("an event serializes");
    let back: ExternalEvent = serde_json::from_str(&text).expect("own JSON parses");
    assert_eq!(&back, e);
    if raw.get("status").is_none() {
        assert_eq!(e.status, EventStatus::Completed);
    }
    assert_eq!(e.name.as_str().parse(), Ok(e.name));
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    vireo_fuzz::bounded(data.len(), || {
        if let Ok(e) = serde_json::from_str::<ExternalEvent>(text) {
            let raw: Value = serde_json::from_str(text).expect("accepted text is JSON");
            check(&e, &raw);
        }
        // Nova's body: `events` only (`additionalProperties: false`).
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Body {
            events: Vec<ExternalEvent>,
        }
        if let Ok(b) = serde_json::from_str::<Body>(text) {
            let raw: Value = serde_json::from_str(text).expect("accepted text is JSON");
            for (e, r) in b
                .events
                .iter()
                .zip(raw["events"].as_array().into_iter().flatten())
            {
                check(e, r);
            }
        }
    });
});
