//! [`SplitNetwork`]: one [`NetworkApi`] over two real network services — the real Neutron
//! and the embedded service — so that one instance can have Neutron's OVS ports and
//! Linux-bridge ports at once (Neutron here runs no Linux bridge agent; the embedded service
//! plays it, learning what is wired from the host's real wiring watcher).
//!
//! It is not a fake of either: every call goes to the service that owns the network or
//! port (networks by id; ports by asking the in-process embedded service first). Calls about
//! one instance's ports go to both and the answers are merged in `network_info` order.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;
use vireo::network::embedded::EmbeddedNetwork;
use vireo_actors::network::{
    Deallocation, HostSetupChange, MigrationHosts, NetworkApi, NetworkError, NetworkSummary,
    NewBinding, Port, PortBinding, PortRequest, PortUpdate, Removal,
};
use vireo_actors::vif::{NetworkInfo, PortId, Vif};

/// Neutron for everything but the embedded service's networks and ports.
#[derive(Debug)]
pub struct SplitNetwork {
    neutron: Arc<dyn NetworkApi>,
    embedded: Arc<EmbeddedNetwork>,
    embedded_networks: BTreeSet<String>,
}

impl SplitNetwork {
    /// `embedded_networks` are the ids the embedded service owns.
    pub fn new(
        neutron: Arc<dyn NetworkApi>,
        embedded: Arc<EmbeddedNetwork>,
        embedded_networks: impl IntoIterator<Item = String>,
    ) -> Self {
        SplitNetwork {
            neutron,
            embedded,
            embedded_networks: embedded_networks.into_iter().collect(),
        }
    }

    fn by_network(&self, network_id: &str) -> &dyn NetworkApi {
        if self.embedded_networks.contains(network_id) {
            &*self.embedded
        } else {
            &*self.neutron
        }
    }

    fn is_embedded_port(&self, port: PortId) -> bool {
        self.embedded.ports().iter().any(|p| p.id == port)
    }

    fn by_port(&self, port: PortId) -> &dyn NetworkApi {
        if self.is_embedded_port(port) {
            &*self.embedded
        } else {
            &*self.neutron
        }
    }

    fn vif_is_embedded(&self, v: &Vif) -> bool {
        v.network
            .id
            .as_deref()
            .is_some_and(|n| self.embedded_networks.contains(n))
            || self.is_embedded_port(v.id)
    }
}

/// Merge two services' VIFs back into request order (`order[i]` = true: the i-th request
/// went to the embedded service).
fn merge(order: &[bool], mut neutron: Vec<Vif>, mut embedded: Vec<Vif>) -> NetworkInfo {
    neutron.reverse();
    embedded.reverse();
    let mut vifs = Vec::with_capacity(order.len());
    for (i, e) in order.iter().enumerate() {
        let v = if *e { embedded.pop() } else { neutron.pop() };
        if let Some(mut v) = v {
            v.index = i;
            vifs.push(v);
        }
    }
    NetworkInfo { vifs }
}

fn join(a: Deallocation, b: Deallocation) -> Deallocation {
    let mut d = a;
    d.deleted.extend(b.deleted);
    d.unbound.extend(b.unbound);
    d.already_gone.extend(b.already_gone);
    d.skipped.extend(b.skipped);
    d
}

#[async_trait]
impl NetworkApi for SplitNetwork {
    async fn list_instance_ports(&self, instance: Uuid) -> Result<Vec<Port>, NetworkError> {
        let mut ports = self.neutron.list_instance_ports(instance).await?;
        ports.extend(self.embedded.list_instance_ports(instance).await?);
        Ok(ports)
    }

    async fn get_port(&self, port: PortId) -> Result<Port, NetworkError> {
        self.by_port(port).get_port(port).await
    }

    async fn get_network(&self, network_id: &str) -> Result<NetworkSummary, NetworkError> {
        self.by_network(network_id).get_network(network_id).await
    }

    async fn create_port_with(
        &self,
        network_id: &str,
        device_id: Option<Uuid>,
    ) -> Result<Port, NetworkError> {
        self.by_network(network_id)
            .create_port_with(network_id, device_id)
            .await
    }

    async fn update_port(&self, port: PortId, update: &PortUpdate) -> Result<Port, NetworkError> {
        self.by_port(port).update_port(port, update).await
    }

    async fn delete_port(&self, port: PortId) -> Result<Removal, NetworkError> {
        self.by_port(port).delete_port(port).await
    }

    async fn show_bindings(&self, port: PortId) -> Result<Vec<PortBinding>, NetworkError> {
        self.by_port(port).show_bindings(port).await
    }

    async fn create_binding(
        &self,
        port: PortId,
        binding: &NewBinding,
    ) -> Result<PortBinding, NetworkError> {
        self.by_port(port).create_binding(port, binding).await
    }

    async fn activate_binding(
        &self,
        port: PortId,
        host: &str,
    ) -> Result<PortBinding, NetworkError> {
        self.by_port(port).activate_binding(port, host).await
    }

    async fn delete_binding(&self, port: PortId, host: &str) -> Result<Removal, NetworkError> {
        self.by_port(port).delete_binding(port, host).await
    }

    async fn allocate_for_instance(
        &self,
        instance: Uuid,
        host: &str,
        requests: &[PortRequest],
    ) -> Result<NetworkInfo, NetworkError> {
        let order: Vec<bool> = requests
            .iter()
            .map(|r| match r {
                PortRequest::Network { network_id } => self.embedded_networks.contains(network_id),
                PortRequest::Port { port_id } => self.is_embedded_port(*port_id),
            })
            .collect();
        let (e_req, n_req): (Vec<_>, Vec<_>) = requests
            .iter()
            .cloned()
            .zip(order.iter().copied())
            .partition(|(_, e)| *e);
        let n_req: Vec<PortRequest> = n_req.into_iter().map(|(r, _)| r).collect();
        let e_req: Vec<PortRequest> = e_req.into_iter().map(|(r, _)| r).collect();
        let n = if n_req.is_empty() {
            NetworkInfo { vifs: vec![] }
        } else {
            self.neutron
                .allocate_for_instance(instance, host, &n_req)
                .await?
        };
        let e = if e_req.is_empty() {
            NetworkInfo { vifs: vec![] }
        } else {
            match self
                .embedded
                .allocate_for_instance(instance, host, &e_req)
                .await
            {
                Ok(e) => e,
                Err(err) => {
                    // Give back what Neutron allocated, as a single service would.
                    let _ = self.neutron.deallocate_for_instance(instance, &n).await;
                    return Err(err);
                }
            }
        };
        Ok(merge(&order, n.vifs, e.vifs))
    }

    async fn deallocate_for_instance(
        &self,
        instance: Uuid,
        network_info: &NetworkInfo,
    ) -> Result<Deallocation, NetworkError> {
        let (e, n): (Vec<Vif>, Vec<Vif>) = network_info
            .vifs
            .iter()
            .cloned()
            .partition(|v| self.vif_is_embedded(v));
        let rn = self
            .neutron
            .deallocate_for_instance(instance, &NetworkInfo { vifs: n })
            .await;
        let re = self
            .embedded
            .deallocate_for_instance(instance, &NetworkInfo { vifs: e })
            .await;
        Ok(join(rn?, re?))
    }

    async fn setup_networks_on_host(
        &self,
        instance: Uuid,
        host: &str,
        teardown: bool,
        migration: Option<&MigrationHosts>,
    ) -> Result<Vec<HostSetupChange>, NetworkError> {
        let rn = self
            .neutron
            .setup_networks_on_host(instance, host, teardown, migration)
            .await;
        let re = self
            .embedded
            .setup_networks_on_host(instance, host, teardown, migration)
            .await;
        let mut changes = rn?;
        changes.extend(re?);
        Ok(changes)
    }
}
