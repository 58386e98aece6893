//! `vireo events send`: post external events to a running agent, exactly as Neutron's Nova
//! notifier does (`POST /v2.1/os-server-external-events`).
//!
//! One event from the flags (`--server`, `--name`, `--tag`, `--status`), or a whole body from
//! `--file` (`{"events": [...]}` or a bare list; `-` reads standard input). Prints each
//! event's code as a table, or with `--json` the agent's answer. Exit codes: 0 when every
//! event was accepted (HTTP 200), 1 when some or all were not (207) or the agent could not be
//! reached, 2 for invalid input.

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::Args;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::client::{to_json, EventsReply};

use super::remote::{block_on, client, read_json, report, table, RemoteError};
use super::ClientOpts;

/// The event names Nova's API knows (`--name`).
pub const EVENT_NAMES: [&str; 8] = [
    "network-vif-plugged",
    "network-vif-unplugged",
    "network-vif-deleted",
    "network-changed",
    "volume-extended",
    "power-update",
    "accelerator-request-bound",
    "volume-reimaged",
];

/// Options of `vireo events send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// The instance (one event from flags).
    #[arg(long, conflicts_with = "file", required_unless_present = "file")]
    pub server: Option<Uuid>,
    /// Event name.
    #[arg(long, default_value = "network-vif-plugged",
          value_parser = clap::builder::PossibleValuesParser::new(EVENT_NAMES))]
    pub name: String,
    /// The tag (the port id for network events).
    #[arg(long)]
    pub tag: Option<String>,
    /// The event's status.
    #[arg(long, default_value = "completed",
          value_parser = clap::builder::PossibleValuesParser::new(["completed", "failed", "in-progress"]))]
    pub status: String,
    /// A whole body: {"events": [...]} or a list of events; `-` reads standard input.
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// How to reach the agent.
    #[command(flatten)]
    pub client: ClientOpts,
}

/// The request body from the arguments.
pub fn body(args: &SendArgs, stdin: &mut dyn Read) -> Result<Value, RemoteError> {
    if let Some(f) = &args.file {
        return Ok(match read_json(f, stdin)? {
            Value::Array(list) => json!({ "events": list }),
            other => other,
        });
    }
    let server = args
        .server
        .ok_or_else(|| RemoteError::Input("--server or --file is required".into()))?;
    let mut e =
        json!({"name": args.name, "server_uuid": server.to_string(), "status": args.status});
    if let Some(t) = &args.tag {
        e["tag"] = Value::from(t.clone());
    }
    Ok(json!({ "events": [e] }))
}

/// Run the subcommand; returns the exit code.
pub fn run(
    args: SendArgs,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    match send(&args, stdin, stdout) {
        Ok(true) => 0,
        Ok(false) => super::EXIT_FAILED,
        Err(e) => report("events send", &e, stderr),
    }
}

fn send(
    args: &SendArgs,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
) -> Result<bool, RemoteError> {
    let body = body(args, stdin)?;
    let c = client(&args.client)?;
    let bytes = serde_json::to_vec(&body).map_err(|e| RemoteError::Input(e.to_string()))?;
    let reply = block_on(async { Ok(c.send_events_raw(bytes).await?) })?;
    if args.client.json {
        writeln!(
            stdout,
            "{}",
            to_json(&json!({"status": reply.status, "events": reply.events}))
        )?;
    } else {
        write!(stdout, "{}", reply_text(&reply))?;
    }
    Ok(reply.status == 200)
}

/// The answer as text: the HTTP status, then one row per event.
pub fn reply_text(r: &EventsReply) -> String {
    let rows: Vec<Vec<String>> = r
        .events
        .iter()
        .map(|e| {
            vec![
                e.name.clone(),
                e.server_uuid.clone(),
                e.tag.clone().unwrap_or_else(|| "-".into()),
                e.status.clone(),
                e.code.to_string(),
            ]
        })
        .collect();
    format!(
        "HTTP {}\n{}",
        r.status,
        table(&["EVENT", "SERVER", "TAG", "STATUS", "CODE"], &rows)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> SendArgs {
        SendArgs {
            server: Some(Uuid::nil()),
            name: "network-vif-plugged".into(),
            tag: Some("p1".into()),
            status: "failed".into(),
            file: None,
            client: ClientOpts::default(),
        }
    }

    #[test]
    fn one_event_from_flags() {
        let b = body(&args(), &mut &b""[..]).unwrap();
        assert_eq!(
            b,
            json!({"events": [{"name": "network-vif-plugged",
                "server_uuid": "00000000-0000-0000-0000-000000000000",
                "status": "failed", "tag": "p1"}]})
        );
    }

    #[test]
    fn a_bare_list_from_stdin_is_wrapped() {
        let mut a = args();
        a.server = None;
        a.file = Some(PathBuf::from("-"));
        let mut stdin: &[u8] = br#"[{"name": "network-changed", "server_uuid": "x"}]"#;
        let b = body(&a, &mut stdin).unwrap();
        assert_eq!(b["events"][0]["name"], "network-changed");
    }
}
