//! Nova network mode: the ports of this host's instances are Nova's.
//!
//! Under nova-compute (`compute_driver = vireo.VireoDriver`) Nova allocates the ports, moves
//! their bindings between hosts, sets and clears `binding:profile.migrating_to` and deletes or
//! unbinds them when an instance goes or a build is rescheduled; vireo plugs, unplugs,
//! defines, waits and rolls back this host's part. A second writer would race Nova (a port
//! vireo unbinds after a failed build is one Nova is about to bind on the next host), so
//! [`NovaOwnedPorts`] lets every read through to Neutron and refuses every write with
//! [`NetworkError::OwnedByNova`], except releasing an instance's ports, which is Nova's job
//! and so, here, a release of nothing. What needs a write (vireo allocating ports, vireo's
//! own cross-host moves) fails with that error instead of changing a port behind Nova.
use std::sync::Arc;

use async_trait::async_trait;
use tracing::debug;
use uuid::Uuid;
use vireo_actors::network::{
    Deallocation, HostSetupChange, MigrationHosts, NetworkApi, NetworkError, NetworkSummary,
    NewBinding, Port, PortBinding, PortRequest, PortUpdate, Removal,
};
use vireo_actors::vif::{NetworkInfo, PortId};

/// Who owns the ports of this host's instances (`[network.neutron] ports_owner`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PortsOwner {
    /// vireo allocates, binds, moves and releases them (the agent on its own).
    #[default]
    Vireo,
    /// Nova does; vireo only reads them (the agent under nova-compute).
    Nova,
}

/// A network service whose ports Nova owns: reads go to `inner`, writes are refused.
#[derive(Debug)]
pub struct NovaOwnedPorts {
    inner: Arc<dyn NetworkApi>,
}

impl NovaOwnedPorts {
    /// Nova network mode over `inner` (the Neutron client).
    pub fn new(inner: Arc<dyn NetworkApi>) -> Self {
        NovaOwnedPorts { inner }
    }
}

fn refused<T>(operation: &'static str) -> Result<T, NetworkError> {
    Err(NetworkError::OwnedByNova { operation })
}

#[async_trait]
impl NetworkApi for NovaOwnedPorts {
    async fn list_instance_ports(&self, instance: Uuid) -> Result<Vec<Port>, NetworkError> {
        self.inner.list_instance_ports(instance).await
    }

    async fn get_port(&self, port: PortId) -> Result<Port, NetworkError> {
        self.inner.get_port(port).await
    }

    async fn get_network(&self, network_id: &str) -> Result<NetworkSummary, NetworkError> {
        self.inner.get_network(network_id).await
    }

    async fn create_port_with(
        &self,
        _network_id: &str,
        _device_id: Option<Uuid>,
    ) -> Result<Port, NetworkError> {
        refused("create a port")
    }

    async fn update_port(&self, _port: PortId, _update: &PortUpdate) -> Result<Port, NetworkError> {
        refused("update a port")
    }

    async fn delete_port(&self, _port: PortId) -> Result<Removal, NetworkError> {
        refused("delete a port")
    }

    async fn show_bindings(&self, port: PortId) -> Result<Vec<PortBinding>, NetworkError> {
        self.inner.show_bindings(port).await
    }

    async fn create_binding(
        &self,
        _port: PortId,
        _binding: &NewBinding,
    ) -> Result<PortBinding, NetworkError> {
        refused("create a binding")
    }

    async fn activate_binding(
        &self,
        _port: PortId,
        _host: &str,
    ) -> Result<PortBinding, NetworkError> {
        refused("activate a binding")
    }

    async fn delete_binding(&self, _port: PortId, _host: &str) -> Result<Removal, NetworkError> {
        refused("delete a binding")
    }

    async fn allocate_for_instance(
        &self,
        _instance: Uuid,
        _host: &str,
        _requests: &[PortRequest],
    ) -> Result<NetworkInfo, NetworkError> {
        refused("allocate ports (give the build Nova's network_info)")
    }

    /// Nova deletes the ports it created and unbinds a user's when the instance goes, and
    /// keeps them for the next host when a failed build is rescheduled: nothing to do here.
    async fn deallocate_for_instance(
        &self,
        instance: Uuid,
        network_info: &NetworkInfo,
    ) -> Result<Deallocation, NetworkError> {
        debug!(%instance, ports = network_info.vifs.len(), "Nova releases the ports");
        Ok(Deallocation::default())
    }

    async fn setup_networks_on_host(
        &self,
        _instance: Uuid,
        _host: &str,
        _teardown: bool,
        _migration: Option<&MigrationHosts>,
    ) -> Result<Vec<HostSetupChange>, NetworkError> {
        refused("set up ports for a live migration")
    }
}
