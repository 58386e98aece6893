//! Device-name rules of the host plugger: which names vireo may create, touch or delete.
//!
//! The os-vif/Nova derivation (prefix + the first 11 characters of the port id, 14 in all,
//! under IFNAMSIZ) lives in [`vireo_actors::vif::Vif`]. This module checks every name before
//! it reaches netlink, OVSDB or sysfs: a valid Linux interface name, and for the names vireo
//! creates or deletes, the expected prefix. A user controls `devname`, `network.bridge`,
//! `details.bridge_name` and `details.physical_interface`; a `devname` that does not start
//! with `tap` is refused, so an unplug can never delete, say, `eth0`. Names never go to a
//! shell (vireo runs no shell), but they are checked as if they could.

use vireo_actors::plug::PlugError;
use vireo_actors::vif::{valid_ifname, PortId};

/// Why a name is refused (used in [`PlugError::InvalidName`]).
const NOT_IFNAME: &str = "not a valid interface name (1-15 of [A-Za-z0-9._-])";

/// A valid interface name, or [`PlugError::InvalidName`].
pub fn ifname(port: PortId, name: &str) -> Result<String, PlugError> {
    if valid_ifname(name) {
        Ok(name.to_owned())
    } else {
        Err(PlugError::InvalidName {
            port,
            name: name.to_owned(),
            reason: NOT_IFNAME,
        })
    }
}

/// A name vireo creates and deletes for a port: a valid interface name that starts with
/// `prefix` (`tap`, `qbr`, `qvb`, `qvo`).
pub fn owned(port: PortId, name: &str, prefix: &'static str) -> Result<String, PlugError> {
    let name = ifname(port, name)?;
    if name.len() > prefix.len() && name.starts_with(prefix) {
        Ok(name)
    } else {
        Err(PlugError::InvalidName {
            port,
            name,
            reason: match prefix {
                "tap" => "a device vireo creates or deletes must start with `tap`",
                "qbr" => "a device vireo creates or deletes must start with `qbr`",
                "qvb" => "a device vireo creates or deletes must start with `qvb`",
                _ => "a device vireo creates or deletes must start with `qvo`",
            },
        })
    }
}

/// The OVS bridges vireo refuses to plug into: none. The integration bridge name comes from
/// the VIF and is validated as an interface name (OVS creates an internal port of the same
/// name).
pub fn ovs_bridge(port: PortId, name: &str) -> Result<String, PlugError> {
    ifname(port, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn port() -> PortId {
        PortId(Uuid::from_u128(1))
    }

    #[test]
    fn refuses_names_that_are_not_interface_names() {
        for bad in [
            "",
            ".",
            "..",
            "tap;rm -rf /",
            "tap 1",
            "tap/1",
            "tap$(x)",
            "tap0123456789abc",
            "tapé",
        ] {
            assert!(
                matches!(ifname(port(), bad), Err(PlugError::InvalidName { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(ifname(port(), "br-int").unwrap(), "br-int");
    }

    #[test]
    fn owned_names_need_their_prefix() {
        assert_eq!(
            owned(port(), "tap3b2c4d5e-00", "tap").unwrap(),
            "tap3b2c4d5e-00"
        );
        for bad in ["eth0", "tap", "qbr3b2c4d5e-00", "lo"] {
            let err = owned(port(), bad, "tap").unwrap_err();
            assert!(
                matches!(err, PlugError::InvalidName { ref name, .. } if name == bad),
                "{bad}"
            );
        }
        assert!(owned(port(), "qvo1", "qvo").is_ok());
        assert!(owned(port(), "qvb1", "qvo").is_err());
    }
}
