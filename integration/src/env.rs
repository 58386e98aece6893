//! The running set-up, as `integration/host-setup.sh up --with-neutron` describes it in
//! `/var/lib/vireo-integration/neutron.env` (`KEY=value` lines); a variable of the same name
//! in the environment wins. A missing set-up is an error (tests fail, they never skip).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::HarnessError;

/// Where `host-setup.sh` writes the Neutron set-up's facts.
pub const ENV_FILE: &str = "/var/lib/vireo-integration/neutron.env";

/// The facts of the running set-up the tests need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackEnv {
    /// Neutron's endpoint (`VIREO_NEUTRON_URL`).
    pub neutron_url: String,
    /// This host as Neutron knows it (`VIREO_NEUTRON_HOST`).
    pub host: String,
    /// A second host name Neutron can bind to, where nothing wires ports
    /// (`VIREO_NEUTRON_SECOND_HOST`, the state reporter's `h2`).
    pub second_host: String,
    /// The test network (`VIREO_NEUTRON_NETWORK_ID`).
    pub network_id: String,
    /// Its subnet (`VIREO_NEUTRON_SUBNET_ID`).
    pub subnet_id: String,
    /// The Linux bridge agent's host (`VIREO_NEUTRON_LB_HOST`): a port bound to it is a
    /// Linux bridge port, wired in this namespace, its events sent by that agent.
    pub lb_host: String,
    /// The flat network the Linux bridge agent serves (`VIREO_NEUTRON_LB_NETWORK_ID`).
    pub lb_network_id: String,
    /// The ML2/OVN Neutron (`VIREO_OVN_NEUTRON_URL`): a second neutron-server whose one
    /// chassis is an ovn-controller on this machine's Open vSwitch.
    pub ovn_neutron_url: String,
    /// That chassis' host (`VIREO_OVN_HOST`): a port bound to it is wired here, on
    /// [`StackEnv::ovn_bridge`], its events sent by the ML2/OVN Neutron.
    pub ovn_host: String,
    /// The ML2/OVN Neutron's geneve network (`VIREO_OVN_NETWORK_ID`).
    pub ovn_network_id: String,
    /// ovn-controller's integration bridge (`VIREO_OVN_BRIDGE`; ML2/OVN bindings name none).
    pub ovn_bridge: String,
    /// OVN's northbound database (`VIREO_OVN_NB_DB`, an ovsdb remote): where a logical
    /// port's `up` shows whether its chassis claimed it, whatever Neutron's status says.
    pub ovn_nb_db: String,
    /// The port Neutron's Nova notifier posts to on 127.0.0.1 (`VIREO_NOVA_PORT`).
    pub nova_port: u16,
    /// The events token Neutron's notifier sends (`[nova] auth_type = admin_token`), in a
    /// 0600 file (`VIREO_EVENTS_TOKEN_FILE`).
    pub events_token_file: PathBuf,
}

const KEYS: [&str; 14] = [
    "VIREO_NEUTRON_URL",
    "VIREO_NEUTRON_HOST",
    "VIREO_NEUTRON_SECOND_HOST",
    "VIREO_NEUTRON_NETWORK_ID",
    "VIREO_NEUTRON_SUBNET_ID",
    "VIREO_NEUTRON_LB_HOST",
    "VIREO_NEUTRON_LB_NETWORK_ID",
    "VIREO_OVN_NEUTRON_URL",
    "VIREO_OVN_HOST",
    "VIREO_OVN_NETWORK_ID",
    "VIREO_OVN_BRIDGE",
    "VIREO_OVN_NB_DB",
    "VIREO_NOVA_PORT",
    "VIREO_EVENTS_TOKEN_FILE",
];

impl StackEnv {
    /// Read [`ENV_FILE`] (when present) and the environment.
    pub fn load() -> Result<StackEnv, HarnessError> {
        Self::load_from(Path::new(ENV_FILE), |k| std::env::var(k).ok())
    }

    /// Read `file` (when present) with `var` overriding it.
    pub fn load_from(
        file: &Path,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<StackEnv, HarnessError> {
        let mut values: BTreeMap<String, String> = match std::fs::read_to_string(file) {
            Ok(text) => parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => {
                return Err(HarnessError::Io {
                    what: format!("read {}", file.display()),
                    source,
                })
            }
        };
        for k in KEYS {
            if let Some(v) = var(k) {
                values.insert(k.to_owned(), v);
            }
        }
        let get = |k: &str| {
            values
                .get(k)
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or_else(|| {
                    HarnessError::Setup(format!(
                        "{k} is not set: run `integration/host-setup.sh up --with-neutron` \
                     (it writes {})",
                        file.display()
                    ))
                })
        };
        let nova_port = get("VIREO_NOVA_PORT")?;
        Ok(StackEnv {
            neutron_url: get("VIREO_NEUTRON_URL")?,
            host: get("VIREO_NEUTRON_HOST")?,
            second_host: get("VIREO_NEUTRON_SECOND_HOST")?,
            network_id: get("VIREO_NEUTRON_NETWORK_ID")?,
            subnet_id: get("VIREO_NEUTRON_SUBNET_ID")?,
            lb_host: get("VIREO_NEUTRON_LB_HOST")?,
            lb_network_id: get("VIREO_NEUTRON_LB_NETWORK_ID")?,
            ovn_neutron_url: get("VIREO_OVN_NEUTRON_URL")?,
            ovn_host: get("VIREO_OVN_HOST")?,
            ovn_network_id: get("VIREO_OVN_NETWORK_ID")?,
            ovn_bridge: get("VIREO_OVN_BRIDGE")?,
            ovn_nb_db: get("VIREO_OVN_NB_DB")?,
            nova_port: nova_port.parse().map_err(|_| {
                HarnessError::Setup(format!("VIREO_NOVA_PORT {nova_port:?} is not a port"))
            })?,
            events_token_file: PathBuf::from(get("VIREO_EVENTS_TOKEN_FILE")?),
        })
    }

    /// `integration/host-setup.sh` of this source tree.
    pub fn host_setup_script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("host-setup.sh")
    }

    /// `integration/guest/build-guest.sh` of this source tree.
    pub fn guest_builder() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("guest")
            .join("build-guest.sh")
    }
}

/// `KEY=value` lines; blank lines, comments and an `export ` prefix are allowed; surrounding
/// single or double quotes are removed.
fn parse(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let l = l.strip_prefix("export ").unwrap_or(l);
            let (k, v) = l.split_once('=')?;
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(v);
            Some((k.trim().to_owned(), v.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_values_and_environment_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("neutron.env");
        std::fs::write(
            &f,
            "# comment\nVIREO_NEUTRON_URL=http://127.0.0.1:9696\nexport VIREO_NEUTRON_HOST='vm'\n\
             VIREO_NEUTRON_SECOND_HOST=h2\nVIREO_NEUTRON_NETWORK_ID=n\nVIREO_NEUTRON_SUBNET_ID=s\n\
             VIREO_NEUTRON_LB_HOST=vm-lb\nVIREO_NEUTRON_LB_NETWORK_ID=lb\n\
             VIREO_OVN_NEUTRON_URL=http://127.0.0.1:9796\nVIREO_OVN_HOST=vm-ovn\n\
             VIREO_OVN_NETWORK_ID=o\nVIREO_OVN_BRIDGE=br-ovn\nVIREO_OVN_NB_DB=unix:/nb\n\
             VIREO_NOVA_PORT=8774\nVIREO_EVENTS_TOKEN_FILE=/etc/t\n",
        )
        .unwrap();
        let env =
            StackEnv::load_from(&f, |k| (k == "VIREO_NOVA_PORT").then(|| "9999".into())).unwrap();
        assert_eq!(env.host, "vm");
        assert_eq!(env.nova_port, 9999);
        assert_eq!(env.network_id, "n");
        assert_eq!(
            (env.lb_host.as_str(), env.lb_network_id.as_str()),
            ("vm-lb", "lb")
        );
        assert_eq!(
            (
                env.ovn_host.as_str(),
                env.ovn_network_id.as_str(),
                env.ovn_bridge.as_str()
            ),
            ("vm-ovn", "o", "br-ovn")
        );
        assert_eq!(env.events_token_file, Path::new("/etc/t"));
        let missing = StackEnv::load_from(&dir.path().join("none"), |_| None).unwrap_err();
        assert!(missing.to_string().contains("host-setup.sh"), "{missing}");
        let bad = StackEnv::load_from(&f, |k| (k == "VIREO_NOVA_PORT").then(|| "x".into()));
        assert!(bad.is_err());
    }
}
