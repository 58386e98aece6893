//! The agent's metrics and their Prometheus text rendering (`GET /metrics`).
//!
//! The registry, the metric types, the text encoder (exposition format 0.0.4) and the process
//! metrics (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_open_fds`, ... read from `/proc/self`) are the `prometheus` crate's (tikv's
//! client; `prometheus-client` was the other candidate, without a process collector). This
//! module names the agent's metrics and keeps its call sites short: [`CounterVec`] and
//! [`HistogramVec`] take label values as slices. Values that live elsewhere — the
//! NetworkEventActor's [`EventStats`], the libvirt connection, the instance count — are read
//! at scrape time into a registry of that scrape alone, so a value that could not be read is
//! absent rather than stale.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    Encoder, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};
use tracing::warn;
use vireo_actors::events::EventStats;
use vireo_actors::instance::WaitReport;

/// Buckets of request latency, seconds.
pub const HTTP_BUCKETS: [f64; 12] = [
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
];
/// Buckets of operation duration, seconds.
pub const OP_BUCKETS: [f64; 12] = [
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Buckets of event-wait duration, seconds: from a wait registered with its event already
/// kept (milliseconds) to Nova's `vif_plugging_timeout` (300 s).
pub const WAIT_BUCKETS: [f64; 13] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// The text format's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

fn register(registry: &Registry, c: impl Collector + 'static) {
    if let Err(e) = registry.register(Box::new(c)) {
        warn!(error = %e, "a metric could not be registered");
    }
}

/// A counter family with fixed label names.
#[derive(Debug, Clone)]
pub struct CounterVec(IntCounterVec);

impl CounterVec {
    fn new(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Self {
        let v = IntCounterVec::new(Opts::new(name, help), labels)
            .unwrap_or_else(|e| unreachable_metric(name, &e));
        register(registry, v.clone());
        CounterVec(v)
    }

    /// Add `n` to the series with `values` (one per label name).
    pub fn add(&self, values: &[&str], n: u64) {
        if let Ok(c) = self.0.get_metric_with_label_values(values) {
            c.inc_by(n);
        }
    }

    /// Add one.
    pub fn inc(&self, values: &[&str]) {
        self.add(values, 1);
    }

    /// The current value of one series (0 when never touched).
    pub fn get(&self, values: &[&str]) -> u64 {
        self.0
            .get_metric_with_label_values(values)
            .map_or(0, |c| c.get())
    }
}

/// A histogram family with fixed buckets.
#[derive(Debug, Clone)]
pub struct HistogramVec(prometheus::HistogramVec);

impl HistogramVec {
    fn new(registry: &Registry, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> Self {
        let v = prometheus::HistogramVec::new(
            HistogramOpts::new(name, help).buckets(buckets.to_vec()),
            labels,
        )
        .unwrap_or_else(|e| unreachable_metric(name, &e));
        register(registry, v.clone());
        HistogramVec(v)
    }

    /// Record `d` in the series with `values`.
    pub fn observe(&self, values: &[&str], d: Duration) {
        if let Ok(h) = self.0.get_metric_with_label_values(values) {
            h.observe(d.as_secs_f64());
        }
    }

    /// Observations in one series.
    pub fn count(&self, values: &[&str]) -> u64 {
        self.0
            .get_metric_with_label_values(values)
            .map_or(0, |h| h.get_sample_count())
    }
}

/// The metric definitions are constants of this module: a failure to build one is a bug
/// caught by the module's tests, not a runtime condition.
#[allow(clippy::panic)]
fn unreachable_metric(name: &str, e: &prometheus::Error) -> ! {
    panic!("metric {name} is invalid: {e}")
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
    registry: Registry,
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
    /// `vireo_stale_events_total`: `network-vif-plugged` events that released a wait while
    /// the network service did not show their port ACTIVE (the wait went on until it did).
    pub stale_events: CounterVec,
    /// `vireo_unconfirmed_plugs_total`: ports whose `network-vif-plugged` was trusted though
    /// the network service still did not show them ACTIVE at the end of the window.
    pub unconfirmed_plugs: CounterVec,
    /// `vireo_operations_total{kind,result}`: result `succeeded`, `failed` or `rejected`
    /// (refused at admission: 400/404/409/503).
    pub operations: CounterVec,
    /// `vireo_operation_duration_seconds{kind,result}`.
    pub op_duration: HistogramVec,
    /// `vireo_event_wait_duration_seconds{timing,result}`: how long each event wait of a
    /// finished operation took, from its registration to its release; `timing` bind-time or
    /// plug-time, `result` complete or incomplete (a non-fatal wait that ended without every
    /// event). A fatal wait that timed out fails its operation: it is counted in
    /// `vireo_event_waits_total{result="timed-out"}`.
    pub event_waits: HistogramVec,
    /// `vireo_operations_in_flight`.
    pub ops_in_flight: AtomicI64,
    /// `vireo_host_halves_total{request,result}`: hosts' halves of moves Nova asked for
    /// here, result `succeeded`, `failed`, `timed-out` or `refused`.
    pub host_halves: CounterVec,
    /// `vireo_host_halves_in_flight`.
    pub halves_in_flight: AtomicI64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty metrics, with `vireo_build_info` and the process collector registered.
    pub fn new() -> Self {
        let r = Registry::new();
        let build = IntGauge::with_opts(
            Opts::new(
                "vireo_build_info",
                "The running vireo: its version (always 1).",
            )
            .const_label("version", env!("CARGO_PKG_VERSION")),
        )
        .unwrap_or_else(|e| unreachable_metric("vireo_build_info", &e));
        build.set(1);
        register(&r, build);
        register(
            &r,
            prometheus::process_collector::ProcessCollector::for_self(),
        );
        Metrics {
            http_requests: CounterVec::new(
                &r,
                "vireo_http_requests_total",
                "HTTP requests answered, by route pattern and status.",
                &["route", "status"],
            ),
            http_duration: HistogramVec::new(
                &r,
                "vireo_http_request_duration_seconds",
                "HTTP request latency, by route pattern.",
                &["route"],
                &HTTP_BUCKETS,
            ),
            auth_failures: CounterVec::new(
                &r,
                "vireo_auth_failures_total",
                "Requests refused for a missing or wrong token.",
                &["scope"],
            ),
            events_received: CounterVec::new(
                &r,
                "vireo_external_events_total",
                "External events received, by Nova's per-event code.",
                &["code"],
            ),
            event_batches: CounterVec::new(
                &r,
                "vireo_external_event_batches_total",
                "External-event POSTs whose accepted events were handed to the events actor.",
                &[],
            ),
            stale_events: CounterVec::new(
                &r,
                "vireo_stale_events_total",
                "network-vif-plugged events that released a wait while their port was not \
                 ACTIVE in the network service; the wait went on until it was.",
                &[],
            ),
            unconfirmed_plugs: CounterVec::new(
                &r,
                "vireo_unconfirmed_plugs_total",
                "Ports whose network-vif-plugged came but which the network service still did \
                 not show ACTIVE at the end of the confirmation window; the events were trusted.",
                &[],
            ),
            operations: CounterVec::new(
                &r,
                "vireo_operations_total",
                "Instance operations, by kind and result (succeeded, failed, rejected).",
                &["kind", "result"],
            ),
            op_duration: HistogramVec::new(
                &r,
                "vireo_operation_duration_seconds",
                "Duration of finished instance operations.",
                &["kind", "result"],
                &OP_BUCKETS,
            ),
            event_waits: HistogramVec::new(
                &r,
                "vireo_event_wait_duration_seconds",
                "Event waits of finished operations, registration to release, by timing and \
                 result (complete, incomplete).",
                &["timing", "result"],
                &WAIT_BUCKETS,
            ),
            ops_in_flight: AtomicI64::new(0),
            host_halves: CounterVec::new(
                &r,
                "vireo_host_halves_total",
                "Hosts' halves of moves between hosts run here, by request and result.",
                &["request", "result"],
            ),
            halves_in_flight: AtomicI64::new(0),
            registry: r,
        }
    }

    /// Record the event waits of a finished operation.
    pub fn observe_waits(&self, waits: &[WaitReport]) {
        for w in waits {
            let result = if w.complete { "complete" } else { "incomplete" };
            self.event_waits
                .observe(&[w.timing.as_str(), result], w.took);
            if !w.stale.is_empty() {
                self.stale_events.add(&[], w.stale.len() as u64);
            }
            if !w.unconfirmed.is_empty() {
                self.unconfirmed_plugs.add(&[], w.unconfirmed.len() as u64);
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self, snap: &Snapshot) -> String {
        let scrape = Registry::new();
        gauge(
            &scrape,
            "vireo_operations_in_flight",
            "Instance operations running now.",
            self.ops_in_flight.load(Ordering::Relaxed),
        );
        gauge(
            &scrape,
            "vireo_host_halves_in_flight",
            "Hosts' halves of moves running now.",
            self.halves_in_flight.load(Ordering::Relaxed),
        );
        if let Some(n) = snap.instances {
            gauge(
                &scrape,
                "vireo_instances",
                "Instances the driver knows on this host.",
                n,
            );
        }
        if let Some(e) = snap.events {
            event_stats(&scrape, &e);
        }
        if let Some(l) = snap.libvirt {
            counter(
                &scrape,
                "vireo_libvirt_reconnects_total",
                "libvirt reconnects since start.",
                l.reconnects,
            );
            gauge(
                &scrape,
                "vireo_libvirt_connected",
                "1 while a libvirt connection is open.",
                u64::from(l.connected),
            );
        }
        let mut families = self.registry.gather();
        families.extend(scrape.gather());
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = Vec::with_capacity(16 * 1024);
        if let Err(e) = TextEncoder::new().encode(&families, &mut out) {
            warn!(error = %e, "metrics could not be encoded");
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

fn counter(r: &Registry, name: &str, help: &str, v: u64) {
    match IntCounter::new(name, help) {
        Ok(c) => {
            c.inc_by(v);
            register(r, c);
        }
        Err(e) => unreachable_metric(name, &e),
    }
}

fn gauge(r: &Registry, name: &str, help: &str, v: impl TryInto<i64>) {
    match IntGauge::new(name, help) {
        Ok(g) => {
            g.set(v.try_into().unwrap_or(i64::MAX));
            register(r, g);
        }
        Err(e) => unreachable_metric(name, &e),
    }
}

fn labelled(r: &Registry, name: &str, help: &str, label: &str, values: &[(&str, u64)]) {
    let v = CounterVec::new(r, name, help, &[label]);
    for (l, n) in values {
        v.add(&[l], *n);
    }
}

fn event_stats(r: &Registry, e: &EventStats) {
    counter(
        r,
        "vireo_events_delivered_total",
        "Events handed to the NetworkEventActor.",
        e.delivered,
    );
    counter(
        r,
        "vireo_events_matched_total",
        "Events that satisfied or failed a waiting operation.",
        e.matched,
    );
    counter(
        r,
        "vireo_events_early_total",
        "Early events: buffered because no wait was registered yet.",
        e.buffered,
    );
    counter(
        r,
        "vireo_events_matched_from_buffer_total",
        "Expected events satisfied from the early-event buffer.",
        e.matched_from_buffer,
    );
    labelled(
        r,
        "vireo_events_dropped_total",
        "Events dropped, by reason.",
        "reason",
        &[
            ("buffer-full", e.buffer_dropped_count),
            ("too-old", e.buffer_dropped_age),
            ("forgotten", e.buffer_dropped_forgotten),
            ("unknown-instance", e.unknown_instance_dropped),
            ("duplicate", e.duplicates),
            ("ignored", e.ignored),
        ],
    );
    labelled(
        r,
        "vireo_event_waits_total",
        "Finished event waits, by result.",
        "result",
        &[
            ("completed", e.completed),
            ("timed-out", e.timeouts),
            ("failed", e.failed),
            ("cancelled", e.cancelled),
            ("abandoned", e.abandoned),
            ("shut-down", e.shut_down),
        ],
    );
    gauge(
        r,
        "vireo_event_waits_pending",
        "Event waits pending now.",
        e.waits_now,
    );
    gauge(
        r,
        "vireo_events_buffered",
        "Early events buffered now.",
        e.buffered_now,
    );
    gauge(
        r,
        "vireo_event_instances",
        "Instances the events actor knows now.",
        e.instances_now,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use vireo_actors::predict::Timing;

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
        assert_eq!(m.http_duration.count(&["/v1/instances"]), 3);
        m.event_batches.inc(&[]);
        let port: vireo_actors::vif::PortId =
            "3b2c4d5e-0000-4000-8000-000000000001".parse().unwrap();
        let wait = |timing, ms, complete| WaitReport {
            timing,
            expected: Vec::new(),
            took: Duration::from_millis(ms),
            complete,
            missing: Vec::new(),
            stale: if ms == 700 { vec![port] } else { Vec::new() },
            unconfirmed: if ms == 3 {
                vec![port, port]
            } else {
                Vec::new()
            },
            outcome: String::new(),
        };
        m.observe_waits(&[
            wait(Timing::BindTime, 3, true),
            wait(Timing::PlugTime, 700, true),
            wait(Timing::PlugTime, 300_000, false),
        ]);
        let snap = Snapshot {
            events: Some(EventStats {
                delivered: 5,
                buffered: 2,
                timeouts: 4,
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
            "vireo_stale_events_total 1",
            "vireo_unconfirmed_plugs_total 2",
            "vireo_events_delivered_total 5",
            "vireo_events_early_total 2",
            "vireo_events_dropped_total{reason=\"unknown-instance\"} 0",
            "vireo_event_waits_total{result=\"timed-out\"} 4",
            "vireo_libvirt_reconnects_total 3",
            "vireo_libvirt_connected 1",
            "vireo_instances 100",
            "vireo_operations_in_flight 0",
            "# TYPE vireo_event_wait_duration_seconds histogram",
            "vireo_event_wait_duration_seconds_bucket{result=\"complete\",timing=\"bind-time\",le=\"0.005\"} 1",
            "vireo_event_wait_duration_seconds_bucket{result=\"complete\",timing=\"plug-time\",le=\"0.5\"} 0",
            "vireo_event_wait_duration_seconds_bucket{result=\"complete\",timing=\"plug-time\",le=\"1\"} 1",
            "vireo_event_wait_duration_seconds_count{result=\"incomplete\",timing=\"plug-time\"} 1",
            "vireo_build_info{version=\"0.1.0\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        // The timeouts are counted once, as a wait result.
        assert!(!text.contains("vireo_event_timeouts_total"), "{text}");
        // The process metrics of this process.
        let rss = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .unwrap();
        assert!(rss.parse::<f64>().unwrap() > 1e6, "{rss}");
        assert!(text.lines().any(|l| l.starts_with("process_open_fds ")));
        // Every sample line is `name{labels} value` or `name value`.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = l.rsplit_once(' ').unwrap();
            assert!(v.parse::<f64>().is_ok(), "{l}");
        }
    }

    #[test]
    fn values_not_read_at_scrape_time_are_absent() {
        let text = Metrics::new().render(&Snapshot::default());
        assert!(!text.contains("vireo_instances "), "{text}");
        assert!(!text.contains("vireo_events_delivered_total"), "{text}");
        assert!(!text.contains("vireo_libvirt_connected"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new();
        m.auth_failures.inc(&["q\"b\\n\n"]);
        let s = m.render(&Snapshot::default());
        assert!(
            s.contains("vireo_auth_failures_total{scope=\"q\\\"b\\\\n\\n\"} 1"),
            "{s}"
        );
    }
}
