//! `POST /os-server-external-events`: Nova's external-events API, as Neutron's Nova notifier
//! calls it.
//!
//! This module owns the body's validation and Nova's answer; the server hands the accepted
//! events to the NetworkEventActor as one batch.
//!
//! - Body: `{"events": [{"name", "server_uuid", "tag"?, "status"?}, ...]}`, nothing else.
//!   Not JSON, a wrong type, an unknown key, an empty list, a `server_uuid` that is not a
//!   UUID, an event name the request's microversion does not have ([`introduced`]), a
//!   `status` other than `completed`/`failed`/`in-progress` or a `tag` over 255 characters
//!   reject the whole request with 400, as Nova's schema does. Like Nova, no count limit:
//!   the body size limit bounds a batch (Neutron sends a whole batch in one POST and drops it
//!   whole when it is refused).
//! - Per event, as Nova's controller answers: `404` the instance is unknown here; `400` the
//!   event needs a tag and has none (`volume-extended`, `power-update`,
//!   `accelerator-request-bound`); `422` the instance is known but not on this host (it
//!   live-migrated away); `200` accepted. Every event is echoed as sent with `status` set to
//!   `completed` when accepted and `failed` otherwise, plus `code`.
//! - The answer is 200 when every event was accepted and 207 otherwise, also when none was
//!   (Nova answered 404 then until bug 1855752 was fixed, and Neutron lost the per-event
//!   answers).
//!
//! Which instances are on this host comes from the driver (`ComputeDriver::knows`, asked once
//! per distinct instance of a POST); [`Departed`] remembers, boundedly, the instances that
//! live-migrated away through this agent, answered 422 rather than 404.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use serde::Deserialize;
use tracing::debug;
use uuid::Uuid;
use vireo_actors::external::{EventName, EventStatus, ExternalEvent};

use super::error::ApiError;
use super::microversion::ApiVersion;
use super::model::{EventAnswer, EventsAnswer};

/// Longest tag Nova accepts.
pub const MAX_TAG_LEN: usize = 255;

/// Where an instance is, as far as external events are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On this host: its events are accepted (200).
    OnHost,
    /// Known, but not on this host now (it live-migrated away): 422.
    NotOnHost,
    /// Never heard of (or deleted): 404.
    Unknown,
}

/// A bounded memory of instances that left this host by live migration (oldest forgotten
/// first).
#[derive(Debug)]
pub struct Departed {
    inner: Mutex<(HashSet<Uuid>, VecDeque<Uuid>)>,
    limit: usize,
}

impl Departed {
    /// Remember at most `limit` instances.
    pub fn new(limit: usize) -> Self {
        Departed {
            inner: Mutex::new((HashSet::new(), VecDeque::new())),
            limit,
        }
    }

    /// `uuid` migrated away.
    pub fn insert(&self, uuid: Uuid) {
        let mut i = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if self.limit == 0 || !i.0.insert(uuid) {
            return;
        }
        i.1.push_back(uuid);
        while i.1.len() > self.limit {
            if let Some(old) = i.1.pop_front() {
                i.0.remove(&old);
            }
        }
    }

    /// `uuid` is here again (it came back).
    pub fn remove(&self, uuid: &Uuid) {
        let mut i = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if i.0.remove(uuid) {
            i.1.retain(|u| u != uuid);
        }
    }

    /// True when `uuid` migrated away and is remembered.
    pub fn contains(&self, uuid: &Uuid) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .contains(uuid)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    events: Vec<RawEvent>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvent {
    name: String,
    server_uuid: String,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    status: Option<String>,
}

/// The answer to one POST.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The body: every event echoed with its code.
    pub answer: EventsAnswer,
    /// The accepted events, in order, for the events actor.
    pub accepted: Vec<ExternalEvent>,
}

impl Outcome {
    /// 200 when every event was accepted, 207 otherwise.
    pub fn status(&self) -> u16 {
        status_of(&self.answer)
    }
}

/// Nova's status for a set of per-event answers: 200 when every event was accepted, 207
/// otherwise.
pub fn status_of(answer: &EventsAnswer) -> u16 {
    if answer.events.iter().all(|e| e.code == 200) {
        200
    } else {
        207
    }
}

/// The microversion that added `name` to the API (Nova's schemas: 2.51 `volume-extended`,
/// 2.76 `power-update`, 2.82 `accelerator-request-bound`, 2.93 `volume-reimaged`; the
/// network events since 2.0).
pub fn introduced(name: EventName) -> ApiVersion {
    match name {
        EventName::NetworkVifPlugged
        | EventName::NetworkVifUnplugged
        | EventName::NetworkVifDeleted
        | EventName::NetworkChanged => ApiVersion::new(2, 0),
        EventName::VolumeExtended => ApiVersion::new(2, 51),
        EventName::PowerUpdate => ApiVersion::new(2, 76),
        EventName::AcceleratorRequestBound => ApiVersion::new(2, 82),
        EventName::VolumeReimaged => ApiVersion::new(2, 93),
    }
}

/// Events Nova drops (per-event 400) when they come without a tag.
pub fn tag_required(name: EventName) -> bool {
    matches!(
        name,
        EventName::VolumeExtended | EventName::PowerUpdate | EventName::AcceleratorRequestBound
    )
}

/// The names an API version accepts, for the refusal's message.
fn names_at(version: ApiVersion) -> String {
    EventName::ALL
        .into_iter()
        .filter(|n| introduced(*n) <= version)
        .map(|n| n.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn parse_status(s: &str) -> Option<EventStatus> {
    match s {
        "completed" => Some(EventStatus::Completed),
        "failed" => Some(EventStatus::Failed),
        "in-progress" => Some(EventStatus::InProgress),
        _ => None,
    }
}

/// A validated POST: its events as sent, with the parsed uuid and status.
#[derive(Debug)]
pub struct Parsed {
    events: Vec<(RawEvent, Uuid, EventName, EventStatus)>,
}

impl Parsed {
    /// The distinct instances the events name, in first-seen order.
    pub fn instances(&self) -> Vec<Uuid> {
        let mut seen = HashSet::with_capacity(self.events.len());
        self.events
            .iter()
            .filter_map(|(_, u, _, _)| seen.insert(*u).then_some(*u))
            .collect()
    }
}

/// Validate `body` as Nova's schema for `version` does (see the module docs). `Err` is the
/// whole request's error (400).
pub fn parse(body: &[u8], version: ApiVersion) -> Result<Parsed, ApiError> {
    let body: Body = serde_json::from_slice(body).map_err(|e| ApiError::BadJson(e.to_string()))?;
    if body.events.is_empty() {
        return Err(ApiError::Invalid(
            "events: must hold at least one event".into(),
        ));
    }
    let mut events = Vec::with_capacity(body.events.len());
    for (i, e) in body.events.into_iter().enumerate() {
        let uuid = Uuid::parse_str(&e.server_uuid).map_err(|_| {
            ApiError::Invalid(format!(
                "events[{i}].server_uuid: {:?} is not a UUID",
                e.server_uuid
            ))
        })?;
        let name = e
            .name
            .parse::<EventName>()
            .ok()
            .filter(|n| introduced(*n) <= version)
            .ok_or_else(|| {
                ApiError::Invalid(format!(
                    "events[{i}].name: {:?} is not one of {} (API version {version})",
                    e.name,
                    names_at(version)
                ))
            })?;
        let status = match e.status.as_deref() {
            None => EventStatus::Completed,
            Some(s) => parse_status(s).ok_or_else(|| {
                ApiError::Invalid(format!(
                    "events[{i}].status: {s:?} is not one of completed, failed, in-progress"
                ))
            })?,
        };
        if let Some(tag) = &e.tag {
            if tag.chars().count() > MAX_TAG_LEN {
                return Err(ApiError::Invalid(format!(
                    "events[{i}].tag: longer than {MAX_TAG_LEN} characters"
                )));
            }
        }
        events.push((e, uuid, name, status));
    }
    Ok(Parsed { events })
}

/// Decide each event's code from where its instance is (`placements` holds every instance of
/// [`Parsed::instances`]; a missing one counts as unknown).
pub fn decide(parsed: Parsed, placements: &HashMap<Uuid, Placement>) -> Outcome {
    let mut answers = Vec::with_capacity(parsed.events.len());
    let mut accepted = Vec::with_capacity(parsed.events.len());
    for (e, uuid, name, status) in parsed.events {
        let placement = placements.get(&uuid).copied().unwrap_or(Placement::Unknown);
        let code = match placement {
            Placement::Unknown => 404,
            _ if tag_required(name) && e.tag.is_none() => 400,
            Placement::NotOnHost => 422,
            Placement::OnHost => {
                accepted.push(ExternalEvent {
                    name,
                    server_uuid: uuid,
                    tag: e.tag.clone(),
                    status,
                });
                200
            }
        };
        debug!(instance = %uuid, name = %e.name, tag = e.tag.as_deref().unwrap_or(""), code,
               "external event");
        answers.push(EventAnswer {
            name: e.name,
            server_uuid: e.server_uuid,
            tag: e.tag,
            status: if code == 200 { "completed" } else { "failed" }.to_owned(),
            code,
        });
    }
    Outcome {
        answer: EventsAnswer { events: answers },
        accepted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::microversion::{MAX, MIN};
    use serde_json::json;

    const A: &str = "9a1c2e44-5d2b-4e55-9c51-3f0f3a6c4d10";
    const B: &str = "9a1c2e44-5d2b-4e55-9c51-3f0f3a6c4d11";
    const PORT: &str = "3b2c4d5e-0000-4000-8000-000000000001";

    fn placements() -> HashMap<Uuid, Placement> {
        HashMap::from([
            (Uuid::parse_str(A).unwrap(), Placement::OnHost),
            (Uuid::parse_str(B).unwrap(), Placement::NotOnHost),
        ])
    }

    fn run(v: serde_json::Value) -> Result<Outcome, ApiError> {
        parse(v.to_string().as_bytes(), MAX).map(|p| decide(p, &placements()))
    }

    #[test]
    fn all_accepted_is_200_with_status_defaulted() {
        let o = run(json!({"events": [
            {"name": "network-vif-plugged", "server_uuid": A, "tag": PORT},
            {"name": "network-changed", "server_uuid": A, "tag": PORT, "status": "completed"},
        ]}))
        .unwrap();
        assert_eq!(o.status(), 200);
        assert_eq!(o.accepted.len(), 2);
        assert_eq!(o.accepted[0].status, EventStatus::Completed);
        let e = &o.answer.events[0];
        assert_eq!(
            (e.code, e.status.as_str(), e.tag.as_deref()),
            (200, "completed", Some(PORT))
        );
    }

    #[test]
    fn mixed_is_207_with_per_event_codes() {
        let unknown = Uuid::new_v4().to_string();
        let o = run(json!({"events": [
            {"name": "network-vif-plugged", "server_uuid": A, "tag": PORT, "status": "failed"},
            {"name": "network-vif-plugged", "server_uuid": unknown, "tag": PORT},
            {"name": "power-update", "server_uuid": A},
            {"name": "volume-extended", "server_uuid": A},
            {"name": "accelerator-request-bound", "server_uuid": A},
            {"name": "volume-reimaged", "server_uuid": A},
            {"name": "network-vif-plugged", "server_uuid": B, "tag": PORT},
        ]}))
        .unwrap();
        assert_eq!(o.status(), 207);
        let codes: Vec<u16> = o.answer.events.iter().map(|e| e.code).collect();
        assert_eq!(
            codes,
            [200, 404, 400, 400, 400, 200, 422],
            "a tag is required by the three events Nova requires it for"
        );
        let statuses: Vec<&str> = o.answer.events.iter().map(|e| e.status.as_str()).collect();
        assert_eq!(
            statuses,
            [
                "completed",
                "failed",
                "failed",
                "failed",
                "failed",
                "completed",
                "failed"
            ]
        );
        assert_eq!(o.accepted.len(), 2);
        assert_eq!(o.accepted[0].status, EventStatus::Failed);
        assert_eq!(o.answer.events[2].name, "power-update", "echoed as sent");
        assert!(o.answer.events[2].tag.is_none());
    }

    #[test]
    fn none_accepted_is_207_with_every_code() {
        let o = run(json!({"events": [
            {"name": "network-vif-plugged", "server_uuid": Uuid::new_v4().to_string()},
            {"name": "network-vif-plugged", "server_uuid": B},
        ]}))
        .unwrap();
        assert_eq!(o.status(), 207);
        assert!(o.accepted.is_empty());
        let codes: Vec<u16> = o.answer.events.iter().map(|e| e.code).collect();
        assert_eq!(codes, [404, 422]);
    }

    #[test]
    fn names_are_gated_by_the_requested_microversion() {
        let body = |name: &str| {
            json!({"events": [{"name": name, "server_uuid": A, "tag": "t"}]}).to_string()
        };
        let cases = [
            ("network-vif-plugged", ApiVersion::new(2, 1)),
            ("volume-extended", ApiVersion::new(2, 51)),
            ("power-update", ApiVersion::new(2, 76)),
            ("accelerator-request-bound", ApiVersion::new(2, 82)),
            ("volume-reimaged", ApiVersion::new(2, 93)),
        ];
        for (name, since) in cases {
            assert!(
                parse(body(name).as_bytes(), since).is_ok(),
                "{name} at {since}"
            );
            assert!(
                parse(body(name).as_bytes(), MAX).is_ok(),
                "{name} at the maximum"
            );
            if since > MIN {
                let before = ApiVersion::new(since.major, since.minor - 1);
                let e = parse(body(name).as_bytes(), before).unwrap_err();
                assert!(
                    matches!(&e, ApiError::Invalid(m) if m.contains(name)),
                    "{name} at {before}: {e:?}"
                );
            }
        }
        // A name no version has: the whole request, as Nova's schema refuses it.
        let e = parse(body("network-vif-exploded").as_bytes(), MAX).unwrap_err();
        assert!(matches!(e, ApiError::Invalid(_)), "{e:?}");
    }

    #[test]
    fn a_batch_has_no_count_limit() {
        let many: Vec<_> = (0..5000)
            .map(|_| json!({"name": "network-changed", "server_uuid": A}))
            .collect();
        let p = parse(json!({"events": many}).to_string().as_bytes(), MIN).unwrap();
        let o = decide(p, &placements());
        assert_eq!((o.status(), o.accepted.len()), (200, 5000));
    }

    #[test]
    fn distinct_instances_in_first_seen_order() {
        let p = parse(
            json!({"events": [
                {"name": "network-changed", "server_uuid": B},
                {"name": "network-changed", "server_uuid": A},
                {"name": "network-changed", "server_uuid": B},
            ]})
            .to_string()
            .as_bytes(),
            MIN,
        )
        .unwrap();
        let ids: Vec<String> = p.instances().iter().map(ToString::to_string).collect();
        assert_eq!(ids, [B, A]);
    }

    #[test]
    fn schema_violations_reject_the_whole_request() {
        let bad = [
            json!({"events": []}),
            json!({"events": {}}),
            json!({}),
            json!({"events": [{"name": "network-changed"}]}),
            json!({"events": [{"name": "network-changed", "server_uuid": "nope"}]}),
            json!({"events": [{"name": 5, "server_uuid": A}]}),
            json!({"events": [{"name": "network-changed", "server_uuid": A, "status": "done"}]}),
            json!({"events": [{"name": "network-changed", "server_uuid": A, "extra": 1}]}),
            json!({"events": [{"name": "network-changed", "server_uuid": A,
                               "tag": "x".repeat(256)}]}),
            json!({"events": [], "more": 1}),
        ];
        for b in bad {
            let e = run(b.clone()).unwrap_err();
            assert!(
                matches!(e, ApiError::BadJson(_) | ApiError::Invalid(_)),
                "{b}: {e:?}"
            );
        }
        assert!(matches!(
            parse(b"not json", MIN).unwrap_err(),
            ApiError::BadJson(_)
        ));
    }

    #[test]
    fn departed_memory_is_bounded() {
        let d = Departed::new(2);
        let ids: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
        for u in &ids {
            d.insert(*u);
        }
        assert!(!d.contains(&ids[0]), "oldest forgotten");
        assert!(d.contains(&ids[1]) && d.contains(&ids[2]));
        d.remove(&ids[2]);
        assert!(!d.contains(&ids[2]));
    }
}
