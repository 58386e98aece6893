//! Plain REST calls to the real Neutron for what vireo's client does not do (agents, ports by
//! device id), and the test's view of the ports it created or let vireo create
//! ([`PortBook`]), which the leak check and the clean-up guard use.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;
use vireo::network::neutron::{NeutronClient, NeutronConfig};
use vireo_actors::network::{NetworkApi, PortUpdate};
use vireo_actors::vif::PortId;

use crate::HarnessError;

/// Raw Neutron REST (noauth: project and admin role headers).
#[derive(Debug, Clone)]
pub struct NeutronRaw {
    http: reqwest::Client,
    base: String,
}

impl NeutronRaw {
    /// For `url` (e.g. `http://127.0.0.1:9696`).
    pub fn new(url: &str) -> Result<NeutronRaw, HarnessError> {
        Ok(NeutronRaw {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .map_err(|e| HarnessError::Setup(format!("http client: {e}")))?,
            base: format!("{}/v2.0", url.trim_end_matches('/')),
        })
    }

    /// GET `path` (below `/v2.0`): the JSON answer of a 200.
    pub async fn get(&self, path: &str) -> Result<Value, HarnessError> {
        let url = format!("{}{path}", self.base);
        let resp = self
            .http
            .get(&url)
            .header("X-Project-Id", "vireo")
            .header("X-Roles", "admin")
            .send()
            .await
            .map_err(|e| HarnessError::Setup(format!("Neutron at {url} is not reachable: {e}")))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| HarnessError::Setup(format!("GET {url}: {e}")))?;
        if !status.is_success() {
            return Err(HarnessError::Setup(format!("GET {url}: {status} {text}")));
        }
        serde_json::from_str(&text).map_err(|e| HarnessError::Setup(format!("GET {url}: {e}")))
    }

    /// The port ids whose `device_id` is `device`.
    pub async fn ports_of_device(&self, device: Uuid) -> Result<Vec<Value>, HarnessError> {
        let v = self.get(&format!("/ports?device_id={device}")).await?;
        Ok(v["ports"].as_array().cloned().unwrap_or_default())
    }

    /// A port, or None when it does not exist.
    pub async fn port(&self, id: PortId) -> Result<Option<Value>, HarnessError> {
        let v = self.get(&format!("/ports?id={id}")).await?;
        Ok(v["ports"].as_array().and_then(|a| a.first()).cloned())
    }

    /// The port's bindings (`GET /ports/ID/bindings`).
    pub async fn bindings(&self, id: PortId) -> Result<Vec<Value>, HarnessError> {
        let v = self.get(&format!("/ports/{id}/bindings")).await?;
        Ok(v["bindings"].as_array().cloned().unwrap_or_default())
    }

    /// The Open vSwitch agent of `host`: (alive, `configurations.ovs_hybrid_plug`).
    pub async fn ovs_agent(
        &self,
        host: &str,
    ) -> Result<Option<(bool, Option<bool>)>, HarnessError> {
        let v = self.get(&format!("/agents?host={host}")).await?;
        Ok(v["agents"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["agent_type"] == "Open vSwitch agent")
            .map(|a| {
                (
                    a["alive"].as_bool().unwrap_or(false),
                    a["configurations"]["ovs_hybrid_plug"].as_bool(),
                )
            }))
    }
}

/// The ports one test deals with: those it made itself (user ports, to delete at the end)
/// and those vireo allocated (which vireo must have deleted), plus the instances.
#[derive(Debug, Default)]
pub struct PortBook {
    inner: Mutex<Book>,
}

#[derive(Debug, Default, Clone)]
struct Book {
    user: BTreeSet<PortId>,
    vireo: BTreeSet<PortId>,
    instances: BTreeSet<Uuid>,
}

impl PortBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A port the test created.
    pub fn user(&self, p: PortId) {
        self.lock().user.insert(p);
    }

    /// A port vireo created.
    pub fn vireo(&self, p: PortId) {
        self.lock().vireo.insert(p);
    }

    /// An instance of the test.
    pub fn instance(&self, i: Uuid) {
        self.lock().instances.insert(i);
    }

    /// User ports.
    pub fn user_ports(&self) -> Vec<PortId> {
        self.lock().user.iter().copied().collect()
    }

    /// vireo's ports.
    pub fn vireo_ports(&self) -> Vec<PortId> {
        self.lock().vireo.iter().copied().collect()
    }

    /// Instances.
    pub fn instances(&self) -> Vec<Uuid> {
        self.lock().instances.iter().copied().collect()
    }

    /// Every port.
    pub fn all_ports(&self) -> Vec<PortId> {
        let b = self.lock();
        b.user.union(&b.vireo).copied().collect()
    }
}

/// Deletes every port of a [`PortBook`] and every Neutron port of its instances when
/// dropped (after a failed test; a passing test has deleted them already).
#[derive(Debug)]
pub struct PortCleanup {
    /// The book.
    pub book: Arc<PortBook>,
    /// Neutron's URL.
    pub url: String,
}

impl Drop for PortCleanup {
    fn drop(&mut self) {
        let book = self.book.clone();
        let url = self.url.clone();
        let t = std::thread::Builder::new()
            .name("vireo-it-cleanup".into())
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                rt.block_on(async move {
                    let Ok(client) = NeutronClient::new(NeutronConfig::new(url.clone())) else {
                        return;
                    };
                    let mut ports: BTreeSet<PortId> = book.all_ports().into_iter().collect();
                    for i in book.instances() {
                        if let Ok(found) = client.list_instance_ports(i).await {
                            ports.extend(found.iter().map(|p| p.id));
                        }
                    }
                    for p in ports {
                        // Unbind first: a bound port's delete also works, but an unbind
                        // leaves nothing on the host's agent if the delete fails.
                        let _ = client
                            .update_port(
                                p,
                                &PortUpdate {
                                    host_id: Some(String::new()),
                                    ..PortUpdate::default()
                                },
                            )
                            .await;
                        let _ = client.delete_port(p).await;
                    }
                });
            });
        if let Ok(t) = t {
            let _ = t.join();
        }
    }
}
