//! Events going wrong between the network service and the actors, for every operation:
//! `network-vif-plugged` lost, late (after the deadline), early (a copy after the operation
//! began and before it registered its wait, the real one lost), stale (a copy before the
//! operation began, the real one lost), duplicated, `failed`, or for a port the instance
//! does not have.
//! The fault holds for the whole operation, its rollback included. Each operation first runs
//! clean; then each fault is a case that must end as docs/FAULTS.md says, the instance
//! consistent, then destroyed with no wait and no buffered event left.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod fault_matrix;
mod faults_support;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use fault_matrix::*;
use vireo::compute::ComputeDriver;

/// A `completed` copy of every event the subject's operation could wait for.
async fn inject_copies(c: &TestCloud, s: &Subject) {
    let mut ports = all_ports(s);
    ports.extend(s.user.iter().copied());
    ports.extend(instance_ports(c, s.id).await);
    ports.sort();
    ports.dedup();
    for e in plugged_events(s.id, &ports) {
        c.sink.inject(e);
    }
}

/// Run the operation, held after it began and before it registers its wait; the copies of
/// its events arrive meanwhile.
async fn early(
    c: &Arc<TestCloud>,
    s: &Subject,
    op: Op,
    at: BeforeWait,
) -> Result<vireo_actors::instance::OpReport, vireo_actors::instance::InstanceError> {
    match at {
        BeforeWait::GetPort(host) => {
            let hold = c.host(host).net.hold(NetCall::GetPort, 0);
            let task = start(op, c, s);
            hold.reached("the first port read").await;
            inject_copies(c, s).await;
            hold.release();
            task.await.unwrap()
        }
        BeforeWait::Libvirt(host) => {
            let h = c.host(host);
            let held = LibvirtHold::start(h.driver.libvirt()).await;
            let task = start(op, c, s);
            eventually(Duration::from_secs(10), "the operation began", || async {
                h.driver
                    .show(s.id)
                    .await
                    .ok()
                    .and_then(|v| v.operation)
                    .map(|_| ())
            })
            .await;
            inject_copies(c, s).await;
            held.release().await;
            task.await.unwrap()
        }
    }
}

async fn event_matrix(op: Op) {
    let c = Arc::new(spec(op.hosts()).timeout(EVENT_TIMEOUT).start().await);
    let prefix = format!("ev-{}", op.test_name());

    let s = setup(op, &c, &name(&prefix, 0), false).await;
    let r = run(op, &c, &s).await;
    check(&c, &s, "clean run", &clean(op), &r).await;
    cleanup(&c, &s).await;

    let mut cases = 1;
    for (n, f) in EvFault::ALL.into_iter().enumerate() {
        let case = format!("{op}: events {}", f.label());
        let s = setup(op, &c, &name(&prefix, n + 1), false).await;
        if f == EvFault::Stale {
            // Copies of every event the operation could wait for, before it begins.
            inject_copies(&c, &s).await;
        }
        let hits = c.sink.fault_hits();
        if f == EvFault::LostThere {
            let host = op.wait_at().map_or("h1", |(h, _)| h);
            let nth = c.hosts.iter().position(|h| h.name == host);
            c.sink.set_event_scope(nth);
        }
        c.sink.set_event_fault(Some(EventRule {
            instance: s.id,
            fault: f.rule(),
        }));
        let r = match (f, before_wait(op)) {
            (EvFault::Early, Some(at)) => early(&c, &s, op, at).await,
            (EvFault::Early, None) => {
                inject_copies(&c, &s).await;
                run(op, &c, &s).await
            }
            _ => run(op, &c, &s).await,
        };
        if op.wait_at().is_some() {
            // The service's events may come a moment after an operation that did not need
            // them ended: the fault holds until one did meet it.
            eventually(
                Duration::from_secs(5),
                &format!("{case}: an event of the operation meeting the fault"),
                || async { (c.sink.fault_hits() > hits).then_some(()) },
            )
            .await;
        }
        c.sink.set_event_fault(None);
        c.sink.set_event_scope(None);
        if f == EvFault::Late {
            // The events come after all: nothing waits for them any more, and they change
            // nothing.
            assert!(
                c.sink.release_held() > 0 || op.wait_at().is_none(),
                "{case}"
            );
        }
        check(&c, &s, &case, &event_expect(op, f), &r).await;
        cleanup(&c, &s).await;
        cases += 1;
    }
    assert_eq!(
        cases,
        event_cases(op),
        "{op}: the cases docs/FAULTS.md counts"
    );
}

fault_matrix::row_tests!(event_matrix);
