//! The fault matrix of docs/FAULTS.md: the operations (rows), the fault families (columns),
//! the subject every case starts from, how a case is run, what it must end in, and the checks
//! after it. The `faults_*.rs` tests run one test per operation and family; each case ends
//! with the instance where the matrix says, consistent, then destroyed and leak-checked.
//!
//! The expected outcome of every case is written here ([`Expect`]), independently of what
//! the run does; `faults_doc.rs` renders the matrix from the same data and requires
//! docs/FAULTS.md to hold it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use uuid::Uuid;
use vireo::compute::{ComputeDriver, ComputeOps};
use vireo_actors::external::{EventName, EventStatus, ExternalEvent};
use vireo_actors::instance::{
    DestroyArgs, InstanceError, LiveMigrateArgs, Migration, OpReport, RebootKind, ResizeArgs,
};
use vireo_actors::lifecycle::InstanceState;
use vireo_actors::network::{unbind_update, NetworkApi, PortRequest, PortStatus, PortUpdate};
use vireo_actors::plug::testing::{FaultMode, InjectedFault};
use vireo_actors::plug::PlugStep;
use vireo_actors::vif::{PortId, Vif};

use super::common::*;

/// Generous bound on one operation: nothing here comes near it unless a wait hangs.
pub const OP_BOUND: Duration = Duration::from_secs(60);

/// The rows of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Spawn,
    HardReboot,
    SoftReboot,
    PowerOff,
    PowerOn,
    Resize,
    ResizeSameHost,
    Confirm,
    Revert,
    RevertSameHost,
    LiveMigration,
    Rollback,
    Reschedule,
    Attach,
    Detach,
    Destroy,
}

impl Op {
    pub const ALL: [Op; 16] = [
        Op::Spawn,
        Op::HardReboot,
        Op::SoftReboot,
        Op::PowerOff,
        Op::PowerOn,
        Op::Resize,
        Op::ResizeSameHost,
        Op::Confirm,
        Op::Revert,
        Op::RevertSameHost,
        Op::LiveMigration,
        Op::Rollback,
        Op::Reschedule,
        Op::Attach,
        Op::Detach,
        Op::Destroy,
    ];

    /// The row's name in the document.
    pub fn label(&self) -> &'static str {
        match self {
            Op::Spawn => "spawn",
            Op::HardReboot => "hard reboot",
            Op::SoftReboot => "soft reboot",
            Op::PowerOff => "power off",
            Op::PowerOn => "power on",
            Op::Resize => "resize (h1 → h2)",
            Op::ResizeSameHost => "resize (same host)",
            Op::Confirm => "confirm (h1 → h2)",
            Op::Revert => "revert (h1 → h2)",
            Op::RevertSameHost => "revert (same host)",
            Op::LiveMigration => "live migration",
            Op::Rollback => "live-migration rollback",
            Op::Reschedule => "reschedule clean-up",
            Op::Attach => "attach interface",
            Op::Detach => "detach interface",
            Op::Destroy => "destroy",
        }
    }

    /// The test function of each family for this row.
    pub fn test_name(&self) -> &'static str {
        match self {
            Op::Spawn => "spawn",
            Op::HardReboot => "hard_reboot",
            Op::SoftReboot => "soft_reboot",
            Op::PowerOff => "power_off",
            Op::PowerOn => "power_on",
            Op::Resize => "resize",
            Op::ResizeSameHost => "resize_same_host",
            Op::Confirm => "confirm",
            Op::Revert => "revert",
            Op::RevertSameHost => "revert_same_host",
            Op::LiveMigration => "live_migration",
            Op::Rollback => "rollback",
            Op::Reschedule => "reschedule",
            Op::Attach => "attach",
            Op::Detach => "detach",
            Op::Destroy => "destroy",
        }
    }

    /// The hosts a case needs.
    pub fn hosts(&self) -> &'static [&'static str] {
        match self {
            Op::Resize | Op::Confirm | Op::Revert | Op::LiveMigration | Op::Rollback => {
                &["h1", "h2"]
            }
            _ => &["h1"],
        }
    }

    /// Where the operation's own (first fatal, or consuming) event wait runs, and the
    /// request that runs it there.
    pub fn wait_at(&self) -> Option<(&'static str, &'static str)> {
        match self {
            Op::Spawn => Some(("h1", "spawn")),
            Op::HardReboot => Some(("h1", "reboot-hard")),
            Op::SoftReboot => Some(("h1", "reboot-soft")),
            Op::PowerOn => Some(("h1", "power-on")),
            Op::Resize => Some(("h2", "finish-resize")),
            Op::ResizeSameHost => Some(("h1", "resize")),
            Op::Revert => Some(("h1", "finish-revert-resize")),
            Op::RevertSameHost => Some(("h1", "revert-resize")),
            Op::LiveMigration | Op::Rollback => Some(("h1", "live-migrate")),
            Op::Attach => Some(("h1", "attach-interface")),
            _ => None,
        }
    }

    /// The wait is fatal (a lost or failed event fails it); the live-migration waits only
    /// consume the events of the operation's own `binding:profile` updates.
    pub fn fatal_wait(&self) -> bool {
        self.wait_at().is_some() && !matches!(self, Op::LiveMigration | Op::Rollback)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// It did what it was asked.
    Completed,
    /// It failed and undid what it did (`RolledBack`, `BuildFailed`).
    RolledBack,
    /// It failed and left the instance in a consistent state that destroy (or the recovery
    /// the state says) finishes.
    Error,
}

impl Outcome {
    pub fn of(r: &Result<OpReport, InstanceError>) -> Outcome {
        match r {
            Ok(_) => Outcome::Completed,
            Err(InstanceError::RolledBack { .. } | InstanceError::BuildFailed { .. }) => {
                Outcome::RolledBack
            }
            Err(_) => Outcome::Error,
        }
    }

    pub fn short(&self) -> &'static str {
        match self {
            Outcome::Completed => "ok",
            Outcome::RolledBack => "RB",
            Outcome::Error => "ERR",
        }
    }
}

/// Where the instance is after a case: each host that knows it, with its state. A host not
/// listed must not know it.
pub type Place = Vec<(&'static str, InstanceState)>;

/// What a case must end in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Expect {
    pub outcome: Outcome,
    pub at: Place,
}

impl Expect {
    pub fn new(outcome: Outcome, at: &[(&'static str, InstanceState)]) -> Expect {
        Expect {
            outcome,
            at: at.to_vec(),
        }
    }

    /// `ok → h1:running`, `RB → gone`, ...
    pub fn short(&self) -> String {
        let at = if self.at.is_empty() {
            "gone".to_owned()
        } else {
            self.at
                .iter()
                .map(|(h, s)| format!("{h}:{s}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        format!("{} → {at}", self.outcome.short())
    }
}

use InstanceState as S;

/// The places a completed operation leaves the instance in.
pub fn completed_at(op: Op) -> Place {
    match op {
        Op::Spawn
        | Op::HardReboot
        | Op::SoftReboot
        | Op::PowerOn
        | Op::Revert
        | Op::RevertSameHost
        | Op::Attach
        | Op::Detach => vec![("h1", S::Running)],
        // The test driver has no migration API: every live migration here is rolled back.
        Op::LiveMigration | Op::Rollback => vec![("h1", S::Running)],
        Op::PowerOff => vec![("h1", S::Stopped)],
        Op::Resize => vec![("h1", S::ResizeSource), ("h2", S::ResizeTarget)],
        Op::ResizeSameHost => vec![("h1", S::ResizeTarget)],
        Op::Confirm => vec![("h2", S::Running)],
        Op::Reschedule | Op::Destroy => vec![],
    }
}

/// What an operation ends in without any fault.
pub fn clean(op: Op) -> Expect {
    let outcome = match op {
        Op::LiveMigration | Op::Rollback => Outcome::RolledBack,
        _ => Outcome::Completed,
    };
    Expect {
        outcome,
        at: completed_at(op),
    }
}

/// The places an operation that failed at its main step and rolled back leaves the
/// instance in (the state it started from).
pub fn started_at(op: Op) -> Place {
    match op {
        Op::Spawn => vec![],
        Op::PowerOn => vec![("h1", S::Stopped)],
        Op::Confirm | Op::Revert => vec![("h1", S::ResizeSource), ("h2", S::ResizeTarget)],
        Op::RevertSameHost => vec![("h1", S::ResizeTarget)],
        Op::Reschedule => vec![("h1", S::Error)],
        _ => vec![("h1", S::Running)],
    }
}

// ----------------------------------------------------------------------------------------
// The subject of a case

/// The instance a case works on: three ports (OVS hybrid and Linux bridge created by vireo,
/// a user-supplied OVS native port), and what some operations need besides.
#[derive(Debug, Clone)]
pub struct Subject {
    pub id: Uuid,
    pub name: String,
    /// The instance's ports (known once it is built).
    pub ports: Vec<PortId>,
    /// User-supplied ports (unbound, not deleted, when the instance goes; the test deletes
    /// them after the leak check).
    pub user: Vec<PortId>,
    /// The port attach plugs (bound to h1 for the instance by the caller).
    pub extra: Option<(PortId, Vif)>,
    /// The port detach removes.
    pub detach: Option<PortId>,
    /// Another instance on h1 (for events delivered to the wrong instance).
    pub bystander: Option<Uuid>,
}

fn migration(src: &str, dst: &str) -> Migration {
    Migration {
        id: Uuid::new_v4(),
        source_host: src.into(),
        dest_host: dst.into(),
    }
}

pub fn spawn_requests(user: PortId) -> Vec<PortRequest> {
    vec![
        on(NET_HYBRID),
        PortRequest::Port { port_id: user },
        on(NET_LB),
    ]
}

/// Build the subject of `op` (`name` must be unique in the cloud).
pub async fn setup(op: Op, c: &TestCloud, name: &str, bystander: bool) -> Subject {
    let h1 = c.host("h1");
    let id = Uuid::new_v4();
    let user = c.user_port(NET_NATIVE).await;
    let mut s = Subject {
        id,
        name: name.to_owned(),
        ports: Vec::new(),
        user: vec![user],
        extra: None,
        detach: None,
        bystander: None,
    };
    if bystander {
        let b = Uuid::new_v4();
        h1.driver
            .spawn(b, spawn_args(&format!("{name}-by"), vec![on(NET_HYBRID)]))
            .await
            .unwrap();
        s.bystander = Some(b);
    }
    if op == Op::Spawn {
        return s;
    }
    if op == Op::Reschedule {
        // A build whose plug and whose release of the networking both fail: the host side
        // is clean, the networking still held, the instance in error.
        h1.plugger
            .faults()
            .fail_once(PlugStep::OvsTransact, Some(user));
        h1.net.fail(NetCall::Deallocate, 0);
        let e = h1
            .driver
            .spawn(id, spawn_args(name, spawn_requests(user)))
            .await
            .unwrap_err();
        assert!(
            matches!(e, InstanceError::RollbackFailed { .. }),
            "{}",
            chain(&e)
        );
        h1.plugger.faults().clear();
        s.ports = instance_ports(c, id).await;
        return s;
    }
    h1.driver
        .spawn(id, spawn_args(name, spawn_requests(user)))
        .await
        .unwrap();
    s.ports = instance_ports(c, id).await;
    match op {
        Op::PowerOn => {
            h1.driver.power_off(id, None).await.unwrap();
        }
        Op::Confirm | Op::Revert => {
            h1.driver
                .resize(
                    id,
                    ResizeArgs::of(&migration("h1", "h2"), flavor("m1.small", 2, 512)),
                )
                .await
                .unwrap();
        }
        Op::RevertSameHost => {
            h1.driver
                .resize(
                    id,
                    ResizeArgs::of(&migration("h1", "h1"), flavor("m1.small", 2, 512)),
                )
                .await
                .unwrap();
        }
        Op::Attach => {
            let extra = c.user_port(NET_NATIVE).await;
            c.network
                .update_port(
                    extra,
                    &PortUpdate {
                        host_id: Some("h1".into()),
                        device_id: Some(id.to_string()),
                        device_owner: Some("compute:nova".into()),
                        ..PortUpdate::default()
                    },
                )
                .await
                .unwrap();
            let vif = network_info(&*c.network, &[extra]).await.vifs.remove(0);
            s.user.push(extra);
            s.extra = Some((extra, vif));
        }
        Op::Detach => {
            // The Linux-bridge port (created by vireo: the caller deletes it once detached).
            let view = h1.driver.show(id).await.unwrap();
            s.detach = Some(ports_by_network(c, &view).await[NET_LB]);
        }
        _ => {}
    }
    settle(c, &s).await;
    s
}

/// The ports the service has for the instance.
pub async fn instance_ports(c: &TestCloud, id: Uuid) -> Vec<PortId> {
    c.network
        .list_instance_ports(id)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.id)
        .collect()
}

/// Wait until the service has heard of every device of the subject's running guest (so no
/// event of the set-up is still on its way when a case arms its fault).
pub async fn settle(c: &TestCloud, s: &Subject) {
    let running = places(c, s.id)
        .await
        .into_iter()
        .any(|(_, st)| st == S::Running);
    if running {
        for p in &s.ports {
            c.port_eventually(*p, PortStatus::Active).await;
        }
    }
}

/// Run the operation of `op` on the subject.
pub async fn run(op: Op, c: &TestCloud, s: &Subject) -> Result<OpReport, InstanceError> {
    let (h1, id) = (&c.host("h1").driver, s.id);
    let fut = async {
        match op {
            Op::Spawn => {
                h1.spawn(id, spawn_args(&s.name, spawn_requests(s.user[0])))
                    .await
            }
            Op::HardReboot => h1.reboot(id, RebootKind::Hard).await,
            Op::SoftReboot => h1.reboot(id, RebootKind::Soft).await,
            Op::PowerOff => h1.power_off(id, None).await,
            Op::PowerOn => h1.power_on(id).await,
            Op::Resize => {
                h1.resize(
                    id,
                    ResizeArgs::of(&migration("h1", "h2"), flavor("m1.small", 2, 512)),
                )
                .await
            }
            Op::ResizeSameHost => {
                h1.resize(
                    id,
                    ResizeArgs::of(&migration("h1", "h1"), flavor("m1.small", 2, 512)),
                )
                .await
            }
            Op::Confirm => c.host("h2").driver.confirm_resize(id).await,
            Op::Revert => c.host("h2").driver.revert_resize(id).await,
            Op::RevertSameHost => h1.revert_resize(id).await,
            Op::LiveMigration | Op::Rollback => {
                h1.live_migrate(id, LiveMigrateArgs::of(&migration("h1", "h2")))
                    .await
            }
            Op::Reschedule => h1.cleanup_for_reschedule(id).await,
            Op::Attach => {
                let (_, vif) = s.extra.clone().unwrap();
                h1.attach_interface(id, vif).await
            }
            Op::Detach => h1.detach_interface(id, s.detach.unwrap()).await,
            Op::Destroy => {
                h1.destroy(
                    id,
                    DestroyArgs {
                        deallocate_network: true,
                    },
                )
                .await
            }
        }
    };
    tokio::time::timeout(OP_BOUND, fut)
        .await
        .unwrap_or_else(|_| panic!("{op} did not finish within {OP_BOUND:?}: a wait hung"))
}

/// Run the operation in the background (the case holds it somewhere meanwhile).
pub fn start(
    op: Op,
    c: &std::sync::Arc<TestCloud>,
    s: &Subject,
) -> tokio::task::JoinHandle<Result<OpReport, InstanceError>> {
    let (c, s) = (c.clone(), s.clone());
    tokio::spawn(async move { run(op, &c, &s).await })
}

/// Each host that knows the instance, with its state.
pub async fn places(c: &TestCloud, id: Uuid) -> Vec<(String, InstanceState)> {
    let mut out = Vec::new();
    for h in &c.hosts {
        if let Ok(v) = h.driver.show(id).await {
            out.push((h.name.clone(), v.state));
        }
    }
    out
}

fn same_place(got: &[(String, InstanceState)], want: &Place) -> bool {
    got.len() == want.len()
        && want
            .iter()
            .all(|(h, s)| got.iter().any(|(gh, gs)| gh == h && gs == s))
}

/// The case ended as expected: the outcome, where the instance is, and that it is
/// consistent there.
pub async fn check(
    c: &TestCloud,
    s: &Subject,
    case: &str,
    want: &Expect,
    result: &Result<OpReport, InstanceError>,
) {
    let outcome = Outcome::of(result);
    let why = match result {
        Ok(_) => "ok".to_owned(),
        Err(e) => chain(e),
    };
    let got = places(c, s.id).await;
    assert!(
        outcome == want.outcome && same_place(&got, &want.at),
        "{case}: expected {}, got {} at {got:?} ({why})",
        want.short(),
        outcome.short()
    );
    consistent(c, s, case, &want.at).await;
}

/// Where the instance is in a stable state, its devices are there and its ports bound there;
/// where it is not, none of its devices is; no port has `migrating_to` or an inactive
/// binding left over; no wait is pending.
pub async fn consistent(c: &TestCloud, s: &Subject, case: &str, at: &Place) {
    let ports = record_ports(c, s).await;
    let mut known: BTreeSet<PortId> = all_ports(s).into_iter().collect();
    known.extend(s.user.iter().copied());
    known.extend(instance_ports(c, s.id).await);
    for h in &c.hosts {
        let here = at.iter().find(|(n, _)| *n == h.name).map(|(_, st)| *st);
        let plugged = h.plugger.plugged();
        match here {
            None => {
                for p in &known {
                    assert!(
                        !plugged.contains(p),
                        "{case}: {} keeps {p} plugged without the instance",
                        h.name
                    );
                }
            }
            Some(st @ (S::Running | S::Stopped | S::ResizeSource | S::ResizeTarget)) => {
                // A stopped guest's host devices are made again by the boot that starts it
                // (every boot plugs them all): they may be missing, as they were when a
                // failed power-on found them gone. Extra ones may not be there.
                for p in ports.iter().filter(|_| st != S::Stopped) {
                    assert!(
                        plugged.contains(p),
                        "{case}: {} misses the device of {p} ({:?})",
                        h.name,
                        here
                    );
                }
                for p in known.iter().filter(|p| !ports.contains(p)) {
                    assert!(
                        !plugged.contains(p),
                        "{case}: {} keeps {p} plugged, which the instance does not have",
                        h.name
                    );
                }
            }
            Some(_) => {}
        }
    }
    // The ports are bound where the instance runs (the resize target owns them).
    let owner = at
        .iter()
        .find(|(_, st)| *st == S::ResizeTarget)
        .or_else(|| {
            at.iter()
                .find(|(_, st)| matches!(st, S::Running | S::Stopped))
        })
        .map(|(h, _)| *h);
    // A failed step of an operation may leave what the step was to undo (an error state
    // says so): destroy removes it, which the clean-up checks.
    let errored = at.iter().any(|(_, st)| *st == S::Error);
    for p in &ports {
        let Ok(port) = c.network.get_port(*p).await else {
            continue;
        };
        if errored {
            continue;
        }
        assert_eq!(port.migrating_to(), None, "{case}: {port:?}");
        if let Ok(bindings) = c.network.show_bindings(*p).await {
            assert!(bindings.len() <= 1, "{case}: bindings left {bindings:?}");
        }
        if let Some(owner) = owner {
            assert_eq!(port.host_id, owner, "{case}: {port:?}");
            if at.iter().any(|(h, st)| *h == owner && *st == S::Running) {
                c.port_eventually(*p, PortStatus::Active).await;
            }
        }
    }
    eventually(Duration::from_secs(2), "no pending wait", || async {
        (c.stats().await.waits_now == 0).then_some(())
    })
    .await;
}

/// The ports the instance's record holds on the host where it is (all of its ports when no
/// host has a record of it).
async fn record_ports(c: &TestCloud, s: &Subject) -> Vec<PortId> {
    for h in &c.hosts {
        if let Ok(v) = h.driver.show(s.id).await {
            return ports(&v);
        }
    }
    Vec::new()
}

/// After a case: lift every fault, destroy the instance (which must work whatever state the
/// case left it in: it is not lost), do what the caller does with ports it attached or
/// detached, and require that nothing is left.
pub async fn cleanup(c: &TestCloud, s: &Subject) {
    lift_faults(c);
    c.sink.release_held();
    for id in [Some(s.id), s.bystander].into_iter().flatten() {
        for h in &c.hosts {
            let r = h
                .driver
                .destroy(
                    id,
                    DestroyArgs {
                        deallocate_network: true,
                    },
                )
                .await;
            if let Err(e) = r {
                panic!(
                    "destroy of {id} on {} after the case failed: {}",
                    h.name,
                    chain(&e)
                );
            }
        }
    }
    // The caller releases a port whose attach failed (Nova: deallocate_port_for_instance) and
    // deletes the port it detached.
    if let Some((extra, _)) = &s.extra {
        if let Ok(p) = c.network.get_port(*extra).await {
            if !p.device_id.is_empty() {
                c.network
                    .update_port(*extra, &unbind_update(&p))
                    .await
                    .unwrap();
            }
        }
    }
    if let Some(d) = s.detach {
        let _ = c.network.delete_port(d).await;
    }
    c.assert_clean(&s.user).await;
    for p in &s.user {
        assert_no_inactive_binding(c, *p).await;
    }
    c.delete_ports(&s.user).await;
    for h in &c.hosts {
        h.net.take_calls();
    }
}

/// Lift every armed fault and hold.
pub fn lift_faults(c: &TestCloud) {
    for h in &c.hosts {
        h.net.clear();
        h.plugger.faults().clear();
        h.gate.clear();
    }
    c.sink.set_event_fault(None);
    c.sink.set_event_scope(None);
}

/// The service is down on every host's seam (it is one service).
pub fn service_down(c: &TestCloud, down: bool) {
    for h in &c.hosts {
        h.net.set_down(down);
    }
}

/// A `network-vif-plugged` `completed` for each port (a copy of what the service sends).
pub fn plugged_events(id: Uuid, ports: &[PortId]) -> Vec<ExternalEvent> {
    ports
        .iter()
        .map(|p| ExternalEvent {
            name: EventName::NetworkVifPlugged,
            server_uuid: id,
            tag: Some(p.to_string()),
            status: EventStatus::Completed,
        })
        .collect()
}

/// Arm a fault at a plug step once (any port).
pub fn plug_fault(c: &TestCloud, host: &str, step: PlugStep, port: Option<PortId>) {
    c.host(host).plugger.faults().inject(InjectedFault {
        step,
        port,
        mode: FaultMode::Once,
    });
}

/// Every port of the subject, the attached one included.
pub fn all_ports(s: &Subject) -> Vec<PortId> {
    let mut v: BTreeSet<PortId> = s.ports.iter().copied().collect();
    if let Some((p, _)) = &s.extra {
        v.insert(*p);
    }
    v.into_iter().collect()
}

/// A unique name for case `n` of a test.
pub fn name(prefix: &str, n: usize) -> String {
    format!("vm-{prefix}-{n}")
}

// ----------------------------------------------------------------------------------------
// Network faults

/// One network call of an operation: the `nth` call of `call` (from 0) on `host`'s seam.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetPoint {
    pub host: &'static str,
    pub call: NetCall,
    pub nth: usize,
}

impl fmt::Display for NetPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} #{} on {}",
            self.call.as_str(),
            self.nth + 1,
            self.host
        )
    }
}

fn pts(host: &'static str, calls: &[(NetCall, usize)]) -> Vec<NetPoint> {
    calls
        .iter()
        .map(|&(call, nth)| NetPoint { host, call, nth })
        .collect()
}

/// Every network call the operation makes when nothing fails, in order (the recording of a
/// clean run must be exactly this). The live migration's calls are split between its row
/// (before the migration) and the rollback's row (the test driver cannot migrate, so every
/// live migration here rolls back).
pub fn net_points(op: Op) -> Vec<NetPoint> {
    use NetCall::*;
    // `ListPorts` after an event wait: the ports whose events released it are read back
    // (a stale event is not taken for the real one).
    match op {
        Op::Spawn => pts(
            "h1",
            &[
                (Allocate, 0),
                (GetPort, 0),
                (GetPort, 1),
                (GetPort, 2),
                (ListPorts, 0),
            ],
        ),
        Op::Resize => pts(
            "h2",
            &[
                (GetPort, 0),
                (UpdatePort, 0),
                (GetPort, 1),
                (UpdatePort, 1),
                (GetPort, 2),
                (UpdatePort, 2),
                (ListPorts, 0),
            ],
        ),
        Op::Revert => pts(
            "h1",
            &[
                (GetPort, 0),
                (GetPort, 1),
                (GetPort, 2),
                (GetPort, 3),
                (UpdatePort, 0),
                (GetPort, 4),
                (UpdatePort, 1),
                (GetPort, 5),
                (UpdatePort, 2),
                (ListPorts, 0),
                (ListPorts, 1),
            ],
        ),
        Op::LiveMigration => pts(
            "h1",
            &[
                (CreateBinding, 0),
                (CreateBinding, 1),
                (CreateBinding, 2),
                (GetPort, 0),
                (GetPort, 1),
                (GetPort, 2),
                (SetupNetworks, 0),
                (ListPorts, 0),
            ],
        ),
        Op::Rollback => pts(
            "h1",
            &[
                (GetPort, 3),
                (GetPort, 4),
                (GetPort, 5),
                (SetupNetworks, 1),
                (ListPorts, 1),
                (SetupNetworks, 2),
            ],
        ),
        // The user port's bindings are read first (what a failed migration rollback may
        // have left on it is taken off before it is unbound).
        Op::Reschedule | Op::Destroy => pts("h1", &[(ShowBindings, 0), (Deallocate, 0)]),
        Op::Attach => pts("h1", &[(GetPort, 0), (ListPorts, 0)]),
        Op::HardReboot | Op::SoftReboot | Op::PowerOn | Op::ResizeSameHost | Op::RevertSameHost => {
            pts("h1", &[(ListPorts, 0)])
        }
        _ => Vec::new(),
    }
}

/// The calls a clean run of the operation records (per host, in order).
pub fn net_recorded(op: Op) -> Vec<NetPoint> {
    match op {
        Op::LiveMigration | Op::Rollback => {
            let mut v = net_points(Op::LiveMigration);
            v.extend(net_points(Op::Rollback));
            v
        }
        _ => net_points(op),
    }
}

/// The client reads this answer as "already so" and goes on: a 404 on a removal or on a
/// port the composite flows skip, a 409 on creating or activating a binding. Reading the
/// ports back after an event wait goes on after any failure but the service staying down.
pub fn net_tolerated(call: NetCall, f: NetFailure) -> bool {
    if call == NetCall::ListPorts {
        return f != NetFailure::Down;
    }
    match f {
        NetFailure::Status(404) => matches!(
            call,
            NetCall::DeleteBinding
                | NetCall::DeletePort
                | NetCall::Deallocate
                | NetCall::SetupNetworks
                | NetCall::ShowBindings
        ),
        NetFailure::Status(409) => {
            matches!(call, NetCall::CreateBinding | NetCall::ActivateBinding)
        }
        _ => false,
    }
}

/// What a failure of the network call at `p` ends in. `Down` stays down for the rest of the
/// operation (its rollback included); the others fail that one call.
pub fn net_expect(op: Op, p: NetPoint, f: NetFailure) -> Expect {
    if net_tolerated(p.call, f) {
        return clean(op);
    }
    if p.call == NetCall::ListPorts {
        // Reading the ports back after a wait never fails the operation; a service that
        // is down stays down for the calls after it.
        let points = net_recorded(op);
        let next = points.iter().skip_while(|q| **q != p).nth(1);
        return match next {
            Some(q) => net_expect(op, *q, f),
            None => clean(op),
        };
    }
    let down = f == NetFailure::Down;
    let rb = |at: &[(&'static str, InstanceState)]| Expect::new(Outcome::RolledBack, at);
    let err = |at: &[(&'static str, InstanceState)]| Expect::new(Outcome::Error, at);
    match op {
        // allocate cleans up after itself; after it, the build is released unless the
        // service is down for the release too (then the record stays for destroy).
        Op::Spawn if p.call == NetCall::Allocate || !down => rb(&[]),
        Op::Spawn => err(&[("h1", S::Error)]),
        // The destination gives up, the source brings the instance back (it needs the
        // service for that: down, it cannot).
        Op::Resize if down => err(&[("h1", S::Error)]),
        Op::Resize => rb(&[("h1", S::Running)]),
        // The source cannot bring the instance back: its domain stays off.
        Op::Revert => err(&[("h1", S::Error)]),
        Op::LiveMigration if down => err(&[("h1", S::Error)]),
        Op::LiveMigration => rb(&[("h1", S::Running)]),
        // A failed step of the rollback: the guest runs on, flagged.
        Op::Rollback => err(&[("h1", S::Error)]),
        Op::Reschedule | Op::Destroy => err(&[("h1", S::Error)]),
        Op::Attach => rb(&[("h1", S::Running)]),
        _ => clean(op),
    }
}

// ----------------------------------------------------------------------------------------
// Plugging faults

use vireo_actors::plug::testing::{CallOutcome, PlugOp};
use vireo_actors::plug::{DomainForm, PlugContext, PlugKind};

/// One plugger call of an operation: `op` of the subject's VIF at `vif` (0 OVS hybrid,
/// 1 OVS native (the user port), 2 Linux bridge, 3 the attached OVS native port) on `host`;
/// `done` when it changed something in a clean run (false: the devices were there already,
/// or gone already).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlugCall {
    pub host: &'static str,
    pub op: PlugOp,
    pub vif: usize,
    pub done: bool,
}

impl PlugCall {
    /// The VIF kind at `vif`.
    pub fn kind(&self) -> PlugKind {
        match self.vif {
            0 => PlugKind::OvsHybrid,
            2 => PlugKind::LinuxBridge,
            _ => PlugKind::OvsNative,
        }
    }

    /// The host steps the call takes.
    pub fn steps(&self) -> &'static [PlugStep] {
        match self.op {
            PlugOp::Plug => self.kind().plug_steps(DomainForm::LibvirtManaged),
            PlugOp::Unplug => self.kind().unplug_steps(DomainForm::LibvirtManaged),
        }
    }
}

impl fmt::Display for PlugCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            PlugOp::Plug => "plug",
            PlugOp::Unplug => "unplug",
        };
        write!(f, "{op} {} on {}", self.kind(), self.host)
    }
}

fn calls(host: &'static str, op: PlugOp, done: bool, vifs: &[usize]) -> Vec<PlugCall> {
    vifs.iter()
        .map(|&vif| PlugCall {
            host,
            op,
            vif,
            done,
        })
        .collect()
}

/// Every plugger call the operation makes when nothing fails, in order per host (a clean
/// run must record exactly these).
pub fn plug_calls(op: Op) -> Vec<PlugCall> {
    use PlugOp::{Plug, Unplug};
    let all = [0, 1, 2];
    match op {
        Op::Spawn => calls("h1", Plug, true, &all),
        // Plugging is idempotent: a re-plug of devices that are there changes nothing (a
        // same-host revert keeps them wired too).
        Op::HardReboot | Op::SoftReboot | Op::PowerOn | Op::ResizeSameHost | Op::RevertSameHost => {
            calls("h1", Plug, false, &all)
        }
        Op::Resize | Op::LiveMigration => calls("h2", Plug, true, &all),
        Op::Confirm | Op::Destroy => calls("h1", Unplug, true, &all),
        Op::Revert => {
            let mut v = calls("h1", Plug, false, &all);
            v.extend(calls("h2", Unplug, true, &all));
            v
        }
        Op::Rollback => calls("h2", Unplug, true, &all),
        // The failed build left nothing plugged.
        Op::Reschedule => calls("h1", Unplug, false, &all),
        Op::Attach => calls("h1", Plug, true, &[3]),
        Op::Detach => calls("h1", Unplug, true, &[2]),
        Op::PowerOff => Vec::new(),
    }
}

/// What a clean run records (the live migration's row and its rollback's together).
pub fn plug_recorded(op: Op) -> Vec<PlugCall> {
    match op {
        Op::LiveMigration | Op::Rollback => {
            let mut v = plug_calls(Op::LiveMigration);
            v.extend(plug_calls(Op::Rollback));
            v
        }
        _ => plug_calls(op),
    }
}

/// The plugging columns of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PlugFamily {
    /// Open vSwitch does not answer (the OVSDB transaction or the wait for its port).
    OvsDown,
    /// A device by the name exists and is not vireo's, or the kernel refuses the device.
    NameTaken,
    /// The devices are there already (plug), or gone already (unplug), or missing where a
    /// re-plug expects them (removed outside vireo).
    ExistsOrGone,
}

pub fn step_family(step: PlugStep) -> PlugFamily {
    match step {
        PlugStep::OvsTransact | PlugStep::OvsWait | PlugStep::DeleteOvsPort => PlugFamily::OvsDown,
        _ => PlugFamily::NameTaken,
    }
}

/// What a failure at a step of `call` ends in (the devices of a call that changed nothing in
/// a clean run are removed outside vireo first, so that the steps run).
pub fn plug_expect(op: Op, call: &PlugCall) -> Expect {
    let rb = |at: &[(&'static str, InstanceState)]| Expect::new(Outcome::RolledBack, at);
    let err = |at: &[(&'static str, InstanceState)]| Expect::new(Outcome::Error, at);
    match (op, call.op) {
        (Op::Spawn, _) => rb(&[]),
        // The guest was down already: left down, devices plugged.
        (Op::HardReboot | Op::SoftReboot, _) => err(&[("h1", S::Error)]),
        (Op::PowerOn, _) => rb(&[("h1", S::Stopped)]),
        (Op::Resize | Op::LiveMigration | Op::ResizeSameHost | Op::Attach, _) => {
            rb(&[("h1", S::Running)])
        }
        (Op::Confirm, _) => err(&[("h1", S::Error), ("h2", S::ResizeTarget)]),
        (Op::Revert, PlugOp::Plug) => err(&[("h1", S::Error)]),
        (Op::Revert, PlugOp::Unplug) => err(&[("h1", S::ResizeSource), ("h2", S::Error)]),
        (Op::RevertSameHost, _) => err(&[("h1", S::Error)]),
        // The source rolls back whatever the destination could not remove; the destination
        // keeps its record of what is left there (destroy removes it).
        (Op::Rollback, _) => rb(&[("h1", S::Running), ("h2", S::Error)]),
        // The device went from the guest; its host side and the record stay.
        (Op::Detach, _) => err(&[("h1", S::Running)]),
        (Op::Destroy | Op::Reschedule, _) => err(&[("h1", S::Error)]),
        (Op::PowerOff, _) => clean(op),
    }
}

/// The subject's port at VIF index `vif` (record order).
pub async fn port_at(c: &TestCloud, s: &Subject, vif: usize) -> PortId {
    if vif == 3 {
        return s.extra.as_ref().unwrap().0;
    }
    for h in &c.hosts {
        if let Ok(v) = h.driver.show(s.id).await {
            return v.vifs[vif].port;
        }
    }
    panic!("no host knows {}", s.id)
}

/// Take the devices of `port` away on `host` as if someone removed them outside vireo.
pub async fn remove_devices(c: &TestCloud, host: &str, s: &Subject, port: PortId) {
    remove_port_devices(c, host, s.id, &s.name, port).await;
}

/// Make the devices of `port` exist on `host` already. An unbound (user) port is bound to
/// `host` for the look at its VIF, then unbound again: the devices are there before the
/// port is bound, as a leftover of someone else's would be.
pub async fn make_devices(c: &TestCloud, host: &str, s: &Subject, port: PortId) {
    let bound = !c.port(port).await.host_id.is_empty();
    let at = |h: &str| PortUpdate {
        host_id: Some(h.to_owned()),
        ..PortUpdate::default()
    };
    if !bound {
        c.network.update_port(port, &at(host)).await.unwrap();
    }
    let vif = network_info(&*c.network, &[port]).await.vifs.remove(0);
    if !bound {
        c.network.update_port(port, &at("")).await.unwrap();
    }
    let ctx = PlugContext {
        instance_uuid: s.id,
        instance_name: s.name.clone(),
        form: DomainForm::LibvirtManaged,
    };
    use vireo_actors::plug::VifPlugger;
    c.host(host).plugger.plug(&ctx, &vif).await.unwrap();
}

/// The plugger calls for instance `id` each host recorded from `marks` on, as [`PlugCall`]s
/// (VIF index from the record `order`).
pub fn plug_recording(c: &TestCloud, id: Uuid, marks: &[usize], order: &[PortId]) -> Vec<PlugCall> {
    let mut out = Vec::new();
    for (h, mark) in c.hosts.iter().zip(marks) {
        let host: &'static str = if h.name == "h1" { "h1" } else { "h2" };
        for call in h.plugger.calls().into_iter().skip(*mark) {
            if call.instance_uuid != id {
                continue;
            }
            let vif = order
                .iter()
                .position(|p| *p == call.port)
                .unwrap_or(usize::MAX);
            out.push(PlugCall {
                host,
                op: call.op,
                vif,
                done: call.outcome == CallOutcome::Done,
            });
        }
    }
    out
}

/// Where each host's recording is now.
pub fn plug_marks(c: &TestCloud) -> Vec<usize> {
    c.hosts.iter().map(|h| h.plugger.calls().len()).collect()
}

// ----------------------------------------------------------------------------------------
// Event faults

/// The fatal waits of the event column: short, since every lost event costs one.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(2);

/// The event columns: what happens to the subject's `network-vif-plugged` events on their
/// way from the service to the actors, for the whole operation (its rollback included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EvFault {
    /// Dropped.
    Lost,
    /// Kept back until the operation ended, then delivered.
    Late,
    /// A copy of each arrives after the operation began, before it registers its wait (and
    /// plugs); the real ones are lost.
    Early,
    /// A copy of each arrived before the operation began; the real ones are lost.
    Stale,
    /// Delivered twice.
    Duplicated,
    /// Delivered with status `failed`.
    Failed,
    /// Delivered with the tag of a port the instance does not have.
    WrongPort,
    /// Dropped on their way to the host where the operation waits (`Op::wait_at`) only;
    /// its rollback on another host gets them.
    LostThere,
}

impl EvFault {
    pub const ALL: [EvFault; 8] = [
        EvFault::Lost,
        EvFault::Late,
        EvFault::Early,
        EvFault::Stale,
        EvFault::Duplicated,
        EvFault::Failed,
        EvFault::WrongPort,
        EvFault::LostThere,
    ];

    pub fn label(&self) -> &'static str {
        match self {
            EvFault::Lost => "lost",
            EvFault::Late => "late",
            EvFault::Early => "early",
            EvFault::Stale => "stale",
            EvFault::Duplicated => "duplicated",
            EvFault::Failed => "failed",
            EvFault::WrongPort => "wrong port",
            EvFault::LostThere => "lost at the waiting host",
        }
    }

    /// The rule the service's sink applies during the operation.
    pub fn rule(&self) -> EventFault {
        match self {
            EvFault::Lost | EvFault::Early | EvFault::Stale | EvFault::LostThere => {
                EventFault::Lost
            }
            EvFault::Late => EventFault::Held,
            EvFault::Duplicated => EventFault::Duplicated,
            EvFault::Failed => EventFault::Failed,
            EvFault::WrongPort => EventFault::WrongPort,
        }
    }
}

/// What an operation whose fatal wait fails ends in (every later wait of the operation, its
/// rollback's included, gets no good event either).
pub fn wait_failed(op: Op) -> Expect {
    let rb = |at: &[(&'static str, InstanceState)]| Expect::new(Outcome::RolledBack, at);
    let err = |at: &[(&'static str, InstanceState)]| Expect::new(Outcome::Error, at);
    match op {
        Op::Spawn => rb(&[]),
        // The guest was down already: left down, flagged, recoverable by another boot.
        Op::HardReboot | Op::SoftReboot => err(&[("h1", S::Error)]),
        Op::PowerOn => rb(&[("h1", S::Stopped)]),
        // The destination gives up; the source brings the instance back as a revert does,
        // which waits for events too: it cannot either.
        Op::Resize => err(&[("h1", S::Error)]),
        // Back to the old definition on the same host: nothing to wait for.
        Op::ResizeSameHost => rb(&[("h1", S::Running)]),
        // The destination let go; the source cannot bring the guest back.
        Op::Revert => err(&[("h1", S::Error)]),
        Op::RevertSameHost => err(&[("h1", S::Error)]),
        Op::Attach => rb(&[("h1", S::Running)]),
        _ => clean(op),
    }
}

/// What an event fault during the operation ends in. An operation without a fatal wait
/// (live migration's waits only consume the events of its own profile updates) does not
/// depend on the events: it ends as without the fault.
pub fn event_expect(op: Op, f: EvFault) -> Expect {
    if !op.fatal_wait() {
        return clean(op);
    }
    match f {
        // An event is an event, however often it comes.
        EvFault::Duplicated => clean(op),
        // An event that arrived before the operation began never counts for it. One that
        // came after it began but before its plug-time wait was registered (every flow
        // registers before it plugs) cannot be that plug's: every operation here waits at
        // plug time for at least one port, and the real events are lost.
        EvFault::Early
        | EvFault::Lost
        | EvFault::Late
        | EvFault::Stale
        | EvFault::Failed
        | EvFault::WrongPort => wait_failed(op),
        // The destination gives up; the source brings the instance back, with its events.
        EvFault::LostThere if op == Op::Resize => {
            Expect::new(Outcome::RolledBack, &[("h1", S::Running)])
        }
        // Every other operation waits and rolls back on one host.
        EvFault::LostThere => wait_failed(op),
    }
}

/// Where an operation is held after it began and before it registers its fatal wait: at a
/// network call or at a libvirt call on a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeforeWait {
    /// The first `get port` on the host (reading which ports are ACTIVE already).
    GetPort(&'static str),
    /// The first libvirt call on the host (saving the operation in flight, defining).
    Libvirt(&'static str),
}

pub fn before_wait(op: Op) -> Option<BeforeWait> {
    match op {
        Op::Spawn | Op::Revert | Op::Attach => Some(BeforeWait::GetPort("h1")),
        Op::HardReboot | Op::SoftReboot | Op::PowerOn | Op::ResizeSameHost | Op::RevertSameHost => {
            Some(BeforeWait::Libvirt("h1"))
        }
        Op::Resize => Some(BeforeWait::Libvirt("h2")),
        _ => None,
    }
}

// ----------------------------------------------------------------------------------------
// The document: docs/FAULTS.md holds the matrix rendered from the data above.

/// The marker lines around the rendered matrix in docs/FAULTS.md.
pub const DOC_BEGIN: &str =
    "<!-- fault matrix: generated by tests/tests/faults_doc.rs, do not edit -->";
pub const DOC_END: &str = "<!-- end of fault matrix -->";

/// The distinct outcomes of a cell, in order, or `fallback` when it has no case.
fn cell(outcomes: impl IntoIterator<Item = Expect>, fallback: &str) -> String {
    let mut seen: Vec<Expect> = Vec::new();
    for e in outcomes {
        if !seen.contains(&e) {
            seen.push(e);
        }
    }
    if seen.is_empty() {
        return fallback.to_owned();
    }
    seen.iter()
        .map(Expect::short)
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The cases a family runs for an operation (its clean run included).
pub fn net_cases(op: Op) -> usize {
    1 + match net_points(op).len() {
        0 => 1,
        n => n * NetFailure::ALL.len(),
    }
}

/// The plugger calls a plug case fails at one step of (an unplug that changes nothing has
/// no step to fail, nor has the unplug of a device libvirt makes and removes).
pub fn plug_fault_calls(op: Op) -> Vec<PlugCall> {
    plug_calls(op)
        .into_iter()
        .filter(|c| (c.op == PlugOp::Plug || c.done) && !c.steps().is_empty())
        .collect()
}

pub fn plug_cases(op: Op) -> usize {
    let steps: usize = plug_fault_calls(op).iter().map(|c| c.steps().len()).sum();
    1 + steps + usize::from(!plug_calls(op).is_empty())
}

pub fn event_cases(_op: Op) -> usize {
    1 + EvFault::ALL.len()
}

fn row(cells: &[String]) -> String {
    format!("| {} |\n", cells.join(" | "))
}

fn header(cells: &[&str]) -> String {
    let mut s = row(&cells.iter().map(|c| c.to_string()).collect::<Vec<_>>());
    s.push_str(&row(&cells
        .iter()
        .map(|_| "---".to_owned())
        .collect::<Vec<_>>()));
    s
}

/// The matrix as docs/FAULTS.md holds it (between [`DOC_BEGIN`] and [`DOC_END`]).
pub fn render_matrix() -> String {
    let mut out = String::new();
    out.push_str(DOC_BEGIN);
    out.push_str("\n\n");
    out.push_str(
        "Outcome → where the instance is afterwards: `ok` completed, `RB` failed and rolled \
         back, `ERR` failed with the instance consistent in the state shown (destroy \
         finishes it); `gone` no host knows it. Several outcomes in a cell: different calls or steps of the operation end \
         differently (the detail tables say which). `no call` / `no step`: the operation \
         makes no such call (or its calls take no such step), so the fault cannot reach \
         it.\n\n",
    );

    // Overview.
    out.push_str("### Overview\n\n");
    let mut cols = vec!["operation"];
    let net_labels: Vec<String> = NetFailure::ALL
        .iter()
        .map(|f| format!("network {}", f.label()))
        .collect();
    cols.extend(net_labels.iter().map(String::as_str));
    cols.extend(["plug: OVS down", "plug: name taken", "devices there / gone"]);
    let ev_labels: Vec<String> = EvFault::ALL
        .iter()
        .map(|f| format!("event {}", f.label()))
        .collect();
    cols.extend(ev_labels.iter().map(String::as_str));
    out.push_str(&header(&cols));
    for op in Op::ALL {
        let mut cells = vec![op.label().to_owned()];
        let points = net_points(op);
        for f in NetFailure::ALL {
            if points.is_empty() {
                cells.push(if f == NetFailure::Down {
                    clean(op).short()
                } else {
                    "no call".to_owned()
                });
            } else {
                cells.push(cell(
                    points.iter().map(|p| net_expect(op, *p, f)),
                    "no call",
                ));
            }
        }
        for family in [PlugFamily::OvsDown, PlugFamily::NameTaken] {
            let calls = plug_fault_calls(op);
            let hits = calls
                .iter()
                .filter(|c| c.steps().iter().any(|s| step_family(*s) == family))
                .map(|c| plug_expect(op, c));
            cells.push(cell(hits, "no step"));
        }
        cells.push(if plug_calls(op).is_empty() {
            "no call".to_owned()
        } else {
            clean(op).short()
        });
        for f in EvFault::ALL {
            cells.push(event_expect(op, f).short());
        }
        out.push_str(&row(&cells));
    }

    // Network detail.
    out.push_str("\n### Network service, call by call\n\n");
    let mut cols = vec!["operation", "call"];
    let fl: Vec<String> = NetFailure::ALL.iter().map(NetFailure::label).collect();
    cols.extend(fl.iter().map(String::as_str));
    out.push_str(&header(&cols));
    for op in Op::ALL {
        let points = net_points(op);
        if points.is_empty() {
            let mut cells = vec![op.label().to_owned(), "none".to_owned()];
            for f in NetFailure::ALL {
                cells.push(if f == NetFailure::Down {
                    clean(op).short()
                } else {
                    "no call".to_owned()
                });
            }
            out.push_str(&row(&cells));
            continue;
        }
        for p in points {
            let mut cells = vec![op.label().to_owned(), p.to_string()];
            for f in NetFailure::ALL {
                let e = net_expect(op, p, f);
                cells.push(
                    if p.call == NetCall::ListPorts && net_tolerated(p.call, f) {
                        format!("{} (events trusted)", e.short())
                    } else if net_tolerated(p.call, f) {
                        format!("{} (already so)", e.short())
                    } else {
                        e.short()
                    },
                );
            }
            out.push_str(&row(&cells));
        }
    }

    // Plug detail.
    out.push_str("\n### Plugging, call by call\n\n");
    out.push_str(&header(&[
        "operation",
        "call",
        "steps failed (one case each)",
        "outcome",
    ]));
    for op in Op::ALL {
        let calls = plug_fault_calls(op);
        if calls.is_empty() {
            out.push_str(&row(&[
                op.label().to_owned(),
                "none with a host step".to_owned(),
                "—".to_owned(),
                "—".to_owned(),
            ]));
            continue;
        }
        for c in calls {
            let steps = c
                .steps()
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ");
            out.push_str(&row(&[
                op.label().to_owned(),
                c.to_string(),
                steps,
                plug_expect(op, &c).short(),
            ]));
        }
    }

    // Counts.
    out.push_str("\n### Cases\n\n");
    out.push_str(&header(&[
        "operation",
        "network",
        "plugging",
        "events",
        "total",
    ]));
    let (mut tn, mut tp, mut te) = (0, 0, 0);
    for op in Op::ALL {
        let (n, p, e) = (net_cases(op), plug_cases(op), event_cases(op));
        tn += n;
        tp += p;
        te += e;
        out.push_str(&row(&[
            op.label().to_owned(),
            n.to_string(),
            p.to_string(),
            e.to_string(),
            (n + p + e).to_string(),
        ]));
    }
    out.push_str(&row(&[
        "**all**".to_owned(),
        tn.to_string(),
        tp.to_string(),
        te.to_string(),
        (tn + tp + te).to_string(),
    ]));
    out.push_str(
        "\nEach count includes the operation's clean run, which must make exactly the calls \
         the matrix lists.\n\n",
    );
    out.push_str(DOC_END);
    out.push('\n');
    out
}

/// One `#[tokio::test]` per row of the matrix, named after the operation, each running
/// `$matrix(Op::...)`: every family's file runs its column with
/// `fault_matrix::row_tests!(its_matrix);` (faults_doc.rs checks both).
#[allow(unused_macros)]
macro_rules! row_tests {
    ($matrix:ident) => {
        fault_matrix::row_tests!(@rows $matrix;
            spawn => Op::Spawn,
            hard_reboot => Op::HardReboot,
            soft_reboot => Op::SoftReboot,
            power_off => Op::PowerOff,
            power_on => Op::PowerOn,
            resize => Op::Resize,
            resize_same_host => Op::ResizeSameHost,
            confirm => Op::Confirm,
            revert => Op::Revert,
            revert_same_host => Op::RevertSameHost,
            live_migration => Op::LiveMigration,
            rollback => Op::Rollback,
            reschedule => Op::Reschedule,
            attach => Op::Attach,
            detach => Op::Detach,
            destroy => Op::Destroy,
        );
    };
    (@rows $matrix:ident; $($name:ident => $op:expr),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            $matrix($op).await;
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use row_tests;
