//! Network faults: every call of the network service API can fail (before or after it is
//! applied) or be held, per call kind, port and host.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use uuid::Uuid;
use vireo::network::embedded::EmbeddedNetwork;
use vireo_actors::network::{
    Deallocation, Failure, HostSetupChange, MigrationHosts, NetworkApi, NetworkError,
    NetworkSummary, NewBinding, Port, PortBinding, PortRequest, PortUpdate, Removal,
};
use vireo_actors::vif::{NetworkInfo, PortId};

use super::Hold;

/// Calls of [`FaultyNetwork`] a fault can be armed on (every call of [`NetworkApi`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NetCall {
    GetPort,
    UpdatePort,
    CreateBinding,
    ActivateBinding,
    DeleteBinding,
    Allocate,
    Deallocate,
    SetupNetworks,
    ListPorts,
    GetNetwork,
    CreatePort,
    DeletePort,
    ShowBindings,
}

impl NetCall {
    /// The call's name in tables and messages.
    pub fn as_str(&self) -> &'static str {
        match self {
            NetCall::GetPort => "get port",
            NetCall::UpdatePort => "update port",
            NetCall::CreateBinding => "create binding",
            NetCall::ActivateBinding => "activate binding",
            NetCall::DeleteBinding => "delete binding",
            NetCall::Allocate => "allocate",
            NetCall::Deallocate => "deallocate",
            NetCall::SetupNetworks => "setup networks",
            NetCall::ListPorts => "list ports",
            NetCall::GetNetwork => "get network",
            NetCall::CreatePort => "create port",
            NetCall::DeletePort => "delete port",
            NetCall::ShowBindings => "show bindings",
        }
    }

    /// True for calls that change the service (a timeout may have applied them).
    pub fn mutates(&self) -> bool {
        !matches!(
            self,
            NetCall::GetPort | NetCall::ListPorts | NetCall::GetNetwork | NetCall::ShowBindings
        )
    }
}

/// How an armed [`FaultyNetwork`] call fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NetFailure {
    /// The service answers this HTTP status, mapped to the error the Neutron client gives
    /// for it on that call (404 → `PortNotFound`/`BindingNotFound`/`NetworkNotFound`, 409 on
    /// a binding → `BindingExists`/`BindingAlreadyActive`, otherwise the call's variant with
    /// `Failure::Status`). Where the client reads the status as "already so" (404 on a
    /// delete, 409 on creating or activating a binding) the service really is so: the
    /// change is applied and the status is what a retry of a lost answer gets.
    Status(u16),
    /// No answer in time (`Failure::Timeout`). A change the call asked for was applied: the
    /// answer, not the request, was lost.
    Timeout,
    /// The service is down (`Failure::Connect`): this call and every later one fail until
    /// [`FaultyNetwork::set_down`]`(false)`.
    Down,
}

impl NetFailure {
    /// Every failure the matrix injects.
    pub const ALL: [NetFailure; 5] = [
        NetFailure::Status(500),
        NetFailure::Status(409),
        NetFailure::Status(404),
        NetFailure::Timeout,
        NetFailure::Down,
    ];

    pub fn label(&self) -> String {
        match self {
            NetFailure::Status(s) => s.to_string(),
            NetFailure::Timeout => "timeout".into(),
            NetFailure::Down => "down".into(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct NetFault {
    call: NetCall,
    skip: usize,
    failure: NetFailure,
}

/// The injected cause of a [`FaultyNetwork`] failure.
#[derive(Debug, thiserror::Error)]
#[error("injected network failure")]
pub struct InjectedNetworkFailure;

/// The embedded network service behind a fault seam: an armed call fails after `skip`
/// successful ones (see [`NetFailure`]); a held call waits for the test. Every call is
/// recorded. Everything else goes through.
#[derive(Debug)]
pub struct FaultyNetwork {
    inner: Arc<EmbeddedNetwork>,
    faults: Mutex<Vec<NetFault>>,
    /// Shared by the seams of every host of a cloud: the service is down for all of them.
    down: Arc<std::sync::atomic::AtomicBool>,
    calls: Mutex<Vec<NetCall>>,
    holds: Mutex<Vec<(NetCall, usize, Arc<Hold>)>>,
}

impl FaultyNetwork {
    pub fn new(inner: Arc<EmbeddedNetwork>) -> Self {
        Self::sharing(inner, Arc::default())
    }

    /// A seam whose "down" state is `down` (shared with other hosts' seams).
    pub fn sharing(inner: Arc<EmbeddedNetwork>, down: Arc<std::sync::atomic::AtomicBool>) -> Self {
        FaultyNetwork {
            inner,
            faults: Mutex::default(),
            down,
            calls: Mutex::default(),
            holds: Mutex::default(),
        }
    }

    /// Fail the next call of `call` after `skip` successful ones (once) with HTTP 503.
    pub fn fail(&self, call: NetCall, skip: usize) {
        self.fail_with(call, skip, NetFailure::Status(503));
    }

    /// Fail the next call of `call` after `skip` successful ones with `failure`.
    pub fn fail_with(&self, call: NetCall, skip: usize, failure: NetFailure) {
        self.faults.lock().unwrap().push(NetFault {
            call,
            skip,
            failure,
        });
    }

    /// Hold the next call of `call` after `skip` others until the hold is released.
    pub fn hold(&self, call: NetCall, skip: usize) -> Arc<Hold> {
        let h = Hold::new();
        self.holds.lock().unwrap().push((call, skip, h.clone()));
        h
    }

    /// The service goes down (every call of every host sharing the state fails to connect)
    /// or comes back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_down(&self) -> bool {
        self.down.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn clear(&self) {
        self.faults.lock().unwrap().clear();
        self.holds.lock().unwrap().clear();
        self.set_down(false);
    }

    pub fn armed(&self) -> usize {
        self.faults.lock().unwrap().len()
    }

    /// The calls made since the last [`FaultyNetwork::take_calls`], in order.
    pub fn take_calls(&self) -> Vec<NetCall> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }

    /// Record the call, pass a hold armed on it, and tell how it fails (if it does).
    async fn enter(&self, call: NetCall) -> Option<NetFailure> {
        self.calls.lock().unwrap().push(call);
        let hold = {
            let mut holds = self.holds.lock().unwrap();
            match holds.iter().position(|(c, _, _)| *c == call) {
                Some(i) if holds[i].1 == 0 => Some(holds.remove(i).2),
                Some(i) => {
                    holds[i].1 -= 1;
                    None
                }
                None => None,
            }
        };
        if let Some(h) = hold {
            h.pass().await;
        }
        if self.is_down() {
            return Some(NetFailure::Down);
        }
        let mut faults = self.faults.lock().unwrap();
        let i = faults.iter().position(|f| f.call == call)?;
        if faults[i].skip > 0 {
            faults[i].skip -= 1;
            return None;
        }
        let f = faults.remove(i);
        if f.failure == NetFailure::Down {
            self.set_down(true);
        }
        Some(f.failure)
    }
}

fn injected() -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(InjectedNetworkFailure)
}

/// The request failure a [`NetFailure`] is on the wire.
fn wire(f: NetFailure) -> Failure {
    match f {
        NetFailure::Status(s) => Failure::Status(s),
        NetFailure::Timeout => Failure::Timeout,
        NetFailure::Down => Failure::Connect,
    }
}

/// `Ok(())`: the call goes to the service as usual (the failure, if any, is the caller's to
/// build after it). `Err`: fail now without touching the service.
fn applied_first(call: NetCall, f: NetFailure) -> bool {
    match f {
        NetFailure::Timeout => call.mutates(),
        NetFailure::Status(404) => matches!(
            call,
            NetCall::DeleteBinding | NetCall::DeletePort | NetCall::Deallocate
        ),
        NetFailure::Status(409) => {
            matches!(call, NetCall::CreateBinding | NetCall::ActivateBinding)
        }
        _ => false,
    }
}

#[async_trait]
impl NetworkApi for FaultyNetwork {
    async fn list_instance_ports(&self, instance: Uuid) -> Result<Vec<Port>, NetworkError> {
        if let Some(f) = self.enter(NetCall::ListPorts).await {
            return Err(NetworkError::ListPorts {
                instance,
                failure: wire(f),
                source: injected(),
            });
        }
        self.inner.list_instance_ports(instance).await
    }

    async fn get_port(&self, port: PortId) -> Result<Port, NetworkError> {
        match self.enter(NetCall::GetPort).await {
            None => self.inner.get_port(port).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::PortNotFound { port }),
            Some(f) => Err(NetworkError::GetPort {
                port,
                failure: wire(f),
                source: injected(),
            }),
        }
    }

    async fn get_network(&self, network_id: &str) -> Result<NetworkSummary, NetworkError> {
        match self.enter(NetCall::GetNetwork).await {
            None => self.inner.get_network(network_id).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::NetworkNotFound {
                network: network_id.to_owned(),
            }),
            Some(f) => Err(NetworkError::GetNetwork {
                network: network_id.to_owned(),
                failure: wire(f),
                source: injected(),
            }),
        }
    }

    async fn create_port_with(
        &self,
        network_id: &str,
        device_id: Option<Uuid>,
    ) -> Result<Port, NetworkError> {
        match self.enter(NetCall::CreatePort).await {
            None => self.inner.create_port_with(network_id, device_id).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::NetworkNotFound {
                network: network_id.to_owned(),
            }),
            Some(f) => {
                if applied_first(NetCall::CreatePort, f) {
                    let _ = self.inner.create_port_with(network_id, device_id).await;
                }
                Err(NetworkError::CreatePort {
                    network: network_id.to_owned(),
                    failure: wire(f),
                    source: injected(),
                })
            }
        }
    }

    async fn update_port(&self, port: PortId, update: &PortUpdate) -> Result<Port, NetworkError> {
        match self.enter(NetCall::UpdatePort).await {
            None => self.inner.update_port(port, update).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::PortNotFound { port }),
            Some(f) => {
                if applied_first(NetCall::UpdatePort, f) {
                    let _ = self.inner.update_port(port, update).await;
                }
                Err(NetworkError::UpdatePort {
                    port,
                    failure: wire(f),
                    source: injected(),
                })
            }
        }
    }

    async fn delete_port(&self, port: PortId) -> Result<Removal, NetworkError> {
        match self.enter(NetCall::DeletePort).await {
            None => self.inner.delete_port(port).await,
            Some(NetFailure::Status(404)) => {
                let _ = self.inner.delete_port(port).await;
                Ok(Removal::AlreadyGone)
            }
            Some(f) => {
                if applied_first(NetCall::DeletePort, f) {
                    let _ = self.inner.delete_port(port).await;
                }
                Err(NetworkError::DeletePort {
                    port,
                    failure: wire(f),
                    source: injected(),
                })
            }
        }
    }

    async fn show_bindings(&self, port: PortId) -> Result<Vec<PortBinding>, NetworkError> {
        match self.enter(NetCall::ShowBindings).await {
            None => self.inner.show_bindings(port).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::PortNotFound { port }),
            Some(f) => Err(NetworkError::ShowBindings {
                port,
                failure: wire(f),
                source: injected(),
            }),
        }
    }

    async fn create_binding(
        &self,
        port: PortId,
        binding: &NewBinding,
    ) -> Result<PortBinding, NetworkError> {
        match self.enter(NetCall::CreateBinding).await {
            None => self.inner.create_binding(port, binding).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::PortNotFound { port }),
            Some(f) => {
                if applied_first(NetCall::CreateBinding, f) {
                    let _ = self.inner.create_binding(port, binding).await;
                }
                if f == NetFailure::Status(409) {
                    return Err(NetworkError::BindingExists {
                        port,
                        host: binding.host.clone(),
                    });
                }
                Err(NetworkError::CreateBinding {
                    port,
                    host: binding.host.clone(),
                    failure: wire(f),
                    source: injected(),
                })
            }
        }
    }

    async fn activate_binding(
        &self,
        port: PortId,
        host: &str,
    ) -> Result<PortBinding, NetworkError> {
        match self.enter(NetCall::ActivateBinding).await {
            None => self.inner.activate_binding(port, host).await,
            Some(NetFailure::Status(404)) => Err(NetworkError::BindingNotFound {
                port,
                host: host.to_owned(),
            }),
            Some(f) => {
                if applied_first(NetCall::ActivateBinding, f) {
                    let _ = self.inner.activate_binding(port, host).await;
                }
                if f == NetFailure::Status(409) {
                    return Err(NetworkError::BindingAlreadyActive {
                        port,
                        host: host.to_owned(),
                    });
                }
                Err(NetworkError::ActivateBinding {
                    port,
                    host: host.to_owned(),
                    failure: wire(f),
                    source: injected(),
                })
            }
        }
    }

    async fn delete_binding(&self, port: PortId, host: &str) -> Result<Removal, NetworkError> {
        match self.enter(NetCall::DeleteBinding).await {
            None => self.inner.delete_binding(port, host).await,
            Some(NetFailure::Status(404)) => {
                let _ = self.inner.delete_binding(port, host).await;
                Ok(Removal::AlreadyGone)
            }
            Some(f) => {
                if applied_first(NetCall::DeleteBinding, f) {
                    let _ = self.inner.delete_binding(port, host).await;
                }
                Err(NetworkError::DeleteBinding {
                    port,
                    host: host.to_owned(),
                    failure: wire(f),
                    source: injected(),
                })
            }
        }
    }

    async fn allocate_for_instance(
        &self,
        instance: Uuid,
        host: &str,
        requests: &[PortRequest],
    ) -> Result<NetworkInfo, NetworkError> {
        match self.enter(NetCall::Allocate).await {
            None => {
                self.inner
                    .allocate_for_instance(instance, host, requests)
                    .await
            }
            // A composite call: the service's own clean-up of a failed allocation ran.
            Some(NetFailure::Status(404)) => Err(NetworkError::NetworkNotFound {
                network: "any".into(),
            }),
            Some(f) => Err(NetworkError::CreatePort {
                network: "any".into(),
                failure: wire(f),
                source: injected(),
            }),
        }
    }

    async fn deallocate_for_instance(
        &self,
        instance: Uuid,
        network_info: &NetworkInfo,
    ) -> Result<Deallocation, NetworkError> {
        let port = network_info
            .vifs
            .first()
            .map_or(PortId(Uuid::nil()), |v| v.id);
        match self.enter(NetCall::Deallocate).await {
            None => {
                self.inner
                    .deallocate_for_instance(instance, network_info)
                    .await
            }
            // A 404 on a port is "already gone" to the client: the deallocation completes.
            Some(NetFailure::Status(404)) => {
                self.inner
                    .deallocate_for_instance(instance, network_info)
                    .await
            }
            Some(f) => {
                let done = if applied_first(NetCall::Deallocate, f) {
                    self.inner
                        .deallocate_for_instance(instance, network_info)
                        .await
                        .unwrap_or_default()
                } else {
                    Deallocation::default()
                };
                Err(NetworkError::Deallocate {
                    instance,
                    done: Box::new(done),
                    failures: vec![NetworkError::DeletePort {
                        port,
                        failure: wire(f),
                        source: injected(),
                    }],
                })
            }
        }
    }

    async fn setup_networks_on_host(
        &self,
        instance: Uuid,
        host: &str,
        teardown: bool,
        migration: Option<&MigrationHosts>,
    ) -> Result<Vec<HostSetupChange>, NetworkError> {
        match self.enter(NetCall::SetupNetworks).await {
            None => {
                self.inner
                    .setup_networks_on_host(instance, host, teardown, migration)
                    .await
            }
            // A 404 on a port is skipped by the client's flow: the setup completes.
            Some(NetFailure::Status(404)) => {
                self.inner
                    .setup_networks_on_host(instance, host, teardown, migration)
                    .await
            }
            Some(f) => {
                let done = if applied_first(NetCall::SetupNetworks, f) {
                    self.inner
                        .setup_networks_on_host(instance, host, teardown, migration)
                        .await
                        .unwrap_or_default()
                } else {
                    Vec::new()
                };
                Err(NetworkError::SetupNetworksOnHost {
                    instance,
                    done,
                    failures: vec![NetworkError::UpdatePort {
                        port: PortId(Uuid::nil()),
                        failure: wire(f),
                        source: injected(),
                    }],
                })
            }
        }
    }
}
