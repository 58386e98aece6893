//! `vireo events explain`: which VIF of an operation produces which network event, and why.
//!
//! Reads one JSON document on stdin:
//! `{"operation": ..., "network_info": [...], "migration": {"source_compute", "dest_compute"},
//! "wiring": {"ovs_native": ..., "linux_bridge": ...}}` (`migration` where the operation moves
//! the instance; `wiring` optional, `libvirt-managed` or `pre-created`, default
//! libvirt-managed). `network_info` is Nova's cache format, so an operator can paste a real
//! instance's. Prints the prediction as a table, or with `--json` as
//! `{"bind_time": [{"name", "tag", "reason"}], "plug_time": [...], "none": [{"tag", "reason"}]}`,
//! every VIF in exactly one list, in `network_info` order. Invalid input: exit code 2 and the
//! typed error on stderr.

use std::error::Error as _;
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use vireo_actors::predict::{self, DeviceForm, EventOp, Prediction, Timing, Wiring};
use vireo_actors::vif::{NetworkInfo, Vif, VifError};

use super::{ExplainArgs, EXIT_INVALID_INPUT, EXIT_IO};

/// The operations `explain` takes, in the order shown to users.
pub const OPERATIONS: [&str; 10] = [
    "spawn",
    "hard-reboot",
    "power-on",
    "finish-resize",
    "revert-resize",
    "live-migration",
    "post-live-migration",
    "attach-interface",
    "update-binding-profile",
    "clear-binding-profile",
];

/// Why the input could not be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// Standard input could not be read.
    #[error("could not read standard input")]
    Read(#[source] io::Error),
    /// The document is not JSON of the expected shape.
    #[error("input is not a valid explain document")]
    Json(#[source] serde_json::Error),
    /// The operation is not one of [`OPERATIONS`].
    #[error("unknown operation {0:?} (expected one of: {ops})", ops = OPERATIONS.join(", "))]
    UnknownOperation(String),
    /// The operation moves the instance and `migration` (or one of its hosts) is missing.
    #[error("operation {operation} needs \"migration\" with a non-empty \"{field}\"")]
    MissingMigration {
        /// The operation.
        operation: &'static str,
        /// The missing key.
        field: &'static str,
    },
    /// A `wiring` value is not `libvirt-managed` or `pre-created`.
    #[error("invalid wiring.{field}: {value:?} (expected libvirt-managed or pre-created)")]
    Wiring {
        /// The key.
        field: &'static str,
        /// The value given.
        value: String,
    },
    /// `network_info` is invalid.
    #[error("invalid network_info")]
    NetworkInfo(#[source] VifError),
    /// A VIF or the migration cannot be predicted.
    #[error("cannot predict the events")]
    Predict(#[source] predict::PredictError),
    /// The output could not be written.
    #[error("could not write the output")]
    Write(#[source] io::Error),
}

impl ExplainError {
    /// A short kind for the error line on stderr.
    pub fn kind(&self) -> &'static str {
        match self {
            ExplainError::Read(_) => "read",
            ExplainError::Json(_) => "json",
            ExplainError::UnknownOperation(_) => "unknown-operation",
            ExplainError::MissingMigration { .. } => "missing-migration",
            ExplainError::Wiring { .. } => "wiring",
            ExplainError::NetworkInfo(_) => "network-info",
            ExplainError::Predict(_) => "prediction",
            ExplainError::Write(_) => "write",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    operation: String,
    network_info: Value,
    #[serde(default)]
    migration: Option<MigrationIn>,
    #[serde(default)]
    wiring: Option<WiringIn>,
}

/// Only the two hosts are read; other keys of a pasted migration record are ignored.
#[derive(Debug, Deserialize)]
struct MigrationIn {
    #[serde(default)]
    source_compute: Option<String>,
    #[serde(default)]
    dest_compute: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WiringIn {
    #[serde(default)]
    ovs_native: Option<String>,
    #[serde(default)]
    linux_bridge: Option<String>,
}

/// A parsed, predicted input.
#[derive(Debug)]
pub struct Explained {
    /// The operation.
    pub operation: EventOp,
    /// The wiring assumed.
    pub wiring: Wiring,
    /// The VIFs.
    pub vifs: Vec<Vif>,
    /// The prediction.
    pub prediction: Prediction,
}

fn parse_operation(name: &str, migration: Option<&MigrationIn>) -> Result<EventOp, ExplainError> {
    let hosts = |operation: &'static str| -> Result<(String, String), ExplainError> {
        let get = |v: Option<&String>, field: &'static str| match v {
            Some(s) if !s.is_empty() => Ok(s.clone()),
            _ => Err(ExplainError::MissingMigration { operation, field }),
        };
        let m = migration.ok_or(ExplainError::MissingMigration {
            operation,
            field: "source_compute",
        })?;
        Ok((
            get(m.source_compute.as_ref(), "source_compute")?,
            get(m.dest_compute.as_ref(), "dest_compute")?,
        ))
    };
    Ok(match name {
        "spawn" => EventOp::Spawn,
        "hard-reboot" => EventOp::HardReboot,
        "power-on" => EventOp::PowerOn,
        "attach-interface" => EventOp::AttachInterface,
        "update-binding-profile" => EventOp::UpdateBindingProfile,
        "clear-binding-profile" => EventOp::ClearBindingProfile,
        "finish-resize" => {
            let (s, d) = hosts("finish-resize")?;
            EventOp::FinishResize { same_host: s == d }
        }
        "revert-resize" => {
            let (source, dest) = hosts("revert-resize")?;
            EventOp::RevertResize { source, dest }
        }
        "live-migration" => {
            let (source, dest) = hosts("live-migration")?;
            EventOp::LiveMigration { source, dest }
        }
        "post-live-migration" => {
            let (source, dest) = hosts("post-live-migration")?;
            EventOp::PostLiveMigration { source, dest }
        }
        other => return Err(ExplainError::UnknownOperation(other.to_owned())),
    })
}

fn parse_form(field: &'static str, v: Option<String>) -> Result<DeviceForm, ExplainError> {
    match v {
        None => Ok(DeviceForm::default()),
        Some(s) => s
            .parse()
            .map_err(|_| ExplainError::Wiring { field, value: s }),
    }
}

/// Parse and predict one explain document.
pub fn explain_input(text: &str) -> Result<Explained, ExplainError> {
    let input: Input = serde_json::from_str(text).map_err(ExplainError::Json)?;
    let operation = parse_operation(&input.operation, input.migration.as_ref())?;
    let w = input.wiring.unwrap_or(WiringIn {
        ovs_native: None,
        linux_bridge: None,
    });
    let wiring = Wiring {
        ovs_native: parse_form("ovs_native", w.ovs_native)?,
        linux_bridge: parse_form("linux_bridge", w.linux_bridge)?,
    };
    let vifs = NetworkInfo::from_value(&input.network_info)
        .map_err(ExplainError::NetworkInfo)?
        .vifs;
    let prediction = predict::predict(&operation, &vifs, &wiring).map_err(ExplainError::Predict)?;
    Ok(Explained {
        operation,
        wiring,
        vifs,
        prediction,
    })
}

#[derive(Debug, Serialize)]
struct EventOut {
    name: &'static str,
    tag: String,
    reason: &'static str,
}

#[derive(Debug, Serialize)]
struct NoneOut {
    tag: String,
    reason: &'static str,
}

#[derive(Debug, Serialize)]
struct JsonOut {
    bind_time: Vec<EventOut>,
    plug_time: Vec<EventOut>,
    none: Vec<NoneOut>,
}

fn json_out(p: &Prediction) -> JsonOut {
    let mut out = JsonOut {
        bind_time: Vec::new(),
        plug_time: Vec::new(),
        none: Vec::new(),
    };
    for v in &p.vifs {
        let event = || EventOut {
            name: "network-vif-plugged",
            tag: v.port.to_string(),
            reason: v.reason,
        };
        match v.timing {
            Timing::BindTime => out.bind_time.push(event()),
            Timing::PlugTime => out.plug_time.push(event()),
            Timing::None => out.none.push(NoneOut {
                tag: v.port.to_string(),
                reason: v.reason,
            }),
        }
    }
    out
}

fn describe(op: &EventOp) -> String {
    // Host names come from the input: keep each on the one line it is printed on.
    let (source, dest) = match op {
        EventOp::RevertResize { source, dest }
        | EventOp::LiveMigration { source, dest }
        | EventOp::PostLiveMigration { source, dest } => (one_line(source), one_line(dest)),
        _ => (String::new(), String::new()),
    };
    match op {
        EventOp::FinishResize { same_host } => format!(
            "finish-resize ({}, destination side)",
            if *same_host {
                "same host"
            } else {
                "cross-host"
            }
        ),
        EventOp::RevertResize { source: s, dest: d } => format!(
            "revert-resize ({}: back from {dest} to {source})",
            if s == d { "same host" } else { "cross-host" }
        ),
        EventOp::LiveMigration { .. } => {
            format!("live-migration ({source} -> {dest}, source side, destination pre-wired)")
        }
        EventOp::PostLiveMigration { .. } => format!(
            "post-live-migration ({source} -> {dest}, destination side, bindings activated)"
        ),
        other => other.name().to_owned(),
    }
}

fn write_table(e: &Explained, w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "operation: {}", describe(&e.operation))?;
    writeln!(
        w,
        "wiring:    ovs native taps {}, linux bridge taps {}",
        e.wiring.ovs_native.as_str(),
        e.wiring.linux_bridge.as_str()
    )?;
    writeln!(w)?;
    writeln!(
        w,
        "{:<3} {:<36}  {:<16} {:<16} {:<29} {:<9}  REASON",
        "#", "PORT", "VIF_TYPE", "VNIC_TYPE", "KIND", "WAIT"
    )?;
    for (v, p) in e.vifs.iter().zip(&e.prediction.vifs) {
        writeln!(
            w,
            "{:<3} {:<36}  {:<16} {:<16} {:<29} {:<9}  {}",
            p.index,
            p.port.to_string(),
            v.vif_type.as_str(),
            v.vnic_type.as_str(),
            p.kind.label(),
            p.timing.as_str(),
            p.reason
        )?;
    }
    let (b, pl) = (
        e.prediction.bind_time_events().len(),
        e.prediction.plug_time_events().len(),
    );
    writeln!(w)?;
    writeln!(
        w,
        "wait: {b} network-vif-plugged event(s) registered before the binding update, \
         {pl} before the plug; {} VIF(s) not waited for",
        e.prediction.not_waited().count()
    )
}

fn explain_to(
    args: ExplainArgs,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
) -> Result<(), ExplainError> {
    let mut text = String::new();
    stdin
        .read_to_string(&mut text)
        .map_err(ExplainError::Read)?;
    let e = explain_input(&text)?;
    if args.json {
        serde_json::to_writer_pretty(&mut *stdout, &json_out(&e.prediction))
            .map_err(|err| ExplainError::Write(err.into()))?;
        writeln!(stdout).map_err(ExplainError::Write)?;
    } else {
        write_table(&e, stdout).map_err(ExplainError::Write)?;
    }
    stdout.flush().map_err(ExplainError::Write)
}

/// `text` with control characters (newlines, terminal escapes) and bidirectional overrides
/// escaped: error messages quote input (an unknown key, a port id) verbatim, and the error
/// must stay one line that cannot rewrite the operator's terminal (found by fuzzing).
fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Run `vireo events explain`: returns the exit code (0, 2 for invalid input, 1 for I/O).
pub fn run(
    args: ExplainArgs,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    match explain_to(args, stdin, stdout) {
        Ok(()) => 0,
        Err(err) => {
            let mut line = format!("vireo events explain: error[{}]: {err}", err.kind());
            let mut source = err.source();
            while let Some(s) = source {
                line.push_str(": ");
                line.push_str(&s.to_string());
                source = s.source();
            }
            let _ = writeln!(stderr, "{}", one_line(&line));
            match err {
                ExplainError::Write(_) | ExplainError::Read(_) => EXIT_IO,
                _ => EXIT_INVALID_INPUT,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use vireo_actors::predict::{PredictError, Unsupported};

    const P1: &str = "a4c4d6c2-1111-4c3b-9a55-0e5c4c7b0001";
    const P2: &str = "a4c4d6c2-2222-4c3b-9a55-0e5c4c7b0002";

    fn vif(id: &str, mac: &str, hybrid: bool) -> Value {
        json!({"id": id, "address": mac, "type": "ovs", "vnic_type": "normal",
               "details": {"ovs_hybrid_plug": hybrid}, "network": {"bridge": "br-int"}})
    }

    fn doc(op: &str, migration: Option<Value>) -> String {
        let mut d = json!({"operation": op,
            "network_info": [vif(P1, "fa:16:3e:00:00:01", true), vif(P2, "fa:16:3e:00:00:02", false)]});
        if let Some(m) = migration {
            d["migration"] = m;
        }
        d.to_string()
    }

    fn run_str(json: bool, input: &str) -> (u8, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(
            ExplainArgs { json },
            &mut input.as_bytes(),
            &mut out,
            &mut err,
        );
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn revert_cross_host_json_is_exactly_the_specified_shape() {
        let m =
            json!({"source_compute": "h1", "dest_compute": "h2", "status": "reverting", "id": 7});
        let (code, out, err) = run_str(true, &doc("revert-resize", Some(m)));
        assert_eq!((code, err.as_str()), (0, ""));
        let v: Value = serde_json::from_str(&out).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 3);
        assert_eq!(v["bind_time"].as_array().unwrap().len(), 1);
        assert_eq!(v["bind_time"][0]["name"], "network-vif-plugged");
        assert_eq!(v["bind_time"][0]["tag"], P1);
        assert!(v["bind_time"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("stayed wired"));
        assert_eq!(v["plug_time"][0]["tag"], P2);
        assert_eq!(v["none"], json!([]));
        assert_eq!(v["plug_time"][0].as_object().unwrap().len(), 3);
    }

    #[test]
    fn none_entries_have_tag_and_reason_only() {
        let (code, out, _) = run_str(
            true,
            &doc(
                "live-migration",
                Some(json!({"source_compute": "h1", "dest_compute": "h2"})),
            ),
        );
        assert_eq!(code, 0);
        let v: Value = serde_json::from_str(&out).unwrap();
        let none = v["none"].as_array().unwrap();
        assert_eq!(none.len(), 2);
        assert_eq!(none[0]["tag"], P1);
        assert_eq!(none[1]["tag"], P2);
        assert_eq!(none[0].as_object().unwrap().len(), 2);
    }

    #[test]
    fn table_shows_every_vif_with_its_wait_and_reason() {
        let (code, out, _) = run_str(false, &doc("hard-reboot", None));
        assert_eq!(code, 0);
        let lines: Vec<&str> = out.lines().collect();
        let row1 = lines.iter().find(|l| l.contains(P1)).unwrap();
        let row2 = lines.iter().find(|l| l.contains(P2)).unwrap();
        assert!(
            row1.contains("ovs-hybrid") && row1.contains("none"),
            "{row1}"
        );
        assert!(
            row2.contains("ovs-native (libvirt-managed)") && row2.contains("plug-time"),
            "{row2}"
        );
        assert!(out.contains("operation: hard-reboot"));
        assert!(out.contains("1 before the plug"));
    }

    #[test]
    fn wiring_changes_the_answer() {
        let mut d: Value = serde_json::from_str(&doc("hard-reboot", None)).unwrap();
        d["wiring"] = json!({"ovs_native": "pre-created"});
        let e = explain_input(&d.to_string()).unwrap();
        assert!(e.prediction.plug_time_events().is_empty());
        d["wiring"] = json!({"ovs_native": "precreated"});
        let err = explain_input(&d.to_string()).unwrap_err();
        assert!(matches!(
            err,
            ExplainError::Wiring {
                field: "ovs_native",
                ..
            }
        ));
    }

    #[test]
    fn invalid_inputs_are_typed_errors_with_exit_code_2() {
        let cases: Vec<(String, &str)> = vec![
            ("{not json".into(), "json"),
            (json!({"operation": "spawn"}).to_string(), "json"),
            (
                json!({"operation": "spawn", "network_info": [], "extra": 1}).to_string(),
                "json",
            ),
            (doc("reboot", None), "unknown-operation"),
            (doc("revert-resize", None), "missing-migration"),
            (
                doc("live-migration", Some(json!({"source_compute": "h1"}))),
                "missing-migration",
            ),
            (
                doc(
                    "live-migration",
                    Some(json!({"source_compute": "h1", "dest_compute": "h1"})),
                ),
                "prediction",
            ),
            (
                json!({"operation": "spawn", "network_info": {}}).to_string(),
                "network-info",
            ),
        ];
        for (input, kind) in cases {
            let (code, out, err) = run_str(true, &input);
            assert_eq!(code, 2, "{input}");
            assert!(out.is_empty());
            assert!(
                err.starts_with(&format!("vireo events explain: error[{kind}]")),
                "{err}"
            );
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }

    // Found by the `explain_input` fuzz target (fuzz/): serde's "unknown field" error quotes
    // the key verbatim, so a key holding a newline or a terminal escape split the one error
    // line (or rewrote the terminal); host names did the same in the table's first line.
    #[test]
    fn input_text_cannot_break_the_one_line_error_or_the_table() {
        let input = "{\"operation\":\"spawn\",\"network_info\":[],\"at0\\n\\u001b[2J\\u202e\":1}";
        let (code, out, err) = run_str(false, input);
        assert_eq!(code, 2);
        assert!(out.is_empty());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            !err.contains('\u{1b}') && !err.contains('\u{202e}'),
            "{err:?}"
        );
        assert!(err.contains("at0\\n\\u{1b}[2J\\u{202e}"), "{err:?}");

        let hosts = json!({"source_compute": "h1\nwait: forged", "dest_compute": "h2\u{1b}[1A"});
        for op in ["revert-resize", "live-migration", "post-live-migration"] {
            let (code, table, _) = run_str(false, &doc(op, Some(hosts.clone())));
            assert_eq!(code, 0, "{op}");
            let first = table.lines().next().unwrap();
            assert!(
                first.contains("h1\\nwait: forged") && first.contains("h2\\u{1b}[1A"),
                "{first}"
            );
            assert!(!table.contains('\u{1b}'));
            assert_eq!(
                table.lines().filter(|l| l.starts_with("wait:")).count(),
                1,
                "{table}"
            );
        }
        // Hosts that differ only in what escaping shows alike are still different hosts.
        let m = json!({"source_compute": "a\nb", "dest_compute": "a\\nb"});
        let (_, table, _) = run_str(false, &doc("revert-resize", Some(m)));
        assert!(
            table.starts_with("operation: revert-resize (cross-host"),
            "{table}"
        );
    }

    #[test]
    fn the_vif_error_names_the_vif_port_and_field() {
        let mut d: Value = serde_json::from_str(&doc("spawn", None)).unwrap();
        d["network_info"][1]["details"]["ovs_hybrid_plug"] = json!("yes");
        let err = explain_input(&d.to_string()).unwrap_err();
        assert!(
            matches!(&err, ExplainError::NetworkInfo(VifError::Field { index: 1, field, .. }) if field == "details.ovs_hybrid_plug")
        );
        let (_, _, stderr) = run_str(false, &d.to_string());
        assert!(
            stderr.contains("VIF 1") && stderr.contains(P2) && stderr.contains("ovs_hybrid_plug"),
            "{stderr}"
        );
    }

    #[test]
    fn an_unusable_vnic_type_is_a_prediction_error() {
        let mut d: Value = serde_json::from_str(&doc("spawn", None)).unwrap();
        d["network_info"][0]["vnic_type"] = json!("baremetal");
        let err = explain_input(&d.to_string()).unwrap_err();
        assert!(matches!(
            err,
            ExplainError::Predict(PredictError::Unsupported {
                index: 0,
                why: Unsupported::NotOnLibvirt,
                ..
            })
        ));
    }

    #[test]
    fn every_operation_name_is_accepted() {
        let m = json!({"source_compute": "h1", "dest_compute": "h2"});
        for op in OPERATIONS {
            let e = explain_input(&doc(op, Some(m.clone()))).unwrap();
            assert_eq!(e.operation.name(), op);
        }
    }
}
