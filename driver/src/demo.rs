//! `vireo demo`: the main job. It starts vireo in-process on the embedded default — compute
//! hosts `h1` and `h2` on libvirt's test driver, the embedded network service — and walks a
//! normal life and the three seed scenarios, printing for every operation what vireo expected,
//! what the network service sent, how long each part and each wait took, and at the end a
//! check that nothing leaked.
//!
//! With `--libvirt qemu:///system`, `h1` is this machine's real libvirtd with real devices
//! (Open vSwitch on a demo integration bridge, kernel bridges) and `h2` stays simulated, so the
//! source side of every cross-host flow runs for real.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Serialize;
use uuid::Uuid;
use vireo_actors::events::{EventConfig, WaitPolicy};
use vireo_actors::external::{EventName, ExternalEvent};
use vireo_actors::instance::{
    error_chain, BootSource, DestroyArgs, DomainSettings, InstanceConfig, InstanceError,
    LiveMigrateArgs, Migration, NetworkRequest, OpReport, RebootKind, ResizeArgs, SpawnArgs,
    StepKind,
};
use vireo_actors::lifecycle::InstanceState;
use vireo_actors::network::{NetworkApi, PortRequest, PortUpdate};
use vireo_actors::plug::{
    DomainForm, PlugContext, PlugError, PlugStep, Plugged, StaticPlugger, VifPlugger,
};
use vireo_actors::predict::{predict, EventOp, Timing};
use vireo_actors::vif::{NetworkInfo, PortId, Vif, VnicType};
use vireo_actors::wiring::WiringSource;
use vireo_xml::domain::DomainType;
use vireo_xml::metadata::Flavor;

use crate::compute::{
    ComputeDriver, ComputeOps, DriverConfig, DriverError, LibvirtDriver, NetworkConfig,
    PluggingConfig, SharedNetwork,
};
use crate::local::{LocalCloud, LocalCloudConfig};
use crate::network::embedded::{EmbeddedConfig, EmbeddedNetworkDef, Mechanism};
use crate::plug::{DatapathType, HostPlugger, PlugConfig};

/// What `vireo demo` runs on.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// `h1`'s libvirt URI: None for the test driver, e.g. `qemu:///system` for real KVM.
    pub libvirt: Option<String>,
    /// Delay of the embedded network service's events (Neutron takes 0.3–1.6 s).
    pub event_delay: Duration,
    /// `vif_plugging_timeout`.
    pub timeout: Duration,
    /// Where the test driver's files go.
    pub state_dir: PathBuf,
    /// The OVS integration bridge of the real host (never Neutron's br-int).
    pub bridge: String,
    /// Progress of each operation while it runs, on standard error: `None` none, `Some(true)`
    /// one line redrawn in place (a terminal), `Some(false)` plain lines.
    pub progress: Option<bool>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            libvirt: None,
            event_delay: Duration::from_millis(300),
            timeout: Duration::from_secs(300),
            state_dir: std::env::temp_dir().join(format!("vireo-demo-{}", std::process::id())),
            bridge: "br-vireo-demo".to_owned(),
            progress: None,
        }
    }
}

/// Why the demo stopped.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The hosts could not start.
    #[error("start the hosts")]
    Start(#[source] DriverError),
    /// A step that must succeed failed.
    #[error("{step}")]
    Step {
        /// The step.
        step: String,
        /// Why.
        #[source]
        source: Box<InstanceError>,
    },
    /// A step gave a result the demo did not expect.
    #[error("{0}")]
    Unexpected(String),
    /// The network service failed.
    #[error("network service: {0}")]
    Network(String),
    /// Writing the output failed.
    #[error("write output")]
    Io(#[from] std::io::Error),
}

/// The demo's summary (also printed as JSON with `--json`).
#[derive(Debug, Clone, Serialize, Default)]
pub struct DemoSummary {
    /// Operations run.
    pub operations: usize,
    /// Event waits.
    pub waits: usize,
    /// Waits that ended by timeout.
    pub timeouts: usize,
    /// Longest wait, milliseconds.
    pub longest_wait_ms: u64,
    /// The leak check's findings (empty: nothing leaked).
    pub leaks: Vec<String>,
    /// Seed scenarios that behaved as vireo promises.
    pub seeds_ok: Vec<String>,
}

const NET_HYBRID: &str = "5eed0000-0000-4000-8000-000000000001";
const NET_NATIVE: &str = "5eed0000-0000-4000-8000-000000000002";
const NET_LB: &str = "5eed0000-0000-4000-8000-000000000003";
const NET_SRIOV: &str = "5eed0000-0000-4000-8000-000000000004";

struct Demo<'a> {
    out: &'a mut dyn Write,
    cloud: LocalCloud<DemoPlugger>,
    h1: Arc<LibvirtDriver>,
    h2: Arc<LibvirtDriver>,
    /// h1's plugger (around the static or the real one), which makes seed 1's plug fail.
    h1_plugger: Arc<DemoPlugger>,
    real: bool,
    summary: DemoSummary,
    started: Instant,
    /// Instances the demo created and where they are, for the clean-up.
    instances: Vec<(Uuid, &'static str)>,
    /// Ports the demo created itself (user ports).
    user_ports: Vec<PortId>,
    /// The real host's OVS integration bridge.
    bridge: String,
    /// See [`DemoOptions::progress`].
    progress: Option<bool>,
}

/// The demo's plugger: the host's plugger (the [`StaticPlugger`] on the test driver, the
/// [`HostPlugger`] on a real libvirtd) that fails one plug on request, before the host is
/// touched — seed 1's VIF that cannot be wired.
#[derive(Debug)]
struct DemoPlugger {
    inner: Arc<dyn VifPlugger>,
    /// The next plug of this port fails at this step.
    fail: Mutex<Option<(PortId, PlugStep)>>,
}

impl Default for DemoPlugger {
    fn default() -> Self {
        DemoPlugger::around(Arc::new(StaticPlugger::new()))
    }
}

impl DemoPlugger {
    fn around(inner: Arc<dyn VifPlugger>) -> Self {
        DemoPlugger {
            inner,
            fail: Mutex::new(None),
        }
    }

    /// Fail the next plug of `port` at `step` (once).
    fn fail_next_plug(&self, port: PortId, step: PlugStep) {
        *self.fail.lock().unwrap_or_else(|p| p.into_inner()) = Some((port, step));
    }
}

#[async_trait]
impl VifPlugger for DemoPlugger {
    async fn plug(&self, ctx: &PlugContext, vif: &Vif) -> Result<Plugged, PlugError> {
        let failing = {
            let mut fail = self.fail.lock().unwrap_or_else(|p| p.into_inner());
            match *fail {
                Some((port, step)) if port == vif.id => {
                    *fail = None;
                    Some(step)
                }
                _ => None,
            }
        };
        if let Some(step) = failing {
            return Err(PlugError::Injected { port: vif.id, step });
        }
        self.inner.plug(ctx, vif).await
    }

    async fn unplug(&self, ctx: &PlugContext, vif: &Vif) -> Result<(), PlugError> {
        self.inner.unplug(ctx, vif).await
    }

    fn wiring(&self) -> Arc<dyn WiringSource> {
        self.inner.wiring()
    }

    async fn devices_attached(&self, ports: &[PortId]) {
        self.inner.devices_attached(ports).await
    }

    async fn devices_detached(&self, ports: &[PortId]) {
        self.inner.devices_detached(ports).await
    }
}

fn networks(bridge: Option<&str>) -> Vec<EmbeddedNetworkDef> {
    let def = |id: &str, name: &str, mechanism, hybrid, physnet: Option<&str>| EmbeddedNetworkDef {
        id: id.into(),
        name: name.into(),
        mtu: Some(1450),
        mechanism,
        ovs_hybrid_plug: hybrid,
        bridge_name: (mechanism == Mechanism::Openvswitch && physnet.is_none())
            .then(|| bridge.map(str::to_owned))
            .flatten(),
        datapath_type: (mechanism == Mechanism::Openvswitch)
            .then(|| bridge.map(|_| "netdev".to_owned()))
            .flatten(),
        physical_network: physnet.map(Into::into),
        vlan: physnet.map(|_| 100),
    };
    vec![
        def(NET_HYBRID, "ovs-hybrid", Mechanism::Openvswitch, true, None),
        def(
            NET_NATIVE,
            "ovs-native",
            Mechanism::Openvswitch,
            false,
            None,
        ),
        def(NET_LB, "linuxbridge", Mechanism::Linuxbridge, false, None),
        def(
            NET_SRIOV,
            "sriov-physnet1",
            Mechanism::Openvswitch,
            false,
            Some("physnet1"),
        ),
    ]
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

fn short(p: &PortId) -> String {
    p.to_string().chars().take(8).collect()
}

fn ms(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.2} ms", d.as_secs_f64() * 1000.0)
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// Run the demo, writing the timeline to `out`.
pub async fn run(opts: DemoOptions, out: &mut dyn Write) -> Result<DemoSummary, DemoError> {
    let real = opts
        .libvirt
        .as_deref()
        .is_some_and(|u| !u.starts_with("test:"));
    let instances = InstanceConfig {
        domain: DomainSettings {
            domain_type: if real && std::path::Path::new("/dev/kvm").exists() {
                DomainType::Kvm
            } else if real {
                DomainType::Qemu
            } else {
                DomainType::Kvm
            },
            machine: None,
            console_dir: None,
        },
        wait: WaitPolicy {
            timeout: opts.timeout,
            fatal: true,
        },
        profile_wait: Duration::from_secs(5).max(opts.event_delay * 4),
        // The demo's guests run no OS: an ACPI shutdown is never answered.
        power_off_timeout: Duration::from_secs(2),
        power_off_poll: Duration::from_millis(50),
        ..InstanceConfig::default()
    };
    let network = EmbeddedConfig {
        networks: networks(real.then_some(opts.bridge.as_str())),
        event_delay_ms: opts.event_delay.as_millis() as u64,
        ..EmbeddedConfig::default()
    };
    writeln!(
        out,
        "vireo demo: hosts h1 ({}) and h2 (libvirt test driver); embedded network service, \
         events delayed {} like Neutron's; vif_plugging_timeout {} s, fatal",
        opts.libvirt.as_deref().unwrap_or("libvirt test driver"),
        ms(opts.event_delay),
        opts.timeout.as_secs()
    )?;
    let hosts = if real {
        vec!["h2".to_owned()]
    } else {
        vec!["h1".to_owned(), "h2".to_owned()]
    };
    let cloud = LocalCloud::<DemoPlugger>::start(LocalCloudConfig {
        hosts,
        dir: opts.state_dir.clone(),
        network,
        instances: instances.clone(),
        events: EventConfig::default(),
    })
    .await
    .map_err(DemoError::Start)?;
    let h2 = cloud
        .hosts
        .last()
        .map(|h| h.driver.clone())
        .ok_or_else(|| DemoError::Unexpected("no hosts".into()))?;
    let (h1, h1_plugger) = if real {
        let uri = opts.libvirt.clone().unwrap_or_default();
        let plug = PlugConfig {
            datapath_type: DatapathType::Netdev,
            ..PlugConfig::default()
        };
        let cfg = DriverConfig {
            host: "h1".into(),
            libvirt: vireo_actors::libvirt::LibvirtConfig::for_uri(uri.clone()),
            instances: InstanceConfig {
                ovs_native_form: DomainForm::LibvirtManaged,
                ..instances.clone()
            },
            events: EventConfig::default(),
            plugging: PluggingConfig::Host(plug),
            network: NetworkConfig::Embedded(EmbeddedConfig::default()),
            migration_uri: Some(uri),
            storage: crate::storage::StorageConfig::in_state_dir(&opts.state_dir.join("h1")),
        };
        let system = cloud.system.clone();
        let plugger = crate::compute::on_actor_thread(&system, move || {
            HostPlugger::start(PlugConfig {
                datapath_type: DatapathType::Netdev,
                ..PlugConfig::default()
            })
        })
        .await
        .map_err(DemoError::Start)?
        .map_err(|e| DemoError::Start(DriverError::Plugging(e)))?;
        let plugger = Arc::new(DemoPlugger::around(Arc::new(plugger)));
        let seam = plugger.clone();
        let d = LibvirtDriver::builder(cfg)
            .system(system)
            .peers(cloud.peers.clone())
            .network(SharedNetwork::Embedded(cloud.network.clone()))
            .plugger(plugger)
            .build()
            .await
            .map_err(DemoError::Start)?;
        cloud.events.add(d.events().clone());
        (Arc::new(d), seam)
    } else {
        (
            cloud.hosts[0].driver.clone(),
            cloud.hosts[0].plugger.clone(),
        )
    };
    let mut demo = Demo {
        out,
        cloud,
        h1,
        h2,
        h1_plugger,
        real,
        summary: DemoSummary::default(),
        started: Instant::now(),
        instances: Vec::new(),
        user_ports: Vec::new(),
        bridge: opts.bridge.clone(),
        progress: opts.progress,
    };
    let result = demo.scenarios().await;
    let cleanup = demo.cleanup().await;
    let result = result.and(cleanup);
    let leaks = demo.leak_check().await;
    demo.summary.leaks = leaks;
    demo.finish(&result)?;
    demo.cloud.shutdown(Duration::from_secs(5)).await;
    demo.h1.shutdown(Duration::from_secs(5)).await;
    let _ = std::fs::remove_dir_all(&opts.state_dir);
    result.map(|()| demo.summary)
}

impl Demo<'_> {
    fn net(&self) -> &dyn NetworkApi {
        self.cloud.network.as_ref()
    }

    fn plugger(&self, host: &str) -> Arc<dyn VifPlugger> {
        if host == "h1" {
            self.h1.plugger().clone()
        } else {
            self.h2.plugger().clone()
        }
    }

    fn driver(&self, host: &str) -> Arc<LibvirtDriver> {
        if host == "h1" {
            self.h1.clone()
        } else {
            self.h2.clone()
        }
    }

    fn title(&mut self, t: &str) -> Result<(), DemoError> {
        writeln!(self.out, "\n== {t}")?;
        Ok(())
    }

    fn note(&mut self, t: &str) -> Result<(), DemoError> {
        writeln!(self.out, "   {t}")?;
        Ok(())
    }

    /// Print what vireo predicts for an operation, with reasons.
    async fn explain(&mut self, op: EventOp, uuid: Uuid, host: &str) -> Result<(), DemoError> {
        let view = self
            .driver(host)
            .show(uuid)
            .await
            .map_err(|source| DemoError::Step {
                step: "show".into(),
                source: Box::new(source),
            })?;
        let vifs: Vec<_> = {
            let ports = self
                .net()
                .list_instance_ports(uuid)
                .await
                .map_err(|e| DemoError::Network(e.to_string()))?;
            let _ = ports;
            // The instance's own network_info is what the model reads.
            view.vifs.iter().map(|v| v.port).collect()
        };
        let ni = self.network_info_of(uuid, host).await?;
        let wiring = InstanceConfig::default().wiring();
        match predict(&op, &ni.vifs, &wiring) {
            Ok(p) => {
                for v in &p.vifs {
                    let kind = ni
                        .vifs
                        .iter()
                        .find(|x| x.id == v.port)
                        .map(|x| x.vif_type.as_str())
                        .unwrap_or("?");
                    writeln!(
                        self.out,
                        "   expect  {:<9} {} {:<22} {}",
                        v.timing.as_str(),
                        short(&v.port),
                        format!("({kind}, {})", v.kind.label()),
                        v.reason
                    )?;
                }
            }
            Err(e) => writeln!(self.out, "   (no prediction: {e})")?,
        }
        let _ = vifs;
        Ok(())
    }

    async fn network_info_of(&self, uuid: Uuid, host: &str) -> Result<NetworkInfo, DemoError> {
        let lv = self.driver(host).libvirt().clone();
        let xml = lv
            .get_metadata(
                uuid,
                vireo_xml::metadata::NAMESPACE_URI,
                vireo_actors::libvirt::Affect::Current,
            )
            .await
            .map_err(|e| DemoError::Unexpected(format!("read metadata: {e}")))?
            .ok_or_else(|| DemoError::Unexpected("no vireo metadata".into()))?;
        let meta = vireo_xml::metadata::VireoMetadata::from_xml(&xml)
            .map_err(|e| DemoError::Unexpected(format!("metadata: {e}")))?;
        NetworkInfo::from_value(&meta.network_info)
            .map_err(|e| DemoError::Unexpected(e.to_string()))
    }

    /// Print an operation's timeline: steps, waits, and the events that arrived for it.
    fn timeline(&mut self, report: &OpReport, uuid: Uuid, since: Instant) -> Result<(), DemoError> {
        self.summary.operations += 1;
        for s in &report.steps {
            if s.kind == StepKind::EventWait {
                continue;
            }
            let kind = match s.kind {
                StepKind::Libvirt => "libvirt",
                StepKind::Plug => "plug",
                StepKind::Network => "network",
                StepKind::EventWait => "wait",
                StepKind::Peer => "peer",
                StepKind::Storage => "storage",
            };
            writeln!(
                self.out,
                "   +{:>7}  {:<8} {:<40} {}{}",
                ms(s.at),
                kind,
                s.name,
                ms(s.took),
                if s.failed { "  FAILED" } else { "" }
            )?;
        }
        for w in &report.waits {
            if w.expected.is_empty() {
                continue;
            }
            self.summary.waits += 1;
            if w.outcome.contains("timed out") {
                self.summary.timeouts += 1;
            }
            self.summary.longest_wait_ms =
                self.summary.longest_wait_ms.max(w.took.as_millis() as u64);
            let ports: Vec<String> = w.expected.iter().map(|e| short(&e.tag)).collect();
            writeln!(
                self.out,
                "   wait    {:<9} for [{}]: {} after {}",
                w.timing.as_str(),
                ports.join(", "),
                w.outcome,
                ms(w.took)
            )?;
        }
        let arrived: Vec<(Instant, ExternalEvent)> = self
            .cloud
            .event_log
            .since(since)
            .into_iter()
            .filter(|(_, e)| e.server_uuid == uuid && e.name != EventName::NetworkChanged)
            .collect();
        for (t, e) in arrived {
            writeln!(
                self.out,
                "   arrived +{:>6}  {} {} {:?}",
                ms(t.duration_since(since)),
                e.name,
                e.tag
                    .as_deref()
                    .map(|t| t.chars().take(8).collect::<String>())
                    .unwrap_or_default(),
                e.status
            )?;
        }
        let by = |k| report.total(k);
        writeln!(
            self.out,
            "   total   {} (libvirt {}, plug {}, network {}, event wait {}, other host {})",
            ms(report.took),
            ms(by(StepKind::Libvirt)),
            ms(by(StepKind::Plug)),
            ms(by(StepKind::Network)),
            ms(by(StepKind::EventWait)),
            ms(by(StepKind::Peer))
        )?;
        Ok(())
    }

    async fn op(
        &mut self,
        step: &str,
        uuid: Uuid,
        f: impl std::future::Future<Output = Result<OpReport, InstanceError>>,
    ) -> Result<OpReport, DemoError> {
        let since = Instant::now();
        let result = match self.progress {
            None => f.await,
            Some(live) => self.with_progress(step, uuid, live, f).await,
        };
        match result {
            Ok(report) => {
                self.timeline(&report, uuid, since)?;
                Ok(report)
            }
            Err(source) => Err(DemoError::Step {
                step: step.to_owned(),
                source: Box::new(source),
            }),
        }
    }

    /// Run `f`, showing the instance's progress on standard error every quarter second
    /// (its phase, the events it waits for and the time left on that wait), from whichever
    /// host runs an operation of it.
    async fn with_progress<T>(
        &self,
        step: &str,
        uuid: Uuid,
        live: bool,
        f: impl std::future::Future<Output = T>,
    ) -> T {
        let mut view = crate::cli::instance::ProgressView::new(live);
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = Instant::now();
        tokio::pin!(f);
        let mut err = std::io::stderr();
        loop {
            tokio::select! {
                r = &mut f => {
                    let _ = view.finish(&mut err);
                    return r;
                }
                _ = tick.tick() => {
                    for d in [&self.h1, &self.h2] {
                        let Ok(v) = d.show(uuid).await else { continue };
                        if v.operation.is_none() {
                            continue;
                        }
                        let inst = crate::agent::view::instance(&v, None);
                        let (key, text) = crate::cli::instance::instance_progress(
                            step, uuid, "running",
                            u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                            Some(&inst));
                        let _ = view.show(key, &text, &mut err);
                        break;
                    }
                }
            }
        }
    }

    async fn user_port(&mut self, vnic: VnicType, pci: &str) -> Result<PortRequest, DemoError> {
        let port = self
            .net()
            .create_port(NET_SRIOV)
            .await
            .map_err(|e| DemoError::Network(e.to_string()))?;
        self.user_ports.push(port.id);
        let mut profile = serde_json::Map::new();
        profile.insert("pci_slot".into(), pci.into());
        profile.insert("physical_network".into(), "physnet1".into());
        self.net()
            .update_port(
                port.id,
                &PortUpdate {
                    vnic_type: Some(vnic),
                    profile: Some(profile),
                    ..PortUpdate::default()
                },
            )
            .await
            .map_err(|e| DemoError::Network(e.to_string()))?;
        Ok(PortRequest::Port { port_id: port.id })
    }

    async fn scenarios(&mut self) -> Result<(), DemoError> {
        // ---- 1. Boot with every VIF kind.
        let a = Uuid::new_v4();
        self.title(&format!(
            "1. Boot vm-a ({}) on h1: OVS hybrid, OVS native, Linux bridge{}",
            a,
            if self.real {
                ""
            } else {
                ", SR-IOV VF, SR-IOV PF"
            }
        ))?;
        let mut requests = vec![
            PortRequest::Network {
                network_id: NET_HYBRID.into(),
            },
            PortRequest::Network {
                network_id: NET_NATIVE.into(),
            },
            PortRequest::Network {
                network_id: NET_LB.into(),
            },
        ];
        if !self.real {
            // No SR-IOV hardware can exist here: on the test driver the static plugger
            // stands in for the PF's VF settings.
            requests.push(self.user_port(VnicType::Direct, "0000:81:10.1").await?);
            requests.push(
                self.user_port(VnicType::DirectPhysical, "0000:82:00.0")
                    .await?,
            );
        }
        let spawn = SpawnArgs {
            name: "vm-a".into(),
            flavor: flavor("m1.small", 1, 512),
            boot: BootSource::None,
            storage: Default::default(),
            network: NetworkRequest::Allocate(requests),
            power_on: true,
        };
        let h1 = self.h1.clone();
        self.instances.push((a, "h1"));
        self.op("boot vm-a", a, h1.spawn(a, spawn)).await?;

        // ---- 2. A normal life.
        self.title("2. A normal life: hard reboot, power off/on, pause, suspend, soft reboot")?;
        self.note("vireo predicts for a hard reboot:")?;
        self.explain(EventOp::HardReboot, a, "h1").await?;
        let h1 = self.h1.clone();
        self.note("hard reboot (waits only where libvirt recreates the tap):")?;
        self.op("hard reboot", a, h1.reboot(a, RebootKind::Hard))
            .await?;
        self.note("power off:")?;
        self.op("power off", a, h1.power_off(a, None)).await?;
        self.note("power on:")?;
        self.op("power on", a, h1.power_on(a)).await?;
        self.note("pause / unpause:")?;
        self.op("pause", a, h1.pause(a)).await?;
        self.op("unpause", a, h1.unpause(a)).await?;
        self.note("suspend / resume:")?;
        self.op("suspend", a, h1.suspend(a)).await?;
        self.op("resume", a, h1.resume(a)).await?;
        self.note("soft reboot:")?;
        self.op("soft reboot", a, h1.reboot(a, RebootKind::Soft))
            .await?;

        // ---- 3. Seed 3: resize then revert across hosts.
        self.title("3. Seed bug 3: resize vm-a h1 -> h2, then revert (bind-time events for what stayed wired)")?;
        let m = Migration {
            id: Uuid::new_v4(),
            source_host: "h1".into(),
            dest_host: "h2".into(),
        };
        let h1 = self.h1.clone();
        self.op(
            "resize",
            a,
            h1.resize(a, ResizeArgs::of(&m, flavor("m1.medium", 2, 1024))),
        )
        .await?;
        self.note("vireo predicts for the revert on h1:")?;
        self.explain(
            EventOp::RevertResize {
                source: "h1".into(),
                dest: "h2".into(),
            },
            a,
            "h1",
        )
        .await?;
        let h2 = self.h2.clone();
        self.note("revert (on h2; h1 brings vm-a back):")?;
        let before = Instant::now();
        self.op("revert", a, h2.revert_resize(a)).await?;
        let view = self.h1.show(a).await.map_err(|source| DemoError::Step {
            step: "show".into(),
            source: Box::new(source),
        })?;
        if view.state != InstanceState::Running {
            return Err(DemoError::Unexpected(format!(
                "vm-a is {} after the revert",
                view.state
            )));
        }
        if let Some(last) = &view.last_operation {
            self.note("the source's side of the revert:")?;
            let last = last.clone();
            self.timeline(&last, a, before)?;
            if last.waits.iter().all(|w| w.complete)
                && last
                    .waits
                    .iter()
                    .any(|w| w.timing == Timing::BindTime && !w.expected.is_empty())
            {
                self.summary.seeds_ok.push(
                    "3: cross-host revert waited for its bind-time events and never timed out"
                        .into(),
                );
            }
        }

        // Same-host resize and revert.
        let b = Uuid::new_v4();
        self.title(&format!("3b. Same-host resize and revert of vm-b ({b}) on h1: no bind-time event comes, none is awaited"))?;
        let h1 = self.h1.clone();
        self.instances.push((b, "h1"));
        self.op(
            "boot vm-b",
            b,
            h1.spawn(
                b,
                SpawnArgs {
                    name: "vm-b".into(),
                    flavor: flavor("m1.small", 1, 512),
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
                },
            ),
        )
        .await?;
        let same = Migration {
            id: Uuid::new_v4(),
            source_host: "h1".into(),
            dest_host: "h1".into(),
        };
        self.op(
            "same-host resize",
            b,
            h1.resize(b, ResizeArgs::of(&same, flavor("m1.medium", 2, 1024))),
        )
        .await?;
        self.note("vireo predicts for the same-host revert:")?;
        self.explain(
            EventOp::RevertResize {
                source: "h1".into(),
                dest: "h1".into(),
            },
            b,
            "h1",
        )
        .await?;
        let r = self.op("same-host revert", b, h1.revert_resize(b)).await?;
        if r.waits
            .iter()
            .all(|w| w.timing != Timing::BindTime || w.expected.is_empty())
            && r.waits.iter().all(|w| w.complete)
        {
            self.summary
                .seeds_ok
                .push("3: same-host revert waited for no bind-time event".into());
        }

        // ---- 4. Seed 2: a live migration that fails.
        self.title(
            "4. Seed bug 2: live-migrate vm-a h1 -> h2; the migration fails and is rolled back",
        )?;
        {
            self.note(
                "h2 looks for h1's probe file to tell whether they share the instances \
                 directory; the rollback clears migrating_to either way",
            )?;
            let m = Migration {
                id: Uuid::new_v4(),
                source_host: "h1".into(),
                dest_host: "h2".into(),
            };
            let since = Instant::now();
            let h1 = self.h1.clone();
            match h1.live_migrate(a, LiveMigrateArgs::of(&m)).await {
                Ok(_) => {
                    return Err(DemoError::Unexpected(
                        "the live migration was expected to fail".into(),
                    ))
                }
                Err(e) => {
                    self.note(&format!("failed as expected: {}", error_chain(&e)))?;
                    let view = h1.show(a).await.map_err(|source| DemoError::Step {
                        step: "show".into(),
                        source: Box::new(source),
                    })?;
                    if let Some(last) = view.last_operation.clone() {
                        self.timeline(&last, a, since)?;
                    }
                }
            }
            let ports = self
                .net()
                .list_instance_ports(a)
                .await
                .map_err(|e| DemoError::Network(e.to_string()))?;
            let mut bad = Vec::new();
            for p in &ports {
                if p.migrating_to().is_some() {
                    bad.push(format!("{} keeps migrating_to", short(&p.id)));
                }
                let bindings = self
                    .net()
                    .show_bindings(p.id)
                    .await
                    .map_err(|e| DemoError::Network(e.to_string()))?;
                if bindings.iter().any(|b| b.host == "h2") {
                    bad.push(format!("{} keeps a binding on h2", short(&p.id)));
                }
            }
            let on_h2 = self
                .plugger("h2")
                .wiring()
                .wired()
                .into_iter()
                .filter(|p| ports.iter().any(|x| x.id == *p))
                .count();
            if on_h2 > 0 {
                bad.push(format!("{on_h2} devices left on h2"));
            }
            if bad.is_empty() {
                self.note(&format!("checked: no port has migrating_to, no binding on h2, nothing wired on h2; vm-a is {}", self.h1.show(a).await.map(|v| v.state.to_string()).unwrap_or_default()))?;
            } else {
                return Err(DemoError::Unexpected(bad.join("; ")));
            }
        }
        self.summary.seeds_ok.push("2: failed live migration left no migrating_to and no destination binding, shared storage or not".into());

        // ---- 5. Seed 1: a build that fails and is rescheduled.
        self.title("5. Seed bug 1: build vm-c on h1 fails (a VIF cannot be plugged); it is cleaned up and rescheduled to h2")?;
        let c = Uuid::new_v4();
        let user = self
            .net()
            .create_port(NET_NATIVE)
            .await
            .map_err(|e| DemoError::Network(e.to_string()))?;
        let requests = vec![
            PortRequest::Network {
                network_id: NET_HYBRID.into(),
            },
            PortRequest::Port { port_id: user.id },
        ];
        self.user_ports.push(user.id);
        // The user's port cannot be wired on h1: its Open vSwitch transaction fails.
        self.h1_plugger
            .fail_next_plug(user.id, PlugStep::OvsTransact);
        self.instances.push((c, "h1"));
        let h1 = self.h1.clone();
        let since = Instant::now();
        let build = h1
            .spawn(
                c,
                SpawnArgs {
                    name: "vm-c".into(),
                    flavor: flavor("m1.small", 1, 512),
                    boot: BootSource::None,
                    storage: Default::default(),
                    network: NetworkRequest::Allocate(requests.clone()),
                    power_on: true,
                },
            )
            .await;
        match build {
            Err(InstanceError::BuildFailed {
                reschedule: true,
                released,
                cause,
            }) => {
                self.note(&format!("build failed: {}", error_chain(cause.as_ref())))?;
                self.note(&format!(
                    "released before reporting: {} created port(s) deleted, {} user port(s) unbound",
                    released.deleted.len(),
                    released.unbound.len()
                ))?;
                let _ = since;
            }
            Err(e) => {
                return Err(DemoError::Unexpected(format!(
                    "unexpected build error: {}",
                    error_chain(&e)
                )))
            }
            Ok(_) => {
                return Err(DemoError::Unexpected(
                    "the build was expected to fail".into(),
                ))
            }
        }
        let bound_here: Vec<_> = self
            .net()
            .list_instance_ports(c)
            .await
            .map_err(|e| DemoError::Network(e.to_string()))?;
        let user_now = self
            .net()
            .get_port(user.id)
            .await
            .map_err(|e| DemoError::Network(e.to_string()))?;
        if !bound_here.is_empty() || !user_now.host_id.is_empty() || !user_now.device_id.is_empty()
        {
            return Err(DemoError::Unexpected(
                "networking was not released on h1".into(),
            ));
        }
        self.note("checked: no port of vm-c is bound to h1, the created port is gone, the user port is unbound")?;
        self.note("rescheduled to h2:")?;
        self.instances.retain(|(u, _)| *u != c);
        self.instances.push((c, "h2"));
        let h2 = self.h2.clone();
        self.op(
            "boot vm-c on h2",
            c,
            h2.spawn(
                c,
                SpawnArgs {
                    name: "vm-c".into(),
                    flavor: flavor("m1.small", 1, 512),
                    boot: BootSource::None,
                    storage: Default::default(),
                    network: NetworkRequest::Allocate(requests),
                    power_on: true,
                },
            ),
        )
        .await?;
        self.summary
            .seeds_ok
            .push("1: the failed build released its networking before it was rescheduled".into());

        Ok(())
    }

    /// Delete every instance the demo made (networking released) and its own ports — also
    /// after a scenario failed, so that nothing is left either way.
    async fn cleanup(&mut self) -> Result<(), DemoError> {
        self.title("6. Delete every instance (networking released)")?;
        let mut first = None;
        for (uuid, host) in std::mem::take(&mut self.instances) {
            let d = self.driver(host);
            let r = self
                .op(
                    "delete",
                    uuid,
                    d.destroy(
                        uuid,
                        DestroyArgs {
                            deallocate_network: true,
                        },
                    ),
                )
                .await;
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        for p in std::mem::take(&mut self.user_ports) {
            if let Err(e) = self.net().delete_port(p).await {
                first.get_or_insert(DemoError::Network(e.to_string()));
            }
        }
        if self.real {
            // Unplugging leaves the networks' bridges, as os-vif does; they are the demo's own.
            if let Err(e) = self.remove_bridges().await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The real host's bridges this demo's networks used: its OVS integration bridge and the
    /// Linux bridge of its Linux-bridge network.
    fn bridges(&self) -> (String, String) {
        let lb: String = format!("brq{NET_LB}").chars().take(14).collect();
        (self.bridge.clone(), lb)
    }

    async fn remove_bridges(&mut self) -> Result<(), DemoError> {
        let (ovs, lb) = self.bridges();
        let vswitch = crate::plug::ovsdb::Vswitch::connect(&PlugConfig::default().ovsdb_connection)
            .await
            .map_err(|e| DemoError::Unexpected(format!("OVSDB: {e}")))?;
        if let Some(cfg) = vswitch
            .delete_bridge(&ovs)
            .await
            .map_err(|e| DemoError::Unexpected(format!("delete {ovs}: {e}")))?
        {
            let _ = vswitch.wait_applied(cfg, Duration::from_secs(10)).await;
        }
        let nl = crate::plug::netlink::Netlink::open()
            .map_err(|e| DemoError::Unexpected(format!("netlink: {e}")))?;
        nl.delete(&lb)
            .await
            .map_err(|e| DemoError::Unexpected(format!("delete {lb}: {e}")))?;
        self.note(&format!("removed the demo's bridges {ovs} and {lb}"))?;
        Ok(())
    }

    async fn leak_check(&mut self) -> Vec<String> {
        let mut leaks = Vec::new();
        for (name, d) in [("h1", self.h1.clone()), ("h2", self.h2.clone())] {
            match d.libvirt().list_all().await {
                Ok(domains) => {
                    let ours: Vec<_> = domains
                        .iter()
                        .filter(|x| x.name.starts_with("vm-"))
                        .map(|x| x.name.clone())
                        .collect();
                    if !ours.is_empty() {
                        leaks.push(format!("{name}: domains left: {ours:?}"));
                    }
                }
                Err(e) => leaks.push(format!("{name}: cannot list domains: {e}")),
            }
            let wired = d.plugger().wiring().wired();
            if !wired.is_empty() {
                leaks.push(format!("{name}: {} devices still wired", wired.len()));
            }
            if !d.list().await.is_empty() {
                leaks.push(format!("{name}: instance actors left"));
            }
        }
        if self.real {
            let (ovs, lb) = self.bridges();
            for b in [ovs, lb] {
                if std::path::Path::new("/sys/class/net").join(&b).exists() {
                    leaks.push(format!("h1: bridge {b} left"));
                }
            }
        }
        let ports = self.cloud.network.ports();
        if !ports.is_empty() {
            leaks.push(format!("{} ports left in the network service", ports.len()));
        }
        if ports.iter().any(|p| p.migrating_to().is_some()) {
            leaks.push("a port keeps migrating_to".into());
        }
        let mut waits = self.cloud.events.stats().await.waits_now;
        if self.real {
            if let Ok(s) = self.h1.events().stats().await {
                waits += s.waits_now;
            }
        }
        if waits > 0 {
            leaks.push(format!("{waits} event waits pending"));
        }
        leaks
    }

    fn finish(&mut self, result: &Result<(), DemoError>) -> Result<(), DemoError> {
        self.title("Summary")?;
        let s = self.summary.clone();
        writeln!(
            self.out,
            "   {} operations, {} event waits, {} timeouts, longest wait {} ms, {:.1} s in all",
            s.operations,
            s.waits,
            s.timeouts,
            s.longest_wait_ms,
            self.started.elapsed().as_secs_f64()
        )?;
        for seed in &s.seeds_ok {
            writeln!(self.out, "   ok  seed {seed}")?;
        }
        if s.leaks.is_empty() {
            writeln!(
                self.out,
                "   leak check: no domain, device, port, binding, migrating_to or waiter left"
            )?;
        } else {
            for l in &s.leaks {
                writeln!(self.out, "   LEAK {l}")?;
            }
        }
        if let Err(e) = result {
            writeln!(self.out, "   FAILED: {}", error_chain(e))?;
        }
        Ok(())
    }
}
