//! OVS hybrid plugging (qbr/qvb/qvo) on real kernel bridges, veths and OVS, with a real
//! qemu:///system domain, checked from the outside.

mod plug_support;

use plug_support::*;
use vireo_actors::plug::{Attachment, DomainForm, HostDevice, PlugError, PlugKind, VifPlugger};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libvirt_managed_hybrid_with_a_domain_on_qbr() {
    let mut s = Scene::new();
    let p = plugger();
    let v = ovs_vif(&s.bridge, true, 1450);
    s.watch(&v);
    let dom = s.domain();
    let c = ctx(DomainForm::LibvirtManaged);
    let mut rx = p.wiring().subscribe();
    let (qbr, qvb, qvo, tap) = (v.qbr_name(), v.qvb_name(), v.qvo_name(), v.tap_name());

    let plugged = p.plug(&c, &v).await.unwrap();
    assert_eq!(plugged.kind, PlugKind::OvsHybrid);
    assert_eq!(
        plugged.attachment,
        Attachment::Bridge {
            bridge: qbr.clone(),
            tap: tap.clone(),
            ovs_interface_id: None
        }
    );
    assert_eq!(
        plugged.created,
        vec![
            HostDevice::LinuxBridge(qbr.clone()),
            HostDevice::VethPair {
                bridge_end: qvb.clone(),
                ovs_end: qvo.clone()
            },
            HostDevice::OvsBridge(s.bridge.clone()),
            HostDevice::OvsPort {
                bridge: s.bridge.clone(),
                port: qvo.clone()
            },
        ]
    );

    // qbr: a Linux bridge, STP off, forward delay 0, up.
    let b = ip_link(&qbr).unwrap();
    assert_eq!(b["linkinfo"]["info_kind"], "bridge");
    assert_eq!(b["linkinfo"]["info_data"]["stp_state"], 0);
    assert_eq!(b["linkinfo"]["info_data"]["forward_delay"], 0);
    assert!(b["flags"].as_array().unwrap().iter().any(|f| f == "UP"));
    // qvb/qvo: a veth pair, MTU set, qvb in qbr, both up.
    for dev in [&qvb, &qvo] {
        let l = ip_link(dev).unwrap();
        assert_eq!(l["linkinfo"]["info_kind"], "veth", "{dev}");
        assert_eq!(l["mtu"], 1450, "{dev}");
        assert!(
            l["flags"].as_array().unwrap().iter().any(|f| f == "UP"),
            "{dev}"
        );
    }
    assert_eq!(master_of(&qvb).as_deref(), Some(qbr.as_str()));
    assert_eq!(
        sysfs(&qvb, "iflink"),
        sysfs(&qvo, "ifindex"),
        "qvb and qvo are peers"
    );
    // qvo on OVS with the os-vif external_ids.
    assert_eq!(vsctl(&["port-to-br", &qvo]), s.bridge);
    assert_eq!(iface_ext(&qvo, "iface-id"), v.id.to_string());
    assert_eq!(iface_ext(&qvo, "iface-status"), "active");
    assert_eq!(iface_ext(&qvo, "attached-mac"), v.address.to_string());
    assert_eq!(iface_ext(&qvo, "vm-uuid"), c.instance_uuid.to_string());
    assert_eq!(vsctl(&["get", "Interface", &qvo, "mtu_request"]), "1450");
    wait_wired(&mut rx, v.id, true, Some(&qvo)).await;

    // libvirt attaches the tap it creates to qbr.
    start_domain(
        &dom,
        &format!(
            "<interface type='bridge'><mac address='{}'/><source bridge='{qbr}'/>\
             <target dev='{tap}'/><model type='virtio'/><mtu size='1450'/></interface>",
            v.address
        ),
    );
    assert_eq!(master_of(&tap).as_deref(), Some(qbr.as_str()));
    assert_eq!(sysfs(&tap, "mtu"), "1450");
    destroy_domain(&dom);

    p.unplug(&c, &v).await.unwrap();
    wait_wired(&mut rx, v.id, false, Some(&qvo)).await;
    for dev in [&qbr, &qvb, &qvo, &tap] {
        assert!(!link_exists(dev), "{dev}");
    }
    assert!(ports_of(&s.bridge).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precreated_hybrid_tap_in_qbr_idempotent() {
    let mut s = Scene::new();
    let p = plugger();
    let v = ovs_vif(&s.bridge, true, 1400);
    s.watch(&v);
    let dom = s.domain();
    let c = ctx(DomainForm::PreCreated);
    let (qbr, tap) = (v.qbr_name(), v.tap_name());

    let first = p.plug(&c, &v).await.unwrap();
    assert_eq!(
        first.attachment,
        Attachment::Ethernet {
            tap: tap.clone(),
            precreated: true
        }
    );
    assert!(first.created.contains(&HostDevice::Tap(tap.clone())));
    assert_eq!(master_of(&tap).as_deref(), Some(qbr.as_str()));
    assert_eq!(sysfs(&tap, "mtu"), "1400");
    let again = p.plug(&c, &v).await.unwrap();
    assert!(again.created.is_empty(), "{:?}", again.created);
    assert_eq!(ports_of(&s.bridge), vec![v.qvo_name()]);

    start_domain(
        &dom,
        &format!(
            "<interface type='ethernet'><mac address='{}'/><target dev='{tap}' managed='no'/>\
             <model type='virtio'/></interface>",
            v.address
        ),
    );
    assert_eq!(master_of(&tap).as_deref(), Some(qbr.as_str()));
    destroy_domain(&dom);

    p.unplug(&c, &v).await.unwrap();
    p.unplug(&c, &v).await.unwrap();
    assert!(!link_exists(&qbr) && !link_exists(&tap));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_failure_at_every_step_leaves_nothing() {
    let mut s = Scene::new();
    let p = plugger();
    for form in DomainForm::ALL {
        for step in PlugKind::OvsHybrid.plug_steps(form) {
            let v = ovs_vif(&s.bridge, true, 1450);
            s.watch(&v);
            p.faults().fail_once(*step, Some(v.id));
            let err = p.plug(&ctx(form), &v).await.unwrap_err();
            assert!(
                matches!(err, PlugError::Injected { step: st, .. } if st == *step),
                "{err}"
            );
            let leaks = vireo::plug::leak::scan(&[frag(&v)]).unwrap();
            assert!(leaks.is_empty(), "{form:?} {step:?}: {leaks}");
            assert!(!br_exists(&s.bridge), "{form:?} {step:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_refusal_of_the_tap_mtu_rolls_back_bridge_veth_and_ovs_port() {
    let mut s = Scene::new();
    let p = plugger();
    // Bridges and veths take MTU 65535, a tap at most 65521: the last step fails.
    let v = ovs_vif(&s.bridge, true, 65_535);
    s.watch(&v);
    let err = p.plug(&ctx(DomainForm::PreCreated), &v).await.unwrap_err();
    assert!(
        matches!(err, PlugError::ConfigureLink { ref device, .. } if *device == v.tap_name()),
        "{err}"
    );
    let leaks = vireo::plug::leak::scan(&[frag(&v)]).unwrap();
    assert!(leaks.is_empty(), "{leaks}");
    assert!(!br_exists(&s.bridge));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unplug_and_replug_of_half_created_state() {
    let mut s = Scene::new();
    let p = plugger();
    let c = ctx(DomainForm::LibvirtManaged);

    // qbr and a veth, made with ip: no OVS port.
    let v = ovs_vif(&s.bridge, true, 1450);
    s.watch(&v);
    run("ip", &["link", "add", &v.qbr_name(), "type", "bridge"]);
    run(
        "ip",
        &[
            "link",
            "add",
            &v.qvb_name(),
            "type",
            "veth",
            "peer",
            "name",
            &v.qvo_name(),
        ],
    );
    p.unplug(&c, &v).await.unwrap();
    assert!(vireo::plug::leak::scan(&[frag(&v)]).unwrap().is_empty());

    // A lone qvo (its qvb gone) is replaced by a fresh pair on plug.
    let w = ovs_vif(&s.bridge, true, 1450);
    s.watch(&w);
    // A qvo whose peer is not its qvb.
    run(
        "ip",
        &[
            "link",
            "add",
            &w.qvo_name(),
            "type",
            "veth",
            "peer",
            "name",
            &format!("vpz{}", s.id),
        ],
    );
    p.plug(&c, &w).await.unwrap();
    assert!(
        !link_exists(&format!("vpz{}", s.id)),
        "the stale pair was removed"
    );
    assert_eq!(
        sysfs(&w.qvb_name(), "iflink"),
        sysfs(&w.qvo_name(), "ifindex")
    );
    p.unplug(&c, &w).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_bridge_named_like_qbr_is_refused() {
    let mut s = Scene::new();
    let p = plugger();
    let v = ovs_vif(&s.bridge, true, 1450);
    s.watch(&v);
    run(
        "ip",
        &["tuntap", "add", "dev", &v.qbr_name(), "mode", "tap"],
    );
    let err = p
        .plug(&ctx(DomainForm::LibvirtManaged), &v)
        .await
        .unwrap_err();
    assert!(
        matches!(err, PlugError::NameTaken { ref device, wanted: "bridge", .. } if *device == v.qbr_name()),
        "{err}"
    );
    // Nothing else was created; the foreign device is untouched until the test removes it.
    assert!(link_exists(&v.qbr_name()));
    assert!(!link_exists(&v.qvb_name()));
    // A failed build unplugs every VIF: that must not delete a device that is not a bridge
    // (plug refused it as not vireo's).
    p.unplug(&ctx(DomainForm::LibvirtManaged), &v)
        .await
        .unwrap();
    assert!(link_exists(&v.qbr_name()), "unplug deleted a foreign tap");
    run("ip", &["link", "del", &v.qbr_name()]);
}
