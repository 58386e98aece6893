//! `vireo instance create|list|show|delete|action|operation`: the instance API of a running
//! agent, as tables or (`--json`) the agent's JSON.
//!
//! Long operations answer with an operation id at once; `--wait` polls it, printing progress
//! lines on stderr (the step and the events the instance waits for) and exits 1 when it
//! fails. Exit codes: 0 done, 1 the agent refused or failed, 2 invalid input.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use crate::agent::model::{CreateInstance, Instance, OpState, OpStatus};
use crate::client::{to_json, AgentClient};
use vireo_actors::instance::Operation;

use super::remote::{block_on, client, read_json, report, table, RemoteError};
use super::ClientOpts;

/// How often `--wait` polls.
pub const POLL_EVERY: Duration = Duration::from_millis(250);

/// `vireo instance ...`.
#[derive(Debug, Subcommand)]
pub enum InstanceCommand {
    /// Create (spawn) an instance from a JSON request (see docs/AGENT.md).
    Create(CreateArgs),
    /// List the instances.
    List(ListArgs),
    /// Show one instance: state, power state, VIFs, in-flight operation and awaited events.
    Show(ShowArgs),
    /// Delete an instance.
    Delete(DeleteArgs),
    /// Run an action: power-on, power-off, reboot-soft, reboot-hard, pause, unpause, suspend,
    /// resume, resize, confirm-resize, revert-resize, live-migrate, attach-interface,
    /// detach-interface, cleanup-for-reschedule.
    Action(ActionArgs),
    /// Show an operation (and with --wait, follow it to its end).
    Operation(OperationArgs),
}

/// `vireo instance create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The request: {"uuid"?, "name"?, "flavor", "image"?, "ports"? | "network_info"?,
    /// "power_on"?}; `-` reads standard input.
    #[arg(long, value_name = "FILE")]
    pub file: PathBuf,
    /// Follow the operation until it ends.
    #[arg(long)]
    pub wait: bool,
    /// How to reach the agent.
    #[command(flatten)]
    pub client: ClientOpts,
}

/// `vireo instance list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// How to reach the agent.
    #[command(flatten)]
    pub client: ClientOpts,
}

/// `vireo instance show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The instance.
    pub uuid: Uuid,
    /// How to reach the agent.
    #[command(flatten)]
    pub client: ClientOpts,
}

/// `vireo instance delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// The instance.
    pub uuid: Uuid,
    /// Keep its ports (do not release the networking).
    #[arg(long)]
    pub keep_network: bool,
    /// Follow the operation until it ends.
    #[arg(long)]
    pub wait: bool,
    /// How to reach the agent.
    #[command(flatten)]
    pub client: ClientOpts,
}

/// `vireo instance action`.
#[derive(Debug, Args)]
pub struct ActionArgs {
    /// The instance.
    pub uuid: Uuid,
    /// The action name.
    pub action: String,
    /// resize: the new flavor as JSON {"name", "vcpus", "memory_mib", ...}.
    #[arg(long, value_name = "FILE")]
    pub flavor: Option<PathBuf>,
    /// resize, live-migrate: the destination host.
    #[arg(long)]
    pub dest_host: Option<String>,
    /// power-off: seconds the guest gets before the domain is destroyed.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    /// attach-interface: one network_info entry as JSON.
    #[arg(long, value_name = "FILE")]
    pub vif: Option<PathBuf>,
    /// detach-interface: the port id.
    #[arg(long)]
    pub port_id: Option<String>,
    /// Follow the operation until it ends.
    #[arg(long)]
    pub wait: bool,
    /// How to reach the agent.
    #[command(flatten)]
    pub client: ClientOpts,
}

/// `vireo instance operation`.
#[derive(Debug, Args)]
pub struct OperationArgs {
    /// The operation id.
    pub id: Uuid,
    /// Follow the operation until it ends.
    #[arg(long)]
    pub wait: bool,
    /// How to reach the agent.
    #[command(flatten)]
    pub client: ClientOpts,
}

/// Run the subcommand; returns the exit code.
pub fn run(
    cmd: InstanceCommand,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let name = match &cmd {
        InstanceCommand::Create(_) => "instance create",
        InstanceCommand::List(_) => "instance list",
        InstanceCommand::Show(_) => "instance show",
        InstanceCommand::Delete(_) => "instance delete",
        InstanceCommand::Action(_) => "instance action",
        InstanceCommand::Operation(_) => "instance operation",
    };
    match dispatch(cmd, stdin, stdout, stderr) {
        Ok(()) => 0,
        Err(e) => report(name, &e, stderr),
    }
}

fn dispatch(
    cmd: InstanceCommand,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<(), RemoteError> {
    match cmd {
        InstanceCommand::Create(a) => {
            let v = read_json(&a.file, stdin)?;
            let req: CreateInstance = serde_json::from_value(v)
                .map_err(|e| RemoteError::Input(format!("create request: {e}")))?;
            let c = client(&a.client)?;
            block_on(async {
                let op = c.create_instance(&req).await?;
                finish_op(&c, op, a.wait, a.client.json, stdout, stderr).await
            })
        }
        InstanceCommand::List(a) => {
            let c = client(&a.client)?;
            let list = block_on(async { Ok(c.list_instances().await?) })?;
            if a.client.json {
                writeln!(stdout, "{}", to_json(&json!({ "instances": list })))?;
            } else {
                write!(stdout, "{}", list_table(&list))?;
            }
            Ok(())
        }
        InstanceCommand::Show(a) => {
            let c = client(&a.client)?;
            let inst = block_on(async { Ok(c.show_instance(a.uuid).await?) })?;
            if a.client.json {
                writeln!(stdout, "{}", to_json(&inst))?;
            } else {
                write!(stdout, "{}", show_text(&inst))?;
            }
            Ok(())
        }
        InstanceCommand::Delete(a) => {
            let c = client(&a.client)?;
            block_on(async {
                let op = c.delete_instance(a.uuid, !a.keep_network).await?;
                finish_op(&c, op, a.wait, a.client.json, stdout, stderr).await
            })
        }
        InstanceCommand::Action(a) => {
            let action = build_action(&a, stdin)?;
            let c = client(&a.client)?;
            block_on(async {
                let op = c.action(a.uuid, &action).await?;
                finish_op(&c, op, a.wait, a.client.json, stdout, stderr).await
            })
        }
        InstanceCommand::Operation(a) => {
            let c = client(&a.client)?;
            block_on(async {
                let op = c.operation(a.id).await?;
                finish_op(&c, op, a.wait, a.client.json, stdout, stderr).await
            })
        }
    }
}

/// The action request from the arguments: `{"action": NAME, ...}` checked by the same
/// schema the agent uses.
pub fn build_action(a: &ActionArgs, stdin: &mut dyn Read) -> Result<Operation, RemoteError> {
    let mut m = Map::new();
    m.insert("action".into(), Value::from(a.action.clone()));
    if let Some(f) = &a.flavor {
        m.insert("flavor".into(), read_json(f, stdin)?);
    }
    if let Some(h) = &a.dest_host {
        m.insert("dest_host".into(), Value::from(h.clone()));
    }
    if let Some(t) = a.timeout {
        m.insert("timeout".into(), Value::from(t));
    }
    if let Some(f) = &a.vif {
        m.insert("vif".into(), read_json(f, stdin)?);
    }
    if let Some(p) = &a.port_id {
        m.insert("port_id".into(), Value::from(p.clone()));
    }
    serde_json::from_value(Value::Object(m))
        .map_err(|e| RemoteError::Input(format!("action {:?}: {e}", a.action)))
}

/// The progress line for a poll (printed when it changes).
pub fn progress_line(op: &OpStatus, inst: Option<&Instance>) -> String {
    let mut line = format!("{} {}: {}", op.kind, op.instance, op.state.as_str());
    if let Some(o) = inst.and_then(|i| i.operation.as_ref()) {
        if let Some(phase) = &o.phase {
            line.push_str(&format!(", phase {phase}"));
        }
        if !o.waiting_for.is_empty() {
            let w: Vec<String> = o
                .waiting_for
                .iter()
                .map(|e| format!("{} {}", e.name, e.tag))
                .collect();
            line.push_str(&format!(", waiting for {}", w.join(", ")));
        }
    }
    line
}

async fn finish_op(
    c: &AgentClient,
    op: OpStatus,
    wait: bool,
    json: bool,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<(), RemoteError> {
    let op = if wait && op.state == OpState::Running {
        let mut last = String::new();
        let mut io_err = None;
        let done = c
            .wait(op.id, POLL_EVERY, |op, inst| {
                let line = progress_line(op, inst);
                if line != last && op.state == OpState::Running {
                    if let Err(e) = writeln!(stderr, "{line}") {
                        io_err.get_or_insert(e);
                    }
                    last = line;
                }
            })
            .await?;
        if let Some(e) = io_err {
            return Err(RemoteError::Write(e));
        }
        done
    } else {
        op
    };
    if json {
        writeln!(stdout, "{}", to_json(&op))?;
    } else {
        write!(stdout, "{}", op_text(&op))?;
    }
    if op.state == OpState::Failed {
        return Err(RemoteError::OperationFailed(op.id));
    }
    Ok(())
}

/// `vireo instance list` as a table.
pub fn list_table(list: &[Instance]) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|i| {
            vec![
                i.uuid.to_string(),
                i.name.clone().unwrap_or_else(|| "-".into()),
                i.state.clone(),
                i.power_state.clone(),
                i.vifs.len().to_string(),
                i.operation
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |o| o.kind.clone()),
            ]
        })
        .collect();
    table(
        &["UUID", "NAME", "STATE", "POWER", "VIFS", "OPERATION"],
        &rows,
    )
}

/// `vireo instance show` as text.
pub fn show_text(i: &Instance) -> String {
    let dash = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
    let mut s = format!(
        "uuid:         {}\nname:         {}\nhost:         {}\nstate:        {}\npower state:  {}\nflavor:       {}\n",
        i.uuid,
        dash(&i.name),
        i.host,
        i.state,
        i.power_state,
        dash(&i.flavor)
    );
    match &i.operation {
        None => s.push_str("operation:    -\n"),
        Some(o) => {
            s.push_str(&format!("operation:    {}", o.kind));
            if let Some(id) = o.id {
                s.push_str(&format!(" ({id})"));
            }
            s.push('\n');
            if let Some(phase) = &o.phase {
                s.push_str(&format!("phase:        {phase} ({} ms)\n", o.elapsed_ms));
            }
            for (n, e) in o.waiting_for.iter().enumerate() {
                let label = if n == 0 { "waiting for:" } else { "" };
                s.push_str(&format!("{label:<14}{} {}\n", e.name, e.tag));
            }
        }
    }
    if i.vifs.is_empty() {
        s.push_str("vifs:         -\n");
    } else {
        s.push_str("vifs:\n");
        let rows: Vec<Vec<String>> = i
            .vifs
            .iter()
            .map(|v| {
                vec![
                    v.port.clone(),
                    v.mac.clone(),
                    v.vif_type.clone(),
                    v.vnic_type.clone(),
                    if v.hybrid { "yes" } else { "no" }.into(),
                    v.device.clone(),
                ]
            })
            .collect();
        for line in table(&["PORT", "MAC", "TYPE", "VNIC", "HYBRID", "DEVICE"], &rows).lines() {
            s.push_str("  ");
            s.push_str(line);
            s.push('\n');
        }
    }
    s
}

/// An operation as text.
pub fn op_text(op: &OpStatus) -> String {
    let mut s = format!(
        "operation {} ({} of {}): {}\n",
        op.id,
        op.kind,
        op.instance,
        op.state.as_str()
    );
    if let (Some(end), start) = (op.finished_ms, op.started_ms) {
        s.push_str(&format!("took {} ms\n", end.saturating_sub(start)));
    }
    if let Some(e) = &op.error {
        s.push_str(&format!("error {}: {}\n", e.code, e.message));
    }
    if let Some(steps) = op
        .report
        .as_ref()
        .and_then(|r| r.get("steps"))
        .and_then(Value::as_array)
    {
        let steps: Vec<&str> = steps
            .iter()
            .filter_map(|st| st.get("name").and_then(Value::as_str))
            .collect();
        if !steps.is_empty() {
            s.push_str(&format!("steps: {}\n", steps.join(" → ")));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::model::{AwaitedEvent, InstanceOperation, InstanceVif, OpKind};

    fn inst() -> Instance {
        Instance {
            uuid: Uuid::nil(),
            host: "h1".into(),
            name: Some("vm1".into()),
            state: "building".into(),
            power_state: "paused".into(),
            flavor: Some("m1.tiny".into()),
            vcpus: Some(1),
            memory_mb: Some(64),
            disks: vec![],
            vifs: vec![InstanceVif {
                port: "p1".into(),
                mac: "fa:16:3e:00:00:01".into(),
                vif_type: "ovs".into(),
                vnic_type: "normal".into(),
                hybrid: true,
                device: "tapp1".into(),
            }],
            operation: Some(InstanceOperation {
                id: None,
                kind: "create".into(),
                phase: Some("wait for events".into()),
                elapsed_ms: 1500,
                waiting_for: vec![AwaitedEvent {
                    name: "network-vif-plugged".into(),
                    tag: "p1".into(),
                }],
            }),
            last_operation: None,
        }
    }

    #[test]
    fn show_text_has_progress_and_vifs() {
        let s = show_text(&inst());
        assert!(s.contains("state:        building"), "{s}");
        assert!(s.contains("phase:        wait for events (1500 ms)"), "{s}");
        assert!(s.contains("waiting for:  network-vif-plugged p1"), "{s}");
        assert!(
            s.contains("  p1    fa:16:3e:00:00:01  ovs   normal  yes     tapp1"),
            "{s}"
        );
    }

    #[test]
    fn progress_lines_name_phase_and_events() {
        let op = OpStatus {
            id: Uuid::nil(),
            instance: Uuid::nil(),
            kind: OpKind::Create,
            state: OpState::Running,
            started_ms: 0,
            finished_ms: None,
            report: None,
            error: None,
        };
        let l = progress_line(&op, Some(&inst()));
        assert!(l.starts_with("create 00000000-0000-0000-0000-000000000000: running"));
        assert!(l.contains("phase wait for events"), "{l}");
        assert!(l.contains("waiting for network-vif-plugged p1"), "{l}");
    }

    #[test]
    fn actions_are_checked_before_sending() {
        let args = |action: &str| ActionArgs {
            uuid: Uuid::nil(),
            action: action.into(),
            flavor: None,
            dest_host: None,
            timeout: None,
            vif: None,
            port_id: None,
            wait: false,
            client: ClientOpts::default(),
        };
        let mut stdin: &[u8] = b"";
        assert!(matches!(
            build_action(&args("pause"), &mut stdin).unwrap(),
            Operation::Pause {}
        ));
        assert!(matches!(
            build_action(&args("explode"), &mut stdin),
            Err(RemoteError::Input(_))
        ));
        assert!(
            build_action(&args("live-migrate"), &mut stdin).is_err(),
            "needs dest_host"
        );
        let mut a = args("live-migrate");
        a.dest_host = Some("h2".into());
        let Operation::LiveMigrate(lm) = build_action(&a, &mut stdin).unwrap() else {
            panic!("not a live migration")
        };
        assert_eq!(lm.dest_host.as_str(), "h2");
        let mut a = args("power-off");
        a.timeout = Some(5);
        assert!(matches!(
            build_action(&a, &mut stdin).unwrap(),
            Operation::PowerOff { timeout: Some(t) } if t.as_secs() == 5
        ));
        let mut a = args("pause");
        a.port_id = Some("x".into());
        assert!(
            build_action(&a, &mut stdin).is_err(),
            "unknown field for pause"
        );
    }
}
