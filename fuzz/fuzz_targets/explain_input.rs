//! The `vireo events explain` input document: `explain_input` and the whole subcommand
//! (`explain::run`, table and `--json` output). Never a panic; an accepted document predicts
//! every VIF once, in order, agrees with `NetworkInfo::parse` + `predict` run on its
//! `network_info` as text (a second path to the same prediction), exits 0 and lists every VIF
//! exactly once in its output; a refused one exits 2 with one error line on stderr and nothing
//! on stdout.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use vireo::cli::explain::{explain_input, run, ExplainError, OPERATIONS};
use vireo::cli::{ExplainArgs, EXIT_INVALID_INPUT};
use vireo_actors::predict::predict;
use vireo_actors::vif::NetworkInfo;

fn run_cli(text: &str, json: bool) -> (u8, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(
        ExplainArgs { json },
        &mut text.as_bytes(),
        &mut out,
        &mut err,
    );
    let s = |v: Vec<u8>| String::from_utf8(v).expect("UTF-8 output");
    (code, s(out), s(err))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    vireo_fuzz::bounded(data.len(), || {
        let explained = explain_input(text);
        let (table_code, table, table_err) = run_cli(text, false);
        let (json_code, json, json_err) = run_cli(text, true);
        match explained {
            Ok(e) => {
                assert_eq!(e.prediction.vifs.len(), e.vifs.len());
                for (i, (v, p)) in e.vifs.iter().zip(&e.prediction.vifs).enumerate() {
                    assert_eq!((v.index, p.index, v.id), (i, i, p.port));
                }
                let doc: Value = serde_json::from_str(text).expect("accepted text is JSON");
                let ni = NetworkInfo::parse(&doc["network_info"].to_string())
                    .expect("accepted network_info parses as text");
                let again = predict(&e.operation, &ni.vifs, &e.wiring);
                assert_eq!(again.as_ref(), Ok(&e.prediction), "the text path disagrees");

                assert_eq!((table_code, json_code), (0, 0), "{table_err}{json_err}");
                assert!(table_err.is_empty() && json_err.is_empty());
                // Header (operation, wiring, blank, columns), one row per VIF, blank, summary.
                assert_eq!(table.lines().count(), 4 + e.vifs.len() + 2, "{table}");
                let out: Value = serde_json::from_str(&json).expect("--json output is JSON");
                let tags: Vec<&str> = ["bind_time", "plug_time", "none"]
                    .iter()
                    .flat_map(|k| out[k].as_array().expect("a list"))
                    .map(|ev| ev["tag"].as_str().expect("a tag"))
                    .collect();
                assert_eq!(tags.len(), e.vifs.len(), "every VIF in exactly one list");
                for v in &e.vifs {
                    assert!(tags.contains(&v.id.to_string().as_str()));
                }
            }
            Err(err) => {
                if let ExplainError::UnknownOperation(op) = &err {
                    assert!(!OPERATIONS.contains(&op.as_str()));
                }
                for (code, out, msg) in [
                    (table_code, &table, &table_err),
                    (json_code, &json, &json_err),
                ] {
                    assert_eq!(code, EXIT_INVALID_INPUT, "{err}");
                    assert!(out.is_empty(), "output despite {err}: {out}");
                    assert!(
                        msg.starts_with(&format!("vireo events explain: error[{}]: ", err.kind()))
                            && msg.ends_with('\n')
                            && msg.lines().count() == 1,
                        "{msg:?}"
                    );
                }
            }
        }
    });
});
