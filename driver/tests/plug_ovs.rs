//! OVS native plugging against the real OVS (userspace datapath) and libvirtd, checked from
//! the outside (ovs-vsctl, ip -d link, sysfs, virsh). Every test runs under a leak guard.

mod plug_support;

use plug_support::*;
use vireo::plug::ovsdb::OvsdbAddr;
use vireo::plug::{HostPlugger, PlugConfig};
use vireo_actors::plug::{Attachment, DomainForm, HostDevice, PlugError, PlugKind, VifPlugger};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precreated_tap_is_on_ovs_with_os_vif_external_ids_and_a_domain_uses_it() {
    let mut s = Scene::new();
    let p = plugger();
    let v = ovs_vif(&s.bridge, false, 1450);
    s.watch(&v);
    let dom = s.domain();
    let c = ctx(DomainForm::PreCreated);
    let mut rx = p.wiring().subscribe();

    let plugged = p.plug(&c, &v).await.unwrap();
    let tap = v.tap_name();
    assert_eq!(plugged.kind, PlugKind::OvsNative);
    assert_eq!(
        plugged.attachment,
        Attachment::Ethernet {
            tap: tap.clone(),
            precreated: true
        }
    );
    assert_eq!(
        plugged.created,
        vec![
            HostDevice::Tap(tap.clone()),
            HostDevice::OvsBridge(s.bridge.clone()),
            HostDevice::OvsPort {
                bridge: s.bridge.clone(),
                port: tap.clone()
            },
        ]
    );

    // From the outside: the bridge, the port, the Interface's external_ids and MTU.
    assert_eq!(
        vsctl(&["get", "Bridge", &s.bridge, "datapath_type"]),
        "netdev"
    );
    assert_eq!(vsctl(&["port-to-br", &tap]), s.bridge);
    assert_eq!(iface_ext(&tap, "iface-id"), v.id.to_string());
    assert_eq!(iface_ext(&tap, "iface-status"), "active");
    assert_eq!(iface_ext(&tap, "attached-mac"), v.address.to_string());
    assert_eq!(iface_ext(&tap, "vm-uuid"), c.instance_uuid.to_string());
    assert_eq!(vsctl(&["get", "Interface", &tap, "mtu_request"]), "1450");
    let ofport: i64 = vsctl(&["get", "Interface", &tap, "ofport"])
        .parse()
        .unwrap();
    assert!(ofport > 0);
    let link = ip_link(&tap).unwrap();
    assert_eq!(link["linkinfo"]["info_kind"], "tun");
    assert_eq!(link["linkinfo"]["info_data"]["type"], "tap");
    assert_eq!(link["linkinfo"]["info_data"]["persist"], true);
    assert_eq!(link["mtu"], 1450);
    assert!(link["flags"].as_array().unwrap().iter().any(|f| f == "UP"));
    let mut host_mac = v.address.octets();
    host_mac[0] = 0xfe;
    assert_eq!(
        link["address"],
        vireo_xml::types::MacAddress(host_mac).to_string()
    );

    // The watcher saw it wired before any domain exists.
    let change = wait_wired(&mut rx, v.id, true, Some(&tap)).await;
    assert_eq!(change.device, tap);
    assert!(p.wiring().wired().contains(&v.id));

    // A real domain attaches to the pre-created tap (managed='no').
    start_domain(
        &dom,
        &format!(
            "<interface type='ethernet'><mac address='{}'/><target dev='{tap}' managed='no'/>\
             <model type='virtio'/><mtu size='1450'/></interface>",
            v.address
        ),
    );
    let attached = ip_link(&tap).unwrap();
    assert_eq!(
        attached["linkinfo"]["info_data"]["vnet_hdr"], true,
        "qemu opened the tap"
    );
    destroy_domain(&dom);
    // The tap is persistent: it outlives the domain until unplug.
    assert!(link_exists(&tap));

    p.unplug(&c, &v).await.unwrap();
    wait_wired(&mut rx, v.id, false, Some(&tap)).await;
    assert!(!link_exists(&tap));
    assert!(ports_of(&s.bridge).is_empty());
    assert!(!p.wiring().wired().contains(&v.id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libvirt_managed_domain_wires_through_virtualport() {
    let mut s = Scene::new();
    let p = plugger();
    let v = ovs_vif(&s.bridge, false, 1500);
    s.watch(&v);
    let dom = s.domain();
    let c = ctx(DomainForm::LibvirtManaged);
    let mut rx = p.wiring().subscribe();

    let plugged = p.plug(&c, &v).await.unwrap();
    let tap = v.tap_name();
    assert_eq!(
        plugged.attachment,
        Attachment::Bridge {
            bridge: s.bridge.clone(),
            tap: tap.clone(),
            ovs_interface_id: Some(v.id)
        }
    );
    assert_eq!(
        plugged.created,
        vec![HostDevice::OvsBridge(s.bridge.clone())]
    );
    assert!(br_exists(&s.bridge));
    assert!(!link_exists(&tap), "libvirt creates the tap, not vireo");

    start_domain(
        &dom,
        &format!(
            "<interface type='bridge'><mac address='{}'/><source bridge='{}'/>\
             <virtualport type='openvswitch'><parameters interfaceid='{}'/></virtualport>\
             <target dev='{tap}'/><model type='virtio'/></interface>",
            v.address, s.bridge, v.id
        ),
    );
    wait_wired(&mut rx, v.id, true, Some(&tap)).await;
    assert_eq!(vsctl(&["port-to-br", &tap]), s.bridge);
    assert_eq!(iface_ext(&tap, "iface-id"), v.id.to_string());
    assert_eq!(iface_ext(&tap, "attached-mac"), v.address.to_string());

    destroy_domain(&dom);
    wait_wired(&mut rx, v.id, false, Some(&tap)).await;
    p.unplug(&c, &v).await.unwrap();
    assert!(ports_of(&s.bridge).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plug_twice_is_one_set_and_unplug_twice_is_fine() {
    let mut s = Scene::new();
    let p = plugger();
    let v = ovs_vif(&s.bridge, false, 1450);
    s.watch(&v);
    let c = ctx(DomainForm::PreCreated);
    let tap = v.tap_name();

    p.plug(&c, &v).await.unwrap();
    let ofport = vsctl(&["get", "Interface", &tap, "ofport"]);
    let uuid = vsctl(&["get", "Interface", &tap, "_uuid"]);
    let again = p.plug(&c, &v).await.unwrap();
    assert!(again.created.is_empty(), "{:?}", again.created);
    assert_eq!(ports_of(&s.bridge), vec![tap.clone()]);
    assert_eq!(vsctl(&["get", "Interface", &tap, "ofport"]), ofport);
    assert_eq!(
        vsctl(&["get", "Interface", &tap, "_uuid"]),
        uuid,
        "updated in place"
    );

    p.unplug(&c, &v).await.unwrap();
    p.unplug(&c, &v).await.unwrap();
    assert!(!link_exists(&tap));
    assert!(ports_of(&s.bridge).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replug_after_someone_changed_external_ids_restores_them() {
    let mut s = Scene::new();
    let p = plugger();
    let v = ovs_vif(&s.bridge, false, 1450);
    s.watch(&v);
    let c = ctx(DomainForm::PreCreated);
    let tap = v.tap_name();
    p.plug(&c, &v).await.unwrap();
    vsctl(&[
        "set",
        "Interface",
        &tap,
        "external_ids:iface-status=inactive",
        "external_ids:other=kept",
        "mtu_request=1300",
    ]);
    p.plug(&c, &v).await.unwrap();
    assert_eq!(iface_ext(&tap, "iface-status"), "active");
    assert_eq!(iface_ext(&tap, "other"), "kept");
    assert_eq!(vsctl(&["get", "Interface", &tap, "mtu_request"]), "1450");
    p.unplug(&c, &v).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_on_another_bridge_is_moved() {
    let mut s = Scene::new();
    let other = format!("vpo{}", s.id);
    s.guard
        .fixture(vireo::plug::leak::Fixture::OvsBridge(other.clone()));
    let p = plugger();
    let v = ovs_vif(&s.bridge, false, 1450);
    s.watch(&v);
    let c = ctx(DomainForm::PreCreated);
    let tap = v.tap_name();
    vsctl(&[
        "add-br",
        &other,
        "--",
        "set",
        "Bridge",
        &other,
        "datapath_type=netdev",
    ]);
    vsctl(&["add-port", &other, &tap]);
    p.plug(&c, &v).await.unwrap();
    assert_eq!(vsctl(&["port-to-br", &tap]), s.bridge);
    assert!(ports_of(&other).is_empty());
    p.unplug(&c, &v).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unplug_of_half_created_state_succeeds() {
    let mut s = Scene::new();
    let p = plugger();
    let c = ctx(DomainForm::PreCreated);

    // Only the tap (made with ip, not vireo).
    let v = ovs_vif(&s.bridge, false, 1450);
    s.watch(&v);
    run(
        "ip",
        &["tuntap", "add", "dev", &v.tap_name(), "mode", "tap"],
    );
    p.unplug(&c, &v).await.unwrap();
    assert!(!link_exists(&v.tap_name()));

    // Only the OVS port (no device behind it: ofport -1).
    let w = ovs_vif(&s.bridge, false, 1450);
    s.watch(&w);
    vsctl(&[
        "add-br",
        &s.bridge,
        "--",
        "set",
        "Bridge",
        &s.bridge,
        "datapath_type=netdev",
    ]);
    vsctl(&["add-port", &s.bridge, &w.tap_name()]);
    p.unplug(&c, &w).await.unwrap();
    assert!(ports_of(&s.bridge).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_failure_at_every_step_leaves_nothing() {
    let mut s = Scene::new();
    let p = plugger();
    for form in DomainForm::ALL {
        for step in PlugKind::OvsNative.plug_steps(form) {
            let v = ovs_vif(&s.bridge, false, 1450);
            s.watch(&v);
            let c = ctx(form);
            p.faults().fail_once(*step, Some(v.id));
            let err = p.plug(&c, &v).await.unwrap_err();
            assert!(
                matches!(err, PlugError::Injected { step: st, .. } if st == *step),
                "{err}"
            );
            let leaks = vireo::plug::leak::scan(&[frag(&v)]).unwrap();
            assert!(leaks.is_empty(), "{form:?} {step:?}: {leaks}");
            assert!(
                !br_exists(&s.bridge),
                "{form:?} {step:?}: the bridge this call created is removed"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_refusal_half_way_rolls_back_the_tap() {
    let mut s = Scene::new();
    let p = plugger();
    // A tap's largest MTU is 65521: the kernel refuses 65535 after the tap was created.
    let v = ovs_vif(&s.bridge, false, 65_535);
    s.watch(&v);
    let err = p.plug(&ctx(DomainForm::PreCreated), &v).await.unwrap_err();
    assert!(
        matches!(err, PlugError::ConfigureLink { ref device, .. } if *device == v.tap_name()),
        "{err}"
    );
    assert!(!link_exists(&v.tap_name()));
    assert!(!br_exists(&s.bridge));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_ovsdb_fails_the_plug_and_removes_the_tap() {
    let mut s = Scene::new();
    let dir = tempfile::tempdir().unwrap();
    let p = HostPlugger::start(PlugConfig {
        ovsdb_connection: OvsdbAddr::Unix(dir.path().join("no-ovsdb.sock")),
        ..config()
    })
    .unwrap();
    let v = ovs_vif(&s.bridge, false, 1450);
    s.watch(&v);
    let err = p.plug(&ctx(DomainForm::PreCreated), &v).await.unwrap_err();
    assert!(
        matches!(err, PlugError::OvsTransact { ref device, .. } if *device == v.tap_name()),
        "{err}"
    );
    assert!(!link_exists(&v.tap_name()));
}

/// A TCP remote added to this machine's ovsdb-server for one test, removed on drop.
struct TcpRemote(String);

#[allow(clippy::unwrap_used)]
impl TcpRemote {
    fn add() -> (TcpRemote, u16) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let remote = format!("ptcp:{port}:127.0.0.1");
        let out = std::process::Command::new("ovs-appctl")
            .args(["-t", "ovsdb-server", "ovsdb-server/add-remote", &remote])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        (TcpRemote(remote), port)
    }
}

impl Drop for TcpRemote {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ovs-appctl")
            .args(["-t", "ovsdb-server", "ovsdb-server/remove-remote", &self.0])
            .output();
    }
}

/// os-vif's default `ovsdb_connection` is `tcp:127.0.0.1:6640`: the plugger and its watcher
/// work over TCP as over the unix socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ovsdb_over_tcp_plugs_watches_and_unplugs() {
    let mut s = Scene::new();
    let (_remote, port) = TcpRemote::add();
    let addr: OvsdbAddr = format!("tcp:127.0.0.1:{port}").parse().unwrap();
    // ovsdb-server listens on the new remote once the command returned; connect with retries
    // all the same (the watcher does too).
    let p = HostPlugger::start(PlugConfig {
        ovsdb_connection: addr,
        ..config()
    })
    .unwrap();
    let v = ovs_vif(&s.bridge, false, 1450);
    s.watch(&v);
    let c = ctx(DomainForm::PreCreated);
    let mut rx = p.wiring().subscribe();
    let tap = v.tap_name();
    p.plug(&c, &v).await.unwrap();
    assert_eq!(vsctl(&["port-to-br", &tap]), s.bridge);
    assert_eq!(iface_ext(&tap, "iface-id"), v.id.to_string());
    wait_wired(&mut rx, v.id, true, Some(&tap)).await;
    p.unplug(&c, &v).await.unwrap();
    wait_wired(&mut rx, v.id, false, Some(&tap)).await;
    assert!(ports_of(&s.bridge).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_outside_vireos_prefixes_are_refused_before_anything_happens() {
    let s = Scene::new();
    let p = plugger();
    let mut v = ovs_vif(&s.bridge, false, 1450);
    v.devname = Some("lo".into());
    for form in DomainForm::ALL {
        let c = ctx(form);
        assert!(matches!(
            p.plug(&c, &v).await,
            Err(PlugError::InvalidName { ref name, .. }) if name == "lo"
        ));
        assert!(matches!(
            p.unplug(&c, &v).await,
            Err(PlugError::InvalidName { .. })
        ));
    }
    assert!(link_exists("lo"));
    assert!(!br_exists(&s.bridge));
    let mut bad = ovs_vif(&s.bridge, false, 1450);
    bad.details.datapath_type = Some("dpdk".into());
    assert!(matches!(
        p.plug(&ctx(DomainForm::LibvirtManaged), &bad).await,
        Err(PlugError::InvalidValue {
            field: "details.datapath_type",
            ..
        })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_vifs_plug_and_unplug_in_parallel() {
    let mut s = Scene::new();
    let p = std::sync::Arc::new(plugger());
    let vifs: Vec<_> = (0..20).map(|_| ovs_vif(&s.bridge, false, 1450)).collect();
    for v in &vifs {
        s.watch(v);
    }
    let c = ctx(DomainForm::PreCreated);
    let plugs = vifs.iter().map(|v| {
        let (p, c, v) = (p.clone(), c.clone(), v.clone());
        tokio::spawn(async move { p.plug(&c, &v).await })
    });
    for r in futures::future::join_all(plugs).await {
        r.unwrap().unwrap();
    }
    let mut ports = ports_of(&s.bridge);
    ports.sort();
    let mut want: Vec<_> = vifs.iter().map(|v| v.tap_name()).collect();
    want.sort();
    assert_eq!(ports, want);
    let unplugs = vifs.iter().map(|v| {
        let (p, c, v) = (p.clone(), c.clone(), v.clone());
        tokio::spawn(async move { p.unplug(&c, &v).await })
    });
    for r in futures::future::join_all(unplugs).await {
        r.unwrap().unwrap();
    }
    assert!(ports_of(&s.bridge).is_empty());
}
