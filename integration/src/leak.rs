//! The leak check every scenario ends with: nothing the test (or vireo for it) created is
//! left — no domain, no tap/veth/bridge/OVS port (seen from the outside, by name fragment),
//! no instance actor, no pending wait; in Neutron no port vireo created, no port of the
//! test's instances, every user port unbound (no host, device id or owner, no
//! `migrating_to`, no inactive binding); in the embedded service the same, nothing wired.

use std::time::{Duration, Instant};

use vireo::compute::ComputeDriver;
use vireo::plug::leak;
use vireo_actors::network::NetworkApi;

use crate::host::Host;
use crate::neutron::{NeutronRaw, PortBook};
use crate::HarnessError;

/// How long state that follows asynchronously (watchers, mailboxes) may lag.
const SETTLE: Duration = Duration::from_secs(5);

/// Everything a check looks at.
#[derive(Debug)]
pub struct LeakCheck<'a> {
    /// The test's hosts.
    pub hosts: &'a [&'a Host],
    /// The test's ports and instances.
    pub book: &'a PortBook,
    /// Neutron.
    pub raw: &'a NeutronRaw,
    /// Name fragments of host devices and domains (port-id prefixes are added).
    pub fragments: Vec<String>,
}

async fn host_scan(fragments: Vec<String>) -> Result<leak::Leaks, HarnessError> {
    tokio::task::spawn_blocking(move || leak::scan(&fragments))
        .await
        .map_err(|e| HarnessError::Setup(format!("scan task: {e}")))?
        .map_err(|e| HarnessError::Setup(format!("scan the host: {e}")))
}

impl LeakCheck<'_> {
    /// Run the check; the error lists everything found.
    pub async fn run(&self) -> Result<(), HarnessError> {
        let mut found: Vec<String> = Vec::new();
        let instances = self.book.instances();
        // Hosts: instances, domains, plugged devices, waits.
        for h in self.hosts {
            let views = h.driver.list().await;
            let mine: Vec<_> = views
                .iter()
                .filter(|v| instances.contains(&v.uuid))
                .map(|v| format!("{} ({:?})", v.uuid, v.state))
                .collect();
            if !mine.is_empty() {
                found.push(format!("{}: instance actors {mine:?}", h.name));
            }
            let domains = h
                .driver
                .libvirt()
                .list_all()
                .await
                .map_err(|e| HarnessError::Setup(format!("list domains: {e}")))?;
            let left: Vec<_> = domains
                .iter()
                .filter(|d| instances.contains(&d.uuid))
                .map(|d| d.name.clone())
                .collect();
            if !left.is_empty() {
                found.push(format!("{}: domains {left:?}", h.name));
            }
            // Disks: no directory of the test's instances, no unfinished image fetch.
            let dirs: Vec<_> = instances
                .iter()
                .map(|u| h.state_dir.join("instances").join(u.to_string()))
                .filter(|d| d.exists())
                .collect();
            if !dirs.is_empty() {
                found.push(format!("{}: instance directories {dirs:?}", h.name));
            }
            let fetches: Vec<_> = std::fs::read_dir(h.state_dir.join("_base"))
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.starts_with(".fetch-"))
                        .collect()
                })
                .unwrap_or_default();
            if !fetches.is_empty() {
                found.push(format!("{}: unfinished image fetches {fetches:?}", h.name));
            }
            if let Some(r) = &h.recording {
                let plugged = r.plugged();
                if !plugged.is_empty() {
                    found.push(format!("{}: recorded as plugged {plugged:?}", h.name));
                }
            }
        }
        let deadline = Instant::now() + SETTLE;
        loop {
            let mut waits = Vec::new();
            for h in self.hosts {
                let s = h
                    .events
                    .stats()
                    .await
                    .map_err(|_| HarnessError::Setup("event actor gone".into()))?;
                if s.waits_now > 0 {
                    waits.push(format!("{}: {} waits pending", h.name, s.waits_now));
                }
            }
            let mut wired = Vec::new();
            for h in self.hosts {
                if let Some(e) = &h.embedded {
                    for p in e.ports() {
                        if e.is_wired(&h.name, p.id) {
                            wired.push(format!("{}: {} wired", h.name, p.id));
                        }
                    }
                }
            }
            if waits.is_empty() && wired.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                found.extend(waits);
                found.extend(wired);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Host devices, by name.
        let mut fragments = self.fragments.clone();
        fragments.extend(self.book.all_ports().iter().map(|p| p.prefix(11)));
        let deadline = Instant::now() + SETTLE;
        loop {
            let leaks = host_scan(fragments.clone()).await?;
            if leaks.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                found.push(format!("host: {leaks}"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Neutron and the embedded service.
        let embedded: Vec<_> = self
            .hosts
            .iter()
            .filter_map(|h| h.embedded.clone())
            .collect();
        for i in &instances {
            let ports = self.raw.ports_of_device(*i).await?;
            if !ports.is_empty() {
                let ids: Vec<_> = ports.iter().map(|p| p["id"].clone()).collect();
                found.push(format!("Neutron: ports of instance {i}: {ids:?}"));
            }
            for e in &embedded {
                let left = e.list_instance_ports(*i).await.unwrap_or_default();
                if !left.is_empty() {
                    let ids: Vec<_> = left.iter().map(|p| p.id).collect();
                    found.push(format!("embedded: ports of instance {i}: {ids:?}"));
                }
            }
        }
        for p in self.book.vireo_ports() {
            if self.raw.port(p).await?.is_some() {
                found.push(format!("Neutron: port {p} vireo created is still there"));
            }
            for e in &embedded {
                if e.port_status(p).is_some() {
                    found.push(format!("embedded: port {p} vireo created is still there"));
                }
            }
        }
        for p in self.book.user_ports() {
            if let Some(port) = self.raw.port(p).await? {
                let host = port["binding:host_id"].as_str().unwrap_or("");
                let dev = port["device_id"].as_str().unwrap_or("");
                let owner = port["device_owner"].as_str().unwrap_or("");
                if !host.is_empty() || !dev.is_empty() || !owner.is_empty() {
                    found.push(format!(
                        "Neutron: user port {p} not unbound (host {host:?}, device {dev:?}, owner {owner:?})"
                    ));
                }
                if port["binding:profile"].get("migrating_to").is_some() {
                    found.push(format!("Neutron: user port {p} keeps migrating_to"));
                }
                // Neutron shows bindings of compute ports only; an unbound port was
                // reported above already.
                let bindings = if owner.starts_with("compute:") {
                    self.raw.bindings(p).await?
                } else {
                    Vec::new()
                };
                for b in bindings {
                    if b["status"] == "INACTIVE" {
                        found.push(format!(
                            "Neutron: user port {p} keeps an inactive binding for {}",
                            b["host"]
                        ));
                    }
                }
                continue;
            }
            for e in &embedded {
                if let Ok(port) = e.get_port(p).await {
                    if !port.host_id.is_empty()
                        || !port.device_id.is_empty()
                        || port.migrating_to().is_some()
                    {
                        found.push(format!("embedded: user port {p} not unbound: {port:?}"));
                    }
                }
            }
        }
        if found.is_empty() {
            Ok(())
        } else {
            Err(HarnessError::Leak(found.join("\n  ")))
        }
    }
}
