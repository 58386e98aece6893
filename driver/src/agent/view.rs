//! Conversions from the driver's types (`vireo_actors::instance`) to the wire format: the one
//! place that knows both. Durations become whole milliseconds.

use std::time::Duration;

use serde_json::{json, Value};
use vireo_actors::instance::{error_chain, InstanceError, InstanceView, OpReport, PowerState};
use vireo_actors::predict::ExpectedEvent;

use super::model::{
    AwaitedEvent, ErrorDetail, Instance, InstanceOperation, InstanceVif, Operation,
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
pub fn instance(v: &InstanceView, op: Option<&Operation>) -> Instance {
    let operation = match (&v.operation, op) {
        (Some(p), op) => Some(InstanceOperation {
            id: op.map(|o| o.id),
            kind: op
                .map_or(p.request.as_str(), |o| o.kind.as_str())
                .to_owned(),
            phase: Some(p.phase.clone()),
            elapsed_ms: ms(p.elapsed),
            waiting_for: p.waiting_for.iter().map(awaited).collect(),
        }),
        (None, Some(op)) => Some(InstanceOperation {
            id: Some(op.id),
            kind: op.kind.as_str().to_owned(),
            phase: None,
            elapsed_ms: 0,
            waiting_for: Vec::new(),
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
        operation,
        last_operation: v.last_operation.as_ref().map(report),
    }
}

/// An operation's report: steps and waits with millisecond times.
pub fn report(r: &OpReport) -> Value {
    let steps: Vec<Value> = r
        .steps
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "kind": s.kind,
                "took_ms": ms(s.took),
                "at_ms": ms(s.at),
                "failed": s.failed,
            })
        })
        .collect();
    let waits: Vec<Value> = r
        .waits
        .iter()
        .map(|w| {
            json!({
                "timing": w.timing,
                "expected": w.expected.iter().map(awaited).collect::<Vec<_>>(),
                "took_ms": ms(w.took),
                "complete": w.complete,
                "missing": w.missing.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "outcome": w.outcome,
            })
        })
        .collect();
    let mut out = json!({
        "op_id": r.op_id,
        "request": r.request,
        "took_ms": ms(r.took),
        "steps": steps,
        "waits": waits,
    });
    if let Some(rel) = &r.released {
        out["released"] = json!({
            "deleted": rel.deleted.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "unbound": rel.unbound.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "already_gone": rel.already_gone.iter().map(ToString::to_string).collect::<Vec<_>>(),
        });
    }
    out
}

/// A failed operation's error: the driver's stable code and the whole cause chain.
pub fn error(e: &InstanceError) -> ErrorDetail {
    ErrorDetail {
        code: e.code().to_owned(),
        message: error_chain(e),
    }
}
