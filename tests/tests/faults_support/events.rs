//! Event faults: the network service's events on their way to the network-event actors
//! (lost, late, duplicated, failed, for another port or instance).

use std::sync::Mutex;
use std::time::Instant;

use uuid::Uuid;
use vireo_actors::events::{EventStats, EventsHandle};
use vireo_actors::external::{EventName, EventSink, EventStatus, ExternalEvent};
use vireo_actors::vif::PortId;

/// One event the network service sent, with when.
#[derive(Debug, Clone)]
pub struct Sent {
    pub at: Instant,
    pub event: ExternalEvent,
}

/// The network service's sink in these tests: keeps every event it sends (the service's own
/// log) and hands it on to the current network-event actor.
#[derive(Debug, Default)]
pub struct TeeSink {
    log: Mutex<Vec<Sent>>,
    targets: Mutex<Vec<EventsHandle>>,
    /// The event fault applied between the service and the actors, if any.
    rule: Mutex<Option<EventRule>>,
    /// Events a [`EventFault::Held`] rule kept back.
    held: Mutex<Vec<ExternalEvent>>,
    /// Events the rule changed, dropped or kept back so far.
    hits: std::sync::atomic::AtomicUsize,
    /// The rule acts on the events of this target only (the nth host's actor); the others
    /// get them as sent. `None`: every target.
    scope: Mutex<Option<usize>>,
}

/// What happens to the `network-vif-plugged` events of one instance on their way from the
/// service to the actors (the seam of the event faults; every other event passes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFault {
    /// Dropped.
    Lost,
    /// Kept back until [`TeeSink::release_held`] (delivered late).
    Held,
    /// Delivered twice.
    Duplicated,
    /// Delivered with status `failed`.
    Failed,
    /// Delivered with the tag of a port the instance does not have.
    WrongPort,
    /// Delivered for another instance (`server_uuid` rewritten).
    OtherInstance(Uuid),
}

/// An [`EventFault`] for one instance's `network-vif-plugged` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRule {
    pub instance: Uuid,
    pub fault: EventFault,
}

impl TeeSink {
    /// Deliver to no actor (the agent crashed).
    pub fn clear_targets(&self) {
        self.targets.lock().unwrap().clear();
    }

    /// Deliver to this host's actor too: every host's actor gets every event and keeps
    /// those of the instances it knows.
    pub fn add_target(&self, to: EventsHandle) {
        self.targets.lock().unwrap().push(to);
    }

    /// The counters of every host's actor, summed.
    pub async fn stats(&self) -> EventStats {
        let targets = self.targets.lock().unwrap().clone();
        let mut sum = EventStats::default();
        for t in targets {
            sum += t.stats().await.unwrap();
        }
        sum
    }

    pub fn log(&self) -> Vec<Sent> {
        self.log.lock().unwrap().clone()
    }

    /// Ports for which `network-vif-plugged` `completed` was sent for `instance` in
    /// `[from, to]`.
    pub fn plugged(&self, instance: Uuid, from: Instant, to: Instant) -> Vec<PortId> {
        self.log()
            .into_iter()
            .filter(|s| {
                s.at >= from
                    && s.at <= to
                    && s.event.server_uuid == instance
                    && s.event.name == EventName::NetworkVifPlugged
                    && s.event.status == EventStatus::Completed
            })
            .filter_map(|s| s.event.tag.and_then(|t| t.parse().ok()))
            .collect()
    }
}

impl TeeSink {
    /// Apply `rule` to the events from now on (None: deliver as sent).
    pub fn set_event_fault(&self, rule: Option<EventRule>) {
        *self.rule.lock().unwrap() = rule;
    }

    /// Apply the rule to the events of the `nth` host's actor only (`None`: every host's).
    pub fn set_event_scope(&self, nth: Option<usize>) {
        *self.scope.lock().unwrap() = nth;
    }

    /// How many events the rule acted on so far.
    pub fn fault_hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Deliver the events a [`EventFault::Held`] rule kept back (now late); how many.
    pub fn release_held(&self) -> usize {
        let held = std::mem::take(&mut *self.held.lock().unwrap());
        let n = held.len();
        for e in held {
            self.to_targets(&e);
        }
        n
    }

    /// Deliver an event the service did not send (a stray, an early copy), logged too.
    pub fn inject(&self, event: ExternalEvent) {
        self.log.lock().unwrap().push(Sent {
            at: Instant::now(),
            event: event.clone(),
        });
        self.to_targets(&event);
    }

    fn to_targets(&self, event: &ExternalEvent) {
        for t in self.targets.lock().unwrap().iter() {
            t.deliver(event.clone());
        }
    }

    /// What the rule makes of an event: the events to deliver now.
    fn apply(&self, event: ExternalEvent) -> Vec<ExternalEvent> {
        let rule = *self.rule.lock().unwrap();
        let Some(rule) = rule.filter(|r| {
            r.instance == event.server_uuid && event.name == EventName::NetworkVifPlugged
        }) else {
            return vec![event];
        };
        self.hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match rule.fault {
            EventFault::Lost => vec![],
            EventFault::Held => {
                self.held.lock().unwrap().push(event);
                vec![]
            }
            EventFault::Duplicated => vec![event.clone(), event],
            EventFault::Failed => vec![ExternalEvent {
                status: EventStatus::Failed,
                ..event
            }],
            EventFault::WrongPort => vec![ExternalEvent {
                tag: Some(Uuid::new_v4().to_string()),
                ..event
            }],
            EventFault::OtherInstance(other) => vec![ExternalEvent {
                server_uuid: other,
                ..event
            }],
        }
    }
}

impl EventSink for TeeSink {
    fn deliver(&self, event: ExternalEvent) {
        self.log.lock().unwrap().push(Sent {
            at: Instant::now(),
            event: event.clone(),
        });
        let scope = *self.scope.lock().unwrap();
        let Some(nth) = scope else {
            for e in self.apply(event) {
                self.to_targets(&e);
            }
            return;
        };
        let faulted = self.apply(event.clone());
        let targets = self.targets.lock().unwrap().clone();
        for (i, t) in targets.iter().enumerate() {
            if i == nth {
                for e in &faulted {
                    t.deliver(e.clone());
                }
            } else {
                t.deliver(event.clone());
            }
        }
    }
}
