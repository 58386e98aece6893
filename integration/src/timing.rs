//! Where an operation's time went: wall time split by clock (`OpReport::total`), each event
//! wait against the arrival of the events it waited for, and the events the endpoint saw
//! during the operation. [`Timings`] collects rows and renders the table.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;
use vireo_actors::external::EventStatus;
use vireo_actors::instance::{OpReport, StepKind};
use vireo_actors::predict::Timing;

use crate::endpoint::{Arrival, Source};

/// One wait of an operation, against its events.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitLag {
    /// bind-time / plug-time.
    pub timing: Timing,
    /// Events waited for.
    pub expected: usize,
    /// All arrived.
    pub complete: bool,
    /// When the flow began awaiting, from the operation's start.
    pub await_at: Duration,
    /// When the wait ended, from the operation's start.
    pub end_at: Duration,
    /// When the last awaited event arrived, from the operation's start (None: not seen).
    pub last_arrival_at: Option<Duration>,
    /// How long after the later of (last arrival, await start) the wait ended.
    pub lag: Option<Duration>,
}

/// The waits of `report` (an operation that began at `start`) against `arrivals`: for each
/// awaited event the first matching `completed` arrival at or after `start` that an earlier
/// wait of the same operation did not take counts (an operation may wait twice for the same
/// port, e.g. a rollback's two binding-profile updates).
pub fn wait_lags(report: &OpReport, start: Instant, arrivals: &[Arrival]) -> Vec<WaitLag> {
    let steps = report
        .steps
        .iter()
        .filter(|s| s.kind == StepKind::EventWait);
    let mut taken = vec![false; arrivals.len()];
    report
        .waits
        .iter()
        .zip(steps)
        .map(|(w, s)| {
            let mut last: Option<Duration> = Some(Duration::ZERO);
            for e in &w.expected {
                let tag = e.tag.to_string();
                let first = arrivals
                    .iter()
                    .enumerate()
                    .filter(|(i, a)| {
                        !taken[*i]
                            && a.at >= start
                            && a.name == e.name
                            && a.status == EventStatus::Completed
                            && a.tag.as_deref() == Some(tag.as_str())
                    })
                    .min_by_key(|(_, a)| a.at);
                if let Some((i, _)) = first {
                    taken[i] = true;
                }
                let first = first.map(|(_, a)| a.at.duration_since(start));
                last = match (last, first) {
                    (Some(l), Some(f)) => Some(l.max(f)),
                    _ => None,
                };
            }
            let last = if w.expected.is_empty() { None } else { last };
            let end_at = s.at + s.took;
            let lag = last.map(|l| end_at.saturating_sub(l.max(s.at)));
            WaitLag {
                timing: w.timing,
                expected: w.expected.len(),
                complete: w.complete,
                await_at: s.at,
                end_at,
                last_arrival_at: last,
                lag,
            }
        })
        .collect()
}

/// One operation's row.
#[derive(Debug, Clone, PartialEq)]
pub struct OpTiming {
    /// Scenario.
    pub scenario: String,
    /// Operation label.
    pub op: String,
    /// Succeeded.
    pub ok: bool,
    /// Wall time seen by the caller.
    pub wall: Duration,
    /// Per clock: libvirt, plug, network, event wait, peer.
    pub libvirt: Duration,
    /// Plugging.
    pub plug: Duration,
    /// Network API.
    pub network: Duration,
    /// Event waits.
    pub event_wait: Duration,
    /// Other host.
    pub peer: Duration,
    /// Part of another row's operation (the half another host ran for it, counted in that
    /// row's `peer` time): left out of the scenario sums.
    pub nested: bool,
    /// The waits.
    pub waits: Vec<WaitLag>,
    /// Events for the instance during the operation: (offset, name, status, port prefix,
    /// source, batch).
    pub arrivals: Vec<(Duration, String, String, String, Source, u64)>,
}

impl OpTiming {
    /// A row from a finished operation.
    pub fn new(
        scenario: &str,
        op: &str,
        instance: Uuid,
        start: Instant,
        wall: Duration,
        report: Option<&OpReport>,
        arrivals: &[Arrival],
    ) -> OpTiming {
        let t = |k| report.map(|r| r.total(k)).unwrap_or_default();
        let end = start + wall;
        OpTiming {
            scenario: scenario.to_owned(),
            op: op.to_owned(),
            ok: report.is_some(),
            wall,
            libvirt: t(StepKind::Libvirt),
            plug: t(StepKind::Plug),
            network: t(StepKind::Network),
            event_wait: t(StepKind::EventWait),
            peer: t(StepKind::Peer),
            nested: false,
            waits: report
                .map(|r| wait_lags(r, start, arrivals))
                .unwrap_or_default(),
            arrivals: arrivals
                .iter()
                .filter(|a| a.server == instance && a.at >= start && a.at <= end)
                .map(|a| {
                    (
                        a.at.duration_since(start),
                        a.name.as_str().trim_start_matches("network-").to_owned(),
                        format!("{:?}", a.status).to_lowercase(),
                        a.tag.as_deref().unwrap_or("-").chars().take(8).collect(),
                        a.source,
                        a.batch,
                    )
                })
                .collect(),
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{}", d.as_millis())
}

/// Every row of a run.
#[derive(Debug, Default)]
pub struct Timings {
    rows: Mutex<Vec<OpTiming>>,
}

impl Timings {
    /// Add a row.
    pub fn push(&self, row: OpTiming) {
        self.rows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(row);
    }

    /// The rows so far.
    pub fn rows(&self) -> Vec<OpTiming> {
        self.rows.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The table: one line per operation, then its waits and event arrivals.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<28} {:<22} {:>3} {:>7} {:>7} {:>6} {:>7} {:>7} {:>6}",
            "scenario", "operation", "ok", "wall", "libvirt", "plug", "network", "events", "peer"
        );
        let _ = writeln!(out, "{}", "-".repeat(100));
        for r in self.rows() {
            let _ = writeln!(
                out,
                "{:<28} {:<22} {:>3} {:>7} {:>7} {:>6} {:>7} {:>7} {:>6}",
                r.scenario,
                r.op,
                if r.ok { "ok" } else { "ERR" },
                ms(r.wall),
                ms(r.libvirt),
                ms(r.plug),
                ms(r.network),
                ms(r.event_wait),
                ms(r.peer)
            );
            for w in &r.waits {
                if w.expected == 0 {
                    continue;
                }
                let _ = writeln!(
                    out,
                    "{:>30} {} x{} await@{} end@{} last-event@{} lag {} {}",
                    "wait",
                    w.timing.as_str(),
                    w.expected,
                    ms(w.await_at),
                    ms(w.end_at),
                    w.last_arrival_at.map(ms).unwrap_or_else(|| "?".into()),
                    w.lag
                        .map(|l| format!("{l:?}"))
                        .unwrap_or_else(|| "?".into()),
                    if w.complete { "complete" } else { "INCOMPLETE" }
                );
            }
            if !r.arrivals.is_empty() {
                let ev: Vec<String> = r
                    .arrivals
                    .iter()
                    .map(|(at, name, status, tag, src, batch)| {
                        let s = if *src == Source::Embedded { "E" } else { "N" };
                        let st = if status == "completed" {
                            String::new()
                        } else {
                            format!("/{status}")
                        };
                        format!("+{}:{name}{st}[{tag}]{s}#{batch}", ms(*at))
                    })
                    .collect();
                let _ = writeln!(out, "{:>30} {}", "events", ev.join(" "));
            }
        }
        out
    }
}

/// The event-wait criterion of the network issue: a wait must end within 5 % of its
/// duration, or 50 ms, of the arrival of the last event it needed, never by timeout.
pub fn wait_within_bound(w: &WaitLag) -> bool {
    let Some(lag) = w.lag else { return false };
    let took = w.end_at.saturating_sub(w.await_at);
    w.complete
        && (lag <= Duration::from_millis(50) || lag.as_secs_f64() <= took.as_secs_f64() * 0.05)
}

impl Timings {
    /// Every wait of every row against [`wait_within_bound`]: how many, how many whose events
    /// were seen at the endpoint, the largest lag, and each wait outside the bound.
    pub fn render_wait_lags(&self) -> String {
        let rows = self.rows();
        let waits: Vec<(&OpTiming, &WaitLag)> = rows
            .iter()
            .flat_map(|r| {
                r.waits
                    .iter()
                    .filter(|w| w.expected > 0)
                    .map(move |w| (r, w))
            })
            .collect();
        let seen: Vec<&(&OpTiming, &WaitLag)> =
            waits.iter().filter(|(_, w)| w.lag.is_some()).collect();
        let max = seen
            .iter()
            .filter_map(|(_, w)| w.lag)
            .max()
            .unwrap_or_default();
        let mut out = format!(
            "event waits: {} ({} with every event seen at the endpoint); largest lag after the \
             last event {:?}\n",
            waits.len(),
            seen.len(),
            max
        );
        for (r, w) in seen.iter().filter(|(_, w)| !wait_within_bound(w)) {
            let _ = writeln!(
                out,
                "  outside 5 % / 50 ms: {} / {}: {} x{} lag {:?}{}",
                r.scenario,
                r.op,
                w.timing.as_str(),
                w.expected,
                w.lag.unwrap_or_default(),
                if w.complete { "" } else { " (incomplete)" }
            );
        }
        out
    }
}

impl Timings {
    /// One line per scenario: its wall time (`walls`, from the runner, set-up and checks
    /// included) and the sums of its operations' rows (nested rows left out).
    pub fn render_scenarios(&self, walls: &[(String, Duration)]) -> String {
        let rows = self.rows();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<40} {:>8} {:>8} {:>8} {:>7} {:>8} {:>7} {:>7}",
            "scenario (ms)", "wall", "ops", "libvirt", "plug", "network", "events", "peer"
        );
        let _ = writeln!(out, "{}", "-".repeat(100));
        let mut total = [Duration::ZERO; 7];
        for (name, wall) in walls {
            let mine: Vec<&OpTiming> = rows
                .iter()
                .filter(|r| r.scenario == *name && !r.nested)
                .collect();
            let sum = |f: fn(&OpTiming) -> Duration| mine.iter().map(|r| f(r)).sum::<Duration>();
            let cols = [
                *wall,
                sum(|r| r.wall),
                sum(|r| r.libvirt),
                sum(|r| r.plug),
                sum(|r| r.network),
                sum(|r| r.event_wait),
                sum(|r| r.peer),
            ];
            for (t, c) in total.iter_mut().zip(cols) {
                *t += c;
            }
            let _ = writeln!(
                out,
                "{:<40} {:>8} {:>8} {:>8} {:>7} {:>8} {:>7} {:>7}",
                name,
                ms(cols[0]),
                ms(cols[1]),
                ms(cols[2]),
                ms(cols[3]),
                ms(cols[4]),
                ms(cols[5]),
                ms(cols[6])
            );
        }
        let _ = writeln!(
            out,
            "{:<40} {:>8} {:>8} {:>8} {:>7} {:>8} {:>7} {:>7}",
            "all scenarios",
            ms(total[0]),
            ms(total[1]),
            ms(total[2]),
            ms(total[3]),
            ms(total[4]),
            ms(total[5]),
            ms(total[6])
        );
        out
    }
}

/// `target/integration-timings.txt` of this workspace (or `$CARGO_TARGET_DIR`).
pub fn timings_file() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        });
    target.join("integration-timings.txt")
}

#[cfg(test)]
mod tests {
    use super::*;
    use vireo_actors::external::EventName;
    use vireo_actors::instance::{Step, WaitReport};
    use vireo_actors::predict::ExpectedEvent;
    use vireo_actors::vif::PortId;

    #[test]
    fn the_wait_bound_is_5_percent_or_50_ms_and_never_a_timeout() {
        let w = |took_ms: u64, lag_ms: Option<u64>, complete: bool| WaitLag {
            timing: Timing::BindTime,
            expected: 1,
            complete,
            await_at: Duration::from_millis(100),
            end_at: Duration::from_millis(100 + took_ms),
            last_arrival_at: None,
            lag: lag_ms.map(Duration::from_millis),
        };
        assert!(wait_within_bound(&w(200, Some(50), true)));
        assert!(!wait_within_bound(&w(200, Some(51), true)));
        assert!(wait_within_bound(&w(4000, Some(200), true)));
        assert!(!wait_within_bound(&w(4000, Some(201), true)));
        assert!(!wait_within_bound(&w(4000, Some(0), false)));
        assert!(!wait_within_bound(&w(4000, None, true)));
    }

    #[test]
    fn lag_is_measured_from_the_later_of_arrival_and_await_start() {
        let start = Instant::now();
        let (p1, p2) = (PortId(Uuid::new_v4()), PortId(Uuid::new_v4()));
        let arrival = |p: PortId, ms: u64| Arrival {
            at: start + Duration::from_millis(ms),
            source: Source::Neutron,
            name: EventName::NetworkVifPlugged,
            server: Uuid::nil(),
            tag: Some(p.to_string()),
            status: EventStatus::Completed,
            batch: 1,
        };
        let wait = |ports: Vec<PortId>| WaitReport {
            timing: Timing::PlugTime,
            expected: ports.into_iter().map(ExpectedEvent::plugged).collect(),
            took: Duration::ZERO,
            complete: true,
            missing: vec![],
            stale: vec![],
            unconfirmed: vec![],
            outcome: String::new(),
        };
        let step = |at: u64, took: u64| Step {
            name: "wait".into(),
            kind: StepKind::EventWait,
            took: Duration::from_millis(took),
            at: Duration::from_millis(at),
            failed: false,
        };
        let report = OpReport {
            steps: vec![step(100, 900), step(1000, 0)],
            waits: vec![wait(vec![p1, p2]), wait(vec![p1])],
            ..OpReport::default()
        };
        // p1 twice: the first arrival counts for the first wait; p2 last at 990 ms; the wait ended at 1000 ms.
        let arrivals = vec![arrival(p1, 300), arrival(p1, 400), arrival(p2, 990)];
        let lags = wait_lags(&report, start, &arrivals);
        assert_eq!(lags[0].last_arrival_at, Some(Duration::from_millis(990)));
        assert_eq!(lags[0].lag, Some(Duration::from_millis(10)));
        // The second wait for p1 gets p1's second arrival (the first went to the first wait);
        // already arrived before the await began: no lag beyond the await start.
        assert_eq!(lags[1].last_arrival_at, Some(Duration::from_millis(400)));
        assert_eq!(lags[1].lag, Some(Duration::ZERO));
        // An event never seen: unknown.
        let lags = wait_lags(&report, start, &arrivals[..1]);
        assert_eq!(lags[0].last_arrival_at, None);
    }

    #[test]
    fn scenario_sums_leave_nested_rows_out() {
        let t = Timings::default();
        let row = |scenario: &str, wall: u64, peer: u64, nested: bool| OpTiming {
            scenario: scenario.into(),
            op: "op".into(),
            ok: true,
            wall: Duration::from_millis(wall),
            libvirt: Duration::from_millis(1),
            plug: Duration::ZERO,
            network: Duration::ZERO,
            event_wait: Duration::ZERO,
            peer: Duration::from_millis(peer),
            nested,
            waits: vec![],
            arrivals: vec![],
        };
        t.push(row("s1", 100, 40, false));
        t.push(row("s1", 40, 0, true));
        t.push(row("s2", 7, 0, false));
        let text = t.render_scenarios(&[
            ("s1".into(), Duration::from_millis(500)),
            ("s2".into(), Duration::from_millis(9)),
        ]);
        let cols = |name: &str| -> Vec<String> {
            text.lines()
                .find(|l| l.starts_with(name))
                .unwrap()
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        // wall, ops, libvirt, plug, network, events, peer
        assert_eq!(cols("s1 ")[1..], ["500", "100", "1", "0", "0", "0", "40"]);
        assert_eq!(cols("s2 ")[1..], ["9", "7", "1", "0", "0", "0", "0"]);
        assert_eq!(
            cols("all scenarios")[2..],
            ["509", "107", "2", "0", "0", "0", "40"]
        );
    }
}
