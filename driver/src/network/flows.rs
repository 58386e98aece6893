//! The composite network operations, built from [`NetworkApi`]'s primitive ones and shared
//! by both backends: allocate (with cleanup on failure), deallocate, and the live-migration
//! setup/teardown of `binding:profile.migrating_to` and destination bindings.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;
use tracing::{debug, info_span, warn, Instrument};
use uuid::Uuid;
use vireo_actors::network::{
    release_port, unbind_update, Deallocation, HostSetupChange, MigrationHosts, NetworkApi,
    NetworkError, NetworkSummary, Port, PortRequest, PortUpdate, Removal, MIGRATING_TO,
};
use vireo_actors::vif::{NetworkInfo, PortId, VifError};

use super::vif_dict;

/// [`NetworkApi::allocate_for_instance`] for any backend; `owner` is the `device_owner`,
/// `ovs_bridge` the OVS bridge of a binding that names none (Nova's `[neutron] ovs_bridge`).
pub(crate) async fn allocate<A: NetworkApi + ?Sized>(
    api: &A,
    owner: &str,
    ovs_bridge: &str,
    instance: Uuid,
    host: &str,
    requests: &[PortRequest],
) -> Result<NetworkInfo, NetworkError> {
    let span = info_span!("allocate_for_instance", instance = %instance, host);
    async {
        let mut made = Made::default();
        let result =
            allocate_steps(api, owner, ovs_bridge, instance, host, requests, &mut made).await;
        let Made { created, taken } = made;
        let cause = match result {
            Ok(ni) => return Ok(ni),
            Err(e) => e,
        };
        warn!(error = %cause, "allocation failed; cleaning up");
        let mut leftovers = Vec::new();
        for port in created {
            if let Err(e) = api.delete_port(port).await {
                leftovers.push(e);
            }
        }
        for port in taken {
            match api.update_port(port.id, &unbind_update(&port)).await {
                Ok(_) | Err(NetworkError::PortNotFound { .. }) => {}
                Err(e) => leftovers.push(e),
            }
        }
        if leftovers.is_empty() {
            Err(cause)
        } else {
            Err(NetworkError::AllocateCleanup {
                instance,
                cause: Box::new(cause),
                leftovers,
            })
        }
    }
    .instrument(span)
    .await
}

/// What an allocation did that its failure undoes: ports it created (deleted) and the
/// caller's ports it took (unbound).
#[derive(Default)]
struct Made {
    created: Vec<PortId>,
    taken: Vec<Port>,
}

async fn allocate_steps<A: NetworkApi + ?Sized>(
    api: &A,
    owner: &str,
    ovs_bridge: &str,
    instance: Uuid,
    host: &str,
    requests: &[PortRequest],
    made: &mut Made,
) -> Result<NetworkInfo, NetworkError> {
    let Made { created, taken } = made;
    let device_id = instance.to_string();
    let mut networks: HashMap<String, NetworkSummary> = HashMap::new();
    // (port, preserve_on_delete) in request order.
    let mut ports: Vec<(PortId, bool)> = Vec::with_capacity(requests.len());
    for request in requests {
        match request {
            PortRequest::Port { port_id } => {
                let port = api.get_port(*port_id).await?;
                if !port.device_id.is_empty() && port.device_id != device_id {
                    return Err(NetworkError::PortInUse {
                        port: port.id,
                        device_id: port.device_id,
                    });
                }
                ports.push((port.id, true));
                taken.push(port);
            }
            PortRequest::Network { network_id } => {
                if !networks.contains_key(network_id) {
                    let net = api.get_network(network_id).await?;
                    networks.insert(network_id.clone(), net);
                }
                // Named for the instance at once: found by instance even if the build dies
                // before binding it (the build journal's recovery releases it).
                let port = api.create_port_with(network_id, Some(instance)).await?;
                debug!(port = %port.id, network = %network_id, "port created");
                created.push(port.id);
                ports.push((port.id, false));
            }
        }
    }
    let bind = PortUpdate {
        host_id: Some(host.to_owned()),
        device_id: Some(device_id.clone()),
        device_owner: Some(owner.to_owned()),
        ..PortUpdate::default()
    };
    let mut vifs = Vec::with_capacity(ports.len());
    for (id, preserve) in &ports {
        let port = api.update_port(*id, &bind).await?;
        if !port.is_bound() || port.host_id != host {
            return Err(NetworkError::BindingFailed {
                port: port.id,
                host: host.to_owned(),
                vif_type: port.vif_type,
            });
        }
        // Neutron names the mechanism driver that bound a port (`bound_drivers`) only when it
        // shows the port, not in its answer to the update. ML2/openvswitch's binding names
        // its bridge; one that names none (ML2/OVN's) is read again, so the event model knows
        // ML2/OVN's ports (docs/EVENT_MODEL.md: their profile changes differ).
        let port = if port.vif_type == "ovs"
            && !port.vif_details.contains_key("bridge_name")
            && !port.vif_details.contains_key("bound_drivers")
        {
            api.get_port(*id).await?
        } else {
            port
        };
        if !networks.contains_key(&port.network_id) {
            let net = api.get_network(&port.network_id).await?;
            networks.insert(port.network_id.clone(), net);
        }
        let net = networks.get(&port.network_id).ok_or_else(|| {
            // Unreachable: inserted just above.
            NetworkError::NetworkNotFound {
                network: port.network_id.clone(),
            }
        })?;
        vifs.push(vif_dict(&port, net, *preserve, ovs_bridge));
    }
    NetworkInfo::from_value(&Value::Array(vifs)).map_err(|source| {
        let index = match &source {
            VifError::Field { index, .. } | VifError::NotAnObject { index } => *index,
            VifError::Json(_) | VifError::NotAList => 0,
        };
        NetworkError::BadVif {
            port: ports
                .get(index)
                .or(ports.first())
                .map_or(PortId(Uuid::nil()), |(p, _)| *p),
            source: Box::new(source),
        }
    })
}

/// [`NetworkApi::deallocate_for_instance`] for any backend.
pub(crate) async fn deallocate<A: NetworkApi + ?Sized>(
    api: &A,
    instance: Uuid,
    network_info: &NetworkInfo,
) -> Result<Deallocation, NetworkError> {
    let span = info_span!("deallocate_for_instance", instance = %instance);
    async {
        let device_id = instance.to_string();
        let mut done = Deallocation::default();
        let mut failures = Vec::new();
        let listed: Vec<Port> = match api.list_instance_ports(instance).await {
            Ok(ports) => ports,
            Err(e) => {
                warn!(error = %e, "listing the instance's ports failed; using network_info only");
                failures.push(e);
                Vec::new()
            }
        };
        let mut by_id: HashMap<PortId, Port> = listed.iter().map(|p| (p.id, p.clone())).collect();
        // network_info order first, then ports only Neutron knows of (treated as vireo's).
        let mut targets: Vec<(PortId, bool)> = network_info
            .vifs
            .iter()
            .map(|v| (v.id, v.preserve_on_delete))
            .collect();
        let in_cache: HashSet<PortId> = targets.iter().map(|(p, _)| *p).collect();
        targets.extend(
            listed
                .iter()
                .filter(|p| !in_cache.contains(&p.id))
                .map(|p| (p.id, false)),
        );

        for (id, preserve) in targets {
            let port = match by_id.remove(&id) {
                Some(p) => p,
                None => match api.get_port(id).await {
                    Ok(p) => p,
                    Err(NetworkError::PortNotFound { .. }) => {
                        done.already_gone.push(id);
                        continue;
                    }
                    Err(e) => {
                        failures.push(e);
                        continue;
                    }
                },
            };
            if !port.device_id.is_empty() && port.device_id != device_id {
                debug!(port = %id, device = %port.device_id, "port now used elsewhere; left alone");
                done.skipped.push(id);
                continue;
            }
            release_port(api, &port, preserve, &mut done, &mut failures).await;
        }
        done.into_result(instance, failures)
    }
    .instrument(span)
    .await
}

/// [`NetworkApi::setup_networks_on_host`] for any backend.
pub(crate) async fn setup_networks_on_host<A: NetworkApi + ?Sized>(
    api: &A,
    instance: Uuid,
    host: &str,
    teardown: bool,
    migration: Option<&MigrationHosts>,
) -> Result<Vec<HostSetupChange>, NetworkError> {
    let span = info_span!(
        "setup_networks_on_host",
        instance = %instance,
        host,
        teardown,
        dest = migration.map(|m| m.dest.as_str()).unwrap_or(""),
    );
    async {
        if !teardown && migration.is_none() {
            return Ok(Vec::new());
        }
        let wrap = |done, failures| NetworkError::SetupNetworksOnHost {
            instance,
            done,
            failures,
        };
        let ports = match api.list_instance_ports(instance).await {
            Ok(ports) => ports,
            Err(e) => return Err(wrap(Vec::new(), vec![e])),
        };
        let ports: BTreeMap<PortId, Port> = ports.into_iter().map(|p| (p.id, p)).collect();
        let mut done = Vec::new();
        let mut failures = Vec::new();
        for (id, port) in ports {
            if teardown {
                if port.profile.contains_key(MIGRATING_TO) {
                    let mut profile = port.profile.clone();
                    profile.remove(MIGRATING_TO);
                    let update = PortUpdate {
                        profile: Some(profile),
                        ..PortUpdate::default()
                    };
                    match api.update_port(id, &update).await {
                        Ok(_) => done.push(HostSetupChange::MigratingToCleared { port: id }),
                        Err(NetworkError::PortNotFound { .. }) => continue,
                        Err(e) => failures.push(e),
                    }
                }
                if let Some(m) = migration {
                    if port.host_id == m.dest {
                        debug!(port = %id, "destination binding is the active one; left alone");
                        continue;
                    }
                    match api.delete_binding(id, &m.dest).await {
                        Ok(Removal::Deleted) => {
                            done.push(HostSetupChange::DestBindingDeleted { port: id })
                        }
                        Ok(Removal::AlreadyGone)
                        | Err(NetworkError::DeleteActiveBinding { .. }) => {}
                        Err(e) => failures.push(e),
                    }
                }
            } else if let Some(m) = migration {
                if port.host_id != host
                    || port.host_id == m.dest
                    || port.migrating_to() == Some(m.dest.as_str())
                {
                    continue;
                }
                let mut profile = port.profile.clone();
                profile.insert(MIGRATING_TO.to_owned(), Value::from(m.dest.clone()));
                let update = PortUpdate {
                    profile: Some(profile),
                    ..PortUpdate::default()
                };
                match api.update_port(id, &update).await {
                    Ok(_) => done.push(HostSetupChange::MigratingToSet { port: id }),
                    Err(NetworkError::PortNotFound { .. }) => {}
                    Err(e) => failures.push(e),
                }
            }
        }
        if failures.is_empty() {
            Ok(done)
        } else {
            Err(wrap(done, failures))
        }
    }
    .instrument(span)
    .await
}
