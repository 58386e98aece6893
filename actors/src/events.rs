//! The NetworkEventActor: waits for Neutron's external events, per instance and operation.
//!
//! This module owns the waiting half of the event model (docs/EVENT_MODEL.md, section 7):
//!
//! - an operation registers what it expects ([`Expect`]) **before** the action that triggers
//!   it, with `since` = the operation's start, one [`WaitPolicy`] (timeout, fatal) and its
//!   [`OpId`]; it gets a [`WaitHandle`] to await;
//! - events come in through [`Deliver`] / [`DeliverBatch`] or the non-blocking
//!   [`EventSink`] implementation of [`EventsHandle`];
//! - an event with no waiter is buffered for its instance (bounded count and age) and satisfies
//!   the next matching registration of an operation that had begun when it arrived; an event
//!   older than `since` never counts;
//! - duplicates are harmless, `failed` fails a fatal wait naming the port, events for unknown
//!   instances are counted and dropped;
//! - [`CancelOperation`], [`ForgetInstance`] and [`Shutdown`] fail and remove waiters, and a
//!   periodic sweep removes abandoned waiters and idle state: nothing grows without bound.
//!
//! Time is tokio time (actix runs on tokio), so tests use `tokio::time::pause()`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use actix::prelude::*;
use serde::Deserialize;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use uuid::Uuid;

use crate::external::{EventName, EventSink, EventStatus, ExternalEvent};
use crate::predict::ExpectedEvent;
use crate::vif::PortId;

/// Why a wait did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// Neutron reported the port as failed (status `failed`) and the wait is fatal.
    #[error("port {port} reported {event} with status failed")]
    Failed {
        /// The port.
        port: PortId,
        /// The event that failed.
        event: EventName,
    },
    /// The deadline passed and the wait is fatal.
    #[error("timed out after {}s; never reported: {}", timeout.as_secs(), ports(missing))]
    TimedOut {
        /// Ports that never reported.
        missing: Vec<PortId>,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The operation was cancelled or its instance forgotten.
    #[error("wait cancelled")]
    Cancelled,
    /// The actor shut down (or was gone when the wait was registered).
    #[error("network event actor shut down")]
    Shutdown,
    /// The instance already has as many waits as the actor allows.
    #[error("too many concurrent waits for the instance (limit {limit})")]
    TooManyWaits {
        /// The limit.
        limit: usize,
    },
}

fn ports(list: &[PortId]) -> String {
    let mut s = String::new();
    for (i, p) in list.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&p.to_string());
    }
    s
}

/// `vif_plugging_timeout` and `vif_plugging_is_fatal` for one wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// One deadline for the whole wait; zero means "do not wait".
    pub timeout: Duration,
    /// True: a timeout or a failed event fails the wait (roll back). False: log a warning and
    /// proceed; the outcome names the ports that never reported or failed.
    pub fatal: bool,
}

impl Default for WaitPolicy {
    /// Nova's defaults: 300 s, fatal.
    fn default() -> Self {
        WaitPolicy {
            timeout: Duration::from_secs(300),
            fatal: true,
        }
    }
}

/// The operation a wait belongs to (chosen by the caller, e.g. the instance actor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op-{}", self.0)
    }
}

/// How a wait ended when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WaitOutcome {
    /// False when nothing was waited for (no events, or timeout zero).
    pub waited: bool,
    /// Non-fatal waits only: ports that never reported before the deadline.
    pub missing: Vec<PortId>,
    /// Non-fatal waits only: ports reported failed.
    pub failed: Vec<PortId>,
}

impl WaitOutcome {
    /// Every expected event arrived with status `completed` (or nothing was expected).
    pub fn complete(&self) -> bool {
        self.missing.is_empty() && self.failed.is_empty()
    }
}

type WaitResult = Result<WaitOutcome, WaitError>;

/// An awaitable wait. Dropping it abandons the wait (the actor removes it at its next sweep
/// or deadline, counted as `abandoned`).
#[derive(Debug)]
pub struct WaitHandle {
    state: HandleState,
}

#[derive(Debug)]
enum HandleState {
    Ready(Option<WaitResult>),
    Pending(oneshot::Receiver<WaitResult>),
}

impl WaitHandle {
    fn ready(r: WaitResult) -> Self {
        WaitHandle {
            state: HandleState::Ready(Some(r)),
        }
    }

    /// True when the result is known without waiting (satisfied from the buffer, refused,
    /// or nothing to wait for).
    pub fn is_ready(&self) -> bool {
        matches!(self.state, HandleState::Ready(_))
    }
}

impl Future for WaitHandle {
    type Output = WaitResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<WaitResult> {
        match &mut self.state {
            HandleState::Ready(r) => Poll::Ready(r.take().unwrap_or(Err(WaitError::Shutdown))),
            HandleState::Pending(rx) => match Pin::new(rx).poll(cx) {
                Poll::Ready(Ok(r)) => Poll::Ready(r),
                // The actor dropped the sender without answering: it is gone.
                Poll::Ready(Err(_)) => Poll::Ready(Err(WaitError::Shutdown)),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

/// Limits and timers of the actor. Plain serde data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventConfig {
    /// Events kept per instance while nobody waits for them (raised to two per port the
    /// instance is known to have); when full, the oldest for a port the instance does not
    /// have is dropped first, then the oldest that no wait takes (not `network-vif-plugged`),
    /// then the oldest of all.
    pub buffer_per_instance: usize,
    /// A buffered event older than this is dropped (seconds).
    pub buffer_max_age_secs: u64,
    /// Concurrent waits one instance may hold.
    pub max_waits_per_instance: usize,
    /// How long an instance that was never tracked stays known after its last wait ended
    /// (seconds): late duplicates are then counted as such, not as unknown.
    pub idle_grace_secs: u64,
    /// Period of the sweep that ages buffers and removes abandoned waits (seconds).
    pub sweep_interval_secs: u64,
}

impl Default for EventConfig {
    fn default() -> Self {
        EventConfig {
            buffer_per_instance: 32,
            buffer_max_age_secs: 600,
            max_waits_per_instance: 16,
            idle_grace_secs: 600,
            sweep_interval_secs: 30,
        }
    }
}

impl EventConfig {
    fn max_age(&self) -> Duration {
        Duration::from_secs(self.buffer_max_age_secs)
    }
    fn grace(&self) -> Duration {
        Duration::from_secs(self.idle_grace_secs)
    }
    fn sweep(&self) -> Duration {
        Duration::from_secs(self.sweep_interval_secs.max(1))
    }
}

/// Counters and current sizes, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventStats {
    /// Events handed to the actor.
    pub delivered: u64,
    /// Events that satisfied (or failed) a waiting registration.
    pub matched: u64,
    /// Registrations' events satisfied from the buffer.
    pub matched_from_buffer: u64,
    /// Events put in a buffer.
    pub buffered: u64,
    /// Buffered events dropped because the instance's buffer was full (oldest first).
    pub buffer_dropped_count: u64,
    /// Buffered events dropped because they were older than the maximum age.
    pub buffer_dropped_age: u64,
    /// Buffered events dropped with their instance (forget, shutdown).
    pub buffer_dropped_forgotten: u64,
    /// Events for instances the actor does not know, dropped.
    pub unknown_instance_dropped: u64,
    /// Events already seen by the waiter or already buffered, dropped.
    pub duplicates: u64,
    /// Events ignored: not a network event, status in-progress, or a tag that is not a port id.
    pub ignored: u64,
    /// Waits that timed out (fatal or not).
    pub timeouts: u64,
    /// Waits failed by a `failed` event.
    pub failed: u64,
    /// Waits cancelled (operation cancelled or instance forgotten).
    pub cancelled: u64,
    /// Waits whose handle was dropped before the end.
    pub abandoned: u64,
    /// Waits failed by shutdown.
    pub shut_down: u64,
    /// Waits completed with every event.
    pub completed: u64,
    /// Pending waits now.
    pub waits_now: u64,
    /// Buffered events now.
    pub buffered_now: u64,
    /// Known instances now (tracked or with recent waits).
    pub instances_now: u64,
}

impl std::ops::AddAssign for EventStats {
    /// Sum the counters of several actors (one per host of a process).
    fn add_assign(&mut self, o: EventStats) {
        self.delivered += o.delivered;
        self.matched += o.matched;
        self.matched_from_buffer += o.matched_from_buffer;
        self.buffered += o.buffered;
        self.buffer_dropped_count += o.buffer_dropped_count;
        self.buffer_dropped_age += o.buffer_dropped_age;
        self.buffer_dropped_forgotten += o.buffer_dropped_forgotten;
        self.unknown_instance_dropped += o.unknown_instance_dropped;
        self.duplicates += o.duplicates;
        self.ignored += o.ignored;
        self.timeouts += o.timeouts;
        self.failed += o.failed;
        self.cancelled += o.cancelled;
        self.abandoned += o.abandoned;
        self.shut_down += o.shut_down;
        self.completed += o.completed;
        self.waits_now += o.waits_now;
        self.buffered_now += o.buffered_now;
        self.instances_now += o.instances_now;
    }
}

/// Sizes behind the memory figures in docs/EVENT_MODEL.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryFigures {
    /// Bytes of one pending wait with no expected events (struct, deadline index entry).
    pub per_wait: usize,
    /// Bytes added per expected event of a wait.
    pub per_expected_event: usize,
    /// Bytes of one buffered event.
    pub per_buffered_event: usize,
    /// Bytes of one known instance's entry (map slot, key, struct), without waits or buffer.
    pub per_instance: usize,
}

/// Make an instance known: its events are buffered until it is forgotten.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct TrackInstance(pub Uuid);

/// Ports a known instance has (its record's VIFs): its buffer then drops events for any other
/// port first, so that strays (events for ports the instance does not have) never push out an
/// early event of one of its own. Waits teach the actor their ports too. Ignored for an
/// instance the actor does not know (send [`TrackInstance`] first).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct TrackPorts {
    /// The instance.
    pub instance: Uuid,
    /// Ports it has.
    pub ports: Vec<PortId>,
}

/// Forget an instance: its waits fail with [`WaitError::Cancelled`], its buffer is dropped,
/// later events for it count as unknown.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct ForgetInstance(pub Uuid);

/// Register a wait. Reply: the handle (already resolved when the buffer satisfied it, the
/// policy says not to wait, or the registration is refused).
#[derive(Debug, Clone, Message)]
#[rtype(result = "WaitHandle")]
pub struct Expect {
    /// The instance.
    pub instance: Uuid,
    /// What to wait for.
    pub events: Vec<ExpectedEvent>,
    /// The start of the operation: an event that arrived before this never counts.
    pub since: Instant,
    /// Timeout and fatality.
    pub policy: WaitPolicy,
    /// The operation, for [`CancelOperation`].
    pub op_id: OpId,
}

/// Hand one event to the actor.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Deliver {
    /// The event.
    pub event: ExternalEvent,
    /// When it was received (stamped by [`EventsHandle`]).
    pub received: Instant,
}

/// Hand a batch of events (one POST from Neutron) to the actor, in order.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct DeliverBatch {
    /// The events, in the order received.
    pub events: Vec<ExternalEvent>,
    /// When they were received.
    pub received: Instant,
}

/// Fail and remove every wait of an operation. Reply: how many were removed.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "usize")]
pub struct CancelOperation {
    /// The instance.
    pub instance: Uuid,
    /// The operation.
    pub op_id: OpId,
}

/// Fail every wait with [`WaitError::Shutdown`], drop all state and stop the actor.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Shutdown;

/// Read the counters.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "EventStats")]
pub struct Stats;

/// A hasher for UUID keys: they are random already, so fold the bytes instead of SipHash.
#[derive(Debug, Default, Clone, Copy)]
struct UuidHasher(u64);

impl Hasher for UuidHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 =
                (self.0.rotate_left(5) ^ u64::from_le_bytes(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, _: usize) {}
}

type UuidMap<V> = HashMap<Uuid, V, BuildHasherDefault<UuidHasher>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    name: EventName,
    tag: PortId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Got {
    Pending,
    Completed,
    Failed,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    op: OpId,
    since: Instant,
    deadline: Instant,
    policy: WaitPolicy,
    expected: Vec<(Key, Got)>,
    pending: usize,
    tx: oneshot::Sender<WaitResult>,
}

#[derive(Debug, Clone, Copy)]
struct Buffered {
    key: Key,
    failed: bool,
    at: Instant,
}

/// Ports one instance is known to have, at most this many (the most recently learnt).
const MAX_KNOWN_PORTS: usize = 64;

#[derive(Debug)]
struct Entry {
    tracked: bool,
    waiters: Vec<Waiter>,
    buffer: VecDeque<Buffered>,
    /// Ports of the instance (from [`TrackPorts`] and its waits), most recent last.
    ports: Vec<PortId>,
    last_active: Instant,
}

impl Entry {
    fn new(now: Instant) -> Self {
        Entry {
            tracked: false,
            waiters: Vec::new(),
            buffer: VecDeque::new(),
            ports: Vec::new(),
            last_active: now,
        }
    }

    fn learn_port(&mut self, port: PortId) {
        if let Some(pos) = self.ports.iter().position(|p| *p == port) {
            self.ports.remove(pos);
        } else if self.ports.len() >= MAX_KNOWN_PORTS {
            self.ports.remove(0);
        }
        self.ports.push(port);
    }

    fn knows(&self, port: &PortId) -> bool {
        self.ports.contains(port)
    }

    /// The buffer's bound: the configured count, raised so that every known port keeps one
    /// `network-vif-plugged` of each status (zero stays zero: no buffering).
    fn buffer_cap(&self, configured: usize) -> usize {
        if configured == 0 {
            0
        } else {
            configured.max(2 * self.ports.len())
        }
    }

    /// Which buffered event goes when the buffer is full: the oldest for a port the instance
    /// does not have (a stray), then the oldest no wait takes (not `network-vif-plugged`),
    /// then the oldest of all.
    fn eviction(&self) -> usize {
        let foreign = || {
            self.buffer
                .iter()
                .position(|b| !self.ports.is_empty() && !self.knows(&b.key.tag))
        };
        let unawaited = || {
            self.buffer
                .iter()
                .position(|b| b.key.name != EventName::NetworkVifPlugged)
        };
        foreign().or_else(unawaited).unwrap_or(0)
    }
}

/// The actor. Start it with [`EventsHandle::start`] or `NetworkEventActor::new(cfg).start()`.
#[derive(Debug)]
pub struct NetworkEventActor {
    cfg: EventConfig,
    instances: UuidMap<Entry>,
    deadlines: BTreeMap<(Instant, u64), Uuid>,
    timer: Option<(Instant, SpawnHandle)>,
    next_id: u64,
    stats: EventStats,
    shutting_down: bool,
}

impl NetworkEventActor {
    /// A new actor with `cfg`.
    pub fn new(cfg: EventConfig) -> Self {
        NetworkEventActor {
            cfg,
            instances: UuidMap::default(),
            deadlines: BTreeMap::new(),
            timer: None,
            next_id: 0,
            stats: EventStats::default(),
            shutting_down: false,
        }
    }

    /// The sizes the memory figures come from (see docs/EVENT_MODEL.md).
    pub fn memory_figures() -> MemoryFigures {
        use std::mem::size_of;
        // A waiter lives inline in its instance's Vec<Waiter>, owns a oneshot channel
        // (one shared allocation: state word, value slot, two wakers) and one entry in the
        // deadline index (a BTreeMap node slot: key + value, nodes are ~2/3 full).
        let channel = size_of::<usize>() * 2 // Arc counts
            + size_of::<usize>() // state
            + size_of::<Option<WaitResult>>()
            + 2 * 2 * size_of::<usize>(); // two Option<Waker>
        let deadline_slot = (size_of::<(Instant, u64)>() + size_of::<Uuid>()) * 3 / 2;
        MemoryFigures {
            per_wait: size_of::<Waiter>() + channel + deadline_slot,
            per_expected_event: size_of::<(Key, Got)>(),
            per_buffered_event: size_of::<Buffered>(),
            // hashbrown: key + value + 1 control byte per slot, load factor up to 7/8.
            per_instance: (size_of::<Uuid>() + size_of::<Entry>() + 1) * 8 / 7,
        }
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn count_now(&mut self) {
        let mut waits = 0;
        let mut buffered = 0;
        for e in self.instances.values() {
            waits += e.waiters.len();
            buffered += e.buffer.len();
        }
        self.stats.waits_now = waits as u64;
        self.stats.buffered_now = buffered as u64;
        self.stats.instances_now = self.instances.len() as u64;
    }

    /// Arm the single timer for the earliest deadline.
    fn arm_timer(&mut self, ctx: &mut Context<Self>) {
        let Some((&(first, _), _)) = self.deadlines.iter().next() else {
            if let Some((_, h)) = self.timer.take() {
                ctx.cancel_future(h);
            }
            return;
        };
        if let Some((at, h)) = self.timer {
            if at <= first {
                return;
            }
            ctx.cancel_future(h);
        }
        let delay = first.saturating_duration_since(Instant::now());
        let h = ctx.run_later(delay, |act, ctx| {
            act.timer = None;
            act.expire_due(ctx);
        });
        self.timer = Some((first, h));
    }

    fn expire_due(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        while let Some((&(at, id), &instance)) = self.deadlines.iter().next() {
            if at > now {
                break;
            }
            self.deadlines.remove(&(at, id));
            let Some(entry) = self.instances.get_mut(&instance) else {
                continue;
            };
            let Some(pos) = entry.waiters.iter().position(|w| w.id == id) else {
                continue;
            };
            let w = entry.waiters.remove(pos);
            entry.last_active = now;
            let missing: Vec<PortId> = w
                .expected
                .iter()
                .filter(|(_, g)| *g == Got::Pending)
                .map(|(k, _)| k.tag)
                .collect();
            self.stats.timeouts += 1;
            warn!(instance = %instance, op = %w.op, fatal = w.policy.fatal,
                  missing = %ports(&missing), "network events timed out");
            let result = if w.policy.fatal {
                Err(WaitError::TimedOut {
                    missing,
                    timeout: w.policy.timeout,
                })
            } else {
                Ok(WaitOutcome {
                    waited: true,
                    missing,
                    failed: failed_of(&w),
                })
            };
            self.send(w.tx, result);
        }
        self.arm_timer(ctx);
    }

    fn send(&mut self, tx: oneshot::Sender<WaitResult>, r: WaitResult) {
        if tx.send(r).is_err() {
            self.stats.abandoned += 1;
        }
    }

    fn prune(entry: &mut Entry, now: Instant, max_age: Duration, stats: &mut EventStats) {
        while let Some(front) = entry.buffer.front() {
            if now.saturating_duration_since(front.at) <= max_age {
                break;
            }
            entry.buffer.pop_front();
            stats.buffer_dropped_age += 1;
        }
    }

    fn deliver(&mut self, event: ExternalEvent, received: Instant) {
        self.stats.delivered += 1;
        if self.shutting_down {
            self.stats.ignored += 1;
            return;
        }
        let network = matches!(
            event.name,
            EventName::NetworkVifPlugged
                | EventName::NetworkVifUnplugged
                | EventName::NetworkVifDeleted
                | EventName::NetworkChanged
        );
        let failed = match event.status {
            EventStatus::Completed => false,
            EventStatus::Failed => true,
            EventStatus::InProgress => {
                self.stats.ignored += 1;
                return;
            }
        };
        let tag = match event.tag.as_deref().map(str::parse::<PortId>) {
            Some(Ok(tag)) if network => tag,
            _ => {
                self.stats.ignored += 1;
                debug!(instance = %event.server_uuid, name = %event.name, "event ignored");
                return;
            }
        };
        let instance = event.server_uuid;
        let Some(entry) = self.instances.get_mut(&instance) else {
            self.stats.unknown_instance_dropped += 1;
            info!(instance = %instance, name = %event.name, tag = %tag,
                  "event for an unknown instance dropped");
            return;
        };
        let key = Key {
            name: event.name,
            tag,
        };
        Self::prune(entry, received, self.cfg.max_age(), &mut self.stats);

        // The oldest registration still waiting for this key, that began before the event.
        let mut seen = false;
        let mut hit = None;
        for (i, w) in entry.waiters.iter().enumerate() {
            if received < w.since {
                continue;
            }
            if let Some(slot) = w.expected.iter().position(|(k, _)| *k == key) {
                if w.expected[slot].1 == Got::Pending {
                    hit = Some((i, slot));
                    break;
                }
                seen = true;
            }
        }
        let Some((i, slot)) = hit else {
            if seen {
                self.stats.duplicates += 1;
                return;
            }
            if let Some(pos) = entry
                .buffer
                .iter()
                .position(|b| b.key == key && b.failed == failed)
            {
                // Keep one copy, with the newer arrival: a repeat that comes after an
                // operation began must count for it, even if an older copy (which must not)
                // was already buffered.
                if let Some(mut b) = entry.buffer.remove(pos) {
                    b.at = received;
                    entry.buffer.push_back(b);
                }
                self.stats.duplicates += 1;
                return;
            }
            let cap = entry.buffer_cap(self.cfg.buffer_per_instance);
            if cap > 0 && entry.buffer.len() >= cap {
                // Strays first (events for ports the instance does not have), then what no
                // wait takes (vireo and Nova wait only for `network-vif-plugged`; unplugged,
                // deleted and changed come with every unplug and port update), so that a
                // flood of either cannot push out an early plug event a wait is about to
                // take. Only then the oldest of all.
                let evict = entry.eviction();
                entry.buffer.remove(evict);
                self.stats.buffer_dropped_count += 1;
            }
            if cap > 0 {
                entry.buffer.push_back(Buffered {
                    key,
                    failed,
                    at: received,
                });
                self.stats.buffered += 1;
            }
            return;
        };
        self.stats.matched += 1;
        entry.last_active = received;
        let w = &mut entry.waiters[i];
        w.expected[slot].1 = if failed { Got::Failed } else { Got::Completed };
        w.pending -= 1;
        let done = if failed && w.policy.fatal {
            Some(Err(WaitError::Failed {
                port: key.tag,
                event: key.name,
            }))
        } else if failed {
            warn!(instance = %instance, op = %w.op, port = %key.tag,
                  "port reported failed; proceeding (not fatal)");
            None
        } else {
            None
        };
        let done = done.or_else(|| {
            (w.pending == 0).then(|| {
                Ok(WaitOutcome {
                    waited: true,
                    missing: Vec::new(),
                    failed: failed_of(w),
                })
            })
        });
        if let Some(result) = done {
            let w = entry.waiters.remove(i);
            self.deadlines.remove(&(w.deadline, w.id));
            if result.is_err() {
                self.stats.failed += 1;
            } else {
                self.stats.completed += 1;
            }
            self.send(w.tx, result);
        }
    }

    fn expect(&mut self, msg: Expect, ctx: &mut Context<Self>) -> WaitHandle {
        if self.shutting_down {
            return WaitHandle::ready(Err(WaitError::Shutdown));
        }
        let now = Instant::now();
        if msg.events.is_empty() || msg.policy.timeout.is_zero() {
            return WaitHandle::ready(Ok(WaitOutcome::default()));
        }
        let id = self.next_id();
        let entry = self
            .instances
            .entry(msg.instance)
            .or_insert_with(|| Entry::new(now));
        entry.last_active = now;
        if entry.waiters.len() >= self.cfg.max_waits_per_instance {
            return WaitHandle::ready(Err(WaitError::TooManyWaits {
                limit: self.cfg.max_waits_per_instance,
            }));
        }
        Self::prune(entry, now, self.cfg.max_age(), &mut self.stats);
        let mut expected: Vec<(Key, Got)> = Vec::with_capacity(msg.events.len());
        for e in msg.events {
            let key = Key {
                name: e.name,
                tag: e.tag,
            };
            if expected.iter().any(|(k, _)| *k == key) {
                continue;
            }
            entry.learn_port(key.tag);
            // An early event of this operation, kept in the buffer?
            let got = match entry
                .buffer
                .iter()
                .position(|b| b.key == key && b.at >= msg.since)
            {
                Some(pos) => {
                    let b = entry.buffer.remove(pos);
                    self.stats.matched_from_buffer += 1;
                    match b {
                        Some(b) if b.failed => Got::Failed,
                        _ => Got::Completed,
                    }
                }
                None => Got::Pending,
            };
            expected.push((key, got));
        }
        if msg.policy.fatal {
            if let Some((k, _)) = expected.iter().find(|(_, g)| *g == Got::Failed) {
                self.stats.failed += 1;
                return WaitHandle::ready(Err(WaitError::Failed {
                    port: k.tag,
                    event: k.name,
                }));
            }
        }
        let pending = expected.iter().filter(|(_, g)| *g == Got::Pending).count();
        let (tx, rx) = oneshot::channel();
        let deadline = now + msg.policy.timeout;
        let w = Waiter {
            id,
            op: msg.op_id,
            since: msg.since,
            deadline,
            policy: msg.policy,
            expected,
            pending,
            tx,
        };
        if pending == 0 {
            self.stats.completed += 1;
            let failed = failed_of(&w);
            return WaitHandle::ready(Ok(WaitOutcome {
                waited: true,
                missing: Vec::new(),
                failed,
            }));
        }
        debug!(instance = %msg.instance, op = %msg.op_id, pending, "wait registered");
        entry.waiters.push(w);
        self.deadlines.insert((deadline, id), msg.instance);
        self.arm_timer(ctx);
        WaitHandle {
            state: HandleState::Pending(rx),
        }
    }

    fn remove_waiters(
        &mut self,
        instance: Uuid,
        pred: impl Fn(&Waiter) -> bool,
        err: WaitError,
    ) -> usize {
        let Some(entry) = self.instances.get_mut(&instance) else {
            return 0;
        };
        let mut removed = Vec::new();
        let mut i = 0;
        while i < entry.waiters.len() {
            if pred(&entry.waiters[i]) {
                removed.push(entry.waiters.remove(i));
            } else {
                i += 1;
            }
        }
        let n = removed.len();
        for w in removed {
            self.deadlines.remove(&(w.deadline, w.id));
            self.send(w.tx, Err(err.clone()));
        }
        n
    }

    fn sweep(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let max_age = self.cfg.max_age();
        let grace = self.cfg.grace();
        let mut gone = Vec::new();
        for (id, entry) in self.instances.iter_mut() {
            Self::prune(entry, now, max_age, &mut self.stats);
            let mut i = 0;
            while i < entry.waiters.len() {
                if entry.waiters[i].tx.is_closed() {
                    let w = entry.waiters.remove(i);
                    self.deadlines.remove(&(w.deadline, w.id));
                    self.stats.abandoned += 1;
                } else {
                    i += 1;
                }
            }
            if !entry.tracked
                && entry.waiters.is_empty()
                && entry.buffer.is_empty()
                && now.saturating_duration_since(entry.last_active) >= grace
            {
                gone.push(*id);
            }
        }
        for id in gone {
            self.instances.remove(&id);
        }
        self.instances.shrink_to(self.instances.len() * 2);
        self.arm_timer(ctx);
    }

    fn shutdown_all(&mut self) {
        self.shutting_down = true;
        for (_, entry) in self.instances.drain() {
            self.stats.buffer_dropped_forgotten += entry.buffer.len() as u64;
            for w in entry.waiters {
                self.stats.shut_down += 1;
                let _ = w.tx.send(Err(WaitError::Shutdown));
            }
        }
        self.deadlines.clear();
    }
}

fn failed_of(w: &Waiter) -> Vec<PortId> {
    w.expected
        .iter()
        .filter(|(_, g)| *g == Got::Failed)
        .map(|(k, _)| k.tag)
        .collect()
}

impl Actor for NetworkEventActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.cfg.sweep(), |act, ctx| act.sweep(ctx));
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.shutdown_all();
    }
}

impl Handler<TrackInstance> for NetworkEventActor {
    type Result = ();
    fn handle(&mut self, msg: TrackInstance, _: &mut Context<Self>) {
        if self.shutting_down {
            return;
        }
        self.instances
            .entry(msg.0)
            .or_insert_with(|| Entry::new(Instant::now()))
            .tracked = true;
    }
}

impl Handler<TrackPorts> for NetworkEventActor {
    type Result = ();
    fn handle(&mut self, msg: TrackPorts, _: &mut Context<Self>) {
        if self.shutting_down {
            return;
        }
        // Only for an instance the actor knows: ports do not make one known (an instance this
        // host gave away stays forgotten).
        if let Some(entry) = self.instances.get_mut(&msg.instance) {
            for p in msg.ports {
                entry.learn_port(p);
            }
        }
    }
}

impl Handler<ForgetInstance> for NetworkEventActor {
    type Result = ();
    fn handle(&mut self, msg: ForgetInstance, _: &mut Context<Self>) {
        let n = self.remove_waiters(msg.0, |_| true, WaitError::Cancelled);
        self.stats.cancelled += n as u64;
        if let Some(e) = self.instances.remove(&msg.0) {
            self.stats.buffer_dropped_forgotten += e.buffer.len() as u64;
        }
    }
}

impl Handler<Expect> for NetworkEventActor {
    type Result = MessageResult<Expect>;
    fn handle(&mut self, msg: Expect, ctx: &mut Context<Self>) -> MessageResult<Expect> {
        MessageResult(self.expect(msg, ctx))
    }
}

impl Handler<Deliver> for NetworkEventActor {
    type Result = ();
    fn handle(&mut self, msg: Deliver, _: &mut Context<Self>) {
        self.deliver(msg.event, msg.received);
    }
}

impl Handler<DeliverBatch> for NetworkEventActor {
    type Result = ();
    fn handle(&mut self, msg: DeliverBatch, _: &mut Context<Self>) {
        for e in msg.events {
            self.deliver(e, msg.received);
        }
    }
}

impl Handler<CancelOperation> for NetworkEventActor {
    type Result = usize;
    fn handle(&mut self, msg: CancelOperation, ctx: &mut Context<Self>) -> usize {
        let n = self.remove_waiters(msg.instance, |w| w.op == msg.op_id, WaitError::Cancelled);
        self.stats.cancelled += n as u64;
        if n > 0 {
            info!(instance = %msg.instance, op = %msg.op_id, waits = n, "waits cancelled");
        }
        self.arm_timer(ctx);
        n
    }
}

impl Handler<Shutdown> for NetworkEventActor {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        self.shutdown_all();
        ctx.stop();
    }
}

impl Handler<Stats> for NetworkEventActor {
    type Result = MessageResult<Stats>;
    fn handle(&mut self, _: Stats, _: &mut Context<Self>) -> MessageResult<Stats> {
        self.count_now();
        MessageResult(self.stats)
    }
}

/// A cheap, cloneable handle on the actor; also the [`EventSink`] the network service
/// delivers into (never blocks).
#[derive(Debug, Clone)]
pub struct EventsHandle {
    addr: Addr<NetworkEventActor>,
}

impl EventsHandle {
    /// Start the actor on the current arbiter.
    pub fn start(cfg: EventConfig) -> Self {
        EventsHandle {
            addr: NetworkEventActor::new(cfg).start(),
        }
    }

    /// Wrap an existing address.
    pub fn from_addr(addr: Addr<NetworkEventActor>) -> Self {
        EventsHandle { addr }
    }

    /// The actor's address.
    pub fn addr(&self) -> &Addr<NetworkEventActor> {
        &self.addr
    }

    /// Register a wait; await the returned handle after triggering the action.
    pub async fn expect(
        &self,
        instance: Uuid,
        events: Vec<ExpectedEvent>,
        since: Instant,
        policy: WaitPolicy,
        op_id: OpId,
    ) -> Result<WaitHandle, MailboxError> {
        self.addr
            .send(Expect {
                instance,
                events,
                since,
                policy,
                op_id,
            })
            .await
    }

    /// Hand over one POST's worth of events (never blocks).
    pub fn deliver_batch(&self, events: Vec<ExternalEvent>) {
        self.addr.do_send(DeliverBatch {
            events,
            received: Instant::now(),
        });
    }

    /// Make an instance known.
    pub fn track(&self, instance: Uuid) {
        self.addr.do_send(TrackInstance(instance));
    }

    /// Ports a known instance has (see [`TrackPorts`]).
    pub fn track_ports(&self, instance: Uuid, ports: Vec<PortId>) {
        self.addr.do_send(TrackPorts { instance, ports });
    }

    /// Forget an instance (its waits are cancelled).
    pub fn forget(&self, instance: Uuid) {
        self.addr.do_send(ForgetInstance(instance));
    }

    /// Cancel an operation's waits; returns how many there were.
    pub async fn cancel(&self, instance: Uuid, op_id: OpId) -> Result<usize, MailboxError> {
        self.addr.send(CancelOperation { instance, op_id }).await
    }

    /// Read the counters.
    pub async fn stats(&self) -> Result<EventStats, MailboxError> {
        self.addr.send(Stats).await
    }

    /// Fail every wait and stop the actor.
    pub async fn shutdown(&self) -> Result<(), MailboxError> {
        self.addr.send(Shutdown).await
    }
}

impl EventSink for EventsHandle {
    fn deliver(&self, event: ExternalEvent) {
        self.addr.do_send(Deliver {
            event,
            received: Instant::now(),
        });
    }
}

#[cfg(test)]
mod tests;
