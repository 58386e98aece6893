//! Host B of `integration/two-host.sh` as a vireo compute host: the real `vireo agent` runs
//! inside host B's mount, UTS and network namespaces (`nsenter` with an argument vector, as
//! the script's `exec` does), on host B's libvirtd (its unix socket), host B's Open vSwitch
//! and kernel, bound to Neutron as host `vireo-hb`. Host A's driver reaches it as an
//! [`HttpPeer`] over its agent API; it reaches host A's peer endpoint and Neutron's API
//! through [`Relay`]s on A's side of the link. Its leak check looks inside host B.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;
use vireo::agent::auth::Token;
use vireo::agent::peer::{HttpPeer, PeerLink};
use vireo::client::AgentClient;
use vireo::config::OvsNativeForm;

use crate::relay::Relay;
use crate::HarnessError;

/// Host B's facts (`two-host.sh env`; the same names in the environment win).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBEnv {
    /// Its host name (Neutron agent `host`, libvirt): `VIREO_HOSTB_NAME`.
    pub name: String,
    /// Its libvirtd from any mount namespace: `VIREO_HOSTB_UNIX_URI`.
    pub unix_uri: String,
    /// Its libvirtd over TCP, what host A migrates to: `VIREO_HOSTB_URI`.
    pub tcp_uri: String,
    /// Host A's address on the link: `VIREO_HOSTA_ADDR`.
    pub addr_a: IpAddr,
    /// Host A's libvirtd as host B reaches it (B copies a resize's disks through it):
    /// `VIREO_HOSTA_URI_FROM_B`.
    pub a_uri_from_b: String,
    /// Host B's address on the link: `VIREO_HOSTB_ADDR`.
    pub addr_b: IpAddr,
    /// Its OVSDB socket (path): from `VIREO_HOSTB_OVSDB`.
    pub ovsdb_socket: PathBuf,
    /// Its network namespace: `VIREO_HOSTB_NETNS`.
    pub netns: String,
    /// Its host name as a chassis of host A's ML2/OVN (`two-host.sh up` starts an
    /// ovn-controller inside B when host A runs ML2/OVN): `VIREO_HOSTB_OVN_HOST`.
    pub ovn_host: String,
    /// The host of its Linux bridge agent (`two-host.sh up` runs one inside B beside B's
    /// Open vSwitch agent): `VIREO_HOSTB_LB_HOST`.
    pub lb_host: String,
    /// Where its mount and UTS namespace files are.
    pub ns_dir: PathBuf,
}

fn var(k: &str, default: &str) -> String {
    std::env::var(k)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

fn setup(msg: impl Into<String>) -> HarnessError {
    HarnessError::Setup(msg.into())
}

impl HostBEnv {
    /// The facts, checked: host B's namespaces exist and its libvirtd answers. Fails (never
    /// skips) when `integration/two-host.sh up` has not run.
    pub fn load() -> Result<HostBEnv, HarnessError> {
        let dir = var("VIREO_HB_DIR", "/var/lib/vireo-integration/hostb");
        let ip = |k: &str, d: &str| -> Result<IpAddr, HarnessError> {
            var(k, d)
                .parse()
                .map_err(|_| setup(format!("{k}: not an IP address")))
        };
        let ovsdb = var("VIREO_HOSTB_OVSDB", &format!("unix:{dir}/ovs/run/db.sock"));
        let env = HostBEnv {
            name: var("VIREO_HOSTB_NAME", "vireo-hb"),
            unix_uri: var(
                "VIREO_HOSTB_UNIX_URI",
                &format!("qemu+unix:///system?socket={dir}/libvirt/run/libvirt-sock"),
            ),
            tcp_uri: var("VIREO_HOSTB_URI", "qemu+tcp://198.51.100.2/system"),
            addr_a: ip("VIREO_HOSTA_ADDR", "198.51.100.1")?,
            a_uri_from_b: var("VIREO_HOSTA_URI_FROM_B", "qemu+tcp://198.51.100.1/system"),
            addr_b: ip("VIREO_HOSTB_ADDR", "198.51.100.2")?,
            ovsdb_socket: PathBuf::from(ovsdb.strip_prefix("unix:").unwrap_or(&ovsdb)),
            netns: var("VIREO_HOSTB_NETNS", "vireo-hb"),
            ovn_host: var(
                "VIREO_HOSTB_OVN_HOST",
                &format!("{}-ovn", var("VIREO_HOSTB_NAME", "vireo-hb")),
            ),
            lb_host: var(
                "VIREO_HOSTB_LB_HOST",
                &format!("{}-lb", var("VIREO_HOSTB_NAME", "vireo-hb")),
            ),
            ns_dir: PathBuf::from("/run/vireo-hb"),
        };
        let netns = Path::new("/run/netns").join(&env.netns);
        for p in [&netns, &env.ns_dir.join("mnt"), &env.ovsdb_socket] {
            if !p.exists() {
                return Err(setup(format!(
                    "host B: {} is missing: run `integration/two-host.sh up`",
                    p.display()
                )));
            }
        }
        let ok = Command::new("virsh")
            .args(["-c", &env.unix_uri, "version"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok {
            return Err(setup(format!(
                "host B's libvirtd ({}) does not answer: run `integration/two-host.sh up`",
                env.unix_uri
            )));
        }
        Ok(env)
    }

    /// The argument vector that runs `program args` inside host B's namespaces.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--mount={}", self.ns_dir.join("mnt").display()))
            .arg(format!("--uts={}", self.ns_dir.join("uts").display()))
            .arg(format!("--net=/run/netns/{}", self.netns))
            .arg("--")
            .arg(program);
        c
    }
}

/// `agent_bin agent --config cfg` inside host B, its output appended to `log`.
fn spawn_agent(
    env: &HostBEnv,
    agent_bin: &Path,
    cfg: &Path,
    log: &Path,
) -> Result<Child, HarnessError> {
    let io = |source| HarnessError::Io {
        what: "host B's agent log".into(),
        source,
    };
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io)?;
    let err = out.try_clone().map_err(io)?;
    env.command(&agent_bin.display().to_string())
        .arg("agent")
        .arg("--config")
        .arg(cfg)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|source| HarnessError::Io {
            what: format!("start {} inside host B", agent_bin.display()),
            source,
        })
}

fn write_secret(path: &Path, secret: &str) -> Result<(), HarnessError> {
    std::fs::write(path, format!("{secret}\n"))
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)))
        .map_err(|source| HarnessError::Io {
            what: format!("write {}", path.display()),
            source,
        })
}

/// Host A as host B's agent sees it.
#[derive(Debug, Clone)]
pub struct HostASide {
    /// Host A's name.
    pub name: String,
    /// Host A's agent API (the events endpoint), on A's loopback.
    pub api: SocketAddr,
    /// Its API token.
    pub api_secret: String,
    /// Neutron's API on A's loopback.
    pub neutron: SocketAddr,
}

/// The port host B's agent listens on (on host B's address).
pub const AGENT_PORT: u16 = 8774;

/// The port of host B's agent as host B's ML2/OVN chassis (a second agent on host B, never
/// run beside the first: [`AgentOptions::ovn`]).
pub const OVN_AGENT_PORT: u16 = 8776;

/// The port of host B's agent as its Linux bridge agent's host ([`AgentOptions::lb`]).
pub const LB_AGENT_PORT: u16 = 8777;

/// How host B's agent runs.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Its host name (Neutron binding host, `[[peers]]` name).
    pub name: String,
    /// The port it listens on, on host B's address.
    pub port: u16,
    /// libvirt's domain type (`qemu` here).
    pub domain_type: String,
    /// Where it keeps instance directories, when not in its own state directory (a
    /// directory host A's agent uses too: a shared instances path).
    pub instances_path: Option<PathBuf>,
    /// `[network.neutron] ovs_bridge`: where its OVS ports go when a binding names no
    /// bridge (ML2/OVN's never do); vireo's default otherwise.
    pub ovs_bridge: Option<String>,
    /// `[instances] ovs_native_form`: how native OVS ports are wired.
    pub ovs_native_form: OvsNativeForm,
}

impl AgentOptions {
    /// Host B as the ML2/OVS host `env.name`, on [`AGENT_PORT`].
    pub fn ovs(env: &HostBEnv) -> AgentOptions {
        AgentOptions {
            name: env.name.clone(),
            port: AGENT_PORT,
            domain_type: "qemu".into(),
            instances_path: None,
            ovs_bridge: None,
            ovs_native_form: OvsNativeForm::LibvirtManaged,
        }
    }

    /// Host B as its Linux bridge agent's host `env.lb_host`, on [`LB_AGENT_PORT`].
    pub fn lb(env: &HostBEnv) -> AgentOptions {
        AgentOptions {
            name: env.lb_host.clone(),
            port: LB_AGENT_PORT,
            ..AgentOptions::ovs(env)
        }
    }

    /// Host B as its ML2/OVN chassis `env.ovn_host`, on [`OVN_AGENT_PORT`] (set
    /// [`AgentOptions::ovs_bridge`] to the chassis' integration bridge).
    pub fn ovn(env: &HostBEnv) -> AgentOptions {
        AgentOptions {
            name: env.ovn_host.clone(),
            port: OVN_AGENT_PORT,
            ..AgentOptions::ovs(env)
        }
    }
}

/// Host B's agent as host A knows it (a `[[peers]]` entry): its API on host B's address,
/// its API token `secret`, and host B's libvirtd over TCP to live-migrate to.
pub fn link(env: &HostBEnv, opts: &AgentOptions, secret: &str) -> PeerLink {
    PeerLink {
        name: opts.name.clone(),
        url: format!("http://{}", SocketAddr::new(env.addr_b, opts.port)),
        token: Token::from_secret(secret),
        migration_uri: Some(env.tcp_uri.clone()),
        timeout: Duration::from_secs(600),
    }
}

/// Host B's running `vireo agent`.
#[derive(Debug)]
pub struct HostBAgent {
    /// Host B (its `name` the agent's host name: [`AgentOptions::name`]).
    pub env: HostBEnv,
    /// Its API client (API token).
    pub client: AgentClient,
    /// Its `[[peers]]`-like entry on host A.
    pub link: PeerLink,
    child: Option<Child>,
    log: PathBuf,
    _relays: Vec<Relay>,
    /// Its state directory (instance disks, image cache).
    pub state_dir: PathBuf,
    bin: PathBuf,
    cfg: PathBuf,
    _dir: tempfile::TempDir,
}

impl HostBAgent {
    /// Write host B's config (`opts`, API token `secret`, see [`link`]) and start
    /// `agent_bin agent --config ...` inside host B; wait until it answers `/healthz`.
    /// Its `env.name` is the agent's host name (`opts.name`) from then on.
    pub async fn start(
        mut env: HostBEnv,
        opts: &AgentOptions,
        secret: &str,
        agent_bin: &Path,
        a: &HostASide,
    ) -> Result<HostBAgent, HarnessError> {
        env.name = opts.name.clone();
        let relay_api = Relay::start(SocketAddr::new(env.addr_a, 0), a.api, env.addr_b).await?;
        let relay_neutron =
            Relay::start(SocketAddr::new(env.addr_a, 0), a.neutron, env.addr_b).await?;
        let dir = tempfile::Builder::new()
            .prefix("vireo-it-hostb-")
            .tempdir()
            .map_err(|source| HarnessError::Io {
                what: "host B's agent directory".into(),
                source,
            })?;
        let root = dir.path();
        // QEMU (libvirt-qemu) reaches B's disks in `state/` by path.
        std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o711))
            .map_err(|source| HarnessError::Io {
                what: "host B's agent directory".into(),
                source,
            })?;
        std::fs::create_dir_all(root.join("images")).map_err(|source| HarnessError::Io {
            what: "host B's image directory".into(),
            source,
        })?;
        write_secret(&root.join("api-token"), secret)?;
        write_secret(&root.join("peer-a-token"), &a.api_secret)?;
        let listen = SocketAddr::new(env.addr_b, opts.port);
        let config = format!(
            r#"host = "{name}"
listen = "{listen}"
api_token_file = "{root}/api-token"
drain_timeout = 30
[libvirt]
uri = "{uri}"
[network]
kind = "neutron"
[network.neutron]
url = "http://{neutron}"
{ovs_bridge}[events]
vif_plugging_timeout = 60
[instances]
state_dir = "{root}/state"
{instances_path}image_dirs = ["{root}/images"]
domain_type = "{domain_type}"
ovs_native_form = "{form}"
power_off_timeout = 2
[plugging]
ovsdb_connection = "unix:{ovsdb}"
datapath_type = "netdev"
[logging]
level = "info"
[[peers]]
name = "{a_name}"
url = "http://{a_api}"
token_file = "{root}/peer-a-token"
migration_uri = "{a_uri}"
timeout = 600
"#,
            name = opts.name,
            domain_type = opts.domain_type,
            form = match opts.ovs_native_form {
                OvsNativeForm::LibvirtManaged => "libvirt-managed",
                OvsNativeForm::PreCreated => "pre-created",
            },
            root = root.display(),
            uri = env.unix_uri,
            neutron = relay_neutron.addr(),
            ovsdb = env.ovsdb_socket.display(),
            a_name = a.name,
            a_api = relay_api.addr(),
            a_uri = env.a_uri_from_b,
            ovs_bridge = opts
                .ovs_bridge
                .as_ref()
                .map(|b| format!("ovs_bridge = \"{b}\"\n"))
                .unwrap_or_default(),
            instances_path = opts
                .instances_path
                .as_ref()
                .map(|p| format!("instances_path = \"{}\"\n", p.display()))
                .unwrap_or_default(),
        );
        let cfg = root.join("agent.toml");
        std::fs::write(&cfg, config).map_err(|source| HarnessError::Io {
            what: "write host B's agent config".into(),
            source,
        })?;
        let log = root.join("agent.log");
        let child = spawn_agent(&env, agent_bin, &cfg, &log)?;
        let link = link(&env, opts, secret);
        let client = AgentClient::new(&link.url, &link.token)
            .map_err(|e| setup(format!("host B's client: {}", crate::chain(&e))))?;
        let mut agent = HostBAgent {
            env,
            client,
            link,
            child: Some(child),
            log,
            bin: agent_bin.to_owned(),
            cfg,
            _relays: vec![relay_api, relay_neutron],
            state_dir: root.join("state"),
            _dir: dir,
        };
        agent.until_healthy().await?;
        Ok(agent)
    }

    /// Kill the agent (SIGKILL: no shutdown runs, as in a crash) and, `down` later, start it
    /// again on the same configuration and state; returns once it answers again (its
    /// recovery is done before it serves anything).
    pub async fn kill_and_restart(&mut self, down: Duration) -> Result<(), HarnessError> {
        self.kill().await;
        tokio::time::sleep(down).await;
        self.restart().await
    }

    /// Kill the agent (SIGKILL: no shutdown runs, as in a crash); [`HostBAgent::restart`]
    /// starts it again.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = tokio::task::spawn_blocking(move || child.wait()).await;
        }
    }

    /// Start a killed agent again on the same configuration and state; returns once it
    /// answers again (its recovery is done before it serves anything).
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        self.child = Some(spawn_agent(&self.env, &self.bin, &self.cfg, &self.log)?);
        self.until_healthy().await
    }

    /// Wait until this run's agent answers (60 s at most); stop it and fail otherwise.
    async fn until_healthy(&mut self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.client.health().await.is_ok() {
                // Ours only if it takes this run's token: an agent left behind by an aborted
                // run (its test process killed before it could stop it) answers the health
                // check at the same address while ours cannot bind.
                if let Err(e) = self.client.list_instances().await {
                    let log = self.log_tail();
                    self.stop_blocking();
                    return Err(setup(format!(
                        "an agent answers at host B's address but not to this run's token \
                         ({}): one left by an aborted run? (ip netns exec {} ss -ltnp) \
                         this run's agent:\n{log}",
                        crate::chain(&e),
                        self.env.netns,
                    )));
                }
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() >= deadline {
                let why = match exited {
                    Some(s) => format!("exited ({s})"),
                    None => "did not answer /healthz in 60 s".into(),
                };
                let log = self.log_tail();
                self.stop_blocking();
                return Err(setup(format!("host B's vireo agent {why}:\n{log}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Host B as a peer of host A's driver.
    pub fn peer(&self) -> Result<Arc<HttpPeer>, HarnessError> {
        HttpPeer::new(&self.link)
            .map(Arc::new)
            .map_err(|e| setup(format!("host B as a peer: {}", crate::chain(&e))))
    }

    /// Its log (every start of the agent appends to it).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// What host B holds of `instances` or of names containing one of `fragments`: its
    /// agent's instances and pending event waits, libvirt domains, links in its network
    /// namespace, ports in its Open vSwitch.
    pub async fn leaks(&self, instances: &[Uuid], fragments: &[String]) -> Vec<String> {
        let mut found = Vec::new();
        match self.client.list_instances().await {
            Ok(list) => {
                let mine: Vec<String> = list
                    .iter()
                    .filter(|i| instances.contains(&i.uuid))
                    .map(|i| i.uuid.to_string())
                    .collect();
                if !mine.is_empty() {
                    found.push(format!("host B: agent instances {mine:?}"));
                }
            }
            Err(e) => found.push(format!("host B: list instances: {}", crate::chain(&e))),
        }
        if let Ok(m) = self.client.metrics().await {
            let pending = m
                .lines()
                .find_map(|l| l.strip_prefix("vireo_event_waits_pending "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0);
            if pending > 0.0 {
                found.push(format!("host B: {pending} event waits pending"));
            }
        }
        let env = self.env.clone();
        let (instances, fragments) = (instances.to_vec(), fragments.to_vec());
        let scan = tokio::task::spawn_blocking(move || scan_host_b(&env, &instances, &fragments))
            .await
            .unwrap_or_else(|e| vec![format!("host B: scan task: {e}")]);
        found.extend(scan);
        found
    }

    /// SIGTERM (graceful shutdown), then wait; SIGKILL after 40 s.
    pub async fn stop(mut self) {
        let _ = tokio::task::spawn_blocking(move || self.stop_blocking()).await;
    }

    fn stop_blocking(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
            }
        }
    }
}

impl Drop for HostBAgent {
    fn drop(&mut self) {
        self.stop_blocking();
    }
}

fn lines_of(mut c: Command) -> Result<Vec<String>, String> {
    let out = c.output().map_err(|e| format!("{c:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{c:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect())
}

/// Domains, links and OVS ports of host B that belong to the test.
pub fn scan_host_b(env: &HostBEnv, instances: &[Uuid], fragments: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let hit = |name: &str| fragments.iter().any(|f| name.contains(f.as_str()));
    let mut virsh = Command::new("virsh");
    virsh.args(["-c", &env.unix_uri, "list", "--all", "--uuid"]);
    match lines_of(virsh) {
        Ok(uuids) => {
            let left: Vec<_> = uuids
                .iter()
                .filter(|u| instances.iter().any(|i| i.to_string() == **u))
                .collect();
            if !left.is_empty() {
                found.push(format!("host B: domains {left:?}"));
            }
        }
        Err(e) => found.push(format!("host B: {e}")),
    }
    let mut ip = Command::new("ip");
    ip.args(["-n", &env.netns, "-o", "link", "show"]);
    match lines_of(ip) {
        Ok(lines) => {
            let links: Vec<String> = lines
                .iter()
                .filter_map(|l| l.split(':').nth(1))
                .map(|n| n.trim().split('@').next().unwrap_or("").to_owned())
                .filter(|n| hit(n))
                .collect();
            if !links.is_empty() {
                found.push(format!("host B: links {links:?}"));
            }
        }
        Err(e) => found.push(format!("host B: {e}")),
    }
    let db = format!("--db=unix:{}", env.ovsdb_socket.display());
    let mut br = Command::new("ovs-vsctl");
    br.args([db.as_str(), "--timeout=10", "list-br"]);
    match lines_of(br) {
        Ok(bridges) => {
            for b in bridges {
                if hit(&b) {
                    found.push(format!("host B: OVS bridge {b}"));
                }
                let mut ports = Command::new("ovs-vsctl");
                ports.args([db.as_str(), "--timeout=10", "list-ports", b.as_str()]);
                match lines_of(ports) {
                    Ok(ps) => {
                        let left: Vec<_> = ps.into_iter().filter(|p| hit(p)).collect();
                        if !left.is_empty() {
                            found.push(format!("host B: OVS ports on {b}: {left:?}"));
                        }
                    }
                    Err(e) => found.push(format!("host B: {e}")),
                }
            }
        }
        Err(e) => found.push(format!("host B: {e}")),
    }
    found
}
