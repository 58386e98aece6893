//! Conversions from the driver's types to the wire format: the one place that knows both.
//!
//! When the real `ComputeDriver` lands, only these functions (and the imports) change.

use serde_json::Value;

use super::model::{
    AwaitedEvent, ErrorDetail, Instance, InstanceOperation, InstanceVif, Operation,
};
use super::provisional::{InstanceError, InstanceView, OpReport, PowerState};

/// The wire name of a power state.
pub fn power_state(p: PowerState) -> &'static str {
    match p {
        PowerState::NoState => "no-state",
        PowerState::Running => "running",
        PowerState::Paused => "paused",
        PowerState::Shutdown => "shutdown",
        PowerState::Crashed => "crashed",
        PowerState::Suspended => "suspended",
    }
}

/// An instance as the API shows it; `op` is the agent's running operation, if any (its kind
/// is shown; the driver's progress gives the step and the awaited events).
pub fn instance(v: &InstanceView, op: Option<&Operation>) -> Instance {
    let operation = match (&v.operation, op) {
        (Some(p), op) => Some(InstanceOperation {
            id: op.map(|o| o.id),
            kind: op
                .map_or(p.request.as_str(), |o| o.kind.as_str())
                .to_owned(),
            step: Some(p.step.clone()),
            steps_done: p.steps_done,
            waiting_for: p
                .waiting_for
                .iter()
                .map(|a| AwaitedEvent {
                    name: a.name.as_str().to_owned(),
                    tag: a.tag.to_string(),
                })
                .collect(),
        }),
        (None, Some(op)) => Some(InstanceOperation {
            id: Some(op.id),
            kind: op.kind.as_str().to_owned(),
            step: None,
            steps_done: 0,
            waiting_for: Vec::new(),
        }),
        (None, None) => None,
    };
    Instance {
        uuid: v.uuid,
        name: v.name.clone(),
        state: v.state.as_str().to_owned(),
        power_state: power_state(v.power).to_owned(),
        vifs: v
            .vifs
            .iter()
            .map(|f| InstanceVif {
                port: f.port.to_string(),
                address: f.address.clone(),
                vif_type: f.vif_type.clone(),
                devname: f.devname.clone(),
                plugged: f.plugged,
            })
            .collect(),
        operation,
    }
}

/// A finished operation's report.
pub fn report(r: &OpReport) -> Value {
    serde_json::to_value(r).unwrap_or(Value::Null)
}

/// A failed operation's error.
pub fn error(e: &InstanceError) -> ErrorDetail {
    ErrorDetail {
        code: e.code().to_owned(),
        message: e.to_string(),
    }
}
