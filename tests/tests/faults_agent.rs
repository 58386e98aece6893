//! The agent killed mid-operation and started again from libvirt alone, for every operation
//! at several points: at its first libvirt call, after the networking was allocated and
//! before the domain exists, at its first plug (the domain defined or torn down, devices
//! not yet there), while it waits for its events (domain started paused, devices plugged),
//! and mid live migration (the destination's bindings made, `migrating_to` set).
//!
//! The agent's death is `TestCloud::crash`: the actor system stops with the operation
//! running, no rollback runs, the caller gets no answer. libvirt's domains (with their vireo
//! `<metadata>`: the record and the operation in flight) are carried over in the state they
//! were in at the point (the test driver keeps them per connection; a real libvirtd keeps
//! them over an agent restart), as are the network service and the host's devices. Events
//! the service sent while the agent was down are lost. The restarted agent rebuilds its
//! instances from libvirt and finishes or rolls back what was in flight.
//!
//! Each case must end where [`expect`] says (the agent column of docs/FAULTS.md), with the
//! instance consistent there, then destroyed by the caller with nothing left (domain, device,
//! port, binding, `migrating_to`, wait, buffered event) and no instance lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod fault_matrix;
mod faults_support;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use fault_matrix::*;
use vireo::compute::ComputeDriver;
use vireo_actors::lifecycle::InstanceState as S;

/// Where the agent dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Point {
    /// At the operation's first libvirt call on the host it runs on (every worker held).
    FirstCall,
    /// The build's networking allocated, its domain not defined yet.
    BeforeDomain,
    /// At the operation's first plug.
    Plug,
    /// An attach's interface plugged on the host, its device not attached yet.
    AfterPlug,
    /// At the operation's first unplug (a detach's device detached, a destroy's or a
    /// confirm's or revert's old copy stopped).
    Unplug,
    /// While the operation waits for its events (held until the agent is dead).
    EventWait,
    /// A live migration with the destination's bindings made and `migrating_to` set,
    /// before the guest moves.
    MidMigration,
    /// A failed live migration's rollback, at its first network call.
    InRollback,
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Point::FirstCall => "at its first libvirt call",
            Point::BeforeDomain => "after allocation, before the domain exists",
            Point::Plug => "at its first plug",
            Point::AfterPlug => "with the interface plugged, before the device is attached",
            Point::Unplug => "at its first unplug",
            Point::EventWait => "while it waits for events",
            Point::MidMigration => "mid migration (bindings made, before the guest moves)",
            Point::InRollback => "during the rollback",
        })
    }
}

/// The points of `op`.
pub fn points(op: Op) -> Vec<Point> {
    if op == Op::Rollback {
        return vec![Point::InRollback];
    }
    let mut v = vec![Point::FirstCall];
    if op == Op::Spawn {
        v.push(Point::BeforeDomain);
    }
    if op.fatal_wait() {
        v.push(Point::Plug);
        if op == Op::Attach {
            v.push(Point::AfterPlug);
        }
        v.push(Point::EventWait);
    }
    if op == Op::LiveMigration {
        v.push(Point::MidMigration);
    }
    if matches!(
        op,
        Op::Detach | Op::Destroy | Op::Confirm | Op::Revert | Op::Reschedule
    ) {
        v.push(Point::Unplug);
    }
    v
}

/// The host the operation runs its part at `point` on.
pub fn point_host(op: Op, point: Point) -> &'static str {
    match point {
        Point::Plug | Point::AfterPlug | Point::EventWait => op.wait_at().map_or("h1", |(h, _)| h),
        // A revert runs on the destination first; a confirm removes the source first.
        _ => match op {
            Op::Revert => "h2",
            _ => "h1",
        },
    }
}

/// Where the instance is once the restarted agent recovered (the caller never got an
/// answer: the agent died).
///
/// - At the first libvirt call nothing happened yet (no in-flight mark in libvirt): the
///   instance is found as it was before the operation; a build whose domain never existed
///   is not found (the build journal has the restarted agent release its networking).
/// - A build interrupted later is rolled back: gone, its networking released.
/// - An interrupted start (power on, hard reboot) is done again: running.
/// - The destination of a resize interrupted before it finished gives the instance back to
///   the source, which runs it again (the same for a revert interrupted on the source).
/// - Every other interrupted operation is settled from what libvirt has (`ops::recover`):
///   a live migration the guest never left for is rolled back; an attach that did not
///   finish is undone and a detach finished (the instance runs without the interface); a
///   destroy that stopped the guest leaves it stopped (the caller destroys it again).
/// - A same-host resize or revert interrupted after it took the guest down boots it again
///   from the definition libvirt has: the resized one (resize-target) once the resize
///   redefined it, the original one once the revert did.
pub fn expect(op: Op, point: Point) -> Place {
    match (op, point) {
        // No domain, so nothing in libvirt: a build that never defined one, a build that
        // failed and whose domain is gone (the reschedule clean-up's subject).
        (Op::Spawn | Op::Reschedule, _) => vec![],
        (_, Point::FirstCall) => started_at(op),
        // The domain stopped, still defined: the caller's destroy (again) removes it.
        (Op::Destroy, Point::Unplug) => vec![("h1", S::Stopped)],
        // A same-host resize interrupted once it redefined the guest finishes.
        (Op::ResizeSameHost, _) => vec![("h1", S::ResizeTarget)],
        (
            Op::HardReboot
            | Op::SoftReboot
            | Op::PowerOn
            | Op::Attach
            | Op::LiveMigration
            | Op::Rollback
            | Op::Resize
            | Op::Revert
            | Op::RevertSameHost,
            _,
        ) => vec![("h1", S::Running)],
        _ => started_at(op),
    }
}

/// The build journal names the instance at the restart, and the restarted agent releases its
/// ports itself: the agent died during a build that allocated ports before its domain
/// existed, or the instance is a failed build whose rollback could not release its
/// networking (the reschedule clean-up's subject: its entry stays until a release succeeds;
/// its domain is gone, so nothing else on the host knows it).
pub fn journal_releases(op: Op, point: Point) -> bool {
    match op {
        Op::Spawn => matches!(point, Point::FirstCall | Point::BeforeDomain),
        Op::Reschedule => true,
        _ => false,
    }
}

/// The instance is where `want` says with no operation running (recovery may take a
/// moment); returns what it is at after 10 s at most.
async fn recovered(c: &TestCloud, s: &Subject, want: &Place) -> Vec<(String, S)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = places(c, s.id).await;
        let mut idle = true;
        for h in &c.hosts {
            if let Ok(v) = h.driver.show(s.id).await {
                idle &= v.operation.is_none();
            }
        }
        let same = got.len() == want.len()
            && want
                .iter()
                .all(|(h, st)| got.iter().any(|(gh, gs)| gh == h && gs == st));
        if (same && idle) || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until the operation shows `pred` on `host`.
async fn op_at(c: &TestCloud, host: &str, id: uuid::Uuid, what: &str, pred: fn(&str) -> bool) {
    let driver = c.host(host).driver.clone();
    eventually(Duration::from_secs(10), what, || async {
        match driver.show(id).await {
            Ok(v) if v.operation.as_ref().is_some_and(|o| pred(&o.phase)) => Some(()),
            _ => None,
        }
    })
    .await;
}

/// Run one case on `c`; returns the restarted cloud.
async fn case(c: TestCloud, op: Op, point: Point, n: usize) -> TestCloud {
    let host = point_host(op, point);
    let label = format!("{op}: agent killed {point} (on {host})");
    let c = Arc::new(c);
    let s = setup(op, &c, &name(&format!("ag-{}", op.test_name()), n), false).await;
    let mut libvirt_hold = None;
    let domains;
    let task;
    match point {
        Point::FirstCall => {
            domains = c.dump_domains().await;
            libvirt_hold = Some(LibvirtHold::start(c.host(host).driver.libvirt()).await);
            task = start(op, &c, &s);
            // It runs until its first libvirt call on the host queues behind the hold.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        Point::BeforeDomain => {
            // The build reads its ports after allocating them, before it defines the domain.
            let hold = c.host(host).net.hold(NetCall::GetPort, 0);
            task = start(op, &c, &s);
            hold.reached("the build's first port read").await;
            domains = c.dump_domains().await;
        }
        Point::Plug => {
            let hold = c.host(host).gate.hold(PlugPoint::Plug, 0);
            task = start(op, &c, &s);
            hold.reached("the first plug").await;
            domains = c.dump_domains().await;
        }
        Point::Unplug => {
            let hold = c.host(host).gate.hold(PlugPoint::Unplug, 0);
            task = start(op, &c, &s);
            hold.reached("the first unplug").await;
            domains = c.dump_domains().await;
        }
        Point::AfterPlug => {
            let h = c.host(host);
            let gate = h.gate.hold(PlugPoint::Plug, 0);
            task = start(op, &c, &s);
            gate.reached("the plug").await;
            domains = c.dump_domains().await;
            libvirt_hold = Some(LibvirtHold::start(h.driver.libvirt()).await);
            gate.release();
            let (extra, _) = s.extra.clone().unwrap();
            eventually(Duration::from_secs(10), "the interface plugged", || async {
                h.plugger.plugged().contains(&extra).then_some(())
            })
            .await;
            // It goes on to attach the device, which queues behind the hold.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Point::EventWait => {
            c.sink.set_event_fault(Some(EventRule {
                instance: s.id,
                fault: EventFault::Held,
            }));
            task = start(op, &c, &s);
            op_at(&c, host, s.id, "the event wait", |p| {
                p.starts_with("wait for")
            })
            .await;
            domains = c.dump_domains().await;
        }
        Point::InRollback => {
            // The rollback reads the ports first (see fault_matrix::net_points).
            let hold = c.host(host).net.hold(NetCall::GetPort, 3);
            task = start(op, &c, &s);
            hold.reached("the rollback").await;
            domains = c.dump_domains().await;
        }
        Point::MidMigration => {
            // The migration's network set-up call, after the destination's bindings.
            let hold = c.host(host).net.hold(NetCall::SetupNetworks, 0);
            task = start(op, &c, &s);
            hold.reached("the migration's network set-up").await;
            domains = c.dump_domains().await;
        }
    }
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    let c = Arc::try_unwrap(c).expect("the cloud is shared still");
    let remains = c.crash();
    if let Some(h) = libvirt_hold {
        h.release().await;
    }
    // What the service sent while the agent was down is lost.
    remains.sink.set_event_fault(None);
    remains.sink.release_held();
    let c = TestCloud::restart(remains, domains).await;
    let want = expect(op, point);
    let got = recovered(&c, &s, &want).await;
    assert!(
        got.len() == want.len()
            && want
                .iter()
                .all(|(h, st)| got.iter().any(|(gh, gs)| gh == h && gs == st)),
        "{label}: expected {}, got {got:?}; recovery: {:?}; last operation: {:#?}",
        Expect::new(Outcome::Completed, &want).short(),
        c.host(host).driver.recovery(),
        c.host(host)
            .driver
            .show(s.id)
            .await
            .ok()
            .and_then(|v| v.last_operation)
    );
    consistent(&c, &s, &label, &want).await;
    let released = &c.host(host).driver.recovery().released_builds;
    assert_eq!(
        released.contains(&s.id),
        journal_releases(op, point),
        "{label}: builds the restarted agent released: {released:?}"
    );
    cleanup(&c, &s).await;
    eprintln!("{label}: {got:?}");
    c
}

async fn agent_matrix(op: Op) {
    let started = Instant::now();
    let mut c = spec(op.hosts()).start().await;
    let mut n = 0;
    for point in points(op) {
        c = case(c, op, point, n).await;
        n += 1;
    }
    c.shutdown().await;
    eprintln!("{op}: {n} cases in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn() {
    agent_matrix(Op::Spawn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_reboot() {
    agent_matrix(Op::HardReboot).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_reboot() {
    agent_matrix(Op::SoftReboot).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_off() {
    agent_matrix(Op::PowerOff).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_on() {
    agent_matrix(Op::PowerOn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize() {
    agent_matrix(Op::Resize).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_same_host() {
    agent_matrix(Op::ResizeSameHost).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm() {
    agent_matrix(Op::Confirm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revert() {
    agent_matrix(Op::Revert).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revert_same_host() {
    agent_matrix(Op::RevertSameHost).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_migration() {
    agent_matrix(Op::LiveMigration).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback() {
    agent_matrix(Op::Rollback).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reschedule() {
    agent_matrix(Op::Reschedule).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach() {
    agent_matrix(Op::Attach).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach() {
    agent_matrix(Op::Detach).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy() {
    agent_matrix(Op::Destroy).await;
}

// ----------------------------------------------------------------------------------------
// Regressions (the bugs this matrix found), each the smallest case that failed before its
// fix.

/// The agent killed mid-attach, the interface plugged and its device not attached: the
/// device stayed plugged on the host with no instance owning it (the attach left no mark in
/// libvirt). Recovery takes the interface away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_an_attach_interrupted_after_its_plug_leaves_no_device() {
    let c = spec(&["h1"]).start().await;
    case(c, Op::Attach, Point::AfterPlug, 0)
        .await
        .shutdown()
        .await;
}

/// The agent killed in a same-host resize after the guest was redefined: recovery left it
/// stopped (or paused) with the resize unfinished. Recovery boots the resized guest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_same_host_resize_interrupted_after_redefine_finishes() {
    let c = spec(&["h1"]).start().await;
    case(c, Op::ResizeSameHost, Point::Plug, 0)
        .await
        .shutdown()
        .await;
}

/// The agent killed in a same-host revert after the original guest was redefined: recovery
/// left it stopped with its devices unplugged. Recovery boots the original guest again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_same_host_revert_interrupted_after_redefine_finishes() {
    let c = spec(&["h1"]).start().await;
    case(c, Op::RevertSameHost, Point::Plug, 0)
        .await
        .shutdown()
        .await;
}

/// Both agents killed while a failed live migration rolled back, the destination's devices
/// pre-wired: the source's recovery asked the destination to remove them before the
/// destination's agent was back (unknown host: given up), and the restarted destination has
/// nothing of the instance in libvirt: its devices stayed plugged. The source waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_rollback_interrupted_after_the_destination_was_wired_unwires_it() {
    let c = spec(&["h1", "h2"]).start().await;
    case(c, Op::Rollback, Point::InRollback, 0)
        .await
        .shutdown()
        .await;
}

/// The agent killed mid-detach, the device detached and the interface not unplugged yet:
/// the interface stayed plugged on the host, the instance's record without it. Recovery
/// finishes the detach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_detach_interrupted_at_its_unplug_finishes() {
    let c = spec(&["h1"]).start().await;
    case(c, Op::Detach, Point::Unplug, 0).await.shutdown().await;
}
