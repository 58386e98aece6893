//! The main job runs to the end on the embedded default: every seed scenario behaves as
//! promised, no wait times out, nothing leaks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use vireo::demo::{run, DemoOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_walks_every_scenario_without_timeouts_or_leaks() {
    let dir = tempfile::tempdir().unwrap();
    let opts = DemoOptions {
        event_delay: Duration::from_millis(20),
        timeout: Duration::from_secs(30),
        state_dir: dir.path().join("state"),
        progress: Some(false),
        ..DemoOptions::default()
    };
    let mut out = Vec::new();
    let summary = run(opts, &mut out).await;
    let text = String::from_utf8_lossy(&out);
    println!("{text}");
    let summary = summary.unwrap_or_else(|e| panic!("demo failed: {e:?}\n{text}"));
    assert!(summary.leaks.is_empty(), "{:?}\n{text}", summary.leaks);
    assert_eq!(summary.timeouts, 0, "{text}");
    assert_eq!(summary.seeds_ok.len(), 4, "{:?}\n{text}", summary.seeds_ok);
    assert!(summary.waits >= 8, "{text}");
    // A wait ends when its events arrive, far from the 30 s timeout.
    assert!(summary.longest_wait_ms < 5_000, "{text}");
    assert!(text.contains("bind-time"), "{text}");
}
