//! Conversions from the driver's types (`vireo_actors::instance`) to the wire format: the one
//! place that knows both. Durations become whole milliseconds.

use std::time::Duration;

use serde_json::Value;
use vireo_actors::instance::{
    error_chain, InstanceError, InstanceView, OpReport, PowerState, StepKind,
};
use vireo_actors::predict::ExpectedEvent;

use super::model::{
    AwaitedEvent, ErrorDetail, Instance, InstanceOperation, InstanceVif, OpStatus, Report,
    ReportReleased, ReportStep, ReportWait,
};

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The wire name of a power state.
pub fn power_state(p: PowerState) -> &'static str {
    match p {
        PowerState::NoDomain => "no-domain",
        PowerState::Running => "running",
        PowerState::Paused => "paused",
        PowerState::Shutoff => "shutoff",
        PowerState::Suspended => "suspended",
        PowerState::Unknown => "unknown",
    }
}

fn awaited(e: &ExpectedEvent) -> AwaitedEvent {
    AwaitedEvent {
        name: e.name.as_str().to_owned(),
        tag: e.tag.to_string(),
    }
}

/// An instance as the API shows it; `op` is the agent's running operation, if any (its id
/// and kind are shown; the driver's progress gives the phase and the awaited events).
pub fn instance(v: &InstanceView, op: Option<&OpStatus>) -> Instance {
    let operation = match (&v.operation, op) {
        (Some(p), op) => Some(InstanceOperation {
            id: op.map(|o| o.id),
            kind: op
                .map_or(p.request.as_str(), |o| o.kind.as_str())
                .to_owned(),
            phase: Some(p.phase.clone()),
            elapsed_ms: ms(p.elapsed),
            waiting_for: p.waiting_for.iter().map(awaited).collect(),
            wait_remaining_ms: p.wait_remaining.map(ms),
        }),
        (None, Some(op)) => Some(InstanceOperation {
            id: Some(op.id),
            kind: op.kind.as_str().to_owned(),
            phase: None,
            elapsed_ms: 0,
            waiting_for: Vec::new(),
            wait_remaining_ms: None,
        }),
        (None, None) => None,
    };
    Instance {
        uuid: v.uuid,
        host: v.host.clone(),
        name: v.name.clone(),
        state: v.state.as_str().to_owned(),
        power_state: power_state(v.power).to_owned(),
        flavor: v.flavor.clone(),
        vcpus: v.size.map(|(vcpus, _)| vcpus),
        memory_mb: v.size.map(|(_, memory_mb)| memory_mb),
        vifs: v
            .vifs
            .iter()
            .map(|f| InstanceVif {
                port: f.port.to_string(),
                mac: f.mac.clone(),
                vif_type: f.vif_type.clone(),
                vnic_type: f.vnic_type.clone(),
                hybrid: f.hybrid,
                device: f.device.clone(),
            })
            .collect(),
        disks: v.disks.clone(),
        operation,
        last_operation: v.last_operation.as_ref().map(report),
    }
}

/// The wire name of a step's clock.
pub fn step_kind(k: StepKind) -> &'static str {
    match k {
        StepKind::Libvirt => "libvirt",
        StepKind::Plug => "plug",
        StepKind::Network => "network",
        StepKind::EventWait => "event-wait",
        StepKind::Peer => "peer",
        StepKind::Storage => "storage",
    }
}

/// An operation's report on the wire: steps and waits with millisecond times.
pub fn report_wire(r: &OpReport) -> Report {
    Report {
        op_id: r.op_id,
        request: r.request.clone(),
        took_ms: ms(r.took),
        steps: r
            .steps
            .iter()
            .map(|s| ReportStep {
                name: s.name.clone(),
                kind: step_kind(s.kind).to_owned(),
                took_ms: ms(s.took),
                at_ms: ms(s.at),
                failed: s.failed,
            })
            .collect(),
        waits: r
            .waits
            .iter()
            .map(|w| ReportWait {
                timing: w.timing.as_str().to_owned(),
                expected: w.expected.iter().map(awaited).collect(),
                took_ms: ms(w.took),
                complete: w.complete,
                missing: w.missing.iter().map(ToString::to_string).collect(),
                stale: w.stale.iter().map(ToString::to_string).collect(),
                unconfirmed: w.unconfirmed.iter().map(ToString::to_string).collect(),
                outcome: w.outcome.clone(),
            })
            .collect(),
        released: r.released.as_ref().map(|rel| ReportReleased {
            deleted: rel.deleted.iter().map(ToString::to_string).collect(),
            unbound: rel.unbound.iter().map(ToString::to_string).collect(),
            already_gone: rel.already_gone.iter().map(ToString::to_string).collect(),
        }),
        incoming: r.incoming.clone(),
        handover: r
            .handover
            .as_ref()
            .and_then(|h| serde_json::to_value(h).ok()),
    }
}

/// An operation's report as JSON (see [`report_wire`]).
pub fn report(r: &OpReport) -> Value {
    serde_json::to_value(report_wire(r)).unwrap_or(Value::Null)
}

/// A failed operation's error: the driver's stable code and the whole cause chain.
pub fn error(e: &InstanceError) -> ErrorDetail {
    ErrorDetail {
        code: e.code().to_owned(),
        message: error_chain(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vireo_actors::instance::{Released, Step, WaitReport};
    use vireo_actors::predict::Timing;
    use vireo_actors::vif::PortId;

    const STEP_KINDS: [StepKind; 6] = [
        StepKind::Libvirt,
        StepKind::Plug,
        StepKind::Network,
        StepKind::EventWait,
        StepKind::Peer,
        StepKind::Storage,
    ];
    const TIMINGS: [Timing; 3] = [Timing::BindTime, Timing::PlugTime, Timing::None];

    fn port(n: u8) -> PortId {
        format!("3b2c4d5e-0000-4000-8000-0000000000{n:02x}")
            .parse()
            .unwrap()
    }

    #[test]
    fn reports_survive_the_wire() {
        let r = OpReport {
            op_id: 7,
            request: "finish-resize".into(),
            took: Duration::from_millis(1234),
            steps: STEP_KINDS
                .into_iter()
                .enumerate()
                .map(|(i, kind)| Step {
                    name: format!("step {i}"),
                    kind,
                    took: Duration::from_millis(i as u64 * 3),
                    at: Duration::from_millis(i as u64 * 10),
                    failed: i == 2,
                })
                .collect(),
            waits: TIMINGS
                .into_iter()
                .map(|timing| WaitReport {
                    timing,
                    expected: vec![ExpectedEvent::plugged(port(1))],
                    took: Duration::from_millis(40),
                    complete: timing != Timing::None,
                    missing: vec![port(2)],
                    stale: vec![port(5)],
                    unconfirmed: vec![port(5)],
                    outcome: "completed".into(),
                })
                .collect(),
            released: Some(Released {
                deleted: vec![port(3)],
                unbound: vec![port(4)],
                already_gone: vec![],
            }),
            incoming: Some(vireo_actors::instance::IncomingDisks {
                shared_instance_path: false,
                disks: vec![vireo_actors::storage::InstanceDisk {
                    role: vireo_actors::storage::DiskRole::Root,
                    path: "/var/lib/vireo/instances/u/disk".into(),
                    format: vireo_actors::storage::ImageFormat::Qcow2,
                    virtual_size: 1 << 30,
                    image: None,
                    cache: Some(vireo_actors::storage::CacheMode::None),
                }],
            }),
            handover: Some(
                serde_json::from_value(serde_json::json!({
                    "name": "instance-1",
                    "flavor": {"name": "m2", "vcpus": 2, "memory_mb": 256, "root_gb": 2},
                    "old_flavor": {"name": "m1", "vcpus": 1, "memory_mb": 128, "root_gb": 1},
                    "boot": {"type": "none"},
                    "network_info": [],
                    "power_on": true,
                }))
                .unwrap(),
            ),
        };
        let wire = serde_json::to_string(&report_wire(&r)).unwrap();
        let back: Report = serde_json::from_str(&wire).unwrap();
        assert_eq!(back.steps.len(), STEP_KINDS.len());
        assert_eq!(back.waits[2].unconfirmed, [port(5).to_string()]);
        assert_eq!(back.took_ms, 1234);
        // The JSON form is the one operations show.
        let v = report(&r);
        assert_eq!(v["steps"][3]["kind"], "event-wait");
        assert_eq!(v["waits"][0]["timing"], "bind-time");
        assert_eq!(v["waits"][0]["expected"][0]["name"], "network-vif-plugged");
        assert_eq!(v["took_ms"], 1234);
        let none = report(&OpReport::default());
        assert!(none.get("released").is_none(), "{none}");
    }
}
