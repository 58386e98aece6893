//! The network service: vireo's two implementations of
//! [`vireo_actors::network::NetworkApi`].
//!
//! - [`neutron`]: a REST client for a real Neutron (noauth or Keystone password auth,
//!   timeouts, bounded retries of idempotent requests, typed errors).
//! - [`embedded`]: an in-process port store following Neutron's port-status rules and
//!   emitting Nova external events, for hosts without a Neutron (the default).
//! - [`nova_owned`]: Nova network mode over the Neutron client (under nova-compute): reads
//!   only, Nova owns the ports.
//!
//! This module owns what both share: building Nova `network_info` VIF dicts from ports
//! ([`vif_dict`]) and the client-side flows built from the primitive operations
//! (allocate, deallocate, setup/teardown around a live migration, in `flows`). Those flows
//! are vireo's logic, not the server's, so both backends run the same code.

pub mod embedded;
mod flows;
pub mod neutron;
pub mod nova_owned;

use serde_json::{json, Map, Value};
use vireo_actors::network::{NetworkSummary, Port, PortStatus};
use vireo_actors::vif::NIC_NAME_LEN;

/// The `device_owner` vireo gives instance ports unless configured otherwise.
pub const DEFAULT_DEVICE_OWNER: &str = "compute:nova";

/// The OVS bridge Nova assumes when a binding names none (`[neutron] ovs_bridge`).
pub const DEFAULT_OVS_BRIDGE: &str = "br-int";

/// True when `owner` is `compute:<zone>` with a non-empty zone of printable characters.
pub fn valid_device_owner(owner: &str) -> bool {
    owner
        .strip_prefix(vireo_actors::network::COMPUTE_OWNER_PREFIX)
        .is_some_and(|zone| !zone.is_empty() && zone.chars().all(|c| c.is_ascii_graphic()))
}

/// Nova's network_info dict for one port (what Nova's `_build_vif_model` produces): `active`
/// is true when the port is ACTIVE or administratively down; `devname` is `tap` + the first
/// 11 characters of the id; `network.bridge` is the binding's `bridge_name` (else
/// `ovs_bridge`, Nova's `[neutron] ovs_bridge`: ML2/OVN names no bridge) for OVS, `brq` +
/// network id for a Linux bridge, cut to 14 characters.
pub fn vif_dict(
    port: &Port,
    network: &NetworkSummary,
    preserve_on_delete: bool,
    ovs_bridge: &str,
) -> Value {
    let id = port.id.to_string();
    let devname: String = format!("tap{id}").chars().take(NIC_NAME_LEN).collect();
    let details = &port.vif_details;
    let ovs_plugged = match port.vif_type.as_str() {
        "ovs" => true,
        "vhostuser" => details
            .get("vhostuser_ovs_plug")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        _ => false,
    };
    let bridge: Option<String> = if ovs_plugged {
        Some(
            details
                .get("bridge_name")
                .and_then(Value::as_str)
                .unwrap_or(ovs_bridge)
                .to_owned(),
        )
    } else if port.vif_type == "bridge" {
        Some(format!("brq{}", port.network_id))
    } else {
        None
    };
    let bridge = bridge.map(|b| b.chars().take(NIC_NAME_LEN).collect::<String>());

    let mut subnets: Vec<(String, Vec<Value>)> = Vec::new();
    for ip in &port.fixed_ips {
        let entry = json!({
            "address": ip.ip_address,
            "type": "fixed",
            "version": if ip.ip_address.contains(':') { 6 } else { 4 },
        });
        match subnets.iter_mut().find(|(s, _)| *s == ip.subnet_id) {
            Some((_, ips)) => ips.push(entry),
            None => subnets.push((ip.subnet_id.clone(), vec![entry])),
        }
    }
    let subnets: Vec<Value> = subnets
        .into_iter()
        .map(|(id, ips)| json!({"meta": {"subnet_id": id}, "ips": ips}))
        .collect();

    let mut net_meta = Map::new();
    net_meta.insert("injected".into(), Value::Bool(false));
    net_meta.insert("tenant_id".into(), Value::from(network.project_id.clone()));
    if let Some(mtu) = network.mtu {
        net_meta.insert("mtu".into(), Value::from(mtu));
    }
    if let Some(physnet) = &network.physical_network {
        net_meta.insert("physical_network".into(), Value::from(physnet.clone()));
    }

    json!({
        "id": id,
        "address": port.mac_address.to_string(),
        "type": port.vif_type,
        "vnic_type": port.vnic_type.as_str(),
        "details": Value::Object(details.clone()),
        "profile": Value::Object(port.profile.clone()),
        "devname": devname,
        "ovs_interfaceid": if ovs_plugged { Value::from(id.clone()) } else { Value::Null },
        "active": port.status == PortStatus::Active || !port.admin_state_up,
        "preserve_on_delete": preserve_on_delete,
        "delegate_create": true,
        "qbh_params": Value::Null,
        "qbg_params": Value::Null,
        "meta": {},
        "network": {
            "id": network.id,
            "bridge": bridge,
            "label": network.name,
            "subnets": subnets,
            "meta": Value::Object(net_meta),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;
    use vireo_actors::network::FixedIp;
    use vireo_actors::vif::{NetworkInfo, PortId, VifType, VnicType};

    fn port(vif_type: &str, details: Value) -> Port {
        Port {
            id: PortId(Uuid::parse_str("3b2c4d5e-0000-4000-8000-000000000001").unwrap()),
            network_id: "a1b2c3d4-e5f6-4000-8000-000000000009".into(),
            mac_address: "fa:16:3e:00:00:01".parse().unwrap(),
            device_id: String::new(),
            device_owner: String::new(),
            status: PortStatus::Down,
            admin_state_up: true,
            host_id: "h1".into(),
            vif_type: vif_type.into(),
            vnic_type: VnicType::Normal,
            vif_details: details.as_object().cloned().unwrap_or_default(),
            profile: Map::new(),
            fixed_ips: vec![
                FixedIp {
                    subnet_id: "s1".into(),
                    ip_address: "10.0.0.5".into(),
                },
                FixedIp {
                    subnet_id: "s2".into(),
                    ip_address: "fd00::5".into(),
                },
            ],
        }
    }

    fn net() -> NetworkSummary {
        NetworkSummary {
            id: "a1b2c3d4-e5f6-4000-8000-000000000009".into(),
            name: "private".into(),
            mtu: Some(1450),
            physical_network: None,
            project_id: "p".into(),
        }
    }

    #[test]
    fn ovs_hybrid_vif_parses_strictly_with_nova_defaults() {
        let p = port(
            "ovs",
            json!({"ovs_hybrid_plug": true, "port_filter": true, "datapath_type": "netdev"}),
        );
        let d = vif_dict(&p, &net(), false, DEFAULT_OVS_BRIDGE);
        let ni = NetworkInfo::from_value(&Value::Array(vec![d.clone()])).unwrap();
        let v = &ni.vifs[0];
        assert_eq!(v.vif_type, VifType::Ovs);
        assert!(v.details.ovs_hybrid_plug);
        assert!(!v.active && !v.preserve_on_delete);
        assert_eq!(v.devname.as_deref(), Some("tap3b2c4d5e-00"));
        assert_eq!(v.ovs_bridge(), "br-int");
        assert_eq!(v.network.mtu, Some(1450));
        assert_eq!(d["ovs_interfaceid"], json!(p.id.to_string()));
        assert_eq!(d["network"]["subnets"].as_array().unwrap().len(), 2);
        assert_eq!(d["network"]["subnets"][1]["ips"][0]["version"], json!(6));
    }

    #[test]
    fn active_and_bridge_names_follow_nova() {
        let mut p = port("bridge", json!({"port_filter": true}));
        p.status = PortStatus::Active;
        let d = vif_dict(&p, &net(), true, DEFAULT_OVS_BRIDGE);
        assert_eq!(d["active"], json!(true));
        assert_eq!(d["preserve_on_delete"], json!(true));
        assert_eq!(d["network"]["bridge"], json!("brqa1b2c3d4-e5"));
        assert_eq!(d["ovs_interfaceid"], Value::Null);
        let mut p = port("ovs", json!({"bridge_name": "br-custom"}));
        p.admin_state_up = false;
        let d = vif_dict(&p, &net(), false, DEFAULT_OVS_BRIDGE);
        assert_eq!(d["network"]["bridge"], json!("br-custom"));
        assert_eq!(d["active"], json!(true), "admin-down counts as active");
        let d = vif_dict(
            &port("hostdev_physical", json!({})),
            &net(),
            false,
            DEFAULT_OVS_BRIDGE,
        );
        assert_eq!(d["network"]["bridge"], Value::Null);
    }

    #[test]
    fn an_ovn_binding_goes_on_the_configured_bridge() {
        // ML2/OVN's vif_details (measured on Neutron 21): no bridge_name, no hybrid plug.
        let p = port("ovs", json!({"port_filter": true, "connectivity": "l2"}));
        let d = vif_dict(&p, &net(), false, "br-ovn");
        assert_eq!(d["network"]["bridge"], json!("br-ovn"));
        assert_eq!(d["ovs_interfaceid"], json!(p.id.to_string()));
        let v = NetworkInfo::from_value(&json!([d])).unwrap();
        assert_eq!(v.vifs[0].ovs_bridge(), "br-ovn");
        assert!(!v.vifs[0].details.ovs_hybrid_plug);
        // A binding that names its bridge keeps it.
        let p = port("ovs", json!({"bridge_name": "br-int"}));
        let d = vif_dict(&p, &net(), false, "br-ovn");
        assert_eq!(d["network"]["bridge"], json!("br-int"));
    }

    #[test]
    fn device_owner_validation() {
        assert!(valid_device_owner("compute:nova"));
        assert!(valid_device_owner("compute:az-1"));
        assert!(!valid_device_owner("compute:"));
        assert!(!valid_device_owner("network:dhcp"));
        assert!(!valid_device_owner("compute:a b"));
    }
}
