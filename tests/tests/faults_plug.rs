//! Plugging failing at every host step of every plugger call of every operation: Open
//! vSwitch not answering (the OVSDB transaction, the wait for the port, the port's removal)
//! and a device name taken or refused by the kernel (bridge, veth, tap creation and
//! enslaving, their removal), on the recording plugger's fault seam; and devices that are
//! there already, gone already, or missing where a re-plug expects them. The real plugger's
//! behaviour at the same steps is tested against the kernel and OVS in driver/tests/plug_*.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod fault_matrix;
mod faults_support;

use std::sync::Arc;

use common::*;
use fault_matrix::*;
use vireo_actors::plug::testing::{CallOutcome, PlugOp};
use vireo_actors::vif::PortId;

/// The subject's ports in record order (the attached one last).
async fn order(c: &TestCloud, s: &Subject) -> Vec<PortId> {
    let mut v = Vec::new();
    for i in 0..3 {
        v.push(port_at(c, s, i).await);
    }
    if let Some((p, _)) = &s.extra {
        v.push(*p);
    }
    v
}

/// Run the operation with a fault at `step` of `call`. A spawn's ports exist only once it
/// allocated them: it is held at its first port read, armed, and let go.
async fn run_with_fault(
    c: &Arc<TestCloud>,
    s: &Subject,
    op: Op,
    call: &PlugCall,
    step: vireo_actors::plug::PlugStep,
) -> (
    Result<vireo_actors::instance::OpReport, vireo_actors::instance::InstanceError>,
    PortId,
) {
    if op == Op::Spawn {
        let hold = c.host("h1").net.hold(NetCall::GetPort, 0);
        let task = start(op, c, s);
        hold.reached("the first port read").await;
        let ports = instance_ports(c, s.id).await;
        let mut by_net = std::collections::BTreeMap::new();
        for p in ports {
            by_net.insert(c.port(p).await.network_id, p);
        }
        let port = match call.vif {
            0 => by_net[NET_HYBRID],
            1 => by_net[NET_NATIVE],
            _ => by_net[NET_LB],
        };
        plug_fault(c, call.host, step, Some(port));
        hold.release();
        return (task.await.unwrap(), port);
    }
    let port = port_at(c, s, call.vif).await;
    if call.op == PlugOp::Plug && !call.done {
        remove_devices(c, call.host, s, port).await;
    }
    plug_fault(c, call.host, step, Some(port));
    (run(op, c, s).await, port)
}

async fn plug_matrix(op: Op) {
    let c = Arc::new(spec(op.hosts()).start().await);
    let prefix = format!("plug-{}", op.test_name());
    let mut n = 0;

    // Clean: the calls the matrix lists.
    let s = setup(op, &c, &name(&prefix, n), false).await;
    let before = if op == Op::Spawn {
        Vec::new()
    } else {
        order(&c, &s).await
    };
    let marks = plug_marks(&c);
    let r = run(op, &c, &s).await;
    let order = if op == Op::Spawn {
        order(&c, &s).await
    } else {
        before
    };
    check(&c, &s, "clean run", &clean(op), &r).await;
    assert_eq!(
        plug_recording(&c, s.id, &marks, &order),
        plug_recorded(op),
        "{op}: the plugger calls of a clean run"
    );
    cleanup(&c, &s).await;

    // Every step of every call fails once (an unplug that changes nothing has no step).
    let mut cases = 1;
    for call in plug_fault_calls(op) {
        for &step in call.steps() {
            n += 1;
            cases += 1;
            let case = format!("{op}: {step:?} of {call} ({:?})", step_family(step));
            let s = setup(op, &c, &name(&prefix, n), false).await;
            let (r, port) = run_with_fault(&c, &s, op, &call, step).await;
            assert!(
                c.host(call.host)
                    .plugger
                    .calls_for(port)
                    .iter()
                    .any(|k| k.outcome == CallOutcome::Failed(step)),
                "{case}: the fault never fired"
            );
            check(&c, &s, &case, &plug_expect(op, &call), &r).await;
            cleanup(&c, &s).await;
        }
    }

    // The devices are there already (plug) / gone already or missing (unplug, re-plug).
    if !plug_calls(op).is_empty() {
        n += 1;
        cases += 1;
        let case = format!("{op}: devices there already / gone already");
        let s = setup(op, &c, &name(&prefix, n), false).await;
        if op == Op::Rollback {
            // The destination's devices are made by the migration itself: take them away
            // before its rollback removes them.
            let hold = c.host("h2").gate.hold(PlugPoint::Unplug, 0);
            let task = start(op, &c, &s);
            hold.reached("the destination's first unplug").await;
            for i in 0..3 {
                let port = port_at(&c, &s, i).await;
                remove_devices(&c, "h2", &s, port).await;
            }
            hold.release();
            let r = task.await.unwrap();
            check(&c, &s, &case, &clean(op), &r).await;
            cleanup(&c, &s).await;
            assert_eq!(
                cases,
                plug_cases(op),
                "{op}: the cases docs/FAULTS.md counts"
            );
            return;
        }
        let mut handled = std::collections::BTreeSet::new();
        for call in plug_calls(op) {
            if op == Op::Spawn && call.vif != 1 {
                continue; // not created yet: only the user port can have devices before
            }
            let port = if op == Op::Spawn {
                s.user[0]
            } else {
                port_at(&c, &s, call.vif).await
            };
            if !handled.insert((call.host, port)) {
                continue;
            }
            let here = c.host(call.host).plugger.plugged().contains(&port);
            match (call.op, call.done) {
                (PlugOp::Plug, true) if !here => make_devices(&c, call.host, &s, port).await,
                (PlugOp::Plug, false) | (PlugOp::Unplug, _) if here => {
                    remove_devices(&c, call.host, &s, port).await
                }
                _ => {}
            }
        }
        let r = run(op, &c, &s).await;
        check(&c, &s, &case, &clean(op), &r).await;
        cleanup(&c, &s).await;
    }
    assert_eq!(
        cases,
        plug_cases(op),
        "{op}: the cases docs/FAULTS.md counts"
    );
}

fault_matrix::row_tests!(plug_matrix);
