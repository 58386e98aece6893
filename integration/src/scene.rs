//! One scenario's context: a unique id (in every domain name, so the host scan finds what
//! it left), its hosts, its ports and instances, timed operations, and [`Scene::finish`]:
//! the leak check, then the clean-up of the test's own ports and hosts. Guards clean up a
//! scenario that failed half-way (host devices and domains by name, Neutron ports).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;
use vireo::compute::ComputeDriver;
use vireo::plug::leak::{Fixture, LeakGuard};
use vireo_actors::instance::{
    BootSource, InstanceError, NetworkRequest, OpReport, Peers, SpawnArgs,
};
use vireo_actors::network::{NetworkApi, PortUpdate};
use vireo_actors::vif::{NetworkInfo, PortId, Vif};
use vireo_xml::metadata::Flavor;

use vireo::agent::auth::Token;
use vireo::client::AgentClient;

use crate::endpoint::{EndpointOptions, EventsEndpoint};
use crate::env::StackEnv;
use crate::guest::GuestImage;
use crate::host::{Host, HostOptions, Shared};
use crate::leak::LeakCheck;
use crate::neutron::{NeutronRaw, PortBook, PortCleanup};
use crate::timing::{OpTiming, Timings};
use crate::HarnessError;

/// What the whole run shares.
#[derive(Debug)]
pub struct Run {
    /// The set-up.
    pub env: StackEnv,
    /// The events endpoint.
    pub endpoint: EventsEndpoint,
    /// Raw Neutron.
    pub raw: NeutronRaw,
    /// The timing rows.
    pub timings: Timings,
    guest: tokio::sync::OnceCell<GuestImage>,
}

impl Run {
    /// Check the set-up and start the endpoint (with `endpoint`'s token and peers). Fails
    /// when a daemon is missing.
    pub async fn start(endpoint: EndpointOptions) -> Result<Run, HarnessError> {
        let env = StackEnv::load()?;
        let raw = NeutronRaw::new(&env.neutron_url)?;
        // Fail early, naming what is missing.
        match raw.ovs_agent(&env.host).await? {
            Some((true, _)) => {}
            _ => {
                return Err(HarnessError::Setup(format!(
                    "no alive Open vSwitch agent on {}",
                    env.host
                )))
            }
        }
        for (prog, args) in [
            ("virsh", &["-c", "qemu:///system", "version"][..]),
            ("ovs-vsctl", &["--timeout=5", "br-exists", "br-int"][..]),
        ] {
            let ok = std::process::Command::new(prog)
                .args(args)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if !ok {
                return Err(HarnessError::Setup(format!(
                    "`{prog} {}` failed: libvirtd / Open vSwitch (br-int) must run",
                    args.join(" ")
                )));
            }
        }
        let endpoint =
            EventsEndpoint::start(env.nova_port, &env.host, &env.events_token_file, endpoint)?;
        Ok(Run {
            env,
            endpoint,
            raw,
            timings: Timings::default(),
            guest: tokio::sync::OnceCell::new(),
        })
    }

    /// A client of host A's agent API (the events endpoint's server).
    pub fn api_client(&self) -> Result<AgentClient, HarnessError> {
        AgentClient::new(
            &self.endpoint.base_url(),
            &Token::from_secret(self.endpoint.api_secret()),
        )
        .map_err(|e| HarnessError::Setup(format!("API client: {}", crate::chain(&e))))
    }

    /// The guest, built on first use.
    pub async fn guest(&self) -> Result<&GuestImage, HarnessError> {
        self.guest
            .get_or_try_init(|| async {
                tokio::task::spawn_blocking(GuestImage::build)
                    .await
                    .map_err(|e| HarnessError::Setup(format!("build task: {e}")))?
            })
            .await
    }
}

/// 8 random hex characters.
pub fn uniq() -> String {
    Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// A flavor.
pub fn flavor(name: &str, vcpus: u32, memory_mb: u64) -> Flavor {
    Flavor {
        name: name.into(),
        vcpus,
        memory_mb,
        root_gb: 0,
        ephemeral_gb: 0,
        swap_mb: 0,
        extra_specs: Default::default(),
    }
}

/// Bind a port to `host` for `instance` (what Nova does before it calls the driver) and
/// return its `network_info` entry (`preserve_on_delete`: a user port).
pub async fn bind_port(net: &dyn NetworkApi, port: PortId, host: &str, instance: Uuid) -> Vif {
    bind_port_on(
        net,
        port,
        host,
        instance,
        vireo::network::DEFAULT_OVS_BRIDGE,
    )
    .await
}

/// [`bind_port`], with `ovs_bridge` for a binding that names no bridge (ML2/OVN).
pub async fn bind_port_on(
    net: &dyn NetworkApi,
    port: PortId,
    host: &str,
    instance: Uuid,
    ovs_bridge: &str,
) -> Vif {
    let p = net
        .update_port(
            port,
            &PortUpdate {
                host_id: Some(host.into()),
                device_id: Some(instance.to_string()),
                device_owner: Some("compute:nova".into()),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("bind {port}: {}", crate::chain(&e)));
    assert!(p.is_bound(), "port {port} did not bind to {host}: {p:?}");
    let n = net
        .get_network(&p.network_id)
        .await
        .unwrap_or_else(|e| panic!("network of {port}: {}", crate::chain(&e)));
    let dict = vireo::network::vif_dict(&p, &n, true, ovs_bridge);
    NetworkInfo::from_value(&serde_json::Value::Array(vec![dict]))
        .unwrap_or_else(|e| panic!("vif of {port}: {e}"))
        .vifs
        .remove(0)
}

/// One scenario.
#[derive(Debug)]
pub struct Scene<'r> {
    /// The run.
    pub run: &'r Run,
    /// Scenario name (timing rows).
    pub name: String,
    /// Unique id, in every name the scenario makes.
    pub id: String,
    /// Ports and instances.
    pub book: Arc<PortBook>,
    /// The directory of hosts.
    pub peers: Arc<Peers>,
    /// Hosts, in start order.
    pub hosts: Vec<Host>,
    /// The Neutron this scenario's hosts use (the run's, or the ML2/OVN one).
    pub neutron_url: String,
    /// Raw access to it (the leak check's).
    pub raw: NeutronRaw,
    /// The OVS bridge of its bindings that name none.
    pub ovs_bridge: String,
    domains: usize,
    guard: std::sync::Mutex<LeakGuard>,
    _ports: PortCleanup,
}

impl<'r> Scene<'r> {
    /// A new scenario.
    pub fn new(run: &'r Run, name: &str) -> Scene<'r> {
        let bridge = vireo::network::DEFAULT_OVS_BRIDGE.to_owned();
        Scene::on(
            run,
            name,
            run.env.neutron_url.clone(),
            run.raw.clone(),
            bridge,
        )
    }

    /// A new scenario whose hosts use the Neutron at `url` (the ML2/OVN one), which its leak
    /// check and port clean-up read too; `ovs_bridge` is where its OVS ports go (its
    /// bindings name no bridge).
    pub fn on_neutron(
        run: &'r Run,
        name: &str,
        url: &str,
        ovs_bridge: &str,
    ) -> Result<Scene<'r>, HarnessError> {
        let raw = NeutronRaw::new(url)?;
        Ok(Scene::on(
            run,
            name,
            url.to_owned(),
            raw,
            ovs_bridge.to_owned(),
        ))
    }

    fn on(
        run: &'r Run,
        name: &str,
        neutron_url: String,
        raw: NeutronRaw,
        ovs_bridge: String,
    ) -> Scene<'r> {
        let id = uniq();
        let book = Arc::new(PortBook::default());
        Scene {
            run,
            name: name.to_owned(),
            guard: std::sync::Mutex::new(LeakGuard::new([format!("vit{id}")])),
            _ports: PortCleanup {
                book: book.clone(),
                url: neutron_url.clone(),
            },
            id,
            book,
            peers: Peers::new(),
            hosts: Vec::new(),
            neutron_url,
            raw,
            ovs_bridge,
            domains: 0,
        }
    }

    /// What hosts share.
    pub fn shared(&self) -> Shared {
        Shared {
            log: self.run.endpoint.log().clone(),
            neutron_url: self.neutron_url.clone(),
            peers: self.peers.clone(),
        }
    }

    /// Options for this machine's host.
    pub fn system_host(&self) -> HostOptions {
        let mut opts = HostOptions::system(&self.run.env.host);
        opts.ovs_bridge = self.ovs_bridge.clone();
        opts
    }

    /// Start a host (registered with the endpoint); its index.
    pub async fn host(&mut self, opts: HostOptions) -> Result<usize, HarnessError> {
        let h = Host::start(opts, &self.shared(), Some(&self.run.endpoint)).await?;
        self.hosts.push(h);
        Ok(self.hosts.len() - 1)
    }

    /// The first host.
    pub fn a(&self) -> &Host {
        &self.hosts[0]
    }

    /// A new instance uuid of this scenario.
    pub fn instance(&self) -> Uuid {
        let u = Uuid::new_v4();
        self.book.instance(u);
        u
    }

    /// A new domain name of this scenario (`vit<id>-<n>`).
    pub fn domain_name(&mut self) -> String {
        self.domains += 1;
        format!("vit{}-{}", self.id, self.domains)
    }

    /// Have the guard remove `f` (a fixture the scenario made) before it scans.
    pub fn fixture(&self, f: Fixture) {
        self.guard().fixture(f);
    }

    fn guard(&self) -> std::sync::MutexGuard<'_, LeakGuard> {
        self.guard.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Also scan for names containing `fragment`.
    pub fn watch(&self, fragment: impl Into<String>) {
        self.guard().watch(fragment);
    }

    /// Book the ports of `ni`: user ports (`preserve_on_delete`) or vireo's.
    pub fn book_vifs(&self, ni: &NetworkInfo) {
        for v in &ni.vifs {
            if v.preserve_on_delete {
                self.book.user(v.id);
            } else {
                self.book.vireo(v.id);
            }
            self.watch(v.id.prefix(11));
        }
    }

    /// A port the test creates on `network` through `net` (booked as the test's).
    pub async fn user_port(&self, net: &dyn NetworkApi, network: &str) -> PortId {
        let p = net
            .create_port(network)
            .await
            .unwrap_or_else(|e| panic!("create a port on {network}: {}", crate::chain(&e)));
        self.book.user(p.id);
        self.watch(p.id.prefix(11));
        p.id
    }

    /// Bind a user port to `host` for `instance`; see [`bind_port`].
    pub async fn bind_user_port(
        &self,
        net: &dyn NetworkApi,
        port: PortId,
        host: &str,
        instance: Uuid,
    ) -> Vif {
        bind_port_on(net, port, host, instance, &self.ovs_bridge).await
    }

    /// Spawn arguments for a diskless guest.
    pub fn spawn_args(&mut self, network: NetworkRequest) -> SpawnArgs {
        SpawnArgs {
            name: self.domain_name(),
            flavor: flavor("m1.tiny", 1, 128),
            boot: BootSource::None,
            storage: Default::default(),
            network,
            power_on: true,
        }
    }

    /// Run a driver operation on host `h`, timed, and record its row (for a failed
    /// operation, the report `show` keeps, when the instance is still there).
    pub async fn op<Fut>(
        &self,
        h: &Host,
        label: &str,
        instance: Uuid,
        fut: Fut,
    ) -> Result<OpReport, InstanceError>
    where
        Fut: Future<Output = Result<OpReport, InstanceError>>,
    {
        let start = Instant::now();
        let r = fut.await;
        let wall = start.elapsed();
        let failed_report = match &r {
            Ok(_) => None,
            Err(_) => h
                .driver
                .show(instance)
                .await
                .ok()
                .and_then(|v| v.last_operation),
        };
        let arrivals = self.run.endpoint.log().for_server(instance, start);
        let mut row = OpTiming::new(
            &self.name,
            label,
            instance,
            start,
            wall,
            r.as_ref().ok().or(failed_report.as_ref()),
            &arrivals,
        );
        row.ok = r.is_ok();
        self.run.timings.push(row);
        r
    }

    /// An operation that does not run on one of the scenario's in-process hosts (another
    /// host's agent, over its API), timed and recorded like [`Scene::op`].
    pub async fn remote_op<Fut>(
        &self,
        label: &str,
        instance: Uuid,
        fut: Fut,
    ) -> Result<OpReport, InstanceError>
    where
        Fut: Future<Output = Result<OpReport, InstanceError>>,
    {
        let start = Instant::now();
        let r = fut.await;
        let wall = start.elapsed();
        let arrivals = self.run.endpoint.log().for_server(instance, start);
        let mut row = OpTiming::new(
            &self.name,
            label,
            instance,
            start,
            wall,
            r.as_ref().ok(),
            &arrivals,
        );
        row.ok = r.is_ok();
        self.run.timings.push(row);
        r
    }

    /// Like [`Scene::remote_op`], panicking with the error chain on failure.
    pub async fn remote_ok<Fut>(&self, label: &str, instance: Uuid, fut: Fut) -> OpReport
    where
        Fut: Future<Output = Result<OpReport, InstanceError>>,
    {
        match self.remote_op(label, instance, fut).await {
            Ok(r) => r,
            Err(e) => panic!("{label} of {instance} failed: {}", crate::chain(&e)),
        }
    }

    /// Record a row for the part of an operation another host ran for it (a peer request
    /// whose report that host kept), without event arrivals.
    pub fn peer_row(&self, label: &str, instance: Uuid, report: &OpReport) {
        let mut row = OpTiming::new(
            &self.name,
            label,
            instance,
            Instant::now(),
            report.took,
            Some(report),
            &[],
        );
        row.nested = true;
        self.run.timings.push(row);
    }

    /// Like [`Scene::op`], panicking with the error chain on failure.
    pub async fn ok<Fut>(&self, h: &Host, label: &str, instance: Uuid, fut: Fut) -> OpReport
    where
        Fut: Future<Output = Result<OpReport, InstanceError>>,
    {
        match self.op(h, label, instance, fut).await {
            Ok(r) => r,
            Err(e) => panic!("{label} of {instance} failed: {}", crate::chain(&e)),
        }
    }

    /// Delete the test's user ports (after the leak check saw them unbound).
    async fn delete_user_ports(&self) -> Result<(), HarnessError> {
        for p in self.book.user_ports() {
            let mut gone = false;
            for h in &self.hosts {
                if let Some(e) = &h.embedded {
                    if e.port_status(p).is_some() {
                        e.delete_port(p).await.map_err(|e| {
                            HarnessError::Setup(format!("delete {p}: {}", crate::chain(&e)))
                        })?;
                        gone = true;
                    }
                }
            }
            if !gone {
                if let Some(h) = self.hosts.first() {
                    h.network.delete_port(p).await.map_err(|e| {
                        HarnessError::Setup(format!("delete {p}: {}", crate::chain(&e)))
                    })?;
                }
            }
        }
        Ok(())
    }

    /// The leak check, then clean up the scenario's ports and hosts.
    pub async fn finish(mut self) -> Result<(), HarnessError> {
        let hosts: Vec<&Host> = self.hosts.iter().collect();
        let mut fragments = vec![format!("vit{}", self.id)];
        fragments.extend(self.book.all_ports().iter().map(|p| p.prefix(11)));
        let check = LeakCheck {
            hosts: &hosts,
            book: &self.book,
            raw: &self.raw,
            fragments,
        }
        .run()
        .await;
        self.delete_user_ports().await?;
        self.run.endpoint.clear();
        for h in self.hosts.drain(..) {
            h.stop().await;
        }
        // Give Neutron's last event batch time to reach the (now unrouted) endpoint.
        tokio::time::sleep(Duration::from_millis(10)).await;
        check
    }
}
