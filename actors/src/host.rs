//! The host actor: the registry of instance actors (uuid → actor, created on demand), the
//! router of libvirt's lifecycle events to the owning actor, and recovery at start-up — every
//! instance actor rebuilt from the domains libvirt has and the vireo metadata in each, with
//! the operations that were in flight finished or rolled back.
//!
//! Several agents may share one libvirtd (a benchmark next to a test, two hosts of a demo):
//! recovery adopts only the domains whose record names this host, or no host at all
//! (metadata older than the owner field). A domain another host saved last is left alone —
//! no actor, no roll back, no destroy — and libvirt's events for it are not routed (events
//! only ever reach existing actors). The one exception: a domain whose record has a live
//! migration to this host in flight is the guest that arrived while this host's agent was
//! down, and is adopted as the incoming instance the source will hand over.
//!
//! [`HostHandle`] is the cheap, cloneable way in; it is also this host's [`PeerHost`] for the
//! flows that cross hosts.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use actix::prelude::*;
use async_trait::async_trait;
use futures::StreamExt;
use tracing::{debug, info, warn};
use uuid::Uuid;
use vireo_xml::metadata::{VireoMetadata, NAMESPACE_URI};

use crate::instance::actor::error_chain;
use crate::instance::actor::{
    nothing_to_destroy, DomainEvent, InstanceActor, InstanceGone, RecoverInterrupted, Resync, Show,
    Stop, Submit,
};
use crate::instance::admission::{AdmissionError, Ticket};
use crate::instance::deps::{HostDeps, PeerHost};
use crate::instance::in_flight::{InFlight, Interrupted, Marker};
use crate::instance::journal::{BuildJournal, LiveMigrationJournal};
use crate::instance::op::power_of;
use crate::instance::operation::Operation;
use crate::instance::record::InstanceRecord;
use crate::instance::types::{InstanceError, InstanceReply, InstanceView, PowerState};
use crate::libvirt::LibvirtEvent;
use crate::lifecycle::{InstanceState, Request};
use crate::network::{release_build_ports, NetworkApi};
use crate::storage::InstanceStorage;
use crate::vif::PortId;

/// Route a request to an instance's actor (created when the request may create one), which
/// admits or refuses it (see [`crate::instance::admission`]).
#[derive(Debug, Message)]
#[rtype(result = "Result<Ticket, AdmissionError>")]
pub struct Route {
    /// The instance.
    pub uuid: Uuid,
    /// The request.
    pub request: Operation,
}

/// Show one instance.
#[derive(Debug, Message)]
#[rtype(result = "Result<InstanceView, InstanceError>")]
pub struct ShowInstance(pub Uuid);

/// Show every instance.
#[derive(Debug, Message)]
#[rtype(result = "Vec<InstanceView>")]
pub struct ListInstances;

/// Is the instance on this host?
#[derive(Debug, Message)]
#[rtype(result = "bool")]
pub struct Knows(pub Uuid);

/// Rebuild the registry from libvirt (start-up and after a reconnect).
#[derive(Debug, Message)]
#[rtype(result = "Result<RecoveryReport, InstanceError>")]
pub struct Recover;

/// Stop every instance actor (their running operations' waits are cancelled) and then the
/// host actor.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ShutdownHost;

/// What recovery found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RecoveryReport {
    /// Instances rebuilt from libvirt.
    pub instances: Vec<RecoveredInstance>,
    /// Domains without vireo metadata (left alone).
    pub foreign_domains: usize,
    /// Domains with vireo metadata another host saved last (left alone): uuid and owner.
    pub other_hosts: Vec<(Uuid, String)>,
    /// Builds the journal held that died before their domain existed: the ports they
    /// allocated were released and the disks they made removed (start-up only).
    pub released_builds: Vec<Uuid>,
}

/// One recovered instance.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecoveredInstance {
    /// The instance.
    pub uuid: Uuid,
    /// Its state after recovery started.
    pub state: InstanceState,
    /// The operation that was in flight (kind/phase), if any.
    pub interrupted: Option<String>,
}

/// The registry of one host's instances.
#[derive(Debug)]
pub struct HostActor {
    deps: Arc<HostDeps>,
    instances: HashMap<Uuid, Addr<InstanceActor>>,
    op_ids: Arc<AtomicU64>,
    /// Domains of other hosts already logged (a resync finds them again).
    others_seen: HashSet<Uuid>,
    /// The build journal was read (by the first recovery, before any request: later ones,
    /// after a reconnect, run beside builds whose entries are theirs).
    journal_read: bool,
}

impl HostActor {
    /// A host actor over `deps`.
    pub fn new(deps: Arc<HostDeps>) -> Self {
        HostActor {
            deps,
            instances: HashMap::new(),
            op_ids: Arc::new(AtomicU64::new(0)),
            others_seen: HashSet::new(),
            journal_read: false,
        }
    }

    fn spawn_instance(
        &mut self,
        uuid: Uuid,
        state: InstanceState,
        record: Option<InstanceRecord>,
        power: PowerState,
        ctx: &mut Context<Self>,
    ) -> Addr<InstanceActor> {
        let actor = InstanceActor::new(
            uuid,
            self.deps.clone(),
            ctx.address().recipient(),
            self.op_ids.clone(),
            state,
            record,
            power,
        );
        let addr = actor.start();
        self.instances.insert(uuid, addr.clone());
        addr
    }

    fn route_event(&mut self, event: LibvirtEvent, ctx: &mut Context<Self>) {
        match event {
            LibvirtEvent::Lifecycle { uuid, event, .. } => match self.instances.get(&uuid) {
                Some(addr) => addr.do_send(DomainEvent { event }),
                None => debug!(%uuid, ?event, "lifecycle event for a domain vireo does not own"),
            },
            LibvirtEvent::Reconnected { .. } | LibvirtEvent::Lagged { .. } => {
                info!(host = %self.deps.host, "libvirt reconnected or events lost: resyncing every instance");
                for addr in self.instances.values() {
                    addr.do_send(Resync);
                }
                // Domains that appeared meanwhile (an incoming migration) get their actors.
                ctx.notify(Recover);
            }
            LibvirtEvent::ConnectionLost { .. } => {
                warn!(host = %self.deps.host, "libvirt connection lost");
            }
            _ => {}
        }
    }
}

/// May this request create the instance's actor?
fn creates(request: &Operation) -> bool {
    matches!(
        request.kind(),
        Request::Spawn
            | Request::FinishResize
            | Request::PreLiveMigration
            | Request::RollbackLiveMigrationAtDestination
    )
}

impl Actor for HostActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let events = self.deps.libvirt.events();
        let stream =
            futures::stream::unfold(
                events,
                |mut ev| async move { ev.recv().await.map(|e| (e, ev)) },
            );
        ctx.add_stream(stream.boxed_local());
    }
}

impl StreamHandler<LibvirtEvent> for HostActor {
    fn handle(&mut self, item: LibvirtEvent, ctx: &mut Self::Context) {
        self.route_event(item, ctx);
    }

    fn finished(&mut self, _ctx: &mut Self::Context) {
        debug!(host = %self.deps.host, "libvirt event stream ended");
    }
}

impl Handler<Route> for HostActor {
    type Result = ResponseFuture<Result<Ticket, AdmissionError>>;

    fn handle(&mut self, msg: Route, ctx: &mut Self::Context) -> Self::Result {
        let Route { uuid, request } = msg;
        let addr = match self.instances.get(&uuid) {
            Some(a) if a.connected() => a.clone(),
            _ if creates(&request) => {
                self.spawn_instance(uuid, InstanceState::Absent, None, PowerState::NoDomain, ctx)
            }
            _ if request.kind() == Request::Destroy => {
                return Box::pin(async { Ok(nothing_to_destroy()) });
            }
            _ => return Box::pin(async move { Err(AdmissionError::NotFound(uuid)) }),
        };
        // A mailbox error (the actor stopped as the request reached it) is not the actor's
        // answer: the instance is unavailable.
        Box::pin(async move {
            addr.send(Submit(request))
                .await
                .unwrap_or(Err(AdmissionError::Unavailable))
        })
    }
}

impl Handler<ShowInstance> for HostActor {
    type Result = ResponseFuture<Result<InstanceView, InstanceError>>;

    fn handle(&mut self, msg: ShowInstance, _ctx: &mut Self::Context) -> Self::Result {
        let uuid = msg.0;
        let addr = self.instances.get(&uuid).cloned();
        Box::pin(async move {
            match addr {
                // A gone instance (one that left leftovers behind) is not here.
                Some(a) => a
                    .send(Show)
                    .await
                    .ok()
                    .filter(|v| v.state != InstanceState::Gone)
                    .ok_or(InstanceError::from(AdmissionError::NotFound(uuid))),
                None => Err(InstanceError::from(AdmissionError::NotFound(uuid))),
            }
        })
    }
}

impl Handler<ListInstances> for HostActor {
    type Result = ResponseFuture<Vec<InstanceView>>;

    fn handle(&mut self, _msg: ListInstances, _ctx: &mut Self::Context) -> Self::Result {
        let addrs: Vec<_> = self.instances.values().cloned().collect();
        Box::pin(async move {
            let mut out = Vec::with_capacity(addrs.len());
            for a in addrs {
                if let Ok(v) = a.send(Show).await {
                    if !matches!(v.state, InstanceState::Absent | InstanceState::Gone) {
                        out.push(v);
                    }
                }
            }
            out.sort_by_key(|v| v.uuid);
            out
        })
    }
}

impl Handler<Knows> for HostActor {
    type Result = ResponseFuture<bool>;

    fn handle(&mut self, msg: Knows, _ctx: &mut Self::Context) -> Self::Result {
        let addr = self
            .instances
            .get(&msg.0)
            .filter(|a| a.connected())
            .cloned();
        Box::pin(async move {
            match addr {
                // A gone instance (one that left leftovers behind) is not here.
                Some(a) => a
                    .send(Show)
                    .await
                    .is_ok_and(|v| v.state != InstanceState::Gone),
                None => false,
            }
        })
    }
}

impl Handler<InstanceGone> for HostActor {
    type Result = ();

    fn handle(&mut self, msg: InstanceGone, _ctx: &mut Self::Context) {
        if self.instances.get(&msg.uuid) == Some(&msg.addr) {
            self.instances.remove(&msg.uuid);
            debug!(instance = %msg.uuid, "instance actor removed");
        }
    }
}

impl Handler<ShutdownHost> for HostActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _msg: ShutdownHost, _ctx: &mut Self::Context) -> Self::Result {
        let addrs: Vec<_> = self.instances.drain().map(|(_, a)| a).collect();
        Box::pin(
            async move {
                for a in addrs {
                    let _ = a.send(Stop).await;
                }
            }
            .into_actor(self)
            .map(|(), _act, ctx| ctx.stop()),
        )
    }
}

impl Handler<Recover> for HostActor {
    type Result = ResponseActFuture<Self, Result<RecoveryReport, InstanceError>>;

    fn handle(&mut self, _msg: Recover, _ctx: &mut Self::Context) -> Self::Result {
        let lv = self.deps.libvirt.clone();
        let host = self.deps.host.clone();
        // Only unknown domains are adopted: an existing actor (an incoming live migration's,
        // whose domain names the source until this host saves it) is never filtered.
        let known: Vec<Uuid> = self.instances.keys().copied().collect();
        let journal = (!self.journal_read).then(|| {
            (
                self.deps.builds.clone(),
                self.deps.migrations.clone(),
                self.deps.network.clone(),
                self.deps.storage.clone(),
            )
        });
        let fut = async move {
            let domains = lv
                .list_all()
                .await
                .map_err(|source| InstanceError::Libvirt {
                    step: "list domains",
                    source,
                })?;
            // Every domain libvirt has, whatever vireo makes of it (and the instances this
            // host already knows): a journaled migration is recovered from its entry only
            // when none of them is its instance.
            let mut present: HashSet<Uuid> = domains.iter().map(|d| d.uuid).collect();
            present.extend(known.iter().copied());
            let mut found = Vec::new();
            let mut foreign = 0;
            let mut others = Vec::new();
            let mut arrived = Vec::new();
            for d in domains {
                if known.contains(&d.uuid) {
                    continue;
                }
                let meta = match lv
                    .get_metadata(d.uuid, NAMESPACE_URI, crate::libvirt::Affect::Current)
                    .await
                {
                    Ok(Some(xml)) => xml,
                    Ok(None) | Err(_) => {
                        foreign += 1;
                        continue;
                    }
                };
                match VireoMetadata::from_xml(&meta)
                    .map_err(Into::into)
                    .and_then(|m| {
                        let owner = InstanceRecord::owner(&m)?;
                        InstanceRecord::from_metadata(&d.name, &m).map(|r| (m, r, owner))
                    }) {
                    Ok((m, r, Some(owner))) if owner != host => {
                        match InstanceRecord::arriving_at(&m, &host) {
                            Some(migration) => arrived.push((d, r, migration)),
                            None => others.push((d.uuid, owner)),
                        }
                    }
                    Ok((m, r, _)) => found.push((d.uuid, power_of(d.state), m, r)),
                    Err(e) => {
                        warn!(uuid = %d.uuid, error = %e, "domain with unreadable vireo metadata left alone");
                        foreign += 1;
                    }
                }
            }
            // A guest that arrived while this host's agent was down: its record is the
            // source's, with this host's disk files (the source waits to hand it over).
            let mut incoming = Vec::new();
            for (d, record, migration) in arrived {
                if d.state != crate::libvirt::DomainState::Running {
                    // Not running here: still arriving (paused by the migration, or starting
                    // up for it), or arrived paused. libvirt answers a read of an arriving
                    // domain's XML (live or inactive) only once the migration ended — as
                    // long as the migration takes (19 s measured) — while its state and
                    // metadata come at once. Adopted now from the source's record (its
                    // migration's end, Nova's post-live-migration or rollback find it), its
                    // disks read once it arrived (post-live-migration does).
                    info!(instance = %d.uuid, source = %migration.source_host, state = ?d.state, "a guest arriving by live migration adopted before it runs here");
                    incoming.push((d, record.arriving(), migration));
                    continue;
                }
                let live =
                    lv.xml_desc(d.uuid, false)
                        .await
                        .map_err(|source| InstanceError::Libvirt {
                            step: "read an arrived domain",
                            source,
                        });
                match live.and_then(|xml| record.arrived(&xml).map_err(InstanceError::Record)) {
                    Ok(record) => incoming.push((d, record, migration)),
                    Err(e) => {
                        warn!(instance = %d.uuid, error = %error_chain(&e), "a guest that arrived by live migration left alone");
                        others.push((d.uuid, migration.source_host));
                    }
                }
            }
            let released = match journal {
                Some((builds, migrations, network, storage)) => {
                    let domains: HashSet<Uuid> = found.iter().map(|f| f.0).collect();
                    let released =
                        release_journaled_builds(&builds, &*network, &*storage, &domains).await;
                    // A live migration whose domain left while the agent was stopped is
                    // recovered from its journal entry, as from its domain.
                    let departed = journaled_migrations(&migrations, &found, &present).await;
                    found.extend(
                        departed
                            .into_iter()
                            .map(|(m, r)| (r.uuid, PowerState::NoDomain, m, r)),
                    );
                    released
                }
                None => Vec::new(),
            };
            Ok::<_, InstanceError>((found, incoming, foreign, others, released))
        };
        Box::pin(fut.into_actor(self).map(|res, act, ctx| {
            let (found, incoming, foreign, others, released_builds) = res?;
            act.journal_read = true;
            for (uuid, owner) in &others {
                if act.others_seen.insert(*uuid) {
                    info!(instance = %uuid, %owner, "domain of another host left alone");
                } else {
                    debug!(instance = %uuid, %owner, "domain of another host left alone");
                }
            }
            let mut report = RecoveryReport {
                instances: Vec::new(),
                foreign_domains: foreign,
                other_hosts: others,
                released_builds,
            };
            for (uuid, power, meta, record) in found {
                let state = recovered_state(record.state, power);
                let ports = record.network_info.port_ids();
                let addr = act.spawn_instance(uuid, state, Some(record), power, ctx);
                act.deps.events.track(uuid);
                act.deps.events.track_ports(uuid, ports);
                let interrupted = meta.operation.as_ref().map(|o| format!("{}/{}", o.kind, o.phase));
                if let Some(op) = meta.operation {
                    let op = Interrupted::from_stored(&op);
                    actix::spawn(async move {
                        match addr.send(RecoverInterrupted(op)).await {
                            Ok(Ok(_)) => info!(instance = %uuid, "interrupted operation recovered"),
                            Ok(Err(e)) => warn!(instance = %uuid, error = %crate::instance::actor::error_chain(&e), "recovery of an interrupted operation failed"),
                            Err(_) => {}
                        }
                    });
                }
                report.instances.push(RecoveredInstance {
                    uuid,
                    state,
                    interrupted,
                });
            }
            for (d, record, migration) in incoming {
                // Adopted as the destination it was before the agent stopped: the source's
                // post-live-migration (or its rollback) finds it.
                let power = power_of(d.state);
                let ports = record.network_info.port_ids();
                act.spawn_instance(d.uuid, InstanceState::Incoming, Some(record), power, ctx);
                act.deps.events.track(d.uuid);
                act.deps.events.track_ports(d.uuid, ports);
                info!(instance = %d.uuid, source = %migration.source_host, "a guest arriving by live migration adopted");
                report.instances.push(RecoveredInstance {
                    uuid: d.uuid,
                    state: InstanceState::Incoming,
                    interrupted: Some(format!(
                        "{}/incoming from {}",
                        Request::LiveMigrate.as_str(),
                        migration.source_host
                    )),
                });
            }
            info!(
                host = %act.deps.host,
                recovered = report.instances.len(),
                foreign,
                other_hosts = report.other_hosts.len(),
                "recovery done"
            );
            Ok(report)
        }))
    }
}

/// The builds the journal holds (see [`crate::instance::journal`]) at start-up: one whose
/// domain exists is that domain's recovery's (it rolls the build back), so its entry is just
/// dropped; one without a domain here died before defining it: the ports it allocated are
/// released, the disks it made (those carrying its token) removed, and its entry dropped. An
/// entry whose clean-up fails stays for the next start; an unreadable one stays for an
/// operator. Returns the instances cleaned up.
async fn release_journaled_builds(
    builds: &BuildJournal,
    network: &dyn NetworkApi,
    storage: &dyn InstanceStorage,
    domains: &HashSet<Uuid>,
) -> Vec<Uuid> {
    let entries = match builds.pending().await {
        Ok(entries) => entries,
        Err(error) => {
            warn!(error = %error_chain(&error), "build journal unreadable");
            return Vec::new();
        }
    };
    let mut released = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                warn!(error = %error_chain(&error), "build journal entry left for an operator");
                continue;
            }
        };
        let instance = entry.instance;
        if !domains.contains(&instance) {
            if entry.allocated {
                let user: Vec<PortId> = entry.user_ports.iter().copied().map(PortId).collect();
                match release_build_ports(network, instance, &entry.host, &user).await {
                    Ok(done) => {
                        info!(%instance, deleted = ?done.deleted, unbound = ?done.unbound, skipped = ?done.skipped, "released the ports of a build that died before its domain existed");
                    }
                    Err(error) => {
                        warn!(%instance, error = %error_chain(&error), "ports of a build that died before its domain existed not released; kept for the next start");
                        continue;
                    }
                }
            }
            if let Some(build) = entry.build {
                match storage.remove_build(instance, build).await {
                    Ok(true) => {
                        info!(%instance, "removed the disks of a build that died before its domain existed");
                    }
                    Ok(false) => {}
                    Err(error) => {
                        warn!(%instance, error = %error_chain(&error), "disks of a build that died before its domain existed not removed; kept for the next start");
                        continue;
                    }
                }
            }
            released.push(instance);
        }
        if let Err(error) = builds.end(instance).await {
            warn!(%instance, error = %error_chain(&error), "build journal entry not removed");
        }
    }
    released
}

/// The live migrations the journal holds (see [`crate::instance::journal`]) at start-up, given
/// the instances `found` in libvirt (this host's, readable) and every domain `present` there
/// (or known already): an entry whose domain was found belongs to that domain's recovery
/// when the domain still records the migration in flight (the recovery drops it), and is
/// dropped now when it does not (the migration ended; only the entry's removal was lost). An
/// entry whose domain is present otherwise (its metadata unreadable now, say) is left alone:
/// a guest that may run here is never handed over. An entry without any domain here is a
/// migration whose guest left while the agent was stopped: returned (its metadata and
/// record) to be recovered as its domain would have been. An unreadable entry stays for an
/// operator.
async fn journaled_migrations(
    journal: &LiveMigrationJournal,
    found: &[(Uuid, PowerState, VireoMetadata, InstanceRecord)],
    present: &HashSet<Uuid>,
) -> Vec<(VireoMetadata, InstanceRecord)> {
    let entries = match journal.pending().await {
        Ok(entries) => entries,
        Err(error) => {
            warn!(error = %error_chain(&error), "live-migration journal unreadable");
            return Vec::new();
        }
    };
    let mut departed = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                warn!(error = %error_chain(&error), "live-migration journal entry left for an operator");
                continue;
            }
        };
        let instance = entry.instance;
        if let Some((_, _, meta, _)) = found.iter().find(|f| f.0 == instance) {
            if !migrating(meta) {
                if let Err(error) = journal.end(instance).await {
                    warn!(%instance, error = %error_chain(&error), "live-migration journal entry not removed");
                }
            }
            continue;
        }
        if present.contains(&instance) {
            warn!(%instance, "a journaled live migration whose domain is here but was not read: left for the next start");
            continue;
        }
        let parsed = VireoMetadata::from_xml(&entry.metadata)
            .map_err(Into::into)
            .and_then(|m| InstanceRecord::from_metadata(&entry.name, &m).map(|r| (m, r)));
        match parsed {
            Ok((m, r)) if r.uuid == instance && migrating(&m) => {
                info!(%instance, "a live migration whose guest left while the agent was stopped: recovered from its journal entry");
                departed.push((m, r));
            }
            Ok(_) => {
                warn!(%instance, "live-migration journal entry names another instance or no migration; left for an operator");
            }
            Err(error) => {
                warn!(%instance, error = %error_chain(&error), "live-migration journal entry unreadable; left for an operator");
            }
        }
    }
    departed
}

/// Whether `meta` records a live migration in flight.
fn migrating(meta: &VireoMetadata) -> bool {
    meta.operation
        .as_ref()
        .and_then(|o| Marker::from_stored(o).ok())
        .is_some_and(|m| matches!(m.operation, InFlight::LiveMigrate(_)))
}

/// The state to rebuild an actor in, from the recorded state and what libvirt says now.
fn recovered_state(recorded: InstanceState, power: PowerState) -> InstanceState {
    use InstanceState as S;
    match (recorded, power) {
        // A build that never finished stays one, whatever its domain does (it was started
        // paused): recovery rolls it back.
        // A confirmed resize's source recorded as gone before its removal: left behind,
        // removed by its actor.
        (
            S::Building | S::ResizeSource | S::ResizeTarget | S::Error | S::Suspended | S::Gone,
            _,
        ) => recorded,
        (_, PowerState::Running) => S::Running,
        (_, PowerState::Paused) => S::Paused,
        (_, PowerState::Suspended) => S::Suspended,
        (_, PowerState::Shutoff) => S::Stopped,
        (_, PowerState::NoDomain | PowerState::Unknown) => S::Error,
    }
}

/// A cheap, cloneable handle on a host actor.
#[derive(Debug, Clone)]
pub struct HostHandle {
    addr: Addr<HostActor>,
    name: String,
    migration_uri: Option<String>,
}

impl HostHandle {
    /// Wrap a host actor's address.
    pub fn new(
        addr: Addr<HostActor>,
        name: impl Into<String>,
        migration_uri: Option<String>,
    ) -> Self {
        HostHandle {
            addr,
            name: name.into(),
            migration_uri,
        }
    }

    /// The actor's address.
    pub fn addr(&self) -> &Addr<HostActor> {
        &self.addr
    }

    /// Submit a request to an instance: its actor admits it (the ticket) or refuses it.
    pub async fn submit(&self, uuid: Uuid, request: Operation) -> Result<Ticket, AdmissionError> {
        self.addr
            .send(Route { uuid, request })
            .await
            .unwrap_or(Err(AdmissionError::Unavailable))
    }

    /// Submit a request and wait for it to end.
    pub async fn run(
        &self,
        uuid: Uuid,
        request: Operation,
    ) -> Result<InstanceReply, InstanceError> {
        self.submit(uuid, request).await?.finished().await
    }

    /// Show an instance.
    pub async fn show(&self, uuid: Uuid) -> Result<InstanceView, InstanceError> {
        self.addr
            .send(ShowInstance(uuid))
            .await
            .unwrap_or(Err(InstanceError::Unavailable))
    }

    /// Every instance.
    pub async fn list(&self) -> Vec<InstanceView> {
        self.addr.send(ListInstances).await.unwrap_or_default()
    }

    /// Is the instance here?
    pub async fn knows(&self, uuid: Uuid) -> bool {
        self.addr.send(Knows(uuid)).await.unwrap_or(false)
    }

    /// Rebuild from libvirt.
    pub async fn recover(&self) -> Result<RecoveryReport, InstanceError> {
        self.addr
            .send(Recover)
            .await
            .unwrap_or(Err(InstanceError::Unavailable))
    }

    /// Stop the host actor and every instance actor.
    pub async fn shutdown(&self) {
        let _ = self.addr.send(ShutdownHost).await;
    }
}

#[async_trait]
impl PeerHost for HostHandle {
    fn name(&self) -> &str {
        &self.name
    }

    fn migration_uri(&self) -> Option<String> {
        self.migration_uri.clone()
    }

    async fn request(
        &self,
        instance: Uuid,
        request: Operation,
    ) -> Result<InstanceReply, InstanceError> {
        self.run(instance, request).await
    }
}
