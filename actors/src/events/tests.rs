//! NetworkEventActor tests. Time-dependent behaviour runs on paused tokio time: no sleeps.

use super::*;
use futures::FutureExt;
use std::time::Duration;

fn port(n: u32) -> PortId {
    format!("3b2c4d5e-0000-4000-8000-{n:012}").parse().unwrap()
}

fn inst(n: u32) -> Uuid {
    Uuid::from_u128(0x9a1c_2e44_5d2b_4e55_9c51_0000_0000_0000 + u128::from(n))
}

fn ev(instance: Uuid, name: EventName, p: PortId, status: EventStatus) -> ExternalEvent {
    ExternalEvent {
        name,
        server_uuid: instance,
        tag: Some(p.to_string()),
        status,
    }
}

fn plugged(instance: Uuid, p: PortId) -> ExternalEvent {
    ev(
        instance,
        EventName::NetworkVifPlugged,
        p,
        EventStatus::Completed,
    )
}

fn want(ports: &[u32]) -> Vec<ExpectedEvent> {
    ports
        .iter()
        .map(|n| ExpectedEvent::plugged(port(*n)))
        .collect()
}

const FATAL: WaitPolicy = WaitPolicy {
    timeout: Duration::from_secs(300),
    fatal: true,
};
const LENIENT: WaitPolicy = WaitPolicy {
    timeout: Duration::from_secs(300),
    fatal: false,
};

async fn setup() -> EventsHandle {
    tokio::time::pause();
    EventsHandle::start(EventConfig::default())
}

async fn expect(
    h: &EventsHandle,
    i: Uuid,
    ports: &[u32],
    policy: WaitPolicy,
    op: u64,
) -> WaitHandle {
    h.expect(i, want(ports), Instant::now(), policy, OpId(op))
        .await
        .unwrap()
}

/// Everything sent before has been handled (the mailbox is FIFO).
async fn barrier(h: &EventsHandle) -> EventStats {
    h.stats().await.unwrap()
}

/// After moving paused time: the actor handles its mailbox before its timers in one poll, so
/// the first barrier lets the timers run, the second reads the result.
async fn settle(h: &EventsHandle) -> EventStats {
    barrier(h).await;
    barrier(h).await
}

fn pending(w: &mut WaitHandle) -> bool {
    w.now_or_never().is_none()
}

#[actix_rt::test]
async fn all_events_complete_the_wait() {
    let h = setup().await;
    h.track(inst(1));
    let mut w = expect(&h, inst(1), &[1, 2], FATAL, 1).await;
    h.deliver(plugged(inst(1), port(1)));
    barrier(&h).await;
    assert!(pending(&mut w), "one of two events is not enough");
    h.deliver(plugged(inst(1), port(2)));
    let out = w.await.unwrap();
    assert!(out.waited && out.complete());
    let s = barrier(&h).await;
    assert_eq!((s.matched, s.completed, s.waits_now), (2, 1, 0));
}

#[actix_rt::test]
async fn an_early_event_of_the_operation_is_buffered_and_satisfies_the_wait() {
    let h = setup().await;
    h.track(inst(1));
    let since = Instant::now();
    tokio::time::advance(Duration::from_secs(2)).await;
    h.deliver(plugged(inst(1), port(1)));
    tokio::time::advance(Duration::from_secs(2)).await;
    let w = h
        .expect(inst(1), want(&[1]), since, FATAL, OpId(1))
        .await
        .unwrap();
    assert!(w.is_ready(), "satisfied from the buffer at registration");
    assert!(w.await.unwrap().complete());
    let s = barrier(&h).await;
    assert_eq!(
        (s.buffered, s.matched_from_buffer, s.buffered_now),
        (1, 1, 0)
    );
}

#[actix_rt::test]
async fn an_event_older_than_the_operation_never_counts() {
    let h = setup().await;
    h.track(inst(1));
    // A leftover from an earlier rebind...
    h.deliver(plugged(inst(1), port(1)));
    barrier(&h).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    // ...must not release a wait of an operation that began later.
    let w = expect(&h, inst(1), &[1], FATAL, 2).await;
    assert!(!w.is_ready());
    let err = w.await.unwrap_err();
    assert_eq!(
        err,
        WaitError::TimedOut {
            missing: vec![port(1)],
            timeout: FATAL.timeout
        }
    );
}

#[actix_rt::test]
async fn a_repeat_of_an_old_buffered_event_counts_for_an_operation_that_began_before_it() {
    let h = setup().await;
    h.track(inst(1));
    // A leftover, buffered before the operation.
    h.deliver(plugged(inst(1), port(1)));
    barrier(&h).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    let since = Instant::now();
    tokio::time::advance(Duration::from_secs(1)).await;
    // The same event again, now after the operation began (before its wait exists).
    h.deliver(plugged(inst(1), port(1)));
    barrier(&h).await;
    let w = h
        .expect(inst(1), want(&[1]), since, FATAL, OpId(1))
        .await
        .unwrap();
    assert!(
        w.is_ready(),
        "the repeat satisfies the wait from the buffer"
    );
    assert!(w.await.unwrap().complete());
    let s = barrier(&h).await;
    assert_eq!(
        (s.duplicates, s.matched_from_buffer, s.buffered_now),
        (1, 1, 0)
    );
}

#[actix_rt::test]
async fn profile_update_events_are_consumed_and_cannot_release_a_later_wait() {
    // Live migration: setting migrating_to rebinds the port (unplugged, then plugged);
    // the flow waits for those as an UpdateBindingProfile op, then the destination's wait
    // registers later and only its own event releases it.
    let h = setup().await;
    h.track(inst(1));
    let profile = expect(&h, inst(1), &[1], LENIENT, 1).await;
    h.deliver(ev(
        inst(1),
        EventName::NetworkVifUnplugged,
        port(1),
        EventStatus::Completed,
    ));
    tokio::time::advance(Duration::from_millis(1500)).await;
    h.deliver(plugged(inst(1), port(1)));
    assert!(profile.await.unwrap().complete());
    // A late duplicate of the rebind event (an HTTP retry) arrives before the next op.
    h.deliver(plugged(inst(1), port(1)));
    barrier(&h).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut activation = expect(&h, inst(1), &[1], FATAL, 2).await;
    barrier(&h).await;
    assert!(pending(&mut activation), "leftover must not count");
    h.deliver(plugged(inst(1), port(1)));
    assert!(activation.await.unwrap().complete());
}

#[actix_rt::test]
async fn duplicates_are_harmless() {
    let h = setup().await;
    h.track(inst(1));
    let mut w = expect(&h, inst(1), &[1, 2], FATAL, 1).await;
    h.deliver(plugged(inst(1), port(1)));
    h.deliver(plugged(inst(1), port(1)));
    barrier(&h).await;
    assert!(pending(&mut w));
    h.deliver(plugged(inst(1), port(2)));
    assert!(w.await.unwrap().complete());
    // Without a waiter, a duplicate is not buffered twice.
    h.deliver(plugged(inst(1), port(3)));
    h.deliver(plugged(inst(1), port(3)));
    let s = barrier(&h).await;
    assert_eq!((s.duplicates, s.buffered, s.buffered_now), (2, 1, 1));
}

#[actix_rt::test]
async fn one_event_satisfies_one_wait_oldest_first() {
    let h = setup().await;
    h.track(inst(1));
    let first = expect(&h, inst(1), &[1], FATAL, 1).await;
    let mut second = expect(&h, inst(1), &[1], FATAL, 2).await;
    h.deliver(plugged(inst(1), port(1)));
    assert!(first.await.unwrap().complete());
    barrier(&h).await;
    assert!(pending(&mut second));
    h.deliver(plugged(inst(1), port(1)));
    assert!(second.await.unwrap().complete());
}

#[actix_rt::test]
async fn failed_fails_a_fatal_wait_naming_the_port() {
    let h = setup().await;
    h.track(inst(1));
    let w = expect(&h, inst(1), &[1, 2], FATAL, 1).await;
    h.deliver(ev(
        inst(1),
        EventName::NetworkVifPlugged,
        port(2),
        EventStatus::Failed,
    ));
    let err = w.await.unwrap_err();
    assert_eq!(
        err,
        WaitError::Failed {
            port: port(2),
            event: EventName::NetworkVifPlugged
        }
    );
    assert!(err.to_string().contains(&port(2).to_string()));
    assert_eq!(barrier(&h).await.failed, 1);
}

#[actix_rt::test]
async fn a_buffered_failure_fails_the_registration_at_once() {
    let h = setup().await;
    h.track(inst(1));
    let since = Instant::now();
    h.deliver(ev(
        inst(1),
        EventName::NetworkVifPlugged,
        port(1),
        EventStatus::Failed,
    ));
    barrier(&h).await;
    let w = h
        .expect(inst(1), want(&[1, 2]), since, FATAL, OpId(1))
        .await
        .unwrap();
    assert!(w.is_ready());
    assert!(matches!(w.await, Err(WaitError::Failed { port: p, .. }) if p == port(1)));
}

#[actix_rt::test]
async fn not_fatal_failed_and_missing_ports_are_reported_and_the_operation_proceeds() {
    let h = setup().await;
    h.track(inst(1));
    let w = expect(&h, inst(1), &[1, 2, 3], LENIENT, 1).await;
    h.deliver(ev(
        inst(1),
        EventName::NetworkVifPlugged,
        port(1),
        EventStatus::Failed,
    ));
    h.deliver(plugged(inst(1), port(2)));
    // Port 3 never reports: paused time jumps to the deadline.
    let out = w.await.unwrap();
    assert_eq!(out.failed, vec![port(1)]);
    assert_eq!(out.missing, vec![port(3)]);
    assert!(out.waited && !out.complete());
    assert_eq!(barrier(&h).await.timeouts, 1);
}

#[actix_rt::test]
async fn fatal_timeout_names_the_ports_that_never_reported() {
    let h = setup().await;
    h.track(inst(1));
    let start = Instant::now();
    let w = expect(&h, inst(1), &[1, 2], FATAL, 1).await;
    h.deliver(plugged(inst(1), port(1)));
    let err = w.await.unwrap_err();
    let waited = Instant::now() - start;
    // One deadline per wait (tokio timers round up to the millisecond).
    assert!(waited >= FATAL.timeout && waited <= FATAL.timeout + Duration::from_millis(5));
    assert_eq!(
        err,
        WaitError::TimedOut {
            missing: vec![port(2)],
            timeout: FATAL.timeout
        }
    );
    let text = err.to_string();
    assert!(text.contains(&port(2).to_string()) && !text.contains(&port(1).to_string()));
}

#[actix_rt::test]
async fn zero_timeout_or_nothing_expected_means_no_wait() {
    let h = setup().await;
    h.track(inst(1));
    let zero = WaitPolicy {
        timeout: Duration::ZERO,
        fatal: true,
    };
    let w = expect(&h, inst(1), &[1], zero, 1).await;
    assert!(w.is_ready());
    assert_eq!(w.await.unwrap(), WaitOutcome::default());
    let w = expect(&h, inst(1), &[], FATAL, 2).await;
    assert!(!w.await.unwrap().waited);
    assert_eq!(barrier(&h).await.waits_now, 0);
}

#[actix_rt::test]
async fn events_for_unknown_instances_are_counted_and_dropped() {
    let h = setup().await;
    h.deliver(plugged(inst(7), port(1)));
    let s = barrier(&h).await;
    assert_eq!((s.unknown_instance_dropped, s.buffered), (1, 0));
    // Not buffered: a later wait of that instance does not see it.
    let since = Instant::now() - Duration::from_secs(1);
    let mut w = h
        .expect(inst(7), want(&[1]), since, FATAL, OpId(1))
        .await
        .unwrap();
    assert!(pending(&mut w));
    // While it waits, the instance is known: events reach it.
    h.deliver(plugged(inst(7), port(1)));
    assert!(w.await.unwrap().complete());
}

#[actix_rt::test]
async fn ignored_events_do_not_match() {
    let h = setup().await;
    h.track(inst(1));
    let mut w = expect(&h, inst(1), &[1], FATAL, 1).await;
    h.deliver(ev(
        inst(1),
        EventName::NetworkVifPlugged,
        port(1),
        EventStatus::InProgress,
    ));
    h.deliver(ev(
        inst(1),
        EventName::VolumeExtended,
        port(1),
        EventStatus::Completed,
    ));
    let mut bad = plugged(inst(1), port(1));
    bad.tag = Some("not-a-port".into());
    h.deliver(bad);
    let mut untagged = plugged(inst(1), port(1));
    untagged.tag = None;
    h.deliver(untagged);
    let s = barrier(&h).await;
    assert_eq!((s.ignored, s.matched), (4, 0));
    assert!(pending(&mut w));
}

#[actix_rt::test]
async fn cancelling_an_operation_fails_only_its_waits() {
    let h = setup().await;
    h.track(inst(1));
    let a1 = expect(&h, inst(1), &[1], FATAL, 1).await;
    let a2 = expect(&h, inst(1), &[2], FATAL, 1).await;
    let b = expect(&h, inst(1), &[3], FATAL, 2).await;
    assert_eq!(h.cancel(inst(1), OpId(1)).await.unwrap(), 2);
    assert_eq!(a1.await, Err(WaitError::Cancelled));
    assert_eq!(a2.await, Err(WaitError::Cancelled));
    h.deliver(plugged(inst(1), port(3)));
    assert!(b.await.unwrap().complete());
    let s = barrier(&h).await;
    assert_eq!((s.cancelled, s.waits_now), (2, 0));
    assert_eq!(h.cancel(inst(1), OpId(1)).await.unwrap(), 0);
}

#[actix_rt::test]
async fn forgetting_an_instance_cancels_its_waits_and_drops_its_buffer() {
    let h = setup().await;
    h.track(inst(1));
    h.deliver(plugged(inst(1), port(9)));
    let w = expect(&h, inst(1), &[1], FATAL, 1).await;
    h.forget(inst(1));
    assert_eq!(w.await, Err(WaitError::Cancelled));
    h.deliver(plugged(inst(1), port(1)));
    let s = barrier(&h).await;
    assert_eq!(s.buffer_dropped_forgotten, 1);
    assert_eq!(s.unknown_instance_dropped, 1);
    assert_eq!((s.instances_now, s.buffered_now, s.waits_now), (0, 0, 0));
}

#[actix_rt::test]
async fn shutdown_fails_every_waiter_and_refuses_new_ones() {
    let h = setup().await;
    let mut waits = Vec::new();
    for n in 0..50 {
        waits.push(expect(&h, inst(n), &[1, 2], FATAL, 1).await);
    }
    h.shutdown().await.unwrap();
    for w in waits {
        assert_eq!(w.await, Err(WaitError::Shutdown));
    }
    // The actor is gone: a new registration is a mailbox error, not a handler error.
    assert!(h
        .expect(inst(1), want(&[1]), Instant::now(), FATAL, OpId(2))
        .await
        .is_err());
}

#[actix_rt::test]
async fn a_dropped_handle_is_removed_by_the_sweep() {
    let h = setup().await;
    h.track(inst(1));
    let w = expect(&h, inst(1), &[1], FATAL, 1).await;
    drop(w);
    assert_eq!(barrier(&h).await.waits_now, 1);
    tokio::time::advance(Duration::from_secs(31)).await;
    let s = settle(&h).await;
    assert_eq!((s.waits_now, s.abandoned), (0, 1));
}

#[actix_rt::test]
async fn too_many_waits_for_one_instance_are_refused() {
    let h = setup().await;
    let limit = EventConfig::default().max_waits_per_instance;
    let mut keep = Vec::new();
    for op in 0..limit as u64 {
        keep.push(expect(&h, inst(1), &[1], FATAL, op).await);
    }
    let w = expect(&h, inst(1), &[1], FATAL, 99).await;
    assert_eq!(w.await, Err(WaitError::TooManyWaits { limit }));
}

/// Every unplug and port update sends unplugged, deleted or changed events, which no wait
/// takes: more of them than the buffer holds must not push out an early plug event.
#[actix_rt::test]
async fn strays_no_wait_takes_never_evict_an_early_plug_event() {
    let h = setup().await;
    h.track(inst(1));
    let since = Instant::now();
    h.deliver(plugged(inst(1), port(1)));
    let cap = EventConfig::default().buffer_per_instance as u32;
    let names = [
        EventName::NetworkVifUnplugged,
        EventName::NetworkVifDeleted,
        EventName::NetworkChanged,
    ];
    for n in 0..2 * cap {
        let name = names[(n % 3) as usize];
        h.deliver(ev(inst(1), name, port(100 + n), EventStatus::Completed));
    }
    let s = barrier(&h).await;
    assert_eq!(s.buffered_now, u64::from(cap));
    assert_eq!(s.buffer_dropped_count, u64::from(cap) + 1);
    let w = h
        .expect(inst(1), want(&[1]), since, FATAL, OpId(1))
        .await
        .unwrap();
    assert!(w.await.unwrap().complete(), "the early plug event was kept");
    // Plug events alone still go oldest first (the bound holds).
    for n in 0..cap + 1 {
        h.deliver(plugged(inst(1), port(200 + n)));
    }
    let s = barrier(&h).await;
    assert_eq!(s.buffered_now, u64::from(cap));
    let mut oldest = h
        .expect(inst(1), want(&[200]), since, LENIENT, OpId(2))
        .await
        .unwrap();
    assert!(pending(&mut oldest));
}

/// More `network-vif-plugged` strays (ports the instance does not have) than the buffer holds,
/// between a real early event and its wait: the real one is kept (LOAD.md's finding).
#[actix_rt::test]
async fn plug_strays_for_ports_the_instance_lacks_never_evict_its_early_event() {
    let h = setup().await;
    h.track(inst(1));
    h.track_ports(inst(1), vec![port(1), port(2)]);
    let since = Instant::now();
    h.deliver(plugged(inst(1), port(1)));
    let cap = EventConfig::default().buffer_per_instance as u32;
    for n in 0..3 * cap {
        h.deliver(plugged(inst(1), port(100 + n)));
    }
    let s = barrier(&h).await;
    assert_eq!(s.buffered_now, u64::from(cap));
    let w = h
        .expect(inst(1), want(&[1]), since, FATAL, OpId(1))
        .await
        .unwrap();
    assert!(w.await.unwrap().complete(), "the early plug event was kept");
}

/// A port is known from a wait that named it, too: after that wait ended, strays still cannot
/// push out the port's next early event.
#[actix_rt::test]
async fn a_wait_teaches_the_actor_its_ports() {
    let h = setup().await;
    h.track(inst(1));
    let first = expect(&h, inst(1), &[1], FATAL, 1).await;
    h.deliver(plugged(inst(1), port(1)));
    assert!(first.await.unwrap().complete());
    tokio::time::advance(Duration::from_secs(1)).await;
    let since = Instant::now();
    h.deliver(plugged(inst(1), port(1)));
    let cap = EventConfig::default().buffer_per_instance as u32;
    for n in 0..2 * cap {
        h.deliver(plugged(inst(1), port(100 + n)));
    }
    barrier(&h).await;
    let w = h
        .expect(inst(1), want(&[1]), since, FATAL, OpId(2))
        .await
        .unwrap();
    assert!(w.await.unwrap().complete());
}

/// An instance with more ports than half the buffer: every port's early plug event is kept,
/// whatever else arrives (the bound grows to two per known port, no further).
#[actix_rt::test]
async fn every_known_port_keeps_its_early_plug_event() {
    let h = setup().await;
    h.track(inst(1));
    let n = EventConfig::default().buffer_per_instance as u32 + 8;
    let ports: Vec<u32> = (1..=n).collect();
    h.track_ports(inst(1), ports.iter().map(|p| port(*p)).collect());
    let since = Instant::now();
    for p in &ports {
        h.deliver(plugged(inst(1), port(*p)));
        h.deliver(ev(
            inst(1),
            EventName::NetworkChanged,
            port(*p),
            EventStatus::Completed,
        ));
    }
    for k in 0..100 {
        h.deliver(plugged(inst(1), port(1_000 + k)));
    }
    let s = barrier(&h).await;
    assert_eq!(s.buffered_now, u64::from(2 * n));
    let w = h
        .expect(inst(1), want(&ports), since, FATAL, OpId(1))
        .await
        .unwrap();
    assert!(
        w.await.unwrap().complete(),
        "every port's early event was kept"
    );
}

/// Ports do not make an instance known: events for it still count as unknown.
#[actix_rt::test]
async fn ports_of_an_unknown_instance_are_ignored() {
    let h = setup().await;
    h.track_ports(inst(1), vec![port(1)]);
    h.deliver(plugged(inst(1), port(1)));
    let s = barrier(&h).await;
    assert_eq!(s.unknown_instance_dropped, 1);
    assert_eq!(s.instances_now, 0);
}

#[actix_rt::test]
async fn the_buffer_is_bounded_by_count_and_age() {
    let h = setup().await;
    h.track(inst(1));
    let cap = EventConfig::default().buffer_per_instance as u64;
    for n in 0..100 {
        h.deliver(plugged(inst(1), port(n)));
    }
    let s = barrier(&h).await;
    assert_eq!(s.buffered_now, cap);
    assert_eq!(s.buffer_dropped_count, 100 - cap);
    // The oldest were dropped: port 0 no longer satisfies an early registration.
    let since = Instant::now() - Duration::from_secs(1);
    let mut w = h
        .expect(inst(1), want(&[0]), since, LENIENT, OpId(1))
        .await
        .unwrap();
    assert!(pending(&mut w));
    drop(w);
    // Age: everything older than the maximum age goes at the next sweep.
    tokio::time::advance(Duration::from_secs(601)).await;
    tokio::time::advance(Duration::from_secs(30)).await;
    let s = settle(&h).await;
    assert_eq!(s.buffered_now, 0);
    assert_eq!(s.buffer_dropped_age, cap);
}

#[actix_rt::test]
async fn many_instances_timing_out_leave_nothing_behind() {
    let h = setup().await;
    let n = 5_000u32;
    let mut waits = Vec::new();
    let short = WaitPolicy {
        timeout: Duration::from_secs(10),
        fatal: true,
    };
    for i in 0..n {
        waits.push(expect(&h, inst(i), &[1, 2], short, u64::from(i)).await);
    }
    for i in (0..n).step_by(2) {
        h.deliver(plugged(inst(i), port(1)));
    }
    let s = barrier(&h).await;
    assert_eq!((s.waits_now, s.instances_now), (u64::from(n), u64::from(n)));
    let mut timed_out = 0;
    for w in waits {
        if let Err(WaitError::TimedOut { missing, .. }) = w.await {
            assert!(!missing.is_empty());
            timed_out += 1;
        }
    }
    assert_eq!(timed_out, n);
    let s = barrier(&h).await;
    assert_eq!((s.waits_now, s.timeouts), (0, u64::from(n)));
    // Instances that were never tracked are forgotten after the grace period.
    tokio::time::advance(Duration::from_secs(
        EventConfig::default().idle_grace_secs + 31,
    ))
    .await;
    let s = settle(&h).await;
    assert_eq!((s.instances_now, s.buffered_now, s.waits_now), (0, 0, 0));
}

#[actix_rt::test]
async fn a_batch_is_delivered_in_order() {
    let h = setup().await;
    h.track(inst(1));
    let w = expect(&h, inst(1), &[1, 2], FATAL, 1).await;
    h.deliver_batch(vec![
        plugged(inst(1), port(1)),
        plugged(inst(2), port(1)),
        plugged(inst(1), port(2)),
    ]);
    assert!(w.await.unwrap().complete());
    let s = barrier(&h).await;
    assert_eq!((s.delivered, s.unknown_instance_dropped), (3, 1));
}

#[test]
fn memory_figures_are_stated_from_sizes() {
    let m = NetworkEventActor::memory_figures();
    assert!(m.per_wait >= std::mem::size_of::<Waiter>());
    assert_eq!(m.per_buffered_event, std::mem::size_of::<Buffered>());
    assert!(m.per_expected_event >= 17 && m.per_expected_event <= 24);
    assert!(m.per_instance > std::mem::size_of::<Entry>());
}

#[test]
fn config_is_strict_serde_data() {
    let c: EventConfig = serde_json::from_str(r#"{"buffer_per_instance": 8}"#).unwrap();
    assert_eq!(c.buffer_per_instance, 8);
    assert_eq!(c.buffer_max_age_secs, 600);
    assert!(serde_json::from_str::<EventConfig>(r#"{"buffer": 8}"#).is_err());
}

mod model {
    //! Random sequences of registrations, deliveries, cancellations and time: every wait
    //! resolves, a wait is only ever satisfied by events that arrived at or after its start,
    //! and nothing is left behind.

    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Expect { i: u32, ports: u8, fatal: bool },
        Deliver { i: u32, port: u32, failed: bool },
        Cancel { i: u32, op: u64 },
        Advance { secs: u64 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..3u32, 1..8u8, any::<bool>()).prop_map(|(i, ports, fatal)| Step::Expect {
                i,
                ports,
                fatal
            }),
            (0..4u32, 0..3u32, prop::bool::weighted(0.1))
                .prop_map(|(i, port, failed)| Step::Deliver { i, port, failed }),
            (0..3u32, 0..20u64).prop_map(|(i, op)| Step::Cancel { i, op }),
            (0..15u64).prop_map(|secs| Step::Advance { secs }),
        ]
    }

    struct Registered {
        instance: u32,
        ports: Vec<u32>,
        since: Instant,
        handle: WaitHandle,
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn waits_resolve_soundly_and_nothing_leaks(steps in prop::collection::vec(step(), 1..60)) {
            let sys = actix_rt::System::new();
            sys.block_on(async move {
                tokio::time::pause();
                let h = EventsHandle::start(EventConfig::default());
                for i in 0..3 {
                    h.track(inst(i));
                }
                let policy = |fatal| WaitPolicy { timeout: Duration::from_secs(10), fatal };
                let mut waits: Vec<Registered> = Vec::new();
                // (instance, port, completed?, received)
                let mut delivered: Vec<(u32, u32, bool, Instant)> = Vec::new();
                for (n, s) in steps.into_iter().enumerate() {
                    match s {
                        Step::Expect { i, ports, fatal } => {
                            let ports: Vec<u32> = (0..3).filter(|b| ports & (1 << b) != 0).collect();
                            let since = Instant::now();
                            let handle = h
                                .expect(inst(i), want(&ports), since, policy(fatal), OpId(n as u64 % 20))
                                .await
                                .unwrap();
                            waits.push(Registered { instance: i, ports, since, handle });
                        }
                        Step::Deliver { i, port: p, failed } => {
                            let status = if failed { EventStatus::Failed } else { EventStatus::Completed };
                            delivered.push((i, p, !failed, Instant::now()));
                            h.deliver(ev(inst(i), EventName::NetworkVifPlugged, port(p), status));
                        }
                        Step::Cancel { i, op } => {
                            h.cancel(inst(i), OpId(op)).await.unwrap();
                        }
                        Step::Advance { secs } => {
                            tokio::time::advance(Duration::from_secs(secs)).await;
                            settle(&h).await;
                        }
                    }
                }
                tokio::time::advance(Duration::from_secs(11)).await;
                settle(&h).await;
                for mut w in waits {
                    let r = (&mut w.handle).now_or_never();
                    let Some(r) = r else { panic!("a wait never resolved") };
                    if let Ok(out) = r {
                        if out.waited && out.complete() {
                            for p in &w.ports {
                                assert!(
                                    delivered.iter().any(|(i, q, ok, at)| *i == w.instance
                                        && q == p && *ok && *at >= w.since),
                                    "released without its event"
                                );
                            }
                        }
                    }
                }
                let s = settle(&h).await;
                assert_eq!(s.waits_now, 0);
                assert!(s.buffered_now <= 3 * EventConfig::default().buffer_per_instance as u64);
                assert_eq!(s.instances_now, 3);
            });
        }
    }
}
