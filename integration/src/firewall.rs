//! The Neutron OVS agent's firewall driver (`iptables_hybrid` → hybrid plug, `openvswitch`
//! → native): read from the agent's report, switched with `host-setup.sh neutron-firewall`,
//! and put back as it was when the guard drops.

use std::process::Command;
use std::time::Instant;

use crate::env::StackEnv;
use crate::neutron::NeutronRaw;
use crate::HarnessError;

/// The two drivers the set-up knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Firewall {
    /// `iptables_hybrid`: ports bind with `ovs_hybrid_plug = true`.
    IptablesHybrid,
    /// `openvswitch`: ports bind with `ovs_hybrid_plug = false`.
    Openvswitch,
}

impl Firewall {
    /// host-setup.sh's name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Firewall::IptablesHybrid => "iptables_hybrid",
            Firewall::Openvswitch => "openvswitch",
        }
    }

    /// What the agent of `host` reports now (its `ovs_hybrid_plug`).
    pub async fn current(raw: &NeutronRaw, host: &str) -> Result<Firewall, HarnessError> {
        match raw.ovs_agent(host).await? {
            Some((true, Some(true))) => Ok(Firewall::IptablesHybrid),
            Some((true, Some(false))) => Ok(Firewall::Openvswitch),
            Some((false, _)) => Err(HarnessError::Setup(format!(
                "the Open vSwitch agent of {host} is not alive"
            ))),
            _ => Err(HarnessError::Setup(format!(
                "no Open vSwitch agent reports for {host} (ovs_hybrid_plug unknown)"
            ))),
        }
    }
}

/// Run `host-setup.sh neutron-firewall DRIVER`; returns how long it took.
pub fn switch(to: Firewall) -> Result<std::time::Duration, HarnessError> {
    let start = Instant::now();
    let out = Command::new("bash")
        .arg(StackEnv::host_setup_script())
        .args(["neutron-firewall", to.as_str()])
        .output()
        .map_err(|source| HarnessError::Io {
            what: "run host-setup.sh neutron-firewall".into(),
            source,
        })?;
    if !out.status.success() {
        let tail = |b: &[u8]| {
            let s = String::from_utf8_lossy(b).into_owned();
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        return Err(HarnessError::Setup(format!(
            "host-setup.sh neutron-firewall {} failed:\n{}\n{}",
            to.as_str(),
            tail(&out.stdout),
            tail(&out.stderr)
        )));
    }
    Ok(start.elapsed())
}

/// Switches to a driver and back to the one found when dropped.
#[derive(Debug)]
pub struct FirewallGuard {
    restore: Option<Firewall>,
    /// How long the switch took (zero when nothing had to change).
    pub took: std::time::Duration,
}

impl FirewallGuard {
    /// Make `to` the driver; remember what to restore.
    pub async fn to(
        raw: &NeutronRaw,
        host: &str,
        to: Firewall,
    ) -> Result<FirewallGuard, HarnessError> {
        let now = Firewall::current(raw, host).await?;
        if now == to {
            return Ok(FirewallGuard {
                restore: None,
                took: std::time::Duration::ZERO,
            });
        }
        let took = tokio::task::spawn_blocking(move || switch(to))
            .await
            .map_err(|e| HarnessError::Setup(format!("switch task: {e}")))??;
        Ok(FirewallGuard {
            restore: Some(now),
            took,
        })
    }

    /// Switch back now (instead of at drop); returns how long it took.
    pub fn restore(mut self) -> Result<std::time::Duration, HarnessError> {
        match self.restore.take() {
            Some(f) => switch(f),
            None => Ok(std::time::Duration::ZERO),
        }
    }
}

impl Drop for FirewallGuard {
    fn drop(&mut self) {
        if let Some(f) = self.restore.take() {
            if let Err(e) = switch(f) {
                eprintln!("could not restore the firewall driver {}: {e}", f.as_str());
            }
        }
    }
}
