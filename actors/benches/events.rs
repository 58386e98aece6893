//! Benchmarks of the event model: prediction time for a 4-VIF instance, events routed per
//! second through the NetworkEventActor with 1,000 instances waiting, and deliver → wake
//! latency (p50/p99 printed from 10,000 samples, as criterion reports means and medians only),
//! next to what one bare hand-off between two threads costs on the same machine.
//!
//! `cargo bench -p vireo-actors --bench events`

use std::hint::black_box;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant as StdInstant};

use actix::prelude::*;
use actix_rt::ArbiterHandle;
use criterion::{Criterion, Throughput};
use futures::executor::block_on;
use serde_json::{json, Value};
use tokio::time::Instant;
use uuid::Uuid;
use vireo_actors::events::{
    Deliver, DeliverBatch, EventConfig, Expect, NetworkEventActor, OpId, Stats, WaitPolicy,
};
use vireo_actors::external::{EventName, EventStatus, ExternalEvent};
use vireo_actors::predict::{predict, EventOp, ExpectedEvent, Wiring};
use vireo_actors::vif::{NetworkInfo, PortId};

const WAITING: u32 = 1_000;

fn port(n: u32) -> PortId {
    PortId(Uuid::from_u128(
        0x3b2c_4d5e_0000_4000_8000_0000_0000_0000 + u128::from(n),
    ))
}

fn inst(n: u32) -> Uuid {
    Uuid::from_u128(0x9a1c_2e44_5d2b_4e55_9c51_0000_0000_0000 + u128::from(n))
}

fn minimal_vif(n: u32, hybrid: bool) -> Value {
    json!({"id": port(n).to_string(), "address": format!("fa:16:3e:00:00:{n:02x}"),
           "type": "ovs", "vnic_type": "normal", "active": false,
           "details": {"ovs_hybrid_plug": hybrid, "port_filter": true}})
}

fn nova_vif(n: u32, hybrid: bool) -> Value {
    let id = port(n).to_string();
    json!({
        "id": id, "address": format!("fa:16:3e:00:00:{n:02x}"),
        "network": {"id": "5f0b0f3e-6f7a-4c4e-9a55-2a6a3a0c1b2d", "bridge": "br-int",
            "label": "private",
            "subnets": [{"cidr": "10.0.0.0/26", "dns": [],
                "gateway": {"address": "10.0.0.1", "type": "gateway", "version": 4, "meta": {}},
                "ips": [{"address": format!("10.0.0.{}", n + 4), "type": "fixed", "version": 4,
                         "meta": {}, "floating_ips": []}],
                "routes": [], "version": 4, "meta": {"enable_dhcp": true, "dhcp_server": "10.0.0.2"}}],
            "meta": {"injected": false, "tenant_id": "3c8b5a2e9d1f4e6a8b7c6d5e4f3a2b1c",
                     "mtu": 1442, "physical_network": null, "tunneled": true}},
        "type": "ovs",
        "details": {"connectivity": "l2", "port_filter": true, "ovs_hybrid_plug": hybrid,
                    "datapath_type": "system", "bridge_name": "br-int"},
        "devname": format!("tap{}", &id[..11]), "ovs_interfaceid": id,
        "qbh_params": null, "qbg_params": null, "active": true, "vnic_type": "normal",
        "profile": {}, "preserve_on_delete": false, "delegate_create": true, "meta": {}
    })
}

fn four(f: fn(u32, bool) -> Value) -> String {
    Value::Array((1..=4).map(|n| f(n, n % 2 == 0)).collect()).to_string()
}

/// Thread CPU time spent in `f`.
fn cpu_time(f: impl FnOnce()) -> Duration {
    let now = || {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
            .map(Duration::from)
            .unwrap_or_default()
    };
    let start = now();
    f();
    now().saturating_sub(start)
}

fn bench_predict(c: &mut Criterion) {
    let op = EventOp::RevertResize {
        source: "h1".into(),
        dest: "h2".into(),
    };
    let wiring = Wiring::default();
    let minimal = four(minimal_vif);
    let nova = four(nova_vif);
    let parsed = NetworkInfo::parse(&nova).unwrap_or_default().vifs;
    assert_eq!(parsed.len(), 4);
    let mut g = c.benchmark_group("predict_4_vifs");
    g.bench_function("parsed_network_info", |b| {
        b.iter(|| predict(black_box(&op), black_box(&parsed), &wiring))
    });
    g.bench_function("parsed_plus_event_lists", |b| {
        b.iter(|| {
            let p = predict(black_box(&op), black_box(&parsed), &wiring);
            p.map(|p| (p.bind_time_events(), p.plug_time_events()))
        })
    });
    g.bench_function("serde_json_value_only_minimal", |b| {
        b.iter(|| serde_json::from_str::<Value>(black_box(&minimal)).map(|v| v.is_array()))
    });
    g.bench_function("full_parse_minimal_vifs", |b| {
        b.iter(|| {
            let ni = NetworkInfo::parse(black_box(&minimal));
            ni.map(|ni| predict(&op, &ni.vifs, &wiring))
        })
    });
    g.bench_function("full_parse_full_nova_vifs", |b| {
        b.iter(|| {
            let ni = NetworkInfo::parse(black_box(&nova));
            ni.map(|ni| predict(&op, &ni.vifs, &wiring))
        })
    });
    g.finish();

    // The same on thread CPU time: what one prediction costs the core that runs it,
    // independent of how many other processes share the machine.
    let mut g = c.benchmark_group("predict_4_vifs_thread_cpu_time");
    g.bench_function("parsed_network_info", |b| {
        b.iter_custom(|iters| {
            cpu_time(|| {
                for _ in 0..iters {
                    let _ = black_box(predict(black_box(&op), black_box(&parsed), &wiring));
                }
            })
        })
    });
    g.bench_function("full_parse_minimal_vifs", |b| {
        b.iter_custom(|iters| {
            cpu_time(|| {
                for _ in 0..iters {
                    let ni = NetworkInfo::parse(black_box(&minimal));
                    let _ = black_box(ni.map(|ni| predict(&op, &ni.vifs, &wiring)));
                }
            })
        })
    });
    g.finish();
    eprintln!(
        "network_info sizes: minimal {} bytes, full Nova {} bytes (4 VIFs)",
        minimal.len(),
        nova.len()
    );
}

/// The actor on its own thread (an actix System), with `WAITING` instances each waiting for
/// two ports that the benchmark never sends.
struct Rig {
    addr: Addr<NetworkEventActor>,
    system: System,
    /// The actor's thread, where a waiter can be spawned as an instance actor's wait runs.
    arbiter: ArbiterHandle,
    thread: Option<thread::JoinHandle<()>>,
}

impl Rig {
    fn new() -> Rig {
        let (tx, rx) = mpsc::channel();
        let thread = thread::Builder::new()
            .name("bench-events".into())
            .spawn(move || {
                let sys = System::new();
                let addr =
                    sys.block_on(async { NetworkEventActor::new(EventConfig::default()).start() });
                let _ = tx.send((addr, System::current(), Arbiter::current()));
                let _ = sys.run();
            })
            .ok();
        let (addr, system, arbiter) = rx.recv().unwrap_or_else(|_| std::process::abort());
        let policy = WaitPolicy {
            timeout: Duration::from_secs(3600),
            fatal: true,
        };
        let mut handles = Vec::new();
        for i in 0..WAITING {
            let h = block_on(addr.send(Expect {
                instance: inst(i),
                events: vec![
                    ExpectedEvent::plugged(port(1)),
                    ExpectedEvent::plugged(port(2)),
                ],
                since: Instant::now(),
                policy,
                op_id: OpId(u64::from(i)),
            }));
            handles.push(h);
        }
        // The handles must stay alive or the sweep would count them abandoned; leak them
        // deliberately for the benchmark's lifetime.
        std::mem::forget(handles);
        Rig {
            addr,
            system,
            arbiter,
            thread,
        }
    }

    fn waits_now(&self) -> u64 {
        block_on(self.addr.send(Stats))
            .map(|s| s.waits_now)
            .unwrap_or(0)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.system.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An event for a waiting instance, for a port it does not wait for: routed, looked up,
/// compared against the wait, then buffered (the buffer stays at its bound).
fn routed(k: u64) -> ExternalEvent {
    ExternalEvent {
        name: EventName::NetworkVifPlugged,
        server_uuid: inst((k % u64::from(WAITING)) as u32),
        tag: Some(port(100 + (k % 64) as u32).to_string()),
        status: EventStatus::Completed,
    }
}

fn bench_throughput(c: &mut Criterion) {
    let rig = Rig::new();
    assert_eq!(rig.waits_now(), u64::from(WAITING));
    let mut g = c.benchmark_group("actor_1000_waiting");
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Elements(1));
    g.bench_function("deliver_one_message_per_event", |b| {
        b.iter_custom(|iters| {
            let events: Vec<_> = (0..iters).map(routed).collect();
            let start = StdInstant::now();
            for e in events {
                rig.addr.do_send(Deliver {
                    event: e,
                    received: Instant::now(),
                });
            }
            let _ = block_on(rig.addr.send(Stats));
            start.elapsed()
        })
    });
    const BATCH: u64 = 64;
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("deliver_batches_of_64", |b| {
        b.iter_custom(|iters| {
            let batches: Vec<Vec<_>> = (0..iters)
                .map(|i| (0..BATCH).map(|k| routed(i * BATCH + k)).collect())
                .collect();
            let start = StdInstant::now();
            for events in batches {
                rig.addr.do_send(DeliverBatch {
                    events,
                    received: Instant::now(),
                });
            }
            let _ = block_on(rig.addr.send(Stats));
            start.elapsed()
        })
    });
    g.finish();
    assert_eq!(
        rig.waits_now(),
        u64::from(WAITING),
        "the 1,000 waits are still there"
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Where the waiting operation runs in [`deliver_to_wake`].
#[derive(Clone, Copy)]
enum Waiter {
    /// On the actor thread, as an instance actor's wait does (instance actors and the event
    /// actor share the `vireo-actors` thread): one hand-off, from the deliverer to it.
    ActorThread,
    /// On the delivering thread: a second hand-off, back from the actor thread.
    DeliveringThread,
}

/// Deliver → wake: register a wait for one event, deliver it from the benchmark thread (as
/// the HTTP endpoint does), and time until the waiter is woken with the result. The waiter
/// takes the time when it wakes, so reporting it back is not counted.
fn deliver_to_wake(rig: &Rig, waiter: Waiter, samples_n: u32, first: u32) -> Vec<Duration> {
    let policy = WaitPolicy {
        timeout: Duration::from_secs(60),
        fatal: true,
    };
    let (woke_tx, woke_rx) = mpsc::channel::<Option<StdInstant>>();
    let mut samples = Vec::with_capacity(samples_n as usize);
    for i in first..first + samples_n {
        let instance = inst(WAITING + i);
        let p = port(1_000 + i);
        let Ok(handle) = block_on(rig.addr.send(Expect {
            instance,
            events: vec![ExpectedEvent::plugged(p)],
            since: Instant::now(),
            policy,
            op_id: OpId(u64::from(i)),
        })) else {
            break;
        };
        let event = ExternalEvent {
            name: EventName::NetworkVifPlugged,
            server_uuid: instance,
            tag: Some(p.to_string()),
            status: EventStatus::Completed,
        };
        // The handle, when this thread is the one to wait on it.
        let here = match waiter {
            Waiter::ActorThread => {
                let tx = woke_tx.clone();
                rig.arbiter.spawn(async move {
                    let r = handle.await;
                    let _ = tx.send(r.is_ok().then(StdInstant::now));
                });
                None
            }
            Waiter::DeliveringThread => Some(handle),
        };
        let t0 = StdInstant::now();
        rig.addr.do_send(Deliver {
            event,
            received: Instant::now(),
        });
        let woke = match here {
            None => woke_rx.recv().ok().flatten().map(|t1| t1 - t0),
            Some(handle) => block_on(handle).ok().map(|_| t0.elapsed()),
        };
        samples.extend(woke);
    }
    samples.sort();
    samples
}

/// One bare hand-off between two threads: the benchmark thread stamps the time and sends
/// it over a channel to a thread parked on it, which takes the difference when it wakes. The
/// platform's floor for any cross-thread wake (on a VM whose other vCPU is idle, the
/// hypervisor's cost of waking that vCPU).
fn thread_hand_off(samples_n: u32) -> Vec<Duration> {
    let (to_tx, to_rx) = mpsc::channel::<StdInstant>();
    let (back_tx, back_rx) = mpsc::channel::<Duration>();
    let echo = thread::Builder::new()
        .name("bench-hand-off".into())
        .spawn(move || {
            while let Ok(t0) = to_rx.recv() {
                if back_tx.send(t0.elapsed()).is_err() {
                    break;
                }
            }
        })
        .ok();
    let mut samples = Vec::with_capacity(samples_n as usize);
    for _ in 0..samples_n {
        if to_tx.send(StdInstant::now()).is_err() {
            break;
        }
        match back_rx.recv() {
            Ok(dt) => samples.push(dt),
            Err(_) => break,
        }
    }
    drop(to_tx);
    if let Some(t) = echo {
        let _ = t.join();
    }
    samples.sort();
    samples
}

fn latency_report() {
    let rig = Rig::new();
    let n = 10_000u32;
    // Warm-up, not counted (as criterion warms up): caches, the allocator, and the
    // hypervisor's halt polling, which adapts to how soon an idle vCPU is woken again.
    let _ = deliver_to_wake(&rig, Waiter::DeliveringThread, 2_000, 3 * n);
    let _ = thread_hand_off(2_000);
    let show = |what: &str, samples: &[Duration]| {
        println!(
            "{what}, {} samples: p50 {:?}, p99 {:?}, max {:?}",
            samples.len(),
            percentile(samples, 0.50),
            percentile(samples, 0.99),
            samples.last().copied().unwrap_or_default()
        );
    };
    show(
        &format!("deliver->wake, waiter on the actor thread, {WAITING} instances waiting"),
        &deliver_to_wake(&rig, Waiter::ActorThread, n, 0),
    );
    show(
        &format!("deliver->wake, waiter on the delivering thread, {WAITING} instances waiting"),
        &deliver_to_wake(&rig, Waiter::DeliveringThread, n, n),
    );
    show(
        "one bare hand-off between two threads (the platform's floor)",
        &thread_hand_off(n),
    );
    let m = NetworkEventActor::memory_figures();
    println!(
        "memory: per pending wait {} B + {} B per expected event; per buffered event {} B; per known instance {} B",
        m.per_wait, m.per_expected_event, m.per_buffered_event, m.per_instance
    );
}

fn main() {
    // VIREO_BENCH_ONLY=predict skips the actor parts (to iterate on prediction quickly).
    let only_predict = std::env::var("VIREO_BENCH_ONLY").is_ok_and(|v| v == "predict");
    if !only_predict {
        latency_report();
    }
    let mut c = Criterion::default().configure_from_args();
    bench_predict(&mut c);
    if !only_predict {
        bench_throughput(&mut c);
    }
    c.final_summary();
}
