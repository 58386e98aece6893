//! libvirtd itself failing mid-operation, for real: every host's libvirt is a private
//! libvirtd process of the test (`vireo_tests::private_libvirtd`, libvirt's test driver over
//! a unix socket) that a case SIGKILLs, restarts or SIGSTOPs while an operation runs.
//!
//! libvirt's test driver keeps its domains per connection, and a restarted daemon (or the
//! connection vireo reopens after a freeze) reads them from the host's node file. A real
//! libvirtd keeps its domains over a crash (the guests run on, their state is on disk): at the
//! fault the case writes the host's domains, as they are at that moment, into the node file
//! (`TestCloud::persist_domains`), so the new connection finds exactly what the old one had.
//!
//! Faults ([`Fault`]): killed (down until the operation returned, then restarted), restarted
//! (killed and back before the operation goes on), frozen (SIGSTOP until the operation
//! returned, then SIGCONT; vireo's keepalive gives up on the connection within ~2 s).
//! Points ([`Point`]): when the operation makes its first libvirt call on the host, and while
//! it waits for its events (the domain defined, devices plugged; the events are held until
//! the fault is in place).
//!
//! Each case must end as [`expect`] says (the data of the libvirtd columns of
//! docs/FAULTS.md), the instance consistent where it is once libvirtd is back, then destroyed
//! with nothing left (domain, device, port, binding, `migrating_to`, wait, buffered event).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod fault_matrix;
mod faults_support;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use fault_matrix::*;
use vireo::compute::ComputeDriver;
use vireo_actors::instance::{InstanceError, OpReport};
use vireo_actors::lifecycle::InstanceState as S;
use vireo_tests::private_libvirtd::PrivateLibvirtd;

/// What happens to a host's libvirtd.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL; started again only after the operation returned.
    Killed,
    /// SIGKILL and started again at once: back before the operation goes on.
    Restarted,
    /// SIGSTOP; SIGCONT after the operation returned.
    Frozen,
}

impl Fault {
    pub const ALL: [Fault; 3] = [Fault::Killed, Fault::Restarted, Fault::Frozen];
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::Killed => "libvirtd killed",
            Fault::Restarted => "libvirtd restarted",
            Fault::Frozen => "libvirtd frozen",
        })
    }
}

/// When the fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Point {
    /// At the operation's first libvirt call on the host (every worker held meanwhile).
    FirstCall,
    /// While the operation waits for its events (held until the fault is in place).
    EventWait,
    /// A failed live migration's rollback, at its first network call (held until the
    /// fault is in place).
    InRollback,
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Point::FirstCall => "at its first libvirt call",
            Point::EventWait => "while it waits for events",
            Point::InRollback => "during the rollback",
        })
    }
}

/// The host whose libvirtd fails at `point` of `op`.
pub fn fault_host(op: Op, point: Point) -> &'static str {
    match point {
        Point::EventWait => op.wait_at().map_or("h1", |(h, _)| h),
        // The source rolls back.
        Point::InRollback => "h1",
        // A revert runs on the destination first; a confirm removes the source first.
        Point::FirstCall => match op {
            Op::Revert => "h2",
            _ => "h1",
        },
    }
}

/// The points of `op`: every operation has a first libvirt call; those with a fatal event
/// wait also fail during it; the rollback row is a live migration failing during its
/// rollback.
pub fn points(op: Op) -> Vec<Point> {
    if op == Op::Rollback {
        return vec![Point::InRollback];
    }
    let mut v = vec![Point::FirstCall];
    if op.fatal_wait() {
        v.push(Point::EventWait);
    }
    v
}

/// What a case ends in (the libvirtd columns of docs/FAULTS.md).
///
/// - Restarted: libvirtd is back with every domain before the operation's next call, so the
///   operation ends as it does without a fault.
/// - Killed or frozen: the operation's next libvirt call fails (at once, or when the
///   keepalive gives up on the frozen daemon) and so does every call of its rollback on that
///   host. An operation whose failed call changed nothing and that needs no undo fails with
///   the instance as it was: power off and detach (an error, the guest and its devices as
///   they were), power on and attach (rolled back). One that needs libvirt to undo or to
///   judge what it did (spawn, reboots, a same-host resize or revert, the source's part of a
///   resize, destroy, the reschedule clean-up) leaves the instance in error on that host,
///   with what it holds kept for destroy. A resize whose destination fails is undone by the
///   source (the destination gives the instance up). Every live migration here rolls back
///   (the test driver cannot migrate), the first libvirt call on the source failing too.
pub fn expect(op: Op, fault: Fault, point: Point) -> Expect {
    let rb = |at: &[(&'static str, S)]| Expect::new(Outcome::RolledBack, at);
    let err = |at: &[(&'static str, S)]| Expect::new(Outcome::Error, at);
    if fault == Fault::Restarted {
        return clean(op);
    }
    match (op, point) {
        (Op::PowerOff | Op::Detach, _) => err(&[("h1", S::Running)]),
        (Op::PowerOn, _) => rb(&[("h1", S::Stopped)]),
        (Op::Attach | Op::LiveMigration, _) => rb(&[("h1", S::Running)]),
        (Op::Rollback, _) => rb(&[("h1", S::Running)]),
        (Op::Resize, Point::EventWait) => rb(&[("h1", S::Running)]),
        (Op::Confirm, _) => err(&[("h1", S::Error), ("h2", S::ResizeTarget)]),
        (Op::Revert, Point::FirstCall) => err(&[("h1", S::ResizeSource), ("h2", S::Error)]),
        (
            Op::Spawn
            | Op::HardReboot
            | Op::SoftReboot
            | Op::Resize
            | Op::ResizeSameHost
            | Op::Revert
            | Op::RevertSameHost
            | Op::Reschedule
            | Op::Destroy,
            _,
        ) => err(&[("h1", S::Error)]),
    }
}

/// Where a case holds the operation until the fault is in place.
enum Held {
    Libvirt(LibvirtHold),
    Net(Arc<Hold>),
}

/// A private libvirtd per host.
struct Daemons(BTreeMap<&'static str, PrivateLibvirtd>);

impl Daemons {
    fn start(hosts: &[&'static str]) -> Daemons {
        Daemons(
            hosts
                .iter()
                .map(|h| (*h, PrivateLibvirtd::start().unwrap()))
                .collect(),
        )
    }

    fn get(&mut self, host: &str) -> &mut PrivateLibvirtd {
        self.0.get_mut(host).unwrap()
    }
}

/// Wait (10 s at most) until `host`'s libvirt connection is open again on a newer
/// connection than `before`.
async fn reconnected(c: &TestCloud, host: &str, before: u64) {
    let lv = c.host(host).driver.libvirt().clone();
    eventually(Duration::from_secs(10), "libvirt reconnected", || {
        let g = lv.generation();
        async move { g.filter(|g| *g > before).map(|_| ()) }
    })
    .await;
}

async fn disconnected(c: &TestCloud, host: &str) {
    let lv = c.host(host).driver.libvirt().clone();
    eventually(Duration::from_secs(10), "libvirt connection lost", || {
        let up = lv.is_connected();
        async move { (!up).then_some(()) }
    })
    .await;
}

/// The instance is where `want` says (it may take the resync after the reconnect a moment).
async fn settled(c: &TestCloud, s: &Subject, want: &Expect) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let got = places(c, s.id).await;
        let same = got.len() == want.at.len()
            && want
                .at
                .iter()
                .all(|(h, st)| got.iter().any(|(gh, gs)| gh == h && gs == st));
        if same || Instant::now() > deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Run one case; returns what it ended in (after checking it against [`expect`]).
async fn case(
    c: &Arc<TestCloud>,
    d: &mut Daemons,
    op: Op,
    fault: Fault,
    point: Point,
    n: usize,
) -> (Outcome, Vec<(String, S)>) {
    let host = fault_host(op, point);
    let label = format!("{op}: {fault} {point} (on {host})");
    let s = setup(op, c, &name(&format!("lv-{}", op.test_name()), n), false).await;
    let lv = c.host(host).driver.libvirt().clone();
    let before = lv.generation().unwrap();
    // Bring the operation to the point; the domains as they are there survive libvirtd.
    let (task, hold) = match point {
        Point::FirstCall => {
            c.persist_domains(host).await;
            let hold = LibvirtHold::start(&lv).await;
            let task = start(op, c, &s);
            // It runs until its first libvirt call on the host queues behind the hold (a
            // call queued after the fault fails the same way).
            tokio::time::sleep(Duration::from_millis(150)).await;
            (task, Some(Held::Libvirt(hold)))
        }
        Point::InRollback => {
            // The rollback reads the ports first (the live migration's calls before it: see
            // fault_matrix::net_points).
            let gate = c.host(host).net.hold(NetCall::GetPort, 3);
            let task = start(op, c, &s);
            gate.reached("the rollback").await;
            c.persist_domains(host).await;
            (task, Some(Held::Net(gate)))
        }
        Point::EventWait => {
            c.sink.set_event_fault(Some(EventRule {
                instance: s.id,
                fault: EventFault::Held,
            }));
            let task = start(op, c, &s);
            let driver = c.host(host).driver.clone();
            eventually(Duration::from_secs(10), "the event wait", || async {
                match driver.show(s.id).await {
                    Ok(v)
                        if v.operation
                            .as_ref()
                            .is_some_and(|o| o.phase.starts_with("wait for")) =>
                    {
                        Some(())
                    }
                    _ => None,
                }
            })
            .await;
            c.persist_domains(host).await;
            (task, None)
        }
    };
    match fault {
        Fault::Killed => {
            d.get(host).kill().unwrap();
            disconnected(c, host).await;
        }
        Fault::Restarted => {
            d.get(host).kill().unwrap();
            disconnected(c, host).await;
            d.get(host).restart().unwrap();
            reconnected(c, host, before).await;
        }
        Fault::Frozen => d.get(host).freeze().unwrap(),
    }
    match hold {
        Some(Held::Libvirt(h)) => h.release().await,
        Some(Held::Net(h)) => h.release(),
        None => {}
    }
    c.sink.set_event_fault(None);
    c.sink.release_held();
    let r: Result<OpReport, InstanceError> = task.await.unwrap();
    match fault {
        Fault::Killed => d.get(host).restart().unwrap(),
        Fault::Frozen => d.get(host).thaw().unwrap(),
        Fault::Restarted => {}
    }
    reconnected(c, host, before).await;
    let want = expect(op, fault, point);
    settled(c, &s, &want).await;
    let got = (Outcome::of(&r), places(c, s.id).await);
    check(c, &s, &label, &want, &r).await;
    cleanup(c, &s).await;
    // The next case starts from an empty node file again.
    for h in op.hosts() {
        c.persist_domains(h).await;
    }
    got
}

async fn libvirtd_matrix(op: Op) {
    let started = Instant::now();
    let mut d = Daemons::start(op.hosts());
    let mut sp = spec(op.hosts());
    for (h, daemon) in &d.0 {
        sp = sp.remote(h, daemon.socket());
    }
    let c = Arc::new(sp.start().await);
    let mut n = 0;
    for point in points(op) {
        for fault in Fault::ALL {
            let (outcome, at) = case(&c, &mut d, op, fault, point, n).await;
            eprintln!("{op} | {fault} {point}: {} at {at:?}", outcome.short());
            n += 1;
        }
    }
    c.shutdown().await;
    eprintln!("{op}: {n} cases in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn() {
    libvirtd_matrix(Op::Spawn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_reboot() {
    libvirtd_matrix(Op::HardReboot).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_reboot() {
    libvirtd_matrix(Op::SoftReboot).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_off() {
    libvirtd_matrix(Op::PowerOff).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_on() {
    libvirtd_matrix(Op::PowerOn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize() {
    libvirtd_matrix(Op::Resize).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_same_host() {
    libvirtd_matrix(Op::ResizeSameHost).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm() {
    libvirtd_matrix(Op::Confirm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revert() {
    libvirtd_matrix(Op::Revert).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revert_same_host() {
    libvirtd_matrix(Op::RevertSameHost).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_migration() {
    libvirtd_matrix(Op::LiveMigration).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback() {
    libvirtd_matrix(Op::Rollback).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reschedule() {
    libvirtd_matrix(Op::Reschedule).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach() {
    libvirtd_matrix(Op::Attach).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach() {
    libvirtd_matrix(Op::Detach).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy() {
    libvirtd_matrix(Op::Destroy).await;
}

/// Regression: a resize whose destination's libvirtd froze while it waited for its events.
/// The destination's rollback could not remove the domain (the connection was lost), the
/// source took the instance back; once libvirtd was back, the recovery after the reconnect
/// adopted the half-made domain again from its metadata (a resize target: the instance on two
/// hosts). The destination keeps what is left as gone (hidden, not adopted again) and removes
/// it once libvirt is back; a recovery pass run then finds nothing to adopt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_destination_frozen_in_its_wait_is_not_adopted_again() {
    let op = Op::Resize;
    let mut d = Daemons::start(op.hosts());
    let mut sp = spec(op.hosts());
    for (h, daemon) in &d.0 {
        sp = sp.remote(h, daemon.socket());
    }
    let c = Arc::new(sp.start().await);
    let s = setup(op, &c, &name("lv-resize-frozen-reg", 0), false).await;
    let lv = c.host("h2").driver.libvirt().clone();
    let before = lv.generation().unwrap();
    c.sink.set_event_fault(Some(EventRule {
        instance: s.id,
        fault: EventFault::Held,
    }));
    let task = start(op, &c, &s);
    let h2 = c.host("h2").driver.clone();
    eventually(Duration::from_secs(10), "the event wait on h2", || async {
        match h2.show(s.id).await {
            Ok(v)
                if v.operation
                    .as_ref()
                    .is_some_and(|o| o.phase.starts_with("wait for")) =>
            {
                Some(())
            }
            _ => None,
        }
    })
    .await;
    // The half-made domain (its metadata: a resize target, finish-resize in flight) is what
    // libvirtd has when it comes back.
    c.persist_domains("h2").await;
    d.get("h2").freeze().unwrap();
    c.sink.set_event_fault(None);
    c.sink.release_held();
    let r: Result<OpReport, InstanceError> = task.await.unwrap();
    assert_eq!(Outcome::of(&r), Outcome::RolledBack, "{r:?}");
    d.get("h2").thaw().unwrap();
    // From the thaw until the leftover domain is gone (the reconnect, its recovery pass and
    // resync), the instance is on the source only: watched closely, as the destination's
    // half-made domain was adopted for a few milliseconds before.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut gone_since = None;
    loop {
        let at = places(&c, s.id).await;
        assert_eq!(
            at,
            vec![("h1".to_owned(), S::Running)],
            "the instance is on the source only"
        );
        let back = lv.generation().is_some_and(|g| g > before);
        let left = match lv.list_all().await {
            Ok(domains) => domains.iter().any(|d| d.uuid == s.id),
            Err(_) => true,
        };
        if back && !left {
            let since = *gone_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_millis(300) {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "h2's leftover domain not removed"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // A recovery pass now finds nothing of it to adopt.
    c.host("h2").driver.host_handle().recover().await.unwrap();
    assert_eq!(places(&c, s.id).await, vec![("h1".to_owned(), S::Running)]);
    let want = expect(op, Fault::Frozen, Point::EventWait);
    check(&c, &s, "resize frozen on h2 in its wait", &want, &r).await;
    cleanup(&c, &s).await;
    for h in op.hosts() {
        c.persist_domains(h).await;
    }
    c.shutdown().await;
}
