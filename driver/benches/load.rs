//! Load: N instances on two local hosts (libvirt's test driver, embedded network service),
//! all spawned, then every instance runs a mix of operations concurrently (soft and hard
//! reboot, power off/on, resize + confirm and resize + revert across the hosts, attach and
//! detach an interface, a live migration — which the test driver cannot do, so it is rolled
//! back), then all destroyed. Twice: quiet, then under an event storm (`--storm` injected
//! events per real one: duplicates, events for ended waits, strays, `failed` for ports nobody
//! waits for, ignored ones). Prints per-kind p50/p99, the storm/quiet p99 ratio, peak RSS and
//! the event counters, writes them as JSON (`target/load-report.json` unless `--json PATH`),
//! and exits non-zero if an invariant broke (an operation hung or failed, something leaked).
//!
//! Machines are noisy (here: 2 cores shared by several builds), so quiet and storm runs
//! alternate for `--rounds` rounds and the table shows, per kind, the median over rounds of
//! each run's p50 and p99. CPU time of the process and of the actor thread is reported too.
//!
//! `cargo bench -p vireo --bench load [-- --instances N --storm F --rounds R
//! --waves W --event-delay-ms D --op-timeout-secs S --json PATH]` (defaults: 200 instances, storm 10,
//! 3 rounds, 1 wave, no event delay). With `--waves W` each run does W waves of spawn, mix
//! and destroy on the same cloud and prints RSS after each: memory must not grow wave over
//! wave.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/load_support/mod.rs"]
mod load_support;

use std::time::Duration;

use load_support::{percentiles, LoadConfig, LoadReport, OpKind};

/// Peak RSS target (MiB).
const RSS_TARGET_MIB: f64 = 200.0;
/// p99 under the storm over p99 quiet, target.
const P99_RATIO_TARGET: f64 = 2.0;

struct Args {
    cfg: LoadConfig,
    storm: u32,
    rounds: usize,
    json: std::path::PathBuf,
}

fn args() -> Args {
    let mut cfg = LoadConfig::default();
    let mut storm = 10;
    let mut rounds = 3;
    let mut json = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("load-report.json");
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().unwrap_or_else(|| panic!("{name} needs a value"));
        match a.as_str() {
            "--instances" => cfg.instances = value(&a).parse().expect("--instances: a number"),
            "--storm" => storm = value(&a).parse().expect("--storm: a number"),
            "--event-delay-ms" => {
                cfg.event_delay_ms = value(&a).parse().expect("--event-delay-ms: a number")
            }
            "--op-timeout-secs" => {
                cfg.op_timeout =
                    Duration::from_secs(value(&a).parse().expect("--op-timeout-secs: a number"))
            }
            "--rounds" => {
                rounds = value(&a)
                    .parse::<usize>()
                    .expect("--rounds: a number")
                    .max(1)
            }
            "--waves" => cfg.waves = value(&a).parse().expect("--waves: a number"),
            "--json" => json = value(&a).into(),
            // cargo bench passes --bench; anything else is ignored too.
            _ => {}
        }
    }
    Args {
        cfg,
        storm,
        rounds,
        json,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn json_of(r: &LoadReport) -> serde_json::Value {
    let ops: serde_json::Map<String, serde_json::Value> = OpKind::ALL
        .iter()
        .map(|k| {
            let p = percentiles(r.times.get(k).map_or(&[][..], Vec::as_slice));
            (
                k.name().to_owned(),
                serde_json::json!({
                    "count": p.count, "p50_ms": ms(p.p50), "p99_ms": ms(p.p99), "max_ms": ms(p.max),
                }),
            )
        })
        .collect();
    let s = &r.stats;
    serde_json::json!({
        "instances": r.instances,
        "storm_factor": r.storm,
        "wall_s": r.wall.as_secs_f64(),
        "operations_started": r.started,
        "operations_finished": r.finished,
        "peak_rss_mib": mib(r.peak_rss_kib),
        "cpu_process_s": r.process_cpu.as_secs_f64(),
        "cpu_actor_thread_s": r.actor_cpu.as_secs_f64(),
        "cpu_by_thread_s": r.thread_cpu.iter().map(|(n, t)| (n.clone(), serde_json::json!(t.as_secs_f64()))).collect::<serde_json::Map<_, _>>(),
        "sampled_max_rss_mib": mib(r.sampled_rss_kib),
        "rss_after_waves_mib": r.rss_after_waves.iter().map(|k| mib(*k)).collect::<Vec<_>>(),
        "vmhwm_reset_per_run": r.hwm_reset,
        "events": {
            "sent_by_network_service": r.real_events,
            "injected": r.injected,
            "delivered_to_actors": s.delivered,
            "matched": s.matched,
            "matched_from_buffer": s.matched_from_buffer,
            "buffered": s.buffered,
            "buffer_dropped_full": s.buffer_dropped_count,
            "buffer_dropped_age": s.buffer_dropped_age,
            "buffer_dropped_forgotten": s.buffer_dropped_forgotten,
            "unknown_instance_dropped": s.unknown_instance_dropped,
            "duplicates": s.duplicates,
            "ignored": s.ignored,
            "timeouts": s.timeouts,
            "failed": s.failed,
            "waits_left": s.waits_now,
            "buffered_left": s.buffered_now,
            "instances_known_left": s.instances_now,
        },
        "operations": ops,
        "violations": r.violations,
    })
}

fn print_events(r: &LoadReport) {
    let s = &r.stats;
    println!(
        "  events: sent by the service {}, injected {} (x{} hosts), delivered {}, matched {} \
         (+{} from buffer), buffered {}, dropped: buffer full {} / age {} / forgotten {} / \
         unknown instance {}, duplicates {}, ignored {}, wait timeouts {}, waits failed {}; \
         left: {} waits, {} buffered, {} instances known",
        r.real_events,
        r.injected,
        load_support::HOSTS.len(),
        s.delivered,
        s.matched,
        s.matched_from_buffer,
        s.buffered,
        s.buffer_dropped_count,
        s.buffer_dropped_age,
        s.buffer_dropped_forgotten,
        s.unknown_instance_dropped,
        s.duplicates,
        s.ignored,
        s.timeouts,
        s.failed,
        s.waits_now,
        s.buffered_now,
        s.instances_now
    );
}

/// Median of a few values.
fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn print_run(name: &str, r: &LoadReport) {
    println!(
        "{name}: wall {:.1} s, {} operations started, {} finished, peak RSS {:.1} MiB \
         (VmHWM{}; sampled max {:.1} MiB), CPU: process {:.1} s, actor thread {:.1} s",
        r.wall.as_secs_f64(),
        r.started,
        r.finished,
        mib(r.peak_rss_kib),
        if r.hwm_reset {
            ", reset before the run"
        } else {
            " of the process"
        },
        mib(r.sampled_rss_kib),
        r.process_cpu.as_secs_f64(),
        r.actor_cpu.as_secs_f64(),
    );
    if r.rss_after_waves.len() > 1 {
        let w: Vec<String> = r
            .rss_after_waves
            .iter()
            .map(|k| format!("{:.1}", mib(*k)))
            .collect();
        println!("  RSS after each wave (MiB): {}", w.join(", "));
    }
    let top: Vec<String> = r
        .thread_cpu
        .iter()
        .take(6)
        .map(|(n, t)| format!("{n} {:.1} s", t.as_secs_f64()))
        .collect();
    println!("  CPU by thread: {}", top.join(", "));
    print_events(r);
    if r.violations.is_empty() {
        println!("  invariants: all held (no hung or failed operation; nothing left)");
    } else {
        println!("  INVARIANTS BROKEN ({}):", r.violations.len());
        for v in r.violations.iter().take(20) {
            println!("    {v}");
        }
    }
}

fn main() {
    let Args {
        cfg,
        storm,
        rounds,
        json,
    } = args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "load: {} instances on {} hosts (libvirt test driver, embedded network service, event \
         delay {} ms), storm x{storm}, {rounds} rounds of quiet then storm; every operation \
         bounded by {:?}",
        cfg.instances,
        load_support::HOSTS.len(),
        cfg.event_delay_ms,
        cfg.op_timeout
    );
    let mut quiet = Vec::new();
    let mut stormy = Vec::new();
    for round in 0..rounds {
        let q = rt.block_on(load_support::run(&LoadConfig {
            storm: 0,
            ..cfg.clone()
        }));
        print_run(&format!("round {round} quiet"), &q);
        let s = rt.block_on(load_support::run(&LoadConfig {
            storm,
            ..cfg.clone()
        }));
        print_run(&format!("round {round} storm"), &s);
        quiet.push(q);
        stormy.push(s);
    }

    println!(
        "\nmedian over {rounds} rounds of each run's per-kind p50 and p99:\n{:<22} {:>5} {:>10} {:>10} {:>10} {:>10} {:>7}",
        "operation", "n/run", "quiet p50", "quiet p99", "storm p50", "storm p99", "p99 x"
    );
    let mut worst: f64 = 0.0;
    let mut table = serde_json::Map::new();
    for k in OpKind::ALL {
        let per = |runs: &[LoadReport]| -> Vec<load_support::Percentiles> {
            runs.iter()
                .map(|r| percentiles(r.times.get(&k).map_or(&[][..], Vec::as_slice)))
                .collect()
        };
        let (q, s) = (per(&quiet), per(&stormy));
        let qp50 = median(q.iter().map(|p| p.p50).collect());
        let qp99 = median(q.iter().map(|p| p.p99).collect());
        let sp50 = median(s.iter().map(|p| p.p50).collect());
        let sp99 = median(s.iter().map(|p| p.p99).collect());
        let ratio = if qp99.is_zero() {
            0.0
        } else {
            sp99.as_secs_f64() / qp99.as_secs_f64()
        };
        worst = worst.max(ratio);
        println!(
            "{:<22} {:>5} {:>8.1}ms {:>8.1}ms {:>8.1}ms {:>8.1}ms {:>7.2}",
            k.name(),
            q.first().map_or(0, |p| p.count),
            ms(qp50),
            ms(qp99),
            ms(sp50),
            ms(sp99),
            ratio
        );
        table.insert(
            k.name().to_owned(),
            serde_json::json!({
                "quiet_p50_ms": ms(qp50), "quiet_p99_ms": ms(qp99),
                "storm_p50_ms": ms(sp50), "storm_p99_ms": ms(sp99), "p99_ratio": ratio,
                "quiet_p99_ms_per_round": q.iter().map(|p| ms(p.p99)).collect::<Vec<_>>(),
                "storm_p99_ms_per_round": s.iter().map(|p| ms(p.p99)).collect::<Vec<_>>(),
            }),
        );
    }
    println!(
        "(* the test driver cannot migrate: every live migration is rolled back, timed to its end)"
    );
    let cpu = |runs: &[LoadReport], f: fn(&LoadReport) -> Duration| {
        median(runs.iter().map(f).collect()).as_secs_f64()
    };
    println!(
        "median CPU: quiet process {:.1} s / actor thread {:.1} s; storm process {:.1} s / actor \
         thread {:.1} s",
        cpu(&quiet, |r| r.process_cpu),
        cpu(&quiet, |r| r.actor_cpu),
        cpu(&stormy, |r| r.process_cpu),
        cpu(&stormy, |r| r.actor_cpu),
    );
    let peak = quiet
        .iter()
        .chain(&stormy)
        .map(|r| mib(r.peak_rss_kib))
        .fold(0.0, f64::max);
    let broken = quiet
        .iter()
        .chain(&stormy)
        .map(|r| r.violations.len())
        .sum::<usize>();
    println!(
        "\ntargets: peak RSS {peak:.1} MiB (target <= {RSS_TARGET_MIB}: {}); worst storm/quiet \
         p99 ratio {worst:.2} (target <= {P99_RATIO_TARGET}: {}); invariants: {}",
        if peak <= RSS_TARGET_MIB {
            "met"
        } else {
            "MISSED"
        },
        if worst <= P99_RATIO_TARGET {
            "met"
        } else {
            "MISSED"
        },
        if broken == 0 {
            "all held".to_owned()
        } else {
            format!("{broken} BROKEN")
        }
    );
    let report = serde_json::json!({
        "instances": quiet.first().map_or(0, |r| r.instances),
        "storm_factor": storm,
        "rounds": rounds,
        "operations": table,
        "peak_rss_mib": peak,
        "worst_p99_ratio": worst,
        "targets": {"peak_rss_mib": RSS_TARGET_MIB, "p99_ratio": P99_RATIO_TARGET},
        "runs": {
            "quiet": quiet.iter().map(json_of).collect::<Vec<_>>(),
            "storm": stormy.iter().map(json_of).collect::<Vec<_>>(),
        },
    });
    if let Some(dir) = json.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(&json, serde_json::to_string_pretty(&report).unwrap()) {
        Ok(()) => println!("written: {}", json.display()),
        Err(e) => println!("could not write {}: {e}", json.display()),
    }
    if broken > 0 {
        std::process::exit(1);
    }
}
