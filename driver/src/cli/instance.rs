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

use crate::agent::model::{rfc3339, CreateInstance, Instance, OpState, OpStatus};
use crate::client::{to_json, AgentClient};
use vireo_actors::instance::Operation;

use super::remote::{block_on, client, read_json, report, table, RemoteError};
use super::ClientOpts;

/// How often `--wait` polls.
pub const POLL_EVERY: Duration = Duration::from_millis(250);

/// The actions `vireo instance action` takes: every request the API's action endpoint takes
/// (create and delete have their own commands).
pub const API_ACTIONS: [&str; 17] = [
    "power-on",
    "power-off",
    "reboot-soft",
    "reboot-hard",
    "pause",
    "unpause",
    "suspend",
    "resume",
    "resize",
    "confirm-resize",
    "revert-resize",
    "live-migrate",
    "attach-interface",
    "detach-interface",
    "plug-vifs",
    "unplug-vifs",
    "cleanup-for-reschedule",
];

/// `vireo instance ...`.
#[derive(Debug, Subcommand)]
pub enum InstanceCommand {
    /// Create (spawn) an instance from a JSON request.
    Create(CreateArgs),
    /// List the instances.
    List(ListArgs),
    /// Show one instance: state, power state, VIFs, in-flight operation and awaited events.
    Show(ShowArgs),
    /// Delete an instance.
    Delete(DeleteArgs),
    /// Run an action: power-on, power-off, reboot-soft, reboot-hard, pause, unpause, suspend,
    /// resume, resize, confirm-resize, revert-resize, live-migrate, attach-interface,
    /// detach-interface, plug-vifs, unplug-vifs, cleanup-for-reschedule.
    Action(ActionArgs),
    /// Show an operation (and with --wait, follow it to its end).
    Operation(OperationArgs),
}

/// `vireo instance create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The request, JSON: {"uuid"?, "name"?, "flavor": {"name", "vcpus", "memory_mb",
    /// "root_gb"?, "ephemeral_gb"?, "swap_mb"?}, "image"?, "ports"? | "network_info"?,
    /// "power_on"?}; `-` reads standard input. Example: {"flavor": {"name": "m1.tiny",
    /// "vcpus": 1, "memory_mb": 64}}.
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
    /// The action.
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(API_ACTIONS))]
    pub action: String,
    /// resize: the new flavor as JSON {"name", "vcpus", "memory_mb", "root_gb"?, ...}.
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
                finish_op(&c, op, &Follow::new(a.wait, &a.client), stdout, stderr).await
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
                finish_op(&c, op, &Follow::new(a.wait, &a.client), stdout, stderr).await
            })
        }
        InstanceCommand::Action(a) => {
            let action = build_action(&a, stdin)?;
            let c = client(&a.client)?;
            block_on(async {
                let op = c.action(a.uuid, &action).await?;
                finish_op(&c, op, &Follow::new(a.wait, &a.client), stdout, stderr).await
            })
        }
        InstanceCommand::Operation(a) => {
            let c = client(&a.client)?;
            block_on(async {
                let op = c.operation(a.id).await?;
                finish_op(&c, op, &Follow::new(a.wait, &a.client), stdout, stderr).await
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

/// How `--wait` shows an operation while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ProgressStyle {
    /// `live` when standard error is a terminal, else `plain`.
    #[default]
    Auto,
    /// One status line redrawn in place (elapsed time, phase, awaited events and the time
    /// left on their wait); each finished phase stays on its own line.
    Live,
    /// A line per phase change, and a line every 10 s while nothing changes.
    Plain,
}

/// How often `plain` progress repeats an unchanged state.
pub const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// One poll's progress: `key` changes with the phase (its name, before any `:` detail) and the
/// awaited events; `text` is the line shown.
pub fn progress_line(op: &OpStatus, inst: Option<&Instance>, now_ms: u64) -> (String, String) {
    let started_ms = op.started_ms;
    let elapsed_ms = now_ms.saturating_sub(started_ms);
    let kind = op.kind.to_string();
    instance_progress(&kind, op.instance, op.state.as_str(), elapsed_ms, inst)
}

/// [`progress_line`] from its parts: what runs (`kind` on `instance`, in `state`), the time
/// since it started as the caller knows it, and the instance as the driver shows it (its
/// own elapsed time wins).
pub fn instance_progress(
    kind: &str,
    instance: Uuid,
    state: &str,
    elapsed_ms: u64,
    inst: Option<&Instance>,
) -> (String, String) {
    let running = inst.and_then(|i| i.operation.as_ref());
    let elapsed_ms = running
        .map(|o| o.elapsed_ms)
        .filter(|ms| *ms > 0)
        .unwrap_or(elapsed_ms);
    let mut text = format!(
        "[+{:.1}s] {kind} {instance}: {state}",
        elapsed_ms as f64 / 1000.0
    );
    let mut key = state.to_owned();
    if let Some(o) = running {
        if let Some(phase) = o.phase.as_ref().filter(|p| !p.is_empty()) {
            text.push_str(&format!(", phase {phase}"));
            key.push('|');
            key.push_str(phase.split(':').next().unwrap_or(phase));
        }
        if !o.waiting_for.is_empty() {
            let w: Vec<String> = o
                .waiting_for
                .iter()
                .map(|e| format!("{} {}", e.name, e.tag))
                .collect();
            text.push_str(&format!(", waiting for {}", w.join(", ")));
            key.push('|');
            key.push_str(&w.join(","));
            if let Some(left) = o.wait_remaining_ms {
                text.push_str(&format!(" ({} s left)", left.div_ceil(1000)));
            }
        }
    }
    (key, text)
}

/// Renders the polls of `--wait` (see [`ProgressStyle`]).
#[derive(Debug)]
pub struct ProgressView {
    live: bool,
    key: String,
    last_plain: Option<std::time::Instant>,
    open: bool,
}

impl ProgressView {
    /// A view; `live` redraws one line in place.
    pub fn new(live: bool) -> Self {
        ProgressView {
            live,
            key: String::new(),
            last_plain: None,
            open: false,
        }
    }

    /// Show one poll.
    pub fn update(
        &mut self,
        op: &OpStatus,
        inst: Option<&Instance>,
        out: &mut dyn Write,
    ) -> std::io::Result<()> {
        if op.state != OpState::Running {
            return Ok(());
        }
        let (key, text) = progress_line(op, inst, crate::agent::ops::now_ms());
        self.show(key, &text, out)
    }

    /// Show one line of progress; `key` says whether it is news (see [`progress_line`]).
    pub fn show(&mut self, key: String, text: &str, out: &mut dyn Write) -> std::io::Result<()> {
        let changed = key != self.key;
        if self.live {
            if changed && self.open {
                // The finished phase stays on its own line.
                writeln!(out)?;
            }
            write!(out, "\r\x1b[2K{text}")?;
            self.open = true;
        } else {
            let due = self.last_plain.is_none_or(|t| t.elapsed() >= PLAIN_EVERY);
            if changed || due {
                writeln!(out, "{text}")?;
                self.last_plain = Some(std::time::Instant::now());
            }
        }
        out.flush()?;
        self.key = key;
        Ok(())
    }

    /// End the live line.
    pub fn finish(&mut self, out: &mut dyn Write) -> std::io::Result<()> {
        if self.open {
            writeln!(out)?;
            self.open = false;
        }
        Ok(())
    }
}

async fn finish_op(
    c: &AgentClient,
    op: OpStatus,
    opts: &Follow,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<(), RemoteError> {
    let op = if opts.wait && op.state == OpState::Running {
        let mut view = ProgressView::new(opts.live);
        let mut io_err = None;
        let done = c
            .wait(op.id, POLL_EVERY, |op, inst| {
                if let Err(e) = view.update(op, inst, stderr) {
                    io_err.get_or_insert(e);
                }
            })
            .await?;
        view.finish(stderr)?;
        if let Some(e) = io_err {
            return Err(RemoteError::Write(e));
        }
        done
    } else {
        op
    };
    if opts.json {
        writeln!(stdout, "{}", to_json(&op))?;
    } else {
        write!(stdout, "{}", op_text(&op))?;
    }
    if op.state == OpState::Failed {
        return Err(RemoteError::OperationFailed(op.id));
    }
    Ok(())
}

/// What `finish_op` does after the agent accepted an operation.
#[derive(Debug, Clone, Copy)]
struct Follow {
    wait: bool,
    json: bool,
    live: bool,
}

impl Follow {
    fn new(wait: bool, client: &ClientOpts) -> Self {
        let live = match client.progress {
            ProgressStyle::Live => true,
            ProgressStyle::Plain => false,
            ProgressStyle::Auto => std::io::IsTerminal::is_terminal(&std::io::stderr()),
        };
        Follow {
            wait,
            json: client.json,
            live,
        }
    }
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
    s.push_str(&format!("started {}\n", rfc3339(op.started_ms)));
    if let (Some(end), start) = (op.finished_ms, op.started_ms) {
        s.push_str(&format!(
            "finished {}, took {} ms\n",
            rfc3339(end),
            end.saturating_sub(start)
        ));
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
                wait_remaining_ms: Some(298_500),
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

    fn running_op() -> OpStatus {
        OpStatus {
            id: Uuid::nil(),
            instance: Uuid::nil(),
            kind: OpKind::Create,
            state: OpState::Running,
            started_ms: 1_764_906_000_000,
            started_at: String::new(),
            finished_ms: None,
            finished_at: None,
            report: None,
            error: None,
        }
    }

    #[test]
    fn progress_lines_name_elapsed_phase_events_and_time_left() {
        let (key, l) = progress_line(&running_op(), Some(&inst()), 0);
        assert!(
            l.starts_with("[+1.5s] create 00000000-0000-0000-0000-000000000000: running"),
            "{l}"
        );
        assert!(l.contains("phase wait for events"), "{l}");
        assert!(
            l.contains("waiting for network-vif-plugged p1 (299 s left)"),
            "{l}"
        );
        // The key ignores counters and a phase's detail.
        let mut i = inst();
        if let Some(o) = i.operation.as_mut() {
            o.elapsed_ms = 9_000;
            o.wait_remaining_ms = Some(1_000);
        }
        assert_eq!(progress_line(&running_op(), Some(&i), 0).0, key);
        let migrate = |detail: &str| {
            let mut i = inst();
            if let Some(o) = i.operation.as_mut() {
                o.phase = Some(format!("migrate: {detail}"));
                o.waiting_for.clear();
            }
            progress_line(&running_op(), Some(&i), 0)
        };
        let (k1, t1) = migrate("900 of 1024 MiB left");
        let (k2, t2) = migrate("100 of 1024 MiB left");
        assert_eq!(k1, k2);
        assert_ne!(t1, t2);
        assert!(t2.contains("phase migrate: 100 of 1024 MiB left"), "{t2}");
        // Before the driver reports progress: elapsed from the operation's start.
        let (_, l) = progress_line(&running_op(), None, 1_764_906_002_500);
        assert!(l.starts_with("[+2.5s] create"), "{l}");
    }

    #[test]
    fn live_progress_redraws_one_line_and_keeps_finished_phases() {
        let mut out = Vec::new();
        let mut v = ProgressView::new(true);
        let mut i = inst();
        v.update(&running_op(), Some(&i), &mut out).unwrap();
        v.update(&running_op(), Some(&i), &mut out).unwrap();
        if let Some(o) = i.operation.as_mut() {
            o.phase = Some("plug".into());
            o.waiting_for.clear();
        }
        v.update(&running_op(), Some(&i), &mut out).unwrap();
        v.finish(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("\r\x1b[2K").count(), 3, "{text:?}");
        // Two lines: the finished wait phase, then the plug phase.
        assert_eq!(text.matches('\n').count(), 2, "{text:?}");
        assert!(text.ends_with("phase plug\n"), "{text:?}");
    }

    #[test]
    fn plain_progress_prints_changes_only() {
        let mut out = Vec::new();
        let mut v = ProgressView::new(false);
        let mut i = inst();
        for _ in 0..3 {
            v.update(&running_op(), Some(&i), &mut out).unwrap();
        }
        if let Some(o) = i.operation.as_mut() {
            o.phase = Some("plug".into());
        }
        v.update(&running_op(), Some(&i), &mut out).unwrap();
        v.finish(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.contains('\r'), "{text:?}");
    }

    #[test]
    fn operations_show_rfc3339_times() {
        let mut op = running_op();
        op.state = OpState::Succeeded;
        op.finished_ms = Some(op.started_ms + 1_234);
        let t = op_text(&op);
        assert!(t.contains("started 2025-12-05T03:40:00.000Z"), "{t}");
        assert!(
            t.contains("finished 2025-12-05T03:40:01.234Z, took 1234 ms"),
            "{t}"
        );
    }

    #[test]
    fn the_action_list_is_every_api_action() {
        use vireo_actors::lifecycle::{Caller, Request};
        let api: Vec<&str> = Request::ALL
            .iter()
            .filter(|r| r.caller() == Caller::Api)
            .filter(|r| !matches!(r, Request::Spawn | Request::Destroy))
            .map(|r| r.as_str())
            .collect();
        let mut listed = API_ACTIONS.to_vec();
        listed.sort_unstable();
        let mut want = api.clone();
        want.sort_unstable();
        assert_eq!(listed, want);
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
