//! Conversions from the driver's types (`vireo_actors::instance`) to the wire format: the one
//! place that knows both. Durations become whole milliseconds.

use std::time::Duration;

use serde_json::Value;
use vireo_actors::external::EventName;
use vireo_actors::instance::{
    error_chain, InstanceError, InstanceView, OpReport, PowerState, Released, Step, StepKind,
    WaitReport,
};
use vireo_actors::predict::{ExpectedEvent, Timing};
use vireo_actors::vif::PortId;

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

const STEP_KINDS: [StepKind; 6] = [
    StepKind::Libvirt,
    StepKind::Plug,
    StepKind::Network,
    StepKind::EventWait,
    StepKind::Peer,
    StepKind::Storage,
];
const TIMINGS: [Timing; 3] = [Timing::BindTime, Timing::PlugTime, Timing::None];

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

fn ports(what: &str, ids: &[String]) -> Result<Vec<PortId>, String> {
    ids.iter()
        .map(|p| {
            p.parse::<PortId>()
                .map_err(|e| format!("{what}: {p:?}: {e}"))
        })
        .collect()
}

/// The driver's report from its wire form (what another host's agent answered a peer
/// request with). Times come back at millisecond precision.
pub fn op_report(r: &Report) -> Result<OpReport, String> {
    let d = Duration::from_millis;
    let mut steps = Vec::with_capacity(r.steps.len());
    for s in &r.steps {
        let kind = STEP_KINDS
            .into_iter()
            .find(|k| step_kind(*k) == s.kind)
            .ok_or_else(|| format!("steps: unknown kind {:?}", s.kind))?;
        steps.push(Step {
            name: s.name.clone(),
            kind,
            took: d(s.took_ms),
            at: d(s.at_ms),
            failed: s.failed,
        });
    }
    let mut waits = Vec::with_capacity(r.waits.len());
    for w in &r.waits {
        let timing = TIMINGS
            .into_iter()
            .find(|t| t.as_str() == w.timing)
            .ok_or_else(|| format!("waits: unknown timing {:?}", w.timing))?;
        let mut expected = Vec::with_capacity(w.expected.len());
        for e in &w.expected {
            expected.push(ExpectedEvent {
                name: e
                    .name
                    .parse::<EventName>()
                    .map_err(|_| format!("waits: unknown event {:?}", e.name))?,
                tag: e
                    .tag
                    .parse::<PortId>()
                    .map_err(|err| format!("waits: tag {:?}: {err}", e.tag))?,
            });
        }
        waits.push(WaitReport {
            timing,
            expected,
            took: d(w.took_ms),
            complete: w.complete,
            missing: ports("waits.missing", &w.missing)?,
            stale: ports("waits.stale", &w.stale)?,
            unconfirmed: ports("waits.unconfirmed", &w.unconfirmed)?,
            outcome: w.outcome.clone(),
        });
    }
    let released = match &r.released {
        None => None,
        Some(rel) => Some(Released {
            deleted: ports("released.deleted", &rel.deleted)?,
            unbound: ports("released.unbound", &rel.unbound)?,
            already_gone: ports("released.already_gone", &rel.already_gone)?,
        }),
    };
    Ok(OpReport {
        op_id: r.op_id,
        request: r.request.clone(),
        took: d(r.took_ms),
        steps,
        waits,
        released,
        incoming: r.incoming.clone(),
        handover: match &r.handover {
            None => None,
            Some(h) => {
                Some(serde_json::from_value(h.clone()).map_err(|e| format!("handover: {e}"))?)
            }
        },
    })
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
        assert_eq!(op_report(&back).unwrap(), r);
        // The JSON form is the one operations show.
        let v = report(&r);
        assert_eq!(v["steps"][3]["kind"], "event-wait");
        assert_eq!(v["waits"][0]["timing"], "bind-time");
        assert_eq!(v["waits"][0]["expected"][0]["name"], "network-vif-plugged");
        assert_eq!(v["took_ms"], 1234);
        let none = report(&OpReport::default());
        assert!(none.get("released").is_none(), "{none}");
    }

    #[test]
    fn a_bad_wire_report_is_refused() {
        let mut w = report_wire(&OpReport {
            steps: vec![Step {
                name: "x".into(),
                kind: StepKind::Peer,
                took: Duration::ZERO,
                at: Duration::ZERO,
                failed: false,
            }],
            ..OpReport::default()
        });
        w.steps[0].kind = "teleport".into();
        assert!(op_report(&w).unwrap_err().contains("teleport"));
        let mut w = report_wire(&OpReport::default());
        w.waits.push(ReportWait {
            timing: "plug-time".into(),
            expected: vec![],
            took_ms: 0,
            complete: true,
            missing: vec!["not-a-port".into()],
            stale: vec![],
            unconfirmed: vec![],
            outcome: String::new(),
        });
        assert!(op_report(&w).is_err());
    }
}
