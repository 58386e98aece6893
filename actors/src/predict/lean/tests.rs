//! Tests of the lean scanner itself: the SSE2 byte classes against the byte-at-a-time
//! reference, what a skipped container is checked for (and what it is not), and the block
//! walk across boundaries. Agreement with the full model on whole predictions is tested in
//! `predict/tests.rs` and by the `predict_json` fuzz target.

use super::*;
use crate::predict::{predict, Operation, Wiring};
use crate::vif::NetworkInfo;
use serde_json::{json, Value};

fn port(n: u32) -> String {
    format!("3b2c4d5e-0000-4000-8000-{n:012}")
}

/// A one-VIF `network_info` whose `network` value is `network` (raw JSON text).
fn doc_with_network(network: &str) -> String {
    format!(
        r#"[{{"id": "{}", "address": "fa:16:3e:00:00:01", "type": "ovs", "vnic_type": "normal", "active": false, "network": {network}, "details": {{"ovs_hybrid_plug": true}}}}]"#,
        port(1)
    )
}

fn full(text: &str) -> Result<Prediction, PredictError> {
    let w = Wiring::default();
    NetworkInfo::parse(text)
        .map_err(PredictError::NetworkInfo)
        .and_then(|ni| predict(&Operation::Spawn, &ni.vifs, &w))
}

fn lean(text: &str) -> Result<Prediction, PredictError> {
    predict_json(&Operation::Spawn, text, &Wiring::default())
}

#[cfg(target_arch = "x86_64")]
#[test]
fn sse2_classes_match_the_byte_at_a_time_reference() {
    // Every byte value at every position, on a plain background and on a background of
    // every class (quotes, brackets, backslashes, control bytes, high bytes).
    let backgrounds: [u8; 6] = [b'a', b'"', b'{', b'\\', 0x01, 0xc3];
    let mut checked = 0;
    for bg in backgrounds {
        for pos in 0..16 {
            for byte in 0..=255u8 {
                let mut chunk = [bg; 16];
                chunk[pos] = byte;
                assert_eq!(
                    sse2::string_stops(&chunk),
                    portable::string_stops(&chunk),
                    "{chunk:?}"
                );
                assert_eq!(
                    sse2::classes(&chunk),
                    portable::classes(&chunk),
                    "{chunk:?}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 6 * 16 * 256);
}

/// What [`classes64`] must give for `block`: the 16-byte classes side by side, except that
/// `rare` need only be non-zero when some byte is rare.
fn check_classes64(block: &[u8; 64]) {
    let wide = classes64(block);
    let mut want = Classes::default();
    for (n, chunk) in block.chunks_exact(16).enumerate() {
        let c = classes16(chunk.try_into().unwrap());
        want.quote |= c.quote << (16 * n);
        want.bracket |= c.bracket << (16 * n);
        want.rare |= c.rare << (16 * n);
    }
    assert_eq!(wide.quote, want.quote, "{block:?}");
    assert_eq!(wide.bracket, want.bracket, "{block:?}");
    assert_eq!(wide.rare != 0, want.rare != 0, "{block:?}");
}

#[test]
fn the_64_byte_classes_are_the_16_byte_classes_side_by_side() {
    let text: Vec<u8> = (0..64u8)
        .map(|n| b"{\"a\\\":[1]}, \x01\xff"[usize::from(n) % 14])
        .collect();
    let block: &[u8; 64] = text.as_slice().try_into().unwrap();
    check_classes64(block);
    assert_eq!(classes64(block).quote.count_ones(), 64 / 14 * 2 + 2);
    // Every byte value at every position of a plain block and of one full of brackets and
    // quotes: the rare bytes are gathered over the four chunks, so each must still count.
    let mut checked = 0;
    for bg in [b'a', b'"', b'}', 0xc3] {
        for pos in 0..64 {
            for byte in 0..=255u8 {
                let mut block = [bg; 64];
                block[pos] = byte;
                check_classes64(&block);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 4 * 64 * 256);
}

/// Padding that puts what follows past the first 64-byte block (the block walk, not the
/// byte-at-a-time tail).
const PAD: &str =
    r#""p": "................................................................................","#;

#[test]
fn skipped_containers_are_checked_for_structure() {
    for (name, network) in [
        ("unterminated string", r#"{"a": "x}]}"#.to_owned()),
        ("mismatched brackets", r#"{"a": [1, 2}}"#.to_owned()),
        ("unbalanced brackets", r#"{"a": [1, 2]"#.to_owned()),
        ("raw tab in a string", "{\"a\": \"x\ty\"}".to_owned()),
        ("raw newline in a string", "{\"a\": \"x\ny\"}".to_owned()),
        ("control byte outside strings", "{\"a\": \u{1}1}".to_owned()),
        ("unknown escape", r#"{"a": "x\qy"}"#.to_owned()),
        ("short unicode escape", r#"{"a": "x\u12"}"#.to_owned()),
    ] {
        for network in [
            network.clone(),
            network.replacen('{', &format!("{{{PAD}"), 1),
        ] {
            let text = doc_with_network(&network);
            assert!(
                matches!(
                    lean(&text),
                    Err(PredictError::NetworkInfo(VifError::Json(_)))
                ),
                "{name}: {text}: {:?}",
                lean(&text)
            );
            assert!(
                full(&text).is_err(),
                "{name}: the full parser accepts {text}"
            );
        }
    }
}

#[test]
fn inside_a_skipped_container_grammar_is_not_checked() {
    // The documented leniency: commas, colons and scalars inside what is skipped.
    let clean = doc_with_network(r#"{"mtu": 1442}"#);
    for network in [r#"{"mtu": 14x2}"#, r#"{"mtu" 1442,,}"#, r#"{"mtu": tru}"#] {
        let text = doc_with_network(network);
        assert!(full(&text).is_err(), "{text}");
        assert_eq!(lean(&text), full(&clean), "{text}");
    }
}

#[test]
fn brackets_and_escaped_quotes_inside_strings_do_not_count_wherever_blocks_split() {
    // Strings of every length up to past two blocks, holding brackets and escaped quotes,
    // so that each lands on every offset of a block boundary.
    for len in 0..150 {
        let body: String = "{[\\\"]}x".chars().cycle().take(len).collect();
        // A trailing lone backslash would escape the closing quote: keep escapes whole.
        let body = if body.ends_with('\\') && !body.ends_with("\\\"") {
            format!("{body}\\")
        } else {
            body
        };
        let network = format!(r#"{{"a": "{body}", "b": [{{"c": "{body}"}}], "d": {{}}}}"#);
        let text = doc_with_network(&network);
        assert!(full(&text).is_ok(), "{text}");
        assert_eq!(lean(&text), full(&text), "{text}");
    }
}

#[test]
fn pretty_printed_documents_read_like_compact_ones() {
    let vif = json!({
        "id": port(7), "address": "fa:16:3e:00:00:07", "type": "ovs", "vnic_type": "normal",
        "active": true,
        "network": {"bridge": "br-int", "subnets": [{"cidr": "10.0.0.0/26", "ips": [
            {"address": "10.0.0.5", "meta": {}}]}], "meta": {"mtu": 1442}},
        "details": {"ovs_hybrid_plug": false, "port_filter": true}, "profile": {}
    });
    let doc = Value::Array(vec![vif]);
    let compact = doc.to_string();
    let pretty = serde_json::to_string_pretty(&doc).unwrap();
    let tabs = pretty.replace("  ", "\t").replace('\n', "\r\n");
    for text in [&compact, &pretty, &tabs] {
        assert!(full(text).is_ok());
        assert_eq!(lean(text), full(&compact), "{text}");
    }
}

#[test]
fn skipped_nesting_is_followed_to_128_levels() {
    // Inside `network` (an object, one level of its own).
    let nested = |levels: usize| {
        format!(
            r#"{{"deep": {}1{}}}"#,
            "[".repeat(levels),
            "]".repeat(levels)
        )
    };
    let ok = doc_with_network(&nested(120));
    assert_eq!(lean(&ok), full(&ok));
    assert!(lean(&ok).is_ok());
    let deep = doc_with_network(&nested(128));
    assert!(
        matches!(lean(&deep), Err(PredictError::NetworkInfo(VifError::Json(m))) if m.contains("recursion"))
    );
    assert!(full(&deep).is_err());
}

#[test]
fn a_syntax_error_names_its_line_and_column() {
    let text = "[\n  {\"id\": 7,\n   \"type\" \"ovs\"}]";
    let Err(PredictError::NetworkInfo(VifError::Json(message))) = lean(text) else {
        panic!("{:?}", lean(text));
    };
    assert_eq!(message, "expected `:` at line 3 column 11");
}

#[test]
fn strings_at_the_vif_level_end_where_they_end_wherever_windows_split() {
    // Strings the scanner steps over and strings it reads, holding escapes and brackets,
    // moved along one byte at a time so that each meets every offset of a 64-byte window.
    for pad in 0..130 {
        for body in ["", r#"a\"b"#, r"\\", r"x\u00e9y", "{[]}:,", r#"\\\""#] {
            let note = format!("{}{body}", ".".repeat(pad));
            let text = format!(
                r#"[{{"note": "{note}", "id": "{}", "address": "fa:16:3e:00:00:01", "note2": "{note}", "type": "ovs", "active": true, "details": {{"x": "{note}", "ovs_hybrid_plug": false}}}}]"#,
                port(1)
            );
            assert!(full(&text).is_ok(), "{text}");
            assert_eq!(lean(&text), full(&text), "{text}");
            // A raw control byte in the same place is refused by both.
            let bad = text.replacen(&format!("\"{note}\""), &format!("\"{note}\u{1}\""), 1);
            assert!(lean(&bad).is_err() && full(&bad).is_err(), "{bad:?}");
        }
    }
}

#[test]
fn every_truncation_of_a_document_is_refused() {
    let text = doc_with_network(
        r#"{"bridge": "br-int", "subnets": [{"ips": [{"address": "10.0.0.5", "meta": {}}]}], "label": "a\"b"}"#,
    );
    assert!(lean(&text).is_ok());
    for end in 0..text.len() {
        let cut = &text[..end];
        assert!(lean(cut).is_err(), "{cut}");
        assert!(full(cut).is_err(), "{cut}");
    }
}
