//! The lifecycle feed: what happened to the guests of this host's instances, as it happens.
//!
//! A compute agent that learns of a guest's power changes only from its periodic power-state
//! sync (Nova's runs every 10 minutes) leaves a guest that shut itself down shown as running
//! that long. libvirt reports every change (started, stopped, paused, ...); the agent keeps
//! those of the domains it holds, numbered, in a ring of [`LIFECYCLE_KEPT`], and answers
//! `GET /v1/lifecycle-events?after=N&wait=S` with the ones after `N`, waiting up to `S`
//! seconds (at most [`MAX_WAIT`]) when there are none yet: a long poll, so a reader (the Nova
//! driver's `emit_event`) needs no second connection or protocol. A reader that fell further
//! behind than the ring is told (`lost`) and compares power states itself. Without `after` the
//! answer is only the newest number: a reader starts from now, having synced on start-up.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::Notify;
use tracing::debug;
use uuid::Uuid;
use vireo_actors::libvirt::{EventStream, LibvirtEvent, LifecycleEvent};

use crate::compute::ComputeDriver;

/// Lifecycle events kept for readers.
pub const LIFECYCLE_KEPT: usize = 1_024;

/// The longest a request waits for an event.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// A guest's power change, in the words compute agents use (Nova's lifecycle events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transition {
    /// Started (booted, restored or migrated in).
    Started,
    /// Stopped (shut down, destroyed, crashed, saved or migrated away).
    Stopped,
    /// vCPUs paused.
    Paused,
    /// vCPUs running again.
    Resumed,
    /// Suspended by the guest (ACPI S3).
    Suspended,
}

impl Transition {
    /// The transition libvirt's event is, if any: a guest beginning to shut down, a
    /// definition or an undefinition changes no power state.
    pub fn of(event: LifecycleEvent) -> Option<Transition> {
        match event {
            LifecycleEvent::Started => Some(Transition::Started),
            LifecycleEvent::Stopped | LifecycleEvent::Crashed => Some(Transition::Stopped),
            LifecycleEvent::Suspended => Some(Transition::Paused),
            LifecycleEvent::Resumed => Some(Transition::Resumed),
            LifecycleEvent::PmSuspended => Some(Transition::Suspended),
            LifecycleEvent::Defined
            | LifecycleEvent::Undefined
            | LifecycleEvent::Shutdown
            | LifecycleEvent::Unknown(_) => None,
        }
    }
}

/// One numbered event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LifecycleNotice {
    /// Its number (1, 2, ...; per agent process).
    pub seq: u64,
    /// The instance.
    pub instance: Uuid,
    /// What happened.
    pub transition: Transition,
    /// When the agent heard of it, milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// An answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LifecyclePage {
    /// The events after the one asked for, oldest first.
    pub events: Vec<LifecycleNotice>,
    /// The newest number so far (ask for the events after it next).
    pub last: u64,
    /// Events after the one asked for were dropped from the ring before this read.
    pub lost: bool,
}

#[derive(Debug, Default)]
struct Ring {
    last: u64,
    events: VecDeque<LifecycleNotice>,
}

/// The ring and its waiting readers.
#[derive(Debug, Default)]
pub struct LifecycleFeed {
    ring: Mutex<Ring>,
    arrived: Notify,
    closed: std::sync::atomic::AtomicBool,
}

impl LifecycleFeed {
    /// An empty feed.
    pub fn new() -> Arc<LifecycleFeed> {
        Arc::new(LifecycleFeed::default())
    }

    /// Record a transition of `instance` and wake the readers.
    pub fn push(&self, instance: Uuid, transition: Transition) {
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if let Ok(mut ring) = self.ring.lock() {
            ring.last += 1;
            let seq = ring.last;
            if ring.events.len() == LIFECYCLE_KEPT {
                ring.events.pop_front();
            }
            ring.events.push_back(LifecycleNotice {
                seq,
                instance,
                transition,
                at_ms,
            });
        }
        self.arrived.notify_waiters();
    }

    /// No more waiting (the agent is shutting down): waiting readers are answered now, and
    /// later reads answer at once.
    pub fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.arrived.notify_waiters();
    }

    fn read(&self, after: Option<u64>) -> LifecyclePage {
        let Ok(ring) = self.ring.lock() else {
            return LifecyclePage {
                events: Vec::new(),
                last: 0,
                lost: true,
            };
        };
        let Some(after) = after else {
            return LifecyclePage {
                events: Vec::new(),
                last: ring.last,
                lost: false,
            };
        };
        let oldest = ring.events.front().map_or(ring.last + 1, |e| e.seq);
        LifecyclePage {
            events: ring
                .events
                .iter()
                .filter(|e| e.seq > after)
                .cloned()
                .collect(),
            last: ring.last,
            lost: after.saturating_add(1) < oldest && after < ring.last,
        }
    }

    /// The events after `after` (None: none, only the newest number), waiting up to `wait`
    /// (at most [`MAX_WAIT`]) for one when there are none yet.
    pub async fn after(&self, after: Option<u64>, wait: Duration) -> LifecyclePage {
        let arrived = self.arrived.notified();
        tokio::pin!(arrived);
        // Registered before reading, so an event pushed in between wakes this reader.
        arrived.as_mut().enable();
        let page = self.read(after);
        let closed = self.closed.load(std::sync::atomic::Ordering::SeqCst);
        // A number this process never gave (the reader's agent restarted): answered at once,
        // so the reader sees `last` below its number and starts over.
        let foreign = after.is_some_and(|a| a > page.last);
        if after.is_none() || !page.events.is_empty() || wait.is_zero() || closed || foreign {
            return page;
        }
        let _ = tokio::time::timeout(wait.min(MAX_WAIT), arrived).await;
        self.read(after)
    }

    /// Fill the feed from `stream` with the lifecycle events of domains `driver` holds, until
    /// the stream ends (the driver, and with it the libvirt layer, is gone). The driver is
    /// held weakly: this task must not keep alive what closes its stream.
    pub async fn follow(&self, mut stream: EventStream, driver: Weak<dyn ComputeDriver>) {
        while let Some(event) = stream.recv().await {
            let LibvirtEvent::Lifecycle { uuid, event, .. } = event else {
                continue;
            };
            let Some(transition) = Transition::of(event) else {
                continue;
            };
            let Some(driver) = driver.upgrade() else {
                return;
            };
            if driver.knows(uuid).await {
                self.push(uuid, transition);
            } else {
                debug!(%uuid, ?event, "lifecycle event of a domain the agent does not hold");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn readers_get_what_came_after_their_number_and_wait_for_more() {
        let feed = LifecycleFeed::new();
        let vm = Uuid::new_v4();
        assert_eq!(feed.after(None, MAX_WAIT).await.last, 0);
        feed.push(vm, Transition::Started);
        feed.push(vm, Transition::Paused);
        let page = feed.after(Some(0), Duration::ZERO).await;
        let got: Vec<_> = page.events.iter().map(|e| (e.seq, e.transition)).collect();
        assert_eq!(got, [(1, Transition::Started), (2, Transition::Paused)]);
        assert!(!page.lost);
        assert_eq!(feed.after(None, MAX_WAIT).await.last, 2);
        // Nothing after 2 yet: the read waits until one comes.
        let waiting = {
            let feed = feed.clone();
            tokio::spawn(async move { feed.after(Some(2), MAX_WAIT).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        feed.push(vm, Transition::Resumed);
        let page = waiting.await.unwrap();
        assert_eq!(page.events.len(), 1);
        assert_eq!(page.events[0].transition, Transition::Resumed);
        // ... and gives up at its bound with nothing.
        let t = tokio::time::Instant::now();
        let page = feed.after(Some(3), Duration::from_secs(600)).await;
        assert!(page.events.is_empty() && !page.lost);
        assert_eq!(t.elapsed(), MAX_WAIT);
    }

    #[tokio::test(start_paused = true)]
    async fn closing_answers_the_waiting_readers_at_once() {
        let feed = LifecycleFeed::new();
        let waiting = {
            let feed = feed.clone();
            tokio::spawn(async move { feed.after(Some(0), MAX_WAIT).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let t = tokio::time::Instant::now();
        feed.close();
        assert!(waiting.await.unwrap().events.is_empty());
        assert_eq!(t.elapsed(), Duration::ZERO);
        let t = tokio::time::Instant::now();
        feed.after(Some(0), MAX_WAIT).await;
        assert_eq!(
            t.elapsed(),
            Duration::ZERO,
            "a read after closing does not wait"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_number_from_another_agent_process_is_answered_at_once() {
        let feed = LifecycleFeed::new();
        feed.push(Uuid::new_v4(), Transition::Started);
        let t = tokio::time::Instant::now();
        let page = feed.after(Some(500), MAX_WAIT).await;
        assert_eq!(t.elapsed(), Duration::ZERO);
        assert_eq!(page.last, 1);
        assert!(page.events.is_empty() && !page.lost);
    }

    #[tokio::test]
    async fn a_reader_behind_the_ring_is_told_it_lost_events() {
        let feed = LifecycleFeed::new();
        let vm = Uuid::new_v4();
        for _ in 0..LIFECYCLE_KEPT + 5 {
            feed.push(vm, Transition::Started);
        }
        let page = feed.after(Some(2), Duration::ZERO).await;
        assert!(page.lost);
        assert_eq!(page.events.len(), LIFECYCLE_KEPT);
        assert_eq!(page.events[0].seq, 6);
        let page = feed.after(Some(5), Duration::ZERO).await;
        assert!(
            !page.lost,
            "event 6 is the oldest kept: nothing after 5 was lost"
        );
    }

    #[test]
    fn only_power_changes_are_transitions() {
        assert_eq!(
            Transition::of(LifecycleEvent::Crashed),
            Some(Transition::Stopped)
        );
        assert_eq!(
            Transition::of(LifecycleEvent::Suspended),
            Some(Transition::Paused)
        );
        assert_eq!(Transition::of(LifecycleEvent::Shutdown), None);
        assert_eq!(Transition::of(LifecycleEvent::Defined), None);
    }
}
