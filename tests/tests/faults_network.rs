//! The network service failing at every call of every operation: HTTP 500, 409 and 404 (as
//! the Neutron client maps them), a timeout (the change applied, the answer lost) and the
//! service down (every later call fails too, until it is back). Each operation first runs
//! clean, which must make exactly the calls the matrix lists; then every call × failure is a
//! case that must end as docs/FAULTS.md says, the instance consistent, then destroyed with
//! nothing left.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod fault_matrix;
mod faults_support;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use fault_matrix::*;

/// The calls each host's seam recorded, as points.
fn recorded(c: &TestCloud) -> Vec<NetPoint> {
    let mut out = Vec::new();
    for h in &c.hosts {
        let host: &'static str = if h.name == "h1" { "h1" } else { "h2" };
        let mut seen: BTreeMap<NetCall, usize> = BTreeMap::new();
        for call in h.net.take_calls() {
            let n = seen.entry(call).or_default();
            out.push(NetPoint {
                host,
                call,
                nth: *n,
            });
            *n += 1;
        }
    }
    out
}

async fn network_matrix(op: Op) {
    let c = Arc::new(spec(op.hosts()).start().await);
    let prefix = format!("net-{}", op.test_name());
    let mut n = 0;

    // Clean: the calls the matrix lists, no more, no less.
    let s = setup(op, &c, &name(&prefix, n), false).await;
    recorded(&c);
    let r = run(op, &c, &s).await;
    let calls = recorded(&c);
    check(&c, &s, "clean run", &clean(op), &r).await;
    assert_eq!(calls, net_recorded(op), "{op}: the calls of a clean run");
    cleanup(&c, &s).await;

    let points = net_points(op);
    if points.is_empty() {
        // No network call: the operation does not need the service at all.
        n += 1;
        let s = setup(op, &c, &name(&prefix, n), false).await;
        service_down(&c, true);
        let r = run(op, &c, &s).await;
        service_down(&c, false);
        check(&c, &s, "service down throughout", &clean(op), &r).await;
        cleanup(&c, &s).await;
        assert_eq!(
            n + 1,
            net_cases(op),
            "{op}: the cases docs/FAULTS.md counts"
        );
        return;
    }
    for p in points {
        for f in NetFailure::ALL {
            n += 1;
            let case = format!("{op}: {} at {p}", f.label());
            let s = setup(op, &c, &name(&prefix, n), false).await;
            recorded(&c);
            c.host(p.host).net.fail_with(p.call, p.nth, f);
            let r = run(op, &c, &s).await;
            service_down(&c, false);
            assert_eq!(
                c.host(p.host).net.armed(),
                0,
                "{case}: the call was never made"
            );
            check(&c, &s, &case, &net_expect(op, p, f), &r).await;
            cleanup(&c, &s).await;
        }
    }
    assert_eq!(
        n + 1,
        net_cases(op),
        "{op}: the cases docs/FAULTS.md counts"
    );
}

fault_matrix::row_tests!(network_matrix);
