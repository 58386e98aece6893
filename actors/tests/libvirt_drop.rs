//! Dropping the last handle joins its threads (bounded by `join_timeout_ms`). One test in its
//! own binary, so the thread census is not disturbed by other tests.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::TestNode;
use vireo_actors::libvirt::{
    Libvirt, LibvirtConfig, LibvirtError, EVENT_THREAD_NAME, SUPERVISOR_THREAD_NAME,
    WORKER_THREAD_PREFIX,
};

/// The kernel's `PF_EXITING` task flag (include/linux/sched.h).
const PF_EXITING: u64 = 0x4;

/// (workers, supervisors, event loops) alive in this process, by thread name.
///
/// A thread in the kernel's exit path is not alive. `JoinHandle::join` (`pthread_join`) returns
/// once the kernel clears the thread's tid (`CLONE_CHILD_CLEARTID`, in `exit_mm`), but the task
/// leaves /proc/self/task only later, when `do_exit` releases it. If the exiting thread is
/// preempted after waking its joiner, a thread that drop has joined is still listed for a moment
/// (state `R`, flags `0x40004c`, gone about 0.2 ms later). A plain std loop (spawn 3 threads, join
/// them, list /proc/self/task) on a 2-CPU machine saw a joined thread still listed in 16 of 5,000
/// rounds, every one of them with `PF_EXITING` set. A task with `PF_EXITING` (set as it enters
/// `do_exit`, before the tid is cleared) never returns to user space: its body, its TLS
/// destructors and libc's thread teardown are over. So such a task is not counted.
fn census() -> (usize, usize, usize) {
    let mut counts = (0, 0, 0);
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        // One read gives name and flags together; a task gone meanwhile reads as empty.
        let stat = std::fs::read_to_string(task.unwrap().path().join("stat")).unwrap_or_default();
        let Some((name, rest)) = stat
            .split_once(" (")
            .and_then(|(_, tail)| tail.rsplit_once(") "))
        else {
            continue;
        };
        // After the name: state, ppid, pgrp, session, tty_nr, tpgid, flags.
        let flags: u64 = rest.split(' ').nth(6).and_then(|f| f.parse().ok()).unwrap();
        if flags & PF_EXITING != 0 {
            continue;
        }
        if name.starts_with(WORKER_THREAD_PREFIX) {
            counts.0 += 1;
        } else if name == SUPERVISOR_THREAD_NAME {
            counts.1 += 1;
        } else if name == EVENT_THREAD_NAME {
            counts.2 += 1;
        }
    }
    counts
}

/// Waits (bounded) for the census to reach `want`: a new thread names itself once it runs.
fn await_census(want: (usize, usize, usize)) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while census() != want {
        assert!(
            Instant::now() < deadline,
            "census {:?}, want {want:?}",
            census()
        );
        std::thread::yield_now();
    }
}

#[tokio::test]
async fn dropping_the_last_handle_joins_its_threads() {
    let node = TestNode::new();
    assert_eq!(census(), (0, 0, 0));

    // Idle threads are joined before drop returns.
    let lv = Libvirt::open(LibvirtConfig {
        workers: 3,
        ..node.config()
    })
    .await
    .unwrap();
    await_census((3, 1, 1));
    let clone = lv.clone();
    drop(lv);
    assert_eq!(census(), (3, 1, 1), "a clone keeps the threads");
    assert!(clone.call("hostname", |c| c.hostname()).await.is_ok());
    drop(clone);
    assert_eq!(
        census(),
        (0, 0, 1),
        "joined; the process-wide event loop stays"
    );

    // A worker stuck in libvirt is waited for join_timeout, then left to finish.
    let lv = Libvirt::open(LibvirtConfig {
        workers: 1,
        join_timeout_ms: 200,
        ..node.config()
    })
    .await
    .unwrap();
    let (release, blocked) = mpsc::channel::<()>();
    let (finished_tx, finished) = mpsc::channel::<()>();
    let entered = Arc::new(tokio::sync::Notify::new());
    let inside = entered.clone();
    let caller = lv.clone();
    let task = tokio::spawn(async move {
        caller
            .call("stuck", move |conn| {
                inside.notify_one();
                let _ = blocked.recv();
                let _ = finished_tx.send(());
                conn.hostname()
            })
            .await
    });
    entered.notified().await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());

    let t0 = Instant::now();
    drop(lv);
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert_eq!(census(), (1, 0, 1), "the stuck worker is left running");

    release.send(()).unwrap();
    finished.recv_timeout(Duration::from_secs(30)).unwrap();
    // The released worker finds the queue closed and exits.
    await_census((0, 0, 1));

    // A handle that failed to open leaves nothing behind.
    let err = Libvirt::open(LibvirtConfig::for_uri("test:///nonexistent/node.xml"))
        .await
        .unwrap_err();
    assert!(matches!(err, LibvirtError::Connect { .. }), "{err:?}");
    assert_eq!(census(), (0, 0, 1));
}
