//! Shared set-up of the cross-crate tests: the one test cloud builder ([`spec`] →
//! [`TestCloud`]: hosts on private test-driver files with the embedded network service and a
//! fault seam of each family in front of every host), ports of every kind, and the leak check
//! every test ends with. The seams themselves live in `faults_support`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use uuid::Uuid;
use vireo::compute::{
    ComputeDriver, ComputeOps, DriverConfig, LibvirtDriver, NetworkConfig, PluggingConfig,
    SharedNetwork,
};
use vireo::local::test_uri;
use vireo::network::embedded::{EmbeddedConfig, EmbeddedNetwork, EmbeddedNetworkDef, Mechanism};
use vireo_actors::events::{EventConfig, EventStats, EventsHandle, WaitPolicy};
use vireo_actors::external::EventSink;
use vireo_actors::instance::{
    BootSource, InstanceConfig, InstanceError, InstanceReply, InstanceView, LiveMigrateArgs,
    Migration, NetworkRequest, OpReport, Peers, SpawnArgs, WaitReport,
};
use vireo_actors::libvirt::LibvirtConfig;
use vireo_actors::network::{NetworkApi, Port, PortRequest, PortUpdate, PCI_PROFILE_KEYS};
use vireo_actors::plug::testing::RecordingPlugger;
use vireo_actors::plug::VifPlugger;
use vireo_actors::predict::Timing;
use vireo_actors::runtime::ActorSystem;
use vireo_actors::vif::{NetworkInfo, PortId, VnicType};
use vireo_xml::metadata::Flavor;

/// The fault seams every host of a [`TestCloud`] has, per family.
pub use super::faults_support::*;

pub const NET_HYBRID: &str = "11111111-0000-4000-8000-000000000001";
pub const NET_NATIVE: &str = "11111111-0000-4000-8000-000000000002";
pub const NET_LB: &str = "11111111-0000-4000-8000-000000000003";
pub const NET_SRIOV: &str = "11111111-0000-4000-8000-000000000004";

pub fn networks() -> Vec<EmbeddedNetworkDef> {
    let def = |id: &str, name: &str, mechanism, hybrid, physnet: Option<&str>| EmbeddedNetworkDef {
        id: id.into(),
        name: name.into(),
        mtu: Some(1450),
        mechanism,
        ovs_hybrid_plug: hybrid,
        bridge_name: None,
        datapath_type: None,
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
            "sriov",
            Mechanism::Openvswitch,
            false,
            Some("physnet1"),
        ),
    ]
}

pub fn flavor(name: &str, vcpus: u32, memory_mb: u64) -> Flavor {
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

pub fn spawn_args(name: &str, requests: Vec<PortRequest>) -> SpawnArgs {
    SpawnArgs {
        name: name.into(),
        flavor: flavor("m1.tiny", 1, 256),
        boot: BootSource::None,
        storage: Default::default(),
        network: NetworkRequest::Allocate(requests),
        power_on: true,
    }
}

pub fn on(network: &str) -> PortRequest {
    PortRequest::Network {
        network_id: network.into(),
    }
}

/// A user-supplied SR-IOV port on the physnet network.
pub async fn sriov_port(net: &dyn NetworkApi, vnic: VnicType, pci: &str) -> PortRequest {
    let port = net.create_port(NET_SRIOV).await.unwrap();
    let mut profile = serde_json::Map::new();
    profile.insert("pci_slot".into(), pci.into());
    profile.insert("physical_network".into(), "physnet1".into());
    net.update_port(
        port.id,
        &PortUpdate {
            vnic_type: Some(vnic),
            profile: Some(profile),
            ..PortUpdate::default()
        },
    )
    .await
    .unwrap();
    PortRequest::Port { port_id: port.id }
}

/// A live migration from h1 to `dest`.
pub fn lm(dest: &str) -> LiveMigrateArgs {
    LiveMigrateArgs::of(&Migration {
        id: uuid(),
        source_host: "h1".into(),
        dest_host: dest.into(),
    })
}

pub fn uuid() -> Uuid {
    Uuid::new_v4()
}

pub fn ports(view: &vireo_actors::instance::InstanceView) -> Vec<PortId> {
    view.vifs.iter().map(|v| v.port).collect()
}

/// What a test cloud is made of.
#[derive(Debug, Clone)]
pub struct Spec {
    pub hosts: Vec<String>,
    pub instances: InstanceConfig,
    pub event_delay_ms: u64,
    /// Hosts whose libvirt is a private libvirtd (the socket it listens on) instead of an
    /// in-process `test:///` connection: the host's node file is read by that daemon.
    pub remote: BTreeMap<String, PathBuf>,
    /// Every host keeps its instances in one directory (a shared instances path); each
    /// still has its own image cache.
    pub shared_instances: bool,
}

/// Hosts `hosts`, fatal waits of 30 s (an operation that waits that long has failed), fast
/// power-off polling and a 100 ms lifecycle debounce.
pub fn spec(hosts: &[&str]) -> Spec {
    Spec {
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        instances: InstanceConfig {
            wait: WaitPolicy {
                timeout: Duration::from_secs(30),
                fatal: true,
            },
            profile_wait: Duration::from_secs(2),
            power_off_timeout: Duration::from_secs(5),
            power_off_poll: Duration::from_millis(20),
            lifecycle_debounce: Duration::from_millis(100),
            ..InstanceConfig::default()
        },
        event_delay_ms: 0,
        remote: BTreeMap::new(),
        shared_instances: false,
    }
}

impl Spec {
    /// `host`'s libvirt is the private libvirtd listening on `socket`.
    pub fn remote(mut self, host: &str, socket: PathBuf) -> Self {
        self.remote.insert(host.to_owned(), socket);
        self
    }

    /// The hosts share one instances directory.
    pub fn shared_instances(mut self, shared: bool) -> Self {
        self.shared_instances = shared;
        self
    }

    pub fn timeout(mut self, t: Duration) -> Self {
        self.instances.wait.timeout = t;
        self
    }

    pub fn event_delay_ms(mut self, ms: u64) -> Self {
        self.event_delay_ms = ms;
        self
    }

    pub async fn start(self) -> TestCloud {
        TestCloud::start(self).await
    }
}

/// One host of a test cloud.
#[derive(Debug)]
pub struct Host {
    pub name: String,
    pub driver: Arc<LibvirtDriver>,
    pub plugger: Arc<RecordingPlugger>,
    pub net: Arc<FaultyNetwork>,
    pub uri: String,
    /// The pause seam in front of the plugger.
    pub gate: Arc<PlugGate>,
    /// The test-driver node file the host's connection was opened on.
    pub node_file: PathBuf,
}

impl Host {
    /// Spawn `id` named `name` on new ports (or the user's) of `requests`; it must succeed.
    pub async fn spawn_on(&self, id: Uuid, name: &str, requests: Vec<PortRequest>) -> OpReport {
        self.driver
            .spawn(id, spawn_args(name, requests))
            .await
            .unwrap_or_else(|e| panic!("spawn of {name} on {}: {}", self.name, chain(&e)))
    }
}

/// Compute hosts on private `test:///` files sharing one actor system, one network-event
/// actor and the embedded network service (as `vireo::local::LocalCloud`), with the
/// service's events logged ([`TeeSink`]), a network fault seam per host ([`FaultyNetwork`]),
/// and the means to crash the agent and start it again on the domains it left.
#[derive(Debug)]
pub struct TestCloud {
    pub system: Arc<ActorSystem>,
    pub network: Arc<EmbeddedNetwork>,
    pub sink: Arc<TeeSink>,
    pub peers: Arc<Peers>,
    pub hosts: Vec<Host>,
    pub spec: Spec,
    pub dir: Arc<TempDir>,
    files: usize,
    net_down: Arc<std::sync::atomic::AtomicBool>,
}

/// What survives an agent crash: the network service, the host devices (the pluggers) and
/// the directory.
#[derive(Debug)]
pub struct Remains {
    pub network: Arc<EmbeddedNetwork>,
    pub sink: Arc<TeeSink>,
    pub pluggers: BTreeMap<String, Arc<RecordingPlugger>>,
    pub spec: Spec,
    pub dir: Arc<TempDir>,
    files: usize,
    net_down: Arc<std::sync::atomic::AtomicBool>,
}

pub async fn on_thread<T: Send + 'static>(
    system: &ActorSystem,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = tokio::sync::oneshot::channel();
    system.arbiter().spawn(async move {
        let _ = tx.send(f());
    });
    rx.await.unwrap()
}

/// libvirt validates domain XML in this process on `test:///` connections (RelaxNG, through
/// libxml2). libxml2 2.9 builds its XML Schema type library lazily and not thread-safely:
/// the first validations running at once on several threads can fail with "Error type
/// 'unsignedLong' is not exported by type library". One validated define before any test
/// goes on builds it once.
pub async fn warm_up_libvirt() {
    static WARM: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    WARM.get_or_init(|| async {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("warm-up.xml");
        std::fs::write(&file, "<node/>\n").unwrap();
        let lv = vireo_actors::libvirt::Libvirt::open(LibvirtConfig::for_uri(test_uri(&file)))
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
    })
    .await;
}

impl TestCloud {
    pub async fn start(spec: Spec) -> TestCloud {
        warm_up_libvirt().await;
        let system = Arc::new(ActorSystem::start().unwrap());
        let sink = Arc::new(TeeSink::default());
        let cfg = EmbeddedConfig {
            networks: networks(),
            event_delay_ms: spec.event_delay_ms,
            ..EmbeddedConfig::default()
        };
        let s: Arc<dyn EventSink> = sink.clone();
        let network = on_thread(&system, move || EmbeddedNetwork::new(cfg, s))
            .await
            .unwrap();
        let remains = Remains {
            network,
            sink,
            pluggers: BTreeMap::new(),
            spec: spec.clone(),
            dir: Arc::new(tempfile::tempdir().unwrap()),
            files: 0,
            net_down: Arc::default(),
        };
        let nodes = spec.hosts.iter().map(|h| (h.clone(), None)).collect();
        Self::restart_on(system, remains, nodes).await
    }

    /// Start the agent again after [`TestCloud::crash`]: every host on a fresh connection to
    /// a new test-driver file holding the domains given (the node XML's `<domain>`
    /// elements), with the same network service and host devices.
    pub async fn restart(remains: Remains, domains: BTreeMap<String, String>) -> TestCloud {
        let system = Arc::new(ActorSystem::start().unwrap());
        let nodes = remains
            .spec
            .hosts
            .iter()
            .map(|h| (h.clone(), domains.get(h).cloned()))
            .collect();
        Self::restart_on(system, remains, nodes).await
    }

    async fn restart_on(
        system: Arc<ActorSystem>,
        remains: Remains,
        nodes: Vec<(String, Option<String>)>,
    ) -> TestCloud {
        remains.sink.clear_targets();
        let mut cloud = TestCloud {
            system,
            network: remains.network,
            sink: remains.sink,
            peers: Peers::new(),
            hosts: Vec::new(),
            spec: remains.spec,
            dir: remains.dir,
            files: remains.files,
            net_down: remains.net_down,
        };
        let mut pluggers = remains.pluggers;
        for (name, domains) in nodes {
            let plugger = pluggers
                .remove(&name)
                .unwrap_or_else(|| Arc::new(RecordingPlugger::new()));
            cloud.add_host(&name, plugger, domains.as_deref()).await;
        }
        cloud
    }

    async fn add_host(
        &mut self,
        name: &str,
        plugger: Arc<RecordingPlugger>,
        domains: Option<&str>,
    ) {
        self.files += 1;
        let file: PathBuf = self.dir.path().join(format!("{name}-{}.xml", self.files));
        std::fs::write(&file, format!("<node>\n{}</node>\n", domains.unwrap_or(""))).unwrap();
        let remote = self.spec.remote.get(name).cloned();
        let uri = match &remote {
            Some(socket) => format!("test+unix://{}?socket={}", file.display(), socket.display()),
            None => test_uri(&file),
        };
        let (n, h, w) = (self.network.clone(), name.to_owned(), plugger.wiring());
        on_thread(&self.system, move || n.attach_host(&h, w))
            .await
            .unwrap();
        let net = Arc::new(FaultyNetwork::sharing(
            self.network.clone(),
            self.net_down.clone(),
        ));
        let libvirt = match remote {
            // A daemon that dies or freezes is noticed within ~2 s and reconnected to fast.
            Some(_) => LibvirtConfig {
                keepalive: vireo_actors::libvirt::Keepalive {
                    interval_s: 1,
                    count: 1,
                },
                reconnect_min_ms: 50,
                reconnect_max_ms: 200,
                call_timeout_ms: 30_000,
                join_timeout_ms: 500,
                ..LibvirtConfig::for_uri(uri.clone())
            },
            None => LibvirtConfig::for_uri(uri.clone()),
        };
        let gate = Arc::new(PlugGate::default());
        let config = DriverConfig {
            host: name.to_owned(),
            libvirt,
            instances: self.spec.instances.clone(),
            events: EventConfig::default(),
            plugging: PluggingConfig::Static,
            network: NetworkConfig::Embedded(EmbeddedConfig::default()),
            migration_uri: Some(uri.clone()),
            // The host's own state directory, kept across its restarts.
            storage: vireo::storage::StorageConfig {
                instances_dir: self.instances_dir(name),
                ..vireo::storage::StorageConfig::in_state_dir(&self.dir.path().join(name))
            },
        };
        let events = self.system.start_events(EventConfig::default());
        self.sink.add_target(events.clone());
        let driver = LibvirtDriver::builder(config)
            .system(self.system.clone())
            .events(events)
            .peers(self.peers.clone())
            .network(SharedNetwork::Api(net.clone()))
            .plugger(Arc::new(GatedPlugger::new(plugger.clone(), gate.clone())))
            .build()
            .await
            .unwrap();
        self.hosts.push(Host {
            name: name.to_owned(),
            driver: Arc::new(driver),
            plugger,
            net,
            uri,
            gate,
            node_file: file,
        });
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts.iter().find(|h| h.name == name).unwrap()
    }

    /// The agent dies: the actor system stops with whatever operation was running (no
    /// rollback runs); libvirt's test driver loses its per-connection state with the
    /// connection. Call [`TestCloud::dump_domains`] first to keep the domains.
    pub fn crash(self) -> Remains {
        let TestCloud {
            system,
            network,
            sink,
            peers,
            hosts,
            spec,
            dir,
            files,
            net_down,
        } = self;
        let pluggers = hosts
            .iter()
            .map(|h| (h.name.clone(), h.plugger.clone()))
            .collect();
        drop(hosts);
        drop(peers);
        sink.clear_targets();
        assert_eq!(
            Arc::strong_count(&system),
            1,
            "something still holds the actor system"
        );
        drop(system);
        Remains {
            network,
            sink,
            pluggers,
            spec,
            dir,
            files,
            net_down,
        }
    }

    /// Every domain of every host as `<domain>` elements for a test-driver node file, each
    /// in the state it is in now (libvirt's test driver starts node-file domains running
    /// unless `test:runstate` says otherwise).
    pub async fn dump_domains(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for h in &self.hosts {
            let lv = h.driver.libvirt();
            let mut xml = String::new();
            for d in lv.list_all().await.unwrap() {
                let desc = lv.xml_desc(d.uuid, true).await.unwrap();
                let runstate = match d.state {
                    vireo_actors::libvirt::DomainState::Running => 1,
                    vireo_actors::libvirt::DomainState::Paused => 3,
                    _ => 5,
                };
                let desc = desc.replacen(
                    "<domain ",
                    "<domain xmlns:test='http://libvirt.org/schemas/domain/test/1.0' ",
                    1,
                );
                let desc = desc.replacen(
                    "</domain>",
                    &format!("  <test:runstate>{runstate}</test:runstate>\n</domain>"),
                    1,
                );
                xml.push_str(&desc);
                xml.push('\n');
            }
            out.insert(h.name.clone(), xml);
        }
        out
    }

    /// Write `host`'s domains, as they are now, into its node file: what a new connection
    /// (after a reconnect, or a restart of its private libvirtd) finds, as a real libvirtd
    /// finds its domains again after a restart.
    pub async fn persist_domains(&self, host: &str) {
        let dump = self.dump_domains().await;
        let h = self.host(host);
        std::fs::write(&h.node_file, format!("<node>\n{}</node>\n", dump[host])).unwrap();
    }

    /// Stop every host and the event actor.
    pub async fn shutdown(&self) {
        for h in &self.hosts {
            h.driver.shutdown(Duration::from_secs(5)).await;
            let _ = h.driver.events().shutdown().await;
        }
    }

    pub async fn stats(&self) -> EventStats {
        self.sink.stats().await
    }

    /// A port of the service.
    pub async fn port(&self, id: PortId) -> Port {
        self.network.get_port(id).await.unwrap()
    }

    /// Wait (2 s at most) until the port has `status`: the service hears of devices that
    /// go away through its watcher, a moment later.
    pub async fn port_eventually(&self, id: PortId, status: vireo_actors::network::PortStatus) {
        eventually(
            Duration::from_secs(2),
            &format!("{id} {status}"),
            || async { (self.port(id).await.status == status).then_some(()) },
        )
        .await
    }

    /// [`leak_check`] of this cloud.
    pub async fn assert_clean(&self, user_ports: &[PortId]) {
        let hosts: Vec<_> = self
            .hosts
            .iter()
            .map(|h| (h.name.as_str(), &*h.driver, &*h.plugger))
            .collect();
        let events: Vec<EventsHandle> = self
            .hosts
            .iter()
            .map(|h| h.driver.events().clone())
            .collect();
        leak_check(&hosts, &self.network, &events, user_ports).await;
        for h in &self.hosts {
            let left = self.disks_left(&h.name);
            assert!(left.is_empty(), "{}: instance disks left: {left:?}", h.name);
        }
    }

    /// What is left in host `name`'s instance directories, and any unfinished image fetch
    /// in its cache.
    pub fn disks_left(&self, name: &str) -> Vec<PathBuf> {
        let state = self.dir.path().join(name);
        let list = |dir: PathBuf| -> Vec<PathBuf> {
            std::fs::read_dir(dir)
                .map(|rd| rd.map(|e| e.unwrap().path()).collect())
                .unwrap_or_default()
        };
        let mut left = list(self.instances_dir(name));
        left.extend(list(state.join("_base")).into_iter().filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        }));
        left
    }

    /// Host `name`'s instances directory (one for every host with
    /// [`Spec::shared_instances`]).
    pub fn instances_dir(&self, name: &str) -> PathBuf {
        if self.spec.shared_instances {
            self.dir.path().join("shared-instances")
        } else {
            self.dir.path().join(name).join("instances")
        }
    }

    /// Host `name`'s image cache directory.
    /// Host `name`'s build journal (`<state_dir>/builds`).
    pub fn journal_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(name).join("builds")
    }

    /// Host `name`'s live-migration journal entry of instance `id`
    /// (`<state_dir>/live-migrations/<id>.json`).
    pub fn migration_entry(&self, name: &str, id: Uuid) -> PathBuf {
        self.dir
            .path()
            .join(name)
            .join("live-migrations")
            .join(format!("{id}.json"))
    }

    pub fn cache_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(name).join("_base")
    }

    /// The end of most tests: destroy `ids` (with deallocation) on every host, then
    /// [`TestCloud::assert_clean`].
    pub async fn destroy_and_assert_clean(&self, ids: &[Uuid], user_ports: &[PortId]) {
        for id in ids {
            self.destroy_everywhere(*id).await;
        }
        self.assert_clean(user_ports).await;
    }

    /// Destroy (with deallocation) on every host that knows it.
    pub async fn destroy_everywhere(&self, id: Uuid) {
        for h in &self.hosts {
            h.driver
                .destroy(
                    id,
                    vireo_actors::instance::DestroyArgs {
                        deallocate_network: true,
                    },
                )
                .await
                .unwrap();
        }
    }

    /// A user-supplied (pre-created, unbound) port on `network`.
    pub async fn user_port(&self, network: &str) -> PortId {
        self.network.create_port(network).await.unwrap().id
    }

    /// Delete user ports at the end of a test (after the leak check saw them unbound).
    pub async fn delete_ports(&self, ports: &[PortId]) {
        for p in ports {
            self.network.delete_port(*p).await.unwrap();
        }
    }
}

/// Poll `f` until it returns `Some` or `within` passes.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The view of an instance once its running operation reached `phase`.
pub async fn at_phase(driver: &LibvirtDriver, id: Uuid, phase: &str) -> InstanceView {
    eventually(Duration::from_secs(10), phase, || async {
        match driver.show(id).await {
            Ok(v) if v.operation.as_ref().is_some_and(|o| o.phase == phase) => Some(v),
            _ => None,
        }
    })
    .await
}

/// The waits of a report with timing `t`, their expected ports in order.
pub fn waited(report: &OpReport, t: Timing) -> Vec<PortId> {
    report
        .waits
        .iter()
        .filter(|w| w.timing == t)
        .flat_map(|w: &WaitReport| w.expected.iter().map(|e| e.tag))
        .collect()
}

pub fn set(ports: impl IntoIterator<Item = PortId>) -> BTreeSet<PortId> {
    ports.into_iter().collect()
}

/// The error chain of an instance error, for messages.
pub fn chain(e: &InstanceError) -> String {
    vireo_actors::instance::error_chain(e)
}

/// The ports of an instance, by the networks they are on (in `view` order).
pub async fn ports_by_network(c: &TestCloud, view: &InstanceView) -> BTreeMap<String, PortId> {
    let mut out = BTreeMap::new();
    for v in &view.vifs {
        let p = c.port(v.port).await;
        out.insert(p.network_id, v.port);
    }
    out
}

/// A network_info for user ports as they are now (preserve_on_delete), for
/// `NetworkRequest::Allocated`.
pub async fn network_info(net: &dyn NetworkApi, ports: &[PortId]) -> NetworkInfo {
    let mut vifs = Vec::new();
    for p in ports {
        let port = net.get_port(*p).await.unwrap();
        let summary = net.get_network(&port.network_id).await.unwrap();
        vifs.push(vireo::network::vif_dict(
            &port,
            &summary,
            true,
            vireo::network::DEFAULT_OVS_BRIDGE,
        ));
    }
    NetworkInfo::from_value(&serde_json::Value::Array(vifs)).unwrap()
}

/// Take the devices of `port` away on `host` as if someone removed them outside vireo (those
/// vireo plugged for instance `uuid`, named `name`).
pub async fn remove_port_devices(c: &TestCloud, host: &str, uuid: Uuid, name: &str, port: PortId) {
    let vif = network_info(&*c.network, &[port]).await.vifs.remove(0);
    let ctx = vireo_actors::plug::PlugContext {
        instance_uuid: uuid,
        instance_name: name.to_owned(),
        form: vireo_actors::plug::DomainForm::LibvirtManaged,
    };
    c.host(host).plugger.unplug(&ctx, &vif).await.unwrap();
}

/// A user port of `id` whose `network-vif-plugged` never comes, and its VIF: bound to h1
/// when the caller read `network_info`, then moved to a host without an L2 agent.
pub async fn silent_port(
    c: &TestCloud,
    id: Uuid,
    network: &str,
) -> (PortId, vireo_actors::vif::Vif) {
    let p = c.user_port(network).await;
    c.network
        .update_port(
            p,
            &PortUpdate {
                host_id: Some("h1".into()),
                device_id: Some(id.to_string()),
                device_owner: Some("compute:nova".into()),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
    let vif = network_info(&*c.network, &[p]).await.vifs.remove(0);
    c.network
        .update_port(
            p,
            &PortUpdate {
                host_id: Some("elsewhere".into()),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
    (p, vif)
}

/// An unbound user port keeps no binding for another host. (The service shows bindings of
/// compute ports only: the port is made one for the look.)
pub async fn assert_no_inactive_binding(c: &TestCloud, p: PortId) {
    let Ok(port) = c.network.get_port(p).await else {
        return;
    };
    let owner = |o: &str| PortUpdate {
        device_owner: Some(o.to_owned()),
        ..PortUpdate::default()
    };
    c.network
        .update_port(p, &owner("compute:nova"))
        .await
        .unwrap();
    let bindings = c.network.show_bindings(p).await.unwrap();
    c.network
        .update_port(p, &owner(&port.device_owner))
        .await
        .unwrap();
    let inactive: Vec<_> = bindings
        .iter()
        .filter(|b| b.status == vireo_actors::network::BindingStatus::Inactive)
        .collect();
    assert!(inactive.is_empty(), "user port {p} keeps {inactive:?}");
}

/// Leak check: no domain on any host, nothing plugged, no instance actor, no port left but
/// `user_ports` and those unbound (no host, device id/owner, PCI keys, `migrating_to`),
/// nothing wired, no pending wait.
pub async fn leak_check(
    hosts: &[(&str, &LibvirtDriver, &RecordingPlugger)],
    network: &EmbeddedNetwork,
    events: &[EventsHandle],
    user_ports: &[PortId],
) {
    for (name, driver, plugger) in hosts {
        let domains = driver.libvirt().list_all().await.unwrap();
        assert!(domains.is_empty(), "{name}: domains left: {domains:?}");
        let plugged = plugger.plugged();
        assert!(plugged.is_empty(), "{name}: plugged left: {plugged:?}");
        let views = driver.list().await;
        assert!(views.is_empty(), "{name}: instances left: {views:?}");
    }
    for p in network.ports() {
        assert!(
            user_ports.contains(&p.id),
            "port {} created by vireo left behind: {p:?}",
            p.id
        );
        assert!(p.host_id.is_empty(), "port {} still bound: {p:?}", p.id);
        assert!(p.device_id.is_empty(), "port {} device id: {p:?}", p.id);
        assert!(p.device_owner.is_empty(), "port {} owner: {p:?}", p.id);
        for k in PCI_PROFILE_KEYS {
            assert!(!p.profile.contains_key(k), "port {} keeps {k}: {p:?}", p.id);
        }
        assert!(p.migrating_to().is_none(), "port {} migrating_to", p.id);
    }
    // The service learns of unplugs through its watcher, and the event actor of ended
    // waits through its mailbox: both may lag a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut stats = EventStats::default();
        for e in events {
            stats += e.stats().await.unwrap();
        }
        let wired: Vec<(String, PortId)> = network
            .ports()
            .iter()
            .flat_map(|p| {
                hosts
                    .iter()
                    .filter(|(name, _, _)| network.is_wired(name, p.id))
                    .map(|(name, _, _)| (name.to_string(), p.id))
            })
            .collect();
        // Nothing of an instance is left once it is gone: no wait, no buffered event, no
        // entry (the actor forgets an instance when it goes).
        if stats.waits_now == 0
            && stats.buffered_now == 0
            && stats.instances_now == 0
            && wired.is_empty()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "waits, buffered events or instances left: {stats:?}; still wired: {wired:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The host domain `id`'s vireo record names as its owner on `lv` (None: no owner recorded).
pub async fn owner_of(lv: &vireo_actors::libvirt::LibvirtHandle, id: Uuid) -> Option<String> {
    let xml = lv
        .get_metadata(
            id,
            vireo_xml::metadata::NAMESPACE_URI,
            vireo_actors::libvirt::Affect::Current,
        )
        .await
        .unwrap()
        .expect("no vireo metadata");
    let meta = vireo_xml::metadata::VireoMetadata::from_xml(&xml).unwrap();
    vireo_actors::instance::InstanceRecord::owner(&meta).unwrap()
}

/// What a [`StagedPeer`] does with one request, given the real agent.
pub type PeerHook = Box<
    dyn Fn(
            Arc<dyn vireo_actors::instance::PeerHost>,
            Uuid,
            vireo_actors::instance::Operation,
        ) -> futures::future::BoxFuture<'static, Result<InstanceReply, InstanceError>>
        + Send
        + Sync,
>;

/// Another host's agent as a test stages it: every request goes through the hook, which may
/// pass it to the real agent, act around it (move a guest as libvirt would), or never
/// answer (an agent that hangs).
pub struct StagedPeer {
    real: Arc<dyn vireo_actors::instance::PeerHost>,
    hook: PeerHook,
}

impl StagedPeer {
    /// Host `name`'s real agent in `peers`, behind `hook`.
    pub fn over(peers: &Peers, name: &str, hook: PeerHook) -> Arc<StagedPeer> {
        Arc::new(StagedPeer {
            real: peers.get(name).unwrap(),
            hook,
        })
    }
}

impl std::fmt::Debug for StagedPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StagedPeer({})", self.real.name())
    }
}

#[async_trait::async_trait]
impl vireo_actors::instance::PeerHost for StagedPeer {
    fn name(&self) -> &str {
        self.real.name()
    }

    fn migration_uri(&self) -> Option<String> {
        self.real.migration_uri()
    }

    async fn request(
        &self,
        instance: Uuid,
        request: vireo_actors::instance::Operation,
    ) -> Result<InstanceReply, InstanceError> {
        (self.hook)(self.real.clone(), instance, request).await
    }
}

/// What libvirt's peer-to-peer job does with a guest, done by hand (the test driver has no
/// migration): the source's domain — its live XML, with the source's metadata, `rewrite`
/// applied — defined and running on the destination, and gone from the source.
pub async fn deliver_guest(
    from: &vireo_actors::libvirt::LibvirtHandle,
    to: &vireo_actors::libvirt::LibvirtHandle,
    id: Uuid,
    rewrite: impl FnOnce(String) -> String,
) {
    let xml = from.xml_desc(id, false).await.unwrap();
    to.define_xml(rewrite(xml), false).await.unwrap();
    to.start(id, false).await.unwrap();
    from.destroy(id).await.unwrap();
    from.undefine(id).await.unwrap();
}
