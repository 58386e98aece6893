//! Shared set-up of the cross-crate tests: a local cloud on private test-driver files with
//! the embedded network service, and ports of every kind.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tempfile::TempDir;
use uuid::Uuid;
use vireo::local::{LocalCloud, LocalCloudConfig};
use vireo::network::embedded::{EmbeddedConfig, EmbeddedNetworkDef, Mechanism};
use vireo_actors::events::{EventConfig, WaitPolicy};
use vireo_actors::instance::{BootSource, InstanceConfig, NetworkRequest, SpawnArgs};
use vireo_actors::network::{NetworkApi, PortRequest, PortUpdate};
use vireo_actors::vif::{PortId, VnicType};
use vireo_xml::metadata::Flavor;

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

pub struct Cloud {
    pub cloud: LocalCloud,
    pub dir: TempDir,
}

/// A local cloud with `hosts`, fatal waits of `timeout`.
pub async fn cloud(hosts: &[&str], timeout: Duration) -> Cloud {
    let dir = tempfile::tempdir().unwrap();
    let instances = InstanceConfig {
        wait: WaitPolicy {
            timeout,
            fatal: true,
        },
        profile_wait: Duration::from_secs(2),
        power_off_timeout: Duration::from_secs(5),
        power_off_poll: Duration::from_millis(20),
        ..InstanceConfig::default()
    };
    let network = EmbeddedConfig {
        networks: networks(),
        ..serde_json::from_str("{}").unwrap()
    };
    let cloud = LocalCloud::start(LocalCloudConfig {
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        dir: dir.path().to_owned(),
        network,
        instances,
        events: EventConfig::default(),
    })
    .await
    .unwrap();
    Cloud { cloud, dir }
}

pub fn flavor(name: &str, vcpus: u32, memory_mb: u64) -> Flavor {
    Flavor {
        name: name.into(),
        vcpus,
        memory_mb,
        root_gb: 1,
        extra_specs: Default::default(),
    }
}

pub fn spawn_args(name: &str, requests: Vec<PortRequest>) -> SpawnArgs {
    SpawnArgs {
        name: name.into(),
        flavor: flavor("m1.tiny", 1, 256),
        boot: BootSource::None,
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

pub fn uuid() -> Uuid {
    Uuid::new_v4()
}

pub fn ports(view: &vireo_actors::instance::InstanceView) -> Vec<PortId> {
    view.vifs.iter().map(|v| v.port).collect()
}
