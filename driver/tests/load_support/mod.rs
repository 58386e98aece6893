//! The load run shared by `benches/load.rs` (full scale, figures) and `tests/load_small.rs`
//! (small scale, invariants only): N instances on a two-host [`LocalCloud`] (libvirt's test
//! driver, embedded network service, recording pluggers), all spawned, then every instance
//! runs a mix of operations concurrently with the others, then all are destroyed.
//!
//! Optionally an event storm runs alongside: for every event the network service sends, a
//! tap on its [`vireo::local::EventLog`] injects `storm` more into the same events path
//! (every host's network-event actor): duplicates of that event and of older ones (for waits
//! that already ended), events for unknown ports and unknown instances, `failed` events for
//! ports nobody waits for, events vireo ignores. The quiet run runs the same tap without
//! injecting, so both runs carry the same harness overhead.
//!
//! Every operation is bounded by a timeout that counts as a hung wait. After the destroy
//! phase [`LoadReport::violations`] lists every broken invariant: an operation that did not
//! finish or failed unexpectedly, a domain, instance actor, plugged device, wired or bound
//! port, pending wait or buffered event left.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;
use vireo::compute::{ComputeDriver, ComputeOps};
use vireo::local::{LocalCloud, LocalCloudConfig};
use vireo::network::embedded::{EmbeddedConfig, EmbeddedNetworkDef, Mechanism};
use vireo_actors::events::{EventConfig, EventStats, WaitPolicy};
use vireo_actors::external::{EventName, EventStatus, ExternalEvent};
use vireo_actors::instance::{
    BootSource, DestroyArgs, InstanceConfig, InstanceError, LiveMigrateArgs, Migration,
    NetworkRequest, RebootKind, ResizeArgs, SpawnArgs,
};
use vireo_actors::lifecycle::Request;
use vireo_actors::network::{NetworkApi, PortRequest, PortUpdate};
use vireo_actors::vif::{NetworkInfo, PortId, Vif};
use vireo_xml::metadata::Flavor;

pub const NET_HYBRID: &str = "10ad0000-0000-4000-8000-000000000001";
pub const NET_NATIVE: &str = "10ad0000-0000-4000-8000-000000000002";
pub const HOSTS: [&str; 2] = ["load-h1", "load-h2"];

/// How a load run is shaped.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Instances.
    pub instances: usize,
    /// Injected events per event the network service sends (0: quiet).
    pub storm: u32,
    /// Bound of every operation; past it the operation counts as hung.
    pub op_timeout: Duration,
    /// `vif_plugging_timeout` (fatal) of every wait.
    pub wait_timeout: Duration,
    /// The embedded service's delay before each event.
    pub event_delay_ms: u64,
    /// Waves of spawn, mix, destroy on the same cloud (memory must not grow wave over wave).
    pub waves: usize,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            instances: 200,
            storm: 0,
            op_timeout: Duration::from_secs(120),
            wait_timeout: Duration::from_secs(60),
            event_delay_ms: 0,
            waves: 1,
        }
    }
}

/// The operation kinds timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    Spawn,
    SoftReboot,
    HardReboot,
    PowerOff,
    PowerOn,
    ResizeConfirm,
    Confirm,
    ResizeRevert,
    Revert,
    Attach,
    Detach,
    LiveMigrate,
    Destroy,
}

impl OpKind {
    pub const ALL: [OpKind; 13] = [
        OpKind::Spawn,
        OpKind::SoftReboot,
        OpKind::HardReboot,
        OpKind::PowerOff,
        OpKind::PowerOn,
        OpKind::ResizeConfirm,
        OpKind::Confirm,
        OpKind::ResizeRevert,
        OpKind::Revert,
        OpKind::Attach,
        OpKind::Detach,
        OpKind::LiveMigrate,
        OpKind::Destroy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Spawn => "spawn",
            OpKind::SoftReboot => "reboot soft",
            OpKind::HardReboot => "reboot hard",
            OpKind::PowerOff => "power off",
            OpKind::PowerOn => "power on",
            OpKind::ResizeConfirm => "resize (to confirm)",
            OpKind::Confirm => "confirm resize",
            OpKind::ResizeRevert => "resize (to revert)",
            OpKind::Revert => "revert resize",
            OpKind::Attach => "attach interface",
            OpKind::Detach => "detach interface",
            OpKind::LiveMigrate => "live migrate*",
            OpKind::Destroy => "destroy",
        }
    }
}

/// p50/p99/max of one operation kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    pub count: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

/// Nearest-rank percentiles.
pub fn percentiles(samples: &[Duration]) -> Percentiles {
    if samples.is_empty() {
        return Percentiles::default();
    }
    let mut s = samples.to_vec();
    s.sort();
    let rank = |p: f64| {
        let r = (p * s.len() as f64).ceil() as usize;
        s[r.clamp(1, s.len()) - 1]
    };
    Percentiles {
        count: s.len(),
        p50: rank(0.50),
        p99: rank(0.99),
        max: s[s.len() - 1],
    }
}

/// What one load run measured and found.
#[derive(Debug, Default)]
pub struct LoadReport {
    pub storm: u32,
    pub instances: usize,
    pub wall: Duration,
    /// Wall time of every finished operation, by kind.
    pub times: BTreeMap<OpKind, Vec<Duration>>,
    /// Operations started.
    pub started: u64,
    /// Operations that finished (ok or with their expected error).
    pub finished: u64,
    /// Events the network service sent during the run.
    pub real_events: u64,
    /// Events the storm injected (per host actor, each goes to every host).
    pub injected: u64,
    /// Counters of every host's network-event actor, summed, after the run.
    pub stats: EventStats,
    /// Peak RSS of the process during the run (VmHWM after a reset, or the sampled maximum).
    pub peak_rss_kib: u64,
    /// VmRSS after each wave.
    pub rss_after_waves: Vec<u64>,
    /// Largest sampled VmRSS.
    pub sampled_rss_kib: u64,
    /// Whether VmHWM could be reset for this run.
    pub hwm_reset: bool,
    /// CPU time of the process during the run (user + system).
    pub process_cpu: Duration,
    /// CPU time of the actor thread (every actor of the cloud runs on it).
    pub actor_cpu: Duration,
    /// CPU time of the run by thread name, largest first (a cheap profile).
    pub thread_cpu: Vec<(String, Duration)>,
    /// Broken invariants (empty: all held).
    pub violations: Vec<String>,
}

/// utime + stime of a `/proc/.../stat` line (clock ticks of 10 ms).
fn stat_cpu(stat: &str) -> Duration {
    // The command name may hold spaces: fields count from after its closing parenthesis.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    Duration::from_millis(f.iter().sum::<u64>() * 10)
}

/// CPU time of this process so far.
pub fn process_cpu() -> Duration {
    std::fs::read_to_string("/proc/self/stat")
        .map(|s| stat_cpu(&s))
        .unwrap_or_default()
}

/// CPU time so far of this process's live threads, by name (trailing digits dropped, so
/// that a pool of workers is one line).
pub fn cpu_by_thread() -> BTreeMap<String, Duration> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in dir.flatten() {
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(t.path().join("comm")),
            std::fs::read_to_string(t.path().join("stat")),
        ) else {
            continue;
        };
        let name = comm.trim().trim_end_matches(|c: char| c.is_ascii_digit());
        *out.entry(name.to_owned()).or_insert(Duration::ZERO) += stat_cpu(&stat);
    }
    out
}

/// CPU time so far of this process's threads named `name`.
pub fn threads_cpu(name: &str) -> Duration {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    dir.flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .map(|s| stat_cpu(&s))
        .sum()
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// VmRSS of this process (KiB).
pub fn rss_kib() -> u64 {
    status_kib("VmRSS:")
}

/// VmHWM (peak RSS) of this process (KiB).
pub fn hwm_kib() -> u64 {
    status_kib("VmHWM:")
}

/// Reset VmHWM to the current RSS (Linux `clear_refs` value 5); false if refused.
pub fn reset_hwm() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn net(id: &str, hybrid: bool) -> EmbeddedNetworkDef {
    EmbeddedNetworkDef {
        id: id.into(),
        name: id.into(),
        mtu: Some(1450),
        mechanism: Mechanism::Openvswitch,
        ovs_hybrid_plug: hybrid,
        bridge_name: None,
        datapath_type: None,
        physical_network: None,
        vlan: None,
    }
}

fn flavor(name: &str, vcpus: u32, memory_mb: u64) -> Flavor {
    Flavor {
        name: name.into(),
        vcpus,
        memory_mb,
        root_gb: 1,
        ephemeral_gb: 0,
        swap_mb: 0,
        extra_specs: Default::default(),
    }
}

async fn start_cloud(dir: &std::path::Path, cfg: &LoadConfig) -> LocalCloud {
    LocalCloud::start(LocalCloudConfig {
        hosts: HOSTS.iter().map(|h| h.to_string()).collect(),
        dir: dir.to_owned(),
        network: EmbeddedConfig {
            networks: vec![net(NET_HYBRID, true), net(NET_NATIVE, false)],
            event_delay_ms: cfg.event_delay_ms,
            ..EmbeddedConfig::default()
        },
        instances: InstanceConfig {
            wait: WaitPolicy {
                timeout: cfg.wait_timeout,
                fatal: true,
            },
            profile_wait: Duration::from_secs(5),
            power_off_timeout: Duration::from_secs(5),
            power_off_poll: Duration::from_millis(20),
            ..InstanceConfig::default()
        },
        events: EventConfig::default(),
    })
    .await
    .unwrap()
}

/// One operation's outcome, for the books.
struct Books {
    times: std::sync::Mutex<BTreeMap<OpKind, Vec<Duration>>>,
    violations: std::sync::Mutex<Vec<String>>,
    started: AtomicU64,
    finished: AtomicU64,
    timeout: Duration,
}

impl Books {
    fn violation(&self, v: String) {
        self.violations.lock().unwrap().push(v);
    }

    /// Run one operation under the timeout; `expected_err` accepts an error as its normal end
    /// (a live migration on the test driver is always rolled back). False when it did not end
    /// as expected.
    async fn op<F>(
        &self,
        kind: OpKind,
        id: Uuid,
        expected_err: fn(&InstanceError) -> bool,
        fut: F,
    ) -> bool
    where
        F: std::future::Future<Output = Result<vireo_actors::instance::OpReport, InstanceError>>,
    {
        self.started.fetch_add(1, Ordering::Relaxed);
        let t = Instant::now();
        let r = tokio::time::timeout(self.timeout, fut).await;
        let took = t.elapsed();
        let ok = match r {
            Err(_) => {
                self.violation(format!(
                    "{id}: {} did not finish within {:?} (hung)",
                    kind.name(),
                    self.timeout
                ));
                return false;
            }
            Ok(Ok(_)) => true,
            Ok(Err(e)) if expected_err(&e) => true,
            Ok(Err(e)) => {
                self.violation(format!(
                    "{id}: {} failed: {}",
                    kind.name(),
                    vireo_actors::instance::error_chain(&e)
                ));
                false
            }
        };
        self.finished.fetch_add(1, Ordering::Relaxed);
        if ok {
            self.times
                .lock()
                .unwrap()
                .entry(kind)
                .or_default()
                .push(took);
        }
        ok
    }
}

fn no_error(_: &InstanceError) -> bool {
    false
}

fn migration_rolled_back(e: &InstanceError) -> bool {
    matches!(
        e,
        InstanceError::RolledBack {
            request: Request::LiveMigrate,
            ..
        }
    )
}

/// Units of operations one instance runs, in an order rotated per instance so that every
/// kind runs concurrently with every other.
#[derive(Debug, Clone, Copy)]
enum Unit {
    SoftReboot,
    HardReboot,
    PowerCycle,
    ResizeConfirm,
    ResizeRevert,
    AttachDetach,
    LiveMigrate,
}

const UNITS: [Unit; 7] = [
    Unit::SoftReboot,
    Unit::HardReboot,
    Unit::PowerCycle,
    Unit::ResizeConfirm,
    Unit::ResizeRevert,
    Unit::AttachDetach,
    Unit::LiveMigrate,
];

struct Ctx {
    cloud: Arc<LocalCloud>,
    books: Arc<Books>,
    user_ports: std::sync::Mutex<Vec<PortId>>,
}

impl Ctx {
    fn driver(&self, host: usize) -> &vireo::compute::LibvirtDriver {
        &self.cloud.hosts[host].driver
    }

    /// A user port bound to `host` for instance `id`, as a VIF to attach.
    async fn user_vif(&self, id: Uuid, host: usize) -> Option<(PortId, Vif)> {
        let net = &self.cloud.network;
        let port = match net.create_port(NET_NATIVE).await {
            Ok(p) => p,
            Err(e) => {
                self.books.violation(format!("{id}: create user port: {e}"));
                return None;
            }
        };
        self.user_ports.lock().unwrap().push(port.id);
        let update = PortUpdate {
            host_id: Some(HOSTS[host].into()),
            device_id: Some(id.to_string()),
            device_owner: Some("compute:nova".into()),
            ..PortUpdate::default()
        };
        let port = match net.update_port(port.id, &update).await {
            Ok(p) => p,
            Err(e) => {
                self.books.violation(format!("{id}: bind user port: {e}"));
                return None;
            }
        };
        let summary = net.get_network(&port.network_id).await.ok()?;
        let value =
            vireo::network::vif_dict(&port, &summary, true, vireo::network::DEFAULT_OVS_BRIDGE);
        let vif = NetworkInfo::from_value(&serde_json::Value::Array(vec![value]))
            .ok()?
            .vifs
            .pop()?;
        Some((port.id, vif))
    }

    /// Every unit of instance `i`; returns the host it ends on.
    async fn life(&self, i: usize, id: Uuid, mut host: usize) -> usize {
        let b = &self.books;
        for k in 0..UNITS.len() {
            let unit = UNITS[(i + k) % UNITS.len()];
            let other = 1 - host;
            let d = self.driver(host);
            match unit {
                Unit::SoftReboot => {
                    b.op(
                        OpKind::SoftReboot,
                        id,
                        no_error,
                        d.reboot(id, RebootKind::Soft),
                    )
                    .await;
                }
                Unit::HardReboot => {
                    b.op(
                        OpKind::HardReboot,
                        id,
                        no_error,
                        d.reboot(id, RebootKind::Hard),
                    )
                    .await;
                }
                Unit::PowerCycle => {
                    if b.op(OpKind::PowerOff, id, no_error, d.power_off(id, None))
                        .await
                    {
                        b.op(OpKind::PowerOn, id, no_error, d.power_on(id)).await;
                    }
                }
                Unit::ResizeConfirm | Unit::ResizeRevert => {
                    let confirm = matches!(unit, Unit::ResizeConfirm);
                    let args = ResizeArgs::of(
                        &Migration {
                            id: Uuid::new_v4(),
                            source_host: HOSTS[host].into(),
                            dest_host: HOSTS[other].into(),
                        },
                        if confirm {
                            flavor("m1.small", 1, 512)
                        } else {
                            flavor("m1.medium", 2, 1024)
                        },
                    );
                    let (k1, k2) = if confirm {
                        (OpKind::ResizeConfirm, OpKind::Confirm)
                    } else {
                        (OpKind::ResizeRevert, OpKind::Revert)
                    };
                    if b.op(k1, id, no_error, d.resize(id, args)).await {
                        let dest = self.driver(other);
                        if confirm {
                            if b.op(k2, id, no_error, dest.confirm_resize(id)).await {
                                host = other;
                            }
                        } else {
                            b.op(k2, id, no_error, dest.revert_resize(id)).await;
                        }
                    }
                }
                Unit::AttachDetach => {
                    if let Some((port, vif)) = self.user_vif(id, host).await {
                        if b.op(OpKind::Attach, id, no_error, d.attach_interface(id, vif))
                            .await
                        {
                            b.op(OpKind::Detach, id, no_error, d.detach_interface(id, port))
                                .await;
                        }
                    }
                }
                Unit::LiveMigrate => {
                    let args = LiveMigrateArgs::of(&Migration {
                        id: Uuid::new_v4(),
                        source_host: HOSTS[host].into(),
                        dest_host: HOSTS[other].into(),
                    });
                    b.op(
                        OpKind::LiveMigrate,
                        id,
                        migration_rolled_back,
                        d.live_migrate(id, args),
                    )
                    .await;
                }
            }
        }
        host
    }
}

/// The tap on the network service's event log: counts what it sent and, when `storm` > 0,
/// injects `storm` events per real one into every host's network-event actor.
struct Storm {
    stop: Arc<AtomicBool>,
    real: Arc<AtomicU64>,
    injected: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

fn storm_event(
    n: u64,
    e: &ExternalEvent,
    recent: &VecDeque<ExternalEvent>,
    rng: &mut u64,
) -> ExternalEvent {
    // xorshift: cheap, deterministic.
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let r = *rng;
    let random_port = || Some(PortId(Uuid::from_u64_pair(r, n)).to_string());
    let ev = |name, server_uuid, tag, status| ExternalEvent {
        name,
        server_uuid,
        tag,
        status,
    };
    match n % 10 {
        // Duplicates of the event just sent.
        0 | 1 => e.clone(),
        // Duplicates of older events: their waits ended long ago.
        2 | 3 => recent
            .get((r as usize) % recent.len().max(1))
            .cloned()
            .unwrap_or_else(|| e.clone()),
        // Strays: an unknown instance.
        4 => ev(
            EventName::NetworkVifPlugged,
            Uuid::from_u64_pair(n, r),
            random_port(),
            EventStatus::Completed,
        ),
        // Strays: a known instance, a port it does not have.
        5 => ev(
            EventName::NetworkVifPlugged,
            e.server_uuid,
            random_port(),
            EventStatus::Completed,
        ),
        // `failed` for a port nobody waits for.
        6 => ev(
            EventName::NetworkVifPlugged,
            e.server_uuid,
            random_port(),
            EventStatus::Failed,
        ),
        7 => ev(
            EventName::NetworkVifUnplugged,
            Uuid::from_u64_pair(r, r),
            random_port(),
            EventStatus::Failed,
        ),
        // A network-changed for the real port (nothing waits for it).
        8 => ev(
            EventName::NetworkChanged,
            e.server_uuid,
            e.tag.clone(),
            EventStatus::Completed,
        ),
        // Events vireo ignores: in progress, not a network event.
        _ => {
            if r % 2 == 0 {
                ev(
                    e.name,
                    e.server_uuid,
                    e.tag.clone(),
                    EventStatus::InProgress,
                )
            } else {
                ev(
                    EventName::VolumeExtended,
                    e.server_uuid,
                    Some("vol".into()),
                    EventStatus::Completed,
                )
            }
        }
    }
}

impl Storm {
    fn start(cloud: Arc<LocalCloud>, storm: u32) -> Storm {
        let stop = Arc::new(AtomicBool::new(false));
        let real = Arc::new(AtomicU64::new(0));
        let injected = Arc::new(AtomicU64::new(0));
        let (s, re, inj) = (stop.clone(), real.clone(), injected.clone());
        let task = tokio::spawn(async move {
            let mut cursor = Instant::now();
            let mut recent: VecDeque<ExternalEvent> = VecDeque::with_capacity(512);
            let mut n: u64 = 0;
            let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
            loop {
                let stopping = s.load(Ordering::Relaxed);
                let new: Vec<(Instant, ExternalEvent)> = cloud
                    .event_log
                    .since(cursor)
                    .into_iter()
                    .filter(|(t, _)| *t > cursor)
                    .collect();
                if let Some((t, _)) = new.last() {
                    cursor = *t;
                }
                re.fetch_add(new.len() as u64, Ordering::Relaxed);
                let mut batch = Vec::new();
                for (_, e) in &new {
                    for _ in 0..storm {
                        batch.push(storm_event(n, e, &recent, &mut rng));
                        n += 1;
                    }
                    if recent.len() == 512 {
                        recent.pop_front();
                    }
                    recent.push_back(e.clone());
                }
                if !batch.is_empty() {
                    inj.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    // Neutron posts events in batches; so does the storm.
                    for chunk in batch.chunks(16) {
                        for h in cloud.events.handles() {
                            h.deliver_batch(chunk.to_vec());
                        }
                    }
                }
                if stopping {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        Storm {
            stop,
            real,
            injected,
            task,
        }
    }

    async fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        (
            self.real.load(Ordering::Relaxed),
            self.injected.load(Ordering::Relaxed),
        )
    }
}

/// Samples VmRSS every 20 ms on a named thread until dropped.
struct RssSampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start() -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicU64::new(rss_kib()));
        let (s, m) = (stop.clone(), max.clone());
        let thread = std::thread::Builder::new()
            .name("load-rss".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    m.fetch_max(rss_kib(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
            .unwrap();
        RssSampler {
            stop,
            max,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.max.load(Ordering::Relaxed)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn event_stats(cloud: &LocalCloud) -> EventStats {
    // Stats is queued behind every event already in each actor's mailbox.
    cloud.events.stats().await
}

/// Check what must be gone after the destroy phase; returns the violations.
async fn leak_check(cloud: &LocalCloud, user_ports: &[PortId]) -> Vec<String> {
    let mut v = Vec::new();
    for h in &cloud.hosts {
        match h.driver.libvirt().list_all().await {
            Ok(d) if d.is_empty() => {}
            Ok(d) => v.push(format!("{}: {} domains left", h.name, d.len())),
            Err(e) => v.push(format!("{}: list domains: {e}", h.name)),
        }
        let plugged = h.plugger.plugged();
        if !plugged.is_empty() {
            v.push(format!("{}: {} devices plugged", h.name, plugged.len()));
        }
        let views = h.driver.list().await;
        if !views.is_empty() {
            v.push(format!("{}: {} instance actors left", h.name, views.len()));
        }
    }
    for p in cloud.network.ports() {
        if !user_ports.contains(&p.id) {
            v.push(format!("port {} created by vireo left", p.id));
        }
        if !p.host_id.is_empty() || !p.device_id.is_empty() {
            v.push(format!(
                "port {} still bound ({} {})",
                p.id, p.host_id, p.device_id
            ));
        }
        if p.migrating_to().is_some() {
            v.push(format!("port {} keeps migrating_to", p.id));
        }
        for h in HOSTS {
            if cloud.network.is_wired(h, p.id) {
                v.push(format!("port {} still wired on {h}", p.id));
            }
        }
    }
    v
}

/// libvirt validates domain XML in this process on `test:///` connections through libxml2,
/// whose schema type library is built lazily and not thread-safely: one validated define
/// before the concurrent spawns builds it once.
async fn warm_up_libvirt(dir: &std::path::Path) {
    use vireo_actors::libvirt::{Libvirt, LibvirtConfig};
    let file = dir.join("warm-up.xml");
    std::fs::write(&file, "<node/>\n").unwrap();
    let lv = Libvirt::open(LibvirtConfig::for_uri(vireo::local::test_uri(&file)))
        .await
        .unwrap();
    let id = Uuid::new_v4();
    lv.define_xml(
        format!(
            "<domain type='test'><name>warm-up</name><uuid>{id}</uuid>\
             <memory>65536</memory><vcpu>1</vcpu><os><type>hvm</type></os></domain>"
        ),
        true,
    )
    .await
    .unwrap();
    lv.undefine(id).await.unwrap();
}

/// One wave: spawn every instance, run every instance's mix, destroy them all; then check
/// that nothing is left. Returns the violations.
async fn one_wave(ctx: &Arc<Ctx>, cfg: &LoadConfig, wave: usize) -> Vec<String> {
    // 1. Spawn them all, alternating hosts.
    let cloud = &ctx.cloud;
    let ids: Vec<Uuid> = (0..cfg.instances).map(|_| Uuid::new_v4()).collect();
    let mut tasks = Vec::new();
    for (i, id) in ids.iter().copied().enumerate() {
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            let host = i % 2;
            let args = SpawnArgs {
                name: format!("load-{wave}-{i}"),
                flavor: flavor("m1.tiny", 1, 256),
                boot: BootSource::None,
                storage: Default::default(),
                network: NetworkRequest::Allocate(vec![
                    PortRequest::Network {
                        network_id: NET_HYBRID.into(),
                    },
                    PortRequest::Network {
                        network_id: NET_NATIVE.into(),
                    },
                ]),
                power_on: true,
            };
            let ok = ctx
                .books
                .op(
                    OpKind::Spawn,
                    id,
                    no_error,
                    ctx.driver(host).spawn(id, args),
                )
                .await;
            (id, host, ok)
        }));
    }
    let mut spawned = Vec::new();
    for t in tasks {
        spawned.push(t.await.unwrap());
    }

    // 2. Every instance's mix, all at once.
    let mut tasks = Vec::new();
    for (i, (id, host, ok)) in spawned.into_iter().enumerate() {
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            let host = if ok {
                ctx.life(i, id, host).await
            } else {
                host
            };
            (id, host)
        }));
    }
    let mut placed = Vec::new();
    for t in tasks {
        placed.push(t.await.unwrap());
    }

    // 3. Destroy them all (on every host, so that a half-moved one goes too).
    let mut tasks = Vec::new();
    for (id, host) in placed {
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            let args = DestroyArgs {
                deallocate_network: true,
            };
            ctx.books
                .op(
                    OpKind::Destroy,
                    id,
                    no_error,
                    ctx.driver(host).destroy(id, args),
                )
                .await;
            let other = ctx.driver(1 - host);
            if other.knows(id).await {
                ctx.books.violation(format!(
                    "{id}: still known on {} after destroy on {}",
                    HOSTS[1 - host],
                    HOSTS[host]
                ));
                let _ = other
                    .destroy(
                        id,
                        DestroyArgs {
                            deallocate_network: true,
                        },
                    )
                    .await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // 4. Invariants.
    let user_ports = std::mem::take(&mut *ctx.user_ports.lock().unwrap());
    let mut violations = std::mem::take(&mut *ctx.books.violations.lock().unwrap());
    // The service learns of unplugs through its watcher, a moment later.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut leaks = leak_check(cloud, &user_ports).await;
    while !leaks.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        leaks = leak_check(cloud, &user_ports).await;
    }
    violations.extend(leaks);
    for p in &user_ports {
        if let Err(e) = cloud.network.delete_port(*p).await {
            violations.push(format!("delete user port {p}: {e}"));
        }
    }
    let left = cloud.network.ports().len();
    if left > 0 {
        violations.push(format!("{left} ports left in the network service"));
    }
    let stats = event_stats(cloud).await;
    if stats.waits_now > 0 {
        violations.push(format!("{} event waits left", stats.waits_now));
    }
    if stats.buffered_now > 0 {
        violations.push(format!("{} buffered events left", stats.buffered_now));
    }
    violations
}

/// One load run on a fresh cloud.
pub async fn run(cfg: &LoadConfig) -> LoadReport {
    vireo_actors::libvirt::init_event_loop().unwrap();
    let dir = tempfile::tempdir().unwrap();
    warm_up_libvirt(dir.path()).await;
    let cloud = Arc::new(start_cloud(dir.path(), cfg).await);
    let books = Arc::new(Books {
        times: Default::default(),
        violations: Default::default(),
        started: AtomicU64::new(0),
        finished: AtomicU64::new(0),
        timeout: cfg.op_timeout,
    });
    let ctx = Arc::new(Ctx {
        cloud: cloud.clone(),
        books: books.clone(),
        user_ports: Default::default(),
    });
    let hwm_reset = reset_hwm();
    let cpu0 = process_cpu();
    // Every cloud has its own actor thread; earlier ones have stopped.
    let actor0 = threads_cpu(vireo_actors::runtime::ACTOR_THREAD_NAME);
    let threads0 = cpu_by_thread();
    let sampler = RssSampler::start();
    let start = Instant::now();
    let storm = Storm::start(cloud.clone(), cfg.storm);

    let mut violations = Vec::new();
    let mut rss_after_waves = Vec::new();
    for wave in 0..cfg.waves.max(1) {
        violations.extend(one_wave(&ctx, cfg, wave).await);
        rss_after_waves.push(rss_kib());
    }
    let wall = start.elapsed();
    let (real_events, injected) = storm.finish().await;
    let stats = event_stats(&cloud).await;
    let started = books.started.load(Ordering::Relaxed);
    let finished = books.finished.load(Ordering::Relaxed);
    if started != finished {
        violations.push(format!("{started} operations started, {finished} finished"));
    }
    let sampled = sampler.finish();
    let process_cpu = process_cpu().saturating_sub(cpu0);
    let actor_cpu = threads_cpu(vireo_actors::runtime::ACTOR_THREAD_NAME).saturating_sub(actor0);
    // Threads that ended during the run are missing; threads started during it count whole.
    let mut thread_cpu: Vec<(String, Duration)> = cpu_by_thread()
        .into_iter()
        .map(|(name, t)| {
            let before = threads0.get(&name).copied().unwrap_or_default();
            (name, t.saturating_sub(before))
        })
        .filter(|(_, t)| !t.is_zero())
        .collect();
    thread_cpu.sort_by_key(|t| std::cmp::Reverse(t.1));
    let peak = if hwm_reset {
        hwm_kib()
    } else {
        sampled.max(hwm_kib())
    };
    cloud.shutdown(Duration::from_secs(10)).await;
    let times = std::mem::take(&mut *books.times.lock().unwrap());
    LoadReport {
        storm: cfg.storm,
        instances: cfg.instances,
        wall,
        times,
        started,
        finished,
        real_events,
        injected,
        stats,
        peak_rss_kib: peak,
        sampled_rss_kib: sampled,
        rss_after_waves,
        hwm_reset,
        process_cpu,
        actor_cpu,
        thread_cpu,
        violations,
    }
}
