//! The agent's metrics and their Prometheus text rendering (`GET /metrics`).
//!
//! A deliberately small registry: labelled counters and histograms with fixed buckets, each a
//! short vector behind a mutex (label sets are few: routes, operation kinds, event codes), and
//! gauges read at scrape time from the NetworkEventActor's [`EventStats`] and the libvirt
//! connection. Exposition format 0.0.4: `# HELP`, `# TYPE`, one sample per line, histogram
//! `_bucket{le=...}` cumulative with `+Inf`, `_sum`, `_count`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use vireo_actors::events::EventStats;

/// Buckets of request latency, seconds.
pub const HTTP_BUCKETS: [f64; 12] = [
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
];
/// Buckets of operation duration, seconds.
pub const OP_BUCKETS: [f64; 12] = [
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// A counter family with fixed label names.
#[derive(Debug)]
pub struct CounterVec {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    series: Mutex<Vec<(Vec<String>, u64)>>,
}

impl CounterVec {
    /// A new family.
    pub const fn new(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        CounterVec {
            name,
            help,
            labels,
            series: Mutex::new(Vec::new()),
        }
    }

    /// Add `n` to the series with `values` (one per label name).
    pub fn add(&self, values: &[&str], n: u64) {
        debug_assert_eq!(values.len(), self.labels.len());
        let mut s = self.series.lock().unwrap_or_else(|e| e.into_inner());
        match s.iter_mut().find(|(k, _)| k.iter().eq(values.iter())) {
            Some((_, v)) => *v += n,
            None => s.push((values.iter().map(|v| (*v).to_owned()).collect(), n)),
        }
    }

    /// Add one.
    pub fn inc(&self, values: &[&str]) {
        self.add(values, 1);
    }

    /// The current value of one series (0 when never touched).
    pub fn get(&self, values: &[&str]) -> u64 {
        let s = self.series.lock().unwrap_or_else(|e| e.into_inner());
        s.iter()
            .find(|(k, _)| k.iter().eq(values.iter()))
            .map_or(0, |(_, v)| *v)
    }

    fn render(&self, out: &mut String) {
        header(out, self.name, self.help, "counter");
        let mut s = self
            .series
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.sort();
        for (values, v) in s {
            let _ = writeln!(
                out,
                "{}{} {v}",
                self.name,
                label_set(self.labels, &values, None)
            );
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct HistSeries {
    values: Vec<String>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// A histogram family with fixed buckets.
#[derive(Debug)]
pub struct HistogramVec {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    buckets: &'static [f64],
    series: Mutex<Vec<HistSeries>>,
}

impl HistogramVec {
    /// A new family; `buckets` ascending upper bounds in seconds.
    pub const fn new(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        buckets: &'static [f64],
    ) -> Self {
        HistogramVec {
            name,
            help,
            labels,
            buckets,
            series: Mutex::new(Vec::new()),
        }
    }

    /// Record one observation.
    pub fn observe(&self, values: &[&str], d: Duration) {
        let secs = d.as_secs_f64();
        let slot = self.buckets.iter().position(|b| secs <= *b);
        let mut s = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let idx = match s.iter().position(|h| h.values.iter().eq(values.iter())) {
            Some(i) => i,
            None => {
                s.push(HistSeries {
                    values: values.iter().map(|v| (*v).to_owned()).collect(),
                    counts: vec![0; self.buckets.len()],
                    sum: 0.0,
                    count: 0,
                });
                s.len() - 1
            }
        };
        let h = &mut s[idx];
        if let Some(i) = slot {
            h.counts[i] += 1;
        }
        h.sum += secs;
        h.count += 1;
    }

    /// Observations of one series.
    pub fn count(&self, values: &[&str]) -> u64 {
        let s = self.series.lock().unwrap_or_else(|e| e.into_inner());
        s.iter()
            .find(|h| h.values.iter().eq(values.iter()))
            .map_or(0, |h| h.count)
    }

    fn render(&self, out: &mut String) {
        header(out, self.name, self.help, "histogram");
        let mut s = self
            .series
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.sort_by(|a, b| a.values.cmp(&b.values));
        for h in s {
            let mut cum = 0;
            for (b, c) in self.buckets.iter().zip(&h.counts) {
                cum += c;
                let le = format!("{b}");
                let _ = writeln!(
                    out,
                    "{}_bucket{} {cum}",
                    self.name,
                    label_set(self.labels, &h.values, Some(&le))
                );
            }
            let _ = writeln!(
                out,
                "{}_bucket{} {}",
                self.name,
                label_set(self.labels, &h.values, Some("+Inf")),
                h.count
            );
            let ls = label_set(self.labels, &h.values, None);
            let _ = writeln!(out, "{}_sum{ls} {}", self.name, h.sum);
            let _ = writeln!(out, "{}_count{ls} {}", self.name, h.count);
        }
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn label_set(names: &[&str], values: &[String], le: Option<&str>) -> String {
    if names.is_empty() && le.is_none() {
        return String::new();
    }
    let mut s = String::from("{");
    let mut first = true;
    for (n, v) in names.iter().zip(values) {
        if !first {
            s.push(',');
        }
        first = false;
        let _ = write!(s, "{n}=\"{}\"", escape(v));
    }
    if let Some(le) = le {
        if !first {
            s.push(',');
        }
        let _ = write!(s, "le=\"{le}\"");
    }
    s.push('}');
    s
}

/// What the libvirt connection reports, when the driver exposes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LibvirtStatus {
    /// Reconnects since start (connection generation - 1).
    pub reconnects: u64,
    /// A connection is open now.
    pub connected: bool,
}

/// Values read at scrape time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    /// The NetworkEventActor's counters (absent when it did not answer).
    pub events: Option<EventStats>,
    /// The libvirt connection (absent when the driver does not expose it).
    pub libvirt: Option<LibvirtStatus>,
    /// Instances the driver knows.
    pub instances: Option<u64>,
}

/// Every metric the agent keeps.
#[derive(Debug)]
pub struct Metrics {
    /// `vireo_http_requests_total{route,status}`.
    pub http_requests: CounterVec,
    /// `vireo_http_request_duration_seconds{route}`.
    pub http_duration: HistogramVec,
    /// `vireo_auth_failures_total{scope}`.
    pub auth_failures: CounterVec,
    /// `vireo_external_events_total{code}`: events received, by Nova's per-event code.
    pub events_received: CounterVec,
    /// `vireo_external_event_batches_total`: POSTs handed to the events actor.
    pub event_batches: CounterVec,
    /// `vireo_operations_total{kind,result}`: result `succeeded`, `failed` or `rejected`
    /// (refused at admission: 400/404/409/503).
    pub operations: CounterVec,
    /// `vireo_operation_duration_seconds{kind,result}`.
    pub op_duration: HistogramVec,
    /// `vireo_operations_in_flight`.
    pub ops_in_flight: AtomicI64,
    /// `vireo_peer_requests_total{request,result}`: requests other hosts sent here, result
    /// `succeeded`, `failed`, `timed-out` or `refused` (shutting down).
    pub peer_requests: CounterVec,
    /// `vireo_peer_requests_in_flight`.
    pub peer_in_flight: AtomicI64,
    /// `vireo_events_forwarded_total{result}`: external events forwarded to the peers, by
    /// result: `accepted` (a peer accepted it), `refused` (the peers answered, none
    /// accepted), `no-answer` (no peer answered in time).
    pub events_forwarded: CounterVec,
    /// `vireo_event_forward_failures_total{peer}`: forwarded POSTs a peer did not answer
    /// usefully (timeout, connection refused, an error).
    pub forward_failures: CounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty metrics.
    pub const fn new() -> Self {
        Metrics {
            http_requests: CounterVec::new(
                "vireo_http_requests_total",
                "HTTP requests answered, by route pattern and status.",
                &["route", "status"],
            ),
            http_duration: HistogramVec::new(
                "vireo_http_request_duration_seconds",
                "HTTP request latency, by route pattern.",
                &["route"],
                &HTTP_BUCKETS,
            ),
            auth_failures: CounterVec::new(
                "vireo_auth_failures_total",
                "Requests refused for a missing or wrong token.",
                &["scope"],
            ),
            events_received: CounterVec::new(
                "vireo_external_events_total",
                "External events received, by Nova's per-event code.",
                &["code"],
            ),
            event_batches: CounterVec::new(
                "vireo_external_event_batches_total",
                "External-event POSTs whose accepted events were handed to the events actor.",
                &[],
            ),
            operations: CounterVec::new(
                "vireo_operations_total",
                "Instance operations, by kind and result (succeeded, failed, rejected).",
                &["kind", "result"],
            ),
            op_duration: HistogramVec::new(
                "vireo_operation_duration_seconds",
                "Duration of finished instance operations.",
                &["kind", "result"],
                &OP_BUCKETS,
            ),
            ops_in_flight: AtomicI64::new(0),
            peer_requests: CounterVec::new(
                "vireo_peer_requests_total",
                "Requests other hosts' flows sent here, by request and result.",
                &["request", "result"],
            ),
            peer_in_flight: AtomicI64::new(0),
            events_forwarded: CounterVec::new(
                "vireo_events_forwarded_total",
                "External events forwarded to the peers, by result (accepted, refused, no-answer).",
                &["result"],
            ),
            forward_failures: CounterVec::new(
                "vireo_event_forward_failures_total",
                "Forwarded external-event POSTs a peer did not answer usefully.",
                &["peer"],
            ),
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self, snap: &Snapshot) -> String {
        let mut out = String::with_capacity(8 * 1024);
        self.http_requests.render(&mut out);
        self.http_duration.render(&mut out);
        self.auth_failures.render(&mut out);
        self.events_received.render(&mut out);
        self.event_batches.render(&mut out);
        self.operations.render(&mut out);
        self.op_duration.render(&mut out);
        gauge(
            &mut out,
            "vireo_operations_in_flight",
            "Instance operations running now.",
            self.ops_in_flight.load(Ordering::Relaxed),
        );
        self.peer_requests.render(&mut out);
        gauge(
            &mut out,
            "vireo_peer_requests_in_flight",
            "Requests from other hosts running now.",
            self.peer_in_flight.load(Ordering::Relaxed),
        );
        self.events_forwarded.render(&mut out);
        self.forward_failures.render(&mut out);
        if let Some(n) = snap.instances {
            gauge(
                &mut out,
                "vireo_instances",
                "Instances the driver knows on this host.",
                n,
            );
        }
        if let Some(e) = snap.events {
            render_event_stats(&mut out, &e);
        }
        if let Some(l) = snap.libvirt {
            counter(
                &mut out,
                "vireo_libvirt_reconnects_total",
                "libvirt reconnects since start.",
                l.reconnects,
            );
            gauge(
                &mut out,
                "vireo_libvirt_connected",
                "1 while a libvirt connection is open.",
                u64::from(l.connected),
            );
        }
        out
    }
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    header(out, name, help, "counter");
    let _ = writeln!(out, "{name} {v}");
}

fn gauge(out: &mut String, name: &str, help: &str, v: impl std::fmt::Display) {
    header(out, name, help, "gauge");
    let _ = writeln!(out, "{name} {v}");
}

fn render_event_stats(out: &mut String, e: &EventStats) {
    counter(
        out,
        "vireo_events_delivered_total",
        "Events handed to the NetworkEventActor.",
        e.delivered,
    );
    counter(
        out,
        "vireo_events_matched_total",
        "Events that satisfied or failed a waiting operation.",
        e.matched,
    );
    counter(
        out,
        "vireo_events_early_total",
        "Early events: buffered because no wait was registered yet.",
        e.buffered,
    );
    counter(
        out,
        "vireo_events_matched_from_buffer_total",
        "Expected events satisfied from the early-event buffer.",
        e.matched_from_buffer,
    );
    header(
        out,
        "vireo_events_dropped_total",
        "Events dropped, by reason.",
        "counter",
    );
    for (reason, v) in [
        ("buffer-full", e.buffer_dropped_count),
        ("too-old", e.buffer_dropped_age),
        ("forgotten", e.buffer_dropped_forgotten),
        ("unknown-instance", e.unknown_instance_dropped),
        ("duplicate", e.duplicates),
        ("ignored", e.ignored),
    ] {
        let _ = writeln!(out, "vireo_events_dropped_total{{reason=\"{reason}\"}} {v}");
    }
    header(
        out,
        "vireo_event_waits_total",
        "Finished event waits, by result.",
        "counter",
    );
    for (result, v) in [
        ("completed", e.completed),
        ("timed-out", e.timeouts),
        ("failed", e.failed),
        ("cancelled", e.cancelled),
        ("abandoned", e.abandoned),
        ("shut-down", e.shut_down),
    ] {
        let _ = writeln!(out, "vireo_event_waits_total{{result=\"{result}\"}} {v}");
    }
    counter(
        out,
        "vireo_event_timeouts_total",
        "Event waits that timed out (fatal or not).",
        e.timeouts,
    );
    gauge(
        out,
        "vireo_event_waits_pending",
        "Event waits pending now.",
        e.waits_now,
    );
    gauge(
        out,
        "vireo_events_buffered",
        "Early events buffered now.",
        e.buffered_now,
    );
    gauge(
        out,
        "vireo_event_instances",
        "Instances the events actor knows now.",
        e.instances_now,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_render_in_text_format() {
        let m = Metrics::new();
        m.operations.inc(&["create", "succeeded"]);
        m.operations.add(&["create", "succeeded"], 2);
        m.operations.inc(&["pause", "rejected"]);
        assert_eq!(m.operations.get(&["create", "succeeded"]), 3);
        assert_eq!(m.operations.get(&["create", "failed"]), 0);
        m.http_duration
            .observe(&["/v1/instances"], Duration::from_micros(300));
        m.http_duration
            .observe(&["/v1/instances"], Duration::from_millis(7));
        m.http_duration
            .observe(&["/v1/instances"], Duration::from_secs(9));
        m.event_batches.inc(&[]);
        let snap = Snapshot {
            events: Some(EventStats {
                delivered: 5,
                buffered: 2,
                ..EventStats::default()
            }),
            libvirt: Some(LibvirtStatus {
                reconnects: 3,
                connected: true,
            }),
            instances: Some(100),
        };
        let text = m.render(&snap);
        for line in [
            "# TYPE vireo_operations_total counter",
            "vireo_operations_total{kind=\"create\",result=\"succeeded\"} 3",
            "vireo_operations_total{kind=\"pause\",result=\"rejected\"} 1",
            "# TYPE vireo_http_request_duration_seconds histogram",
            "vireo_http_request_duration_seconds_bucket{route=\"/v1/instances\",le=\"0.00025\"} 0",
            "vireo_http_request_duration_seconds_bucket{route=\"/v1/instances\",le=\"0.0005\"} 1",
            "vireo_http_request_duration_seconds_bucket{route=\"/v1/instances\",le=\"0.01\"} 2",
            "vireo_http_request_duration_seconds_bucket{route=\"/v1/instances\",le=\"5\"} 2",
            "vireo_http_request_duration_seconds_bucket{route=\"/v1/instances\",le=\"+Inf\"} 3",
            "vireo_http_request_duration_seconds_count{route=\"/v1/instances\"} 3",
            "vireo_external_event_batches_total 1",
            "vireo_events_delivered_total 5",
            "vireo_events_early_total 2",
            "vireo_events_dropped_total{reason=\"unknown-instance\"} 0",
            "vireo_libvirt_reconnects_total 3",
            "vireo_libvirt_connected 1",
            "vireo_instances 100",
            "vireo_operations_in_flight 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        // Every sample line is `name{labels} value` or `name value`.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = l.rsplit_once(' ').unwrap();
            assert!(v.parse::<f64>().is_ok(), "{l}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        let c = CounterVec::new("x_total", "x", &["a"]);
        c.inc(&["q\"b\\n\n"]);
        let mut s = String::new();
        c.render(&mut s);
        assert!(s.contains("x_total{a=\"q\\\"b\\\\n\\n\"} 1"), "{s}");
    }
}
