//! The files of an OpenStack config drive, as cloud-init's ConfigDrive data source reads
//! them: `openstack/latest/meta_data.json`, `network_data.json` derived from the instance's
//! `network_info`, `user_data` when given, and an empty `vendor_data.json`. The storage
//! writes them into an ISO 9660 image labelled `config-2`.
//!
//! `network_data.json` follows the layout Nova's metadata service documents: one link per
//! VIF (its device name, MAC, MTU and port id), one network per subnet of that VIF (static
//! with its first fixed address, netmask and routes, or `ipv4_dhcp`/`ipv6_dhcp` when the
//! subnet has a DHCP server), and the DNS servers as services.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::{json, Map, Value};
use uuid::Uuid;

use crate::vif::{NetworkInfo, Vif};

use super::{ConfigDrive, MAX_USER_DATA};

/// One file of a config drive, its path relative to the drive's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigDriveFile {
    /// `openstack/latest/meta_data.json`, ...
    pub path: String,
    /// Its bytes.
    pub contents: Vec<u8>,
}

/// Why a config drive's files could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConfigDriveError {
    /// `user_data` over [`MAX_USER_DATA`] bytes.
    #[error("user_data of {0} bytes, at most {MAX_USER_DATA}")]
    UserDataTooLarge(usize),
    /// A VIF's stored JSON does not read back.
    #[error("network_info of port {port}")]
    NetworkInfo {
        /// The port.
        port: Uuid,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A subnet's CIDR is not an address and a prefix length.
    #[error("port {port}: subnet cidr {cidr:?}")]
    Cidr {
        /// The port.
        port: Uuid,
        /// The CIDR given.
        cidr: String,
    },
    /// A file could not be encoded.
    #[error("encode {0}")]
    Encode(&'static str, #[source] serde_json::Error),
}

const LATEST: &str = "openstack/latest";

/// The files of the config drive of instance `uuid` named `name`.
pub fn config_drive_files(
    uuid: Uuid,
    name: &str,
    drive: &ConfigDrive,
    network_info: &NetworkInfo,
) -> Result<Vec<ConfigDriveFile>, ConfigDriveError> {
    if let Some(u) = &drive.user_data {
        if u.len() > MAX_USER_DATA {
            return Err(ConfigDriveError::UserDataTooLarge(u.len()));
        }
    }
    let keys: Vec<Value> = drive
        .public_keys
        .iter()
        .map(|(name, data)| json!({"name": name, "type": "ssh", "data": data}))
        .collect();
    let meta = json!({
        "uuid": uuid.to_string(),
        "name": name,
        "hostname": drive.hostname.as_deref().unwrap_or(name),
        "launch_index": 0,
        "availability_zone": drive.availability_zone,
        "public_keys": drive.public_keys,
        "keys": keys,
        "meta": drive.meta,
        "devices": [],
    });
    let encode =
        |what, v: &Value| serde_json::to_vec(v).map_err(|e| ConfigDriveError::Encode(what, e));
    let mut files = vec![
        ConfigDriveFile {
            path: format!("{LATEST}/meta_data.json"),
            contents: encode("meta_data.json", &meta)?,
        },
        ConfigDriveFile {
            path: format!("{LATEST}/network_data.json"),
            contents: encode("network_data.json", &network_data(network_info)?)?,
        },
        ConfigDriveFile {
            path: format!("{LATEST}/vendor_data.json"),
            contents: b"{}".to_vec(),
        },
    ];
    if let Some(u) = &drive.user_data {
        files.push(ConfigDriveFile {
            path: format!("{LATEST}/user_data"),
            contents: u.clone().into_bytes(),
        });
    }
    Ok(files)
}

/// `network_data.json` of `network_info`.
pub fn network_data(network_info: &NetworkInfo) -> Result<Value, ConfigDriveError> {
    let mut links = Vec::new();
    let mut networks = Vec::new();
    let mut services: Vec<Value> = Vec::new();
    for vif in &network_info.vifs {
        let port = vif.id.0;
        let raw: Value = serde_json::from_str(&vif.raw)
            .map_err(|source| ConfigDriveError::NetworkInfo { port, source })?;
        let link_id = link_id(vif);
        let mut link = Map::new();
        link.insert("id".into(), json!(link_id));
        link.insert("vif_id".into(), json!(port.to_string()));
        link.insert("type".into(), json!(vif.vif_type.to_string()));
        link.insert(
            "ethernet_mac_address".into(),
            json!(vif.address.to_string()),
        );
        if let Some(mtu) = vif.network.mtu {
            link.insert("mtu".into(), json!(mtu));
        }
        links.push(Value::Object(link));
        let subnets = raw
            .pointer("/network/subnets")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for subnet in &subnets {
            if let Some(net) = subnet_network(vif, &link_id, networks.len(), subnet)? {
                for s in net["services"].as_array().into_iter().flatten() {
                    if !services.contains(s) {
                        services.push(s.clone());
                    }
                }
                networks.push(net);
            }
        }
    }
    Ok(json!({"links": links, "networks": networks, "services": services}))
}

fn link_id(vif: &Vif) -> String {
    vif.devname
        .clone()
        .unwrap_or_else(|| format!("tap{}", &vif.id.0.to_string()[..11]))
}

/// The network entry of one subnet of `vif` (none for a subnet with no address here).
fn subnet_network(
    vif: &Vif,
    link: &str,
    index: usize,
    subnet: &Value,
) -> Result<Option<Value>, ConfigDriveError> {
    let port = vif.id.0;
    let cidr = subnet["cidr"].as_str().unwrap_or_default();
    let (prefix_addr, prefix_len) = parse_cidr(cidr).ok_or_else(|| ConfigDriveError::Cidr {
        port,
        cidr: cidr.to_owned(),
    })?;
    let version = if prefix_addr.is_ipv4() { 4 } else { 6 };
    let network_id = vif.network.id.clone();
    let dns: Vec<Value> = subnet["dns"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["address"].as_str())
        .map(|a| json!({"type": "dns", "address": a}))
        .collect();
    let id = format!("network{index}");
    if subnet
        .pointer("/meta/dhcp_server")
        .is_some_and(|v| !v.is_null())
    {
        return Ok(Some(json!({
            "id": id,
            "type": format!("ipv{version}_dhcp"),
            "link": link,
            "network_id": network_id,
            "services": dns,
        })));
    }
    let Some(address) = subnet["ips"]
        .as_array()
        .and_then(|ips| ips.first())
        .and_then(|ip| ip["address"].as_str())
    else {
        return Ok(None);
    };
    let any = if version == 4 { "0.0.0.0" } else { "::" };
    let mut routes = Vec::new();
    if let Some(gw) = subnet.pointer("/gateway/address").and_then(Value::as_str) {
        routes.push(json!({"network": any, "netmask": any, "gateway": gw}));
    }
    for r in subnet["routes"].as_array().into_iter().flatten() {
        let (Some(c), Some(gw)) = (
            r["cidr"].as_str(),
            r.pointer("/gateway/address").and_then(Value::as_str),
        ) else {
            continue;
        };
        if let Some((net, len)) = parse_cidr(c) {
            routes.push(
                json!({"network": net.to_string(), "netmask": netmask(net, len), "gateway": gw}),
            );
        }
    }
    Ok(Some(json!({
        "id": id,
        "type": format!("ipv{version}"),
        "link": link,
        "ip_address": address,
        "netmask": netmask(prefix_addr, prefix_len),
        "routes": routes,
        "network_id": network_id,
        "services": dns,
    })))
}

fn parse_cidr(cidr: &str) -> Option<(IpAddr, u8)> {
    let (addr, len) = cidr.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    let len: u8 = len.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((addr, len))
}

/// The netmask of a prefix length, in the address family of `addr`.
fn netmask(addr: IpAddr, len: u8) -> String {
    match addr {
        IpAddr::V4(_) => {
            let bits = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            Ipv4Addr::from(bits).to_string()
        }
        IpAddr::V6(_) => {
            let bits = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            Ipv6Addr::from(bits).to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network_info() -> NetworkInfo {
        let doc = json!([
            {
                "id": "9d3e0c4e-1111-4a2b-8c3d-000000000001",
                "address": "fa:16:3e:00:00:01",
                "type": "ovs",
                "vnic_type": "normal",
                "devname": "tap9d3e0c4e-11",
                "details": {"ovs_hybrid_plug": false, "port_filter": true},
                "network": {
                    "id": "be4c0000-0000-4000-8000-000000000001",
                    "bridge": "br-int",
                    "meta": {"mtu": 1450},
                    "subnets": [
                        {
                            "cidr": "10.0.0.0/24",
                            "gateway": {"address": "10.0.0.1"},
                            "ips": [{"address": "10.0.0.5", "type": "fixed"}],
                            "dns": [{"address": "10.0.0.2"}],
                            "routes": [{"cidr": "192.168.0.0/16", "gateway": {"address": "10.0.0.254"}}]
                        },
                        {
                            "cidr": "fd00::/64",
                            "ips": [{"address": "fd00::5"}],
                            "meta": {"dhcp_server": "fd00::2"}
                        }
                    ]
                },
                "active": false
            }
        ]);
        NetworkInfo::from_value(&doc).unwrap()
    }

    fn file<'a>(files: &'a [ConfigDriveFile], name: &str) -> &'a [u8] {
        &files
            .iter()
            .find(|f| f.path == format!("{LATEST}/{name}"))
            .unwrap_or_else(|| panic!("no {name}"))
            .contents
    }

    #[test]
    fn meta_data_carries_the_instance_keys_and_metadata() {
        let uuid = Uuid::new_v4();
        let drive = ConfigDrive {
            user_data: Some("#cloud-config\n".into()),
            public_keys: [("k1".to_owned(), "ssh-ed25519 AAAA k1".to_owned())].into(),
            meta: [("role".to_owned(), "web".to_owned())].into(),
            hostname: None,
            availability_zone: Some("az1".into()),
        };
        let files = config_drive_files(uuid, "vm-1", &drive, &network_info()).unwrap();
        let meta: Value = serde_json::from_slice(file(&files, "meta_data.json")).unwrap();
        assert_eq!(meta["uuid"], uuid.to_string());
        assert_eq!(meta["hostname"], "vm-1");
        assert_eq!(meta["availability_zone"], "az1");
        assert_eq!(meta["public_keys"]["k1"], "ssh-ed25519 AAAA k1");
        assert_eq!(meta["keys"][0]["type"], "ssh");
        assert_eq!(meta["meta"]["role"], "web");
        assert_eq!(file(&files, "user_data"), b"#cloud-config\n");
        assert_eq!(file(&files, "vendor_data.json"), b"{}");
        // No user data, no file.
        let bare =
            config_drive_files(uuid, "vm-1", &ConfigDrive::default(), &network_info()).unwrap();
        assert!(!bare.iter().any(|f| f.path.ends_with("user_data")));
    }

    #[test]
    fn network_data_has_a_link_per_vif_and_a_network_per_subnet() {
        let nd = network_data(&network_info()).unwrap();
        let link = &nd["links"][0];
        assert_eq!(link["id"], "tap9d3e0c4e-11");
        assert_eq!(link["ethernet_mac_address"], "fa:16:3e:00:00:01");
        assert_eq!(link["vif_id"], "9d3e0c4e-1111-4a2b-8c3d-000000000001");
        assert_eq!(link["type"], "ovs");
        let v4 = &nd["networks"][0];
        assert_eq!(v4["type"], "ipv4");
        assert_eq!(v4["link"], "tap9d3e0c4e-11");
        assert_eq!(v4["ip_address"], "10.0.0.5");
        assert_eq!(v4["netmask"], "255.255.255.0");
        assert_eq!(v4["routes"][0]["gateway"], "10.0.0.1");
        assert_eq!(v4["routes"][1]["network"], "192.168.0.0");
        assert_eq!(v4["routes"][1]["netmask"], "255.255.0.0");
        assert_eq!(v4["network_id"], "be4c0000-0000-4000-8000-000000000001");
        let v6 = &nd["networks"][1];
        assert_eq!(v6["type"], "ipv6_dhcp");
        assert_eq!(v6["id"], "network1");
        assert_eq!(
            nd["services"],
            json!([{"type": "dns", "address": "10.0.0.2"}])
        );
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let too_big = ConfigDrive {
            user_data: Some("x".repeat(MAX_USER_DATA + 1)),
            ..ConfigDrive::default()
        };
        assert!(matches!(
            config_drive_files(Uuid::new_v4(), "vm", &too_big, &network_info()),
            Err(ConfigDriveError::UserDataTooLarge(n)) if n == MAX_USER_DATA + 1
        ));
        let mut doc: Value = serde_json::from_str(&network_info().vifs[0].raw).unwrap();
        doc["network"]["subnets"][0]["cidr"] = json!("10.0.0.0/33");
        let ni = NetworkInfo::from_value(&json!([doc])).unwrap();
        assert!(matches!(
            network_data(&ni),
            Err(ConfigDriveError::Cidr { .. })
        ));
    }

    #[test]
    fn netmasks_of_both_families() {
        assert_eq!(netmask("10.0.0.0".parse().unwrap(), 0), "0.0.0.0");
        assert_eq!(netmask("10.0.0.0".parse().unwrap(), 32), "255.255.255.255");
        assert_eq!(netmask("10.0.0.0".parse().unwrap(), 20), "255.255.240.0");
        assert_eq!(
            netmask("fd00::".parse().unwrap(), 64),
            "ffff:ffff:ffff:ffff::"
        );
        assert_eq!(parse_cidr("fd00::/129"), None);
        assert_eq!(parse_cidr("nonsense"), None);
    }
}
