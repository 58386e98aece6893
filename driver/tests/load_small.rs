//! The load run of `benches/load.rs` at small scale, quiet and under an event storm (10
//! injected events per real one: duplicates, strays, `failed` for ports nobody waits for,
//! events for ended waits), on libvirt's test driver with the embedded network service.
//! Asserts the invariants only, never timings: every operation finished as expected (none
//! hung), and after the destroy phase no domain, instance actor, plugged device, bound or
//! wired port, pending wait or buffered event is left.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod load_support;

use load_support::{LoadConfig, LoadReport, OpKind};

fn check(r: &LoadReport, instances: usize) {
    assert!(r.violations.is_empty(), "violations: {:#?}", r.violations);
    assert_eq!(r.started, r.finished);
    // Every kind ran once per instance (confirm, revert, power on and detach follow their
    // first half, which must have succeeded for the run to be clean).
    for k in OpKind::ALL {
        let n = r.times.get(&k).map_or(0, Vec::len);
        assert_eq!(n, instances, "{}: {n} of {instances}", k.name());
    }
    assert_eq!(r.stats.waits_now, 0);
    assert_eq!(r.stats.buffered_now, 0);
    assert!(r.real_events > 0, "the network service sent no events");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_load_quiet_then_under_a_storm_leaves_nothing() {
    let quiet = load_support::run(&LoadConfig {
        instances: 20,
        storm: 0,
        ..LoadConfig::default()
    })
    .await;
    check(&quiet, 20);
    assert_eq!(quiet.injected, 0);

    let storm = load_support::run(&LoadConfig {
        instances: 20,
        storm: 10,
        ..LoadConfig::default()
    })
    .await;
    check(&storm, 20);
    // The storm really went through the events path: ten per real event, and the actors
    // saw duplicates, unknown instances and ignored events.
    assert_eq!(storm.injected, storm.real_events * 10);
    assert!(storm.stats.duplicates > 0, "{:?}", storm.stats);
    assert!(
        storm.stats.unknown_instance_dropped > 0,
        "{:?}",
        storm.stats
    );
    assert!(storm.stats.ignored > 0, "{:?}", storm.stats);
    assert!(
        storm.stats.delivered >= storm.injected,
        "{:?} < {}",
        storm.stats,
        storm.injected
    );
}
