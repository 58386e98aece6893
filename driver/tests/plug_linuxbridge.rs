//! Linux-bridge plugging on real kernel bridges with a real qemu:///system domain; the
//! watcher follows the tap through netlink.

mod plug_support;

use plug_support::*;
use serde_json::json;
use uuid::Uuid;
use vireo_actors::plug::{Attachment, DomainForm, HostDevice, PlugError, PlugKind, VifPlugger};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libvirt_managed_tap_joins_the_network_bridge_and_is_seen_wired() {
    let mut s = Scene::new();
    let br = s.linux_bridge();
    let p = plugger();
    let v = lb_vif(&br, 1450);
    s.watch(&v);
    let dom = s.domain();
    let c = ctx(DomainForm::LibvirtManaged);
    let mut rx = p.wiring().subscribe();
    let tap = v.tap_name();

    let plugged = p.plug(&c, &v).await.unwrap();
    assert_eq!(plugged.kind, PlugKind::LinuxBridge);
    assert_eq!(
        plugged.attachment,
        Attachment::Bridge {
            bridge: br.clone(),
            tap: tap.clone(),
            ovs_interface_id: None
        }
    );
    assert_eq!(plugged.created, vec![HostDevice::LinuxBridge(br.clone())]);
    let b = ip_link(&br).unwrap();
    assert_eq!(b["linkinfo"]["info_kind"], "bridge");
    assert_eq!(b["linkinfo"]["info_data"]["stp_state"], 0);
    assert!(
        !p.wiring().wired().contains(&v.id),
        "nothing is wired before the domain"
    );

    start_domain(
        &dom,
        &format!(
            "<interface type='bridge'><mac address='{}'/><source bridge='{br}'/>\
             <target dev='{tap}'/><model type='virtio'/></interface>",
            v.address
        ),
    );
    wait_wired(&mut rx, v.id, true, Some(&tap)).await;
    assert_eq!(master_of(&tap).as_deref(), Some(br.as_str()));
    destroy_domain(&dom);
    wait_wired(&mut rx, v.id, false, Some(&tap)).await;

    p.unplug(&c, &v).await.unwrap();
    // The network's bridge stays (it is shared); the test's guard removes it.
    assert!(link_exists(&br));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precreated_tap_is_enslaved_wired_and_removed() {
    let mut s = Scene::new();
    let br = s.linux_bridge();
    let p = plugger();
    let v = lb_vif(&br, 1400);
    s.watch(&v);
    let c = ctx(DomainForm::PreCreated);
    let mut rx = p.wiring().subscribe();
    let tap = v.tap_name();

    let plugged = p.plug(&c, &v).await.unwrap();
    assert_eq!(
        plugged.attachment,
        Attachment::Ethernet {
            tap: tap.clone(),
            precreated: true
        }
    );
    assert_eq!(master_of(&tap).as_deref(), Some(br.as_str()));
    assert_eq!(sysfs(&tap, "mtu"), "1400");
    wait_wired(&mut rx, v.id, true, Some(&tap)).await;
    assert!(p.plug(&c, &v).await.unwrap().created.is_empty());

    p.unplug(&c, &v).await.unwrap();
    wait_wired(&mut rx, v.id, false, Some(&tap)).await;
    assert!(!link_exists(&tap));
    assert!(link_exists(&br));
    p.unplug(&c, &v).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brq_name_from_the_network_id() {
    let mut s = Scene::new();
    let p = plugger();
    // A network id starting with the test's unique id, so brq<id> is unique and guarded.
    let net = format!("{}-{}", s.id, &Uuid::new_v4().to_string()[9..]);
    let v = plug_support::vif(json!({
        "id": Uuid::new_v4().to_string(), "address": mac(), "type": "bridge",
        "network": {"id": net, "meta": {"mtu": 1500}}
    }));
    s.watch(&v);
    let brq = format!("brq{}", &net[..11]);
    s.guard
        .fixture(vireo::plug::leak::Fixture::Link(brq.clone()));
    let plugged = p.plug(&ctx(DomainForm::LibvirtManaged), &v).await.unwrap();
    assert!(matches!(plugged.attachment, Attachment::Bridge { ref bridge, .. } if *bridge == brq));
    assert!(link_exists(&brq));
    p.unplug(&ctx(DomainForm::LibvirtManaged), &v)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_failure_at_every_step_leaves_nothing() {
    let mut s = Scene::new();
    let br = s.linux_bridge();
    let p = plugger();
    for form in DomainForm::ALL {
        for step in PlugKind::LinuxBridge.plug_steps(form) {
            let v = lb_vif(&br, 1450);
            s.watch(&v);
            p.faults().fail_once(*step, Some(v.id));
            let err = p.plug(&ctx(form), &v).await.unwrap_err();
            assert!(
                matches!(err, PlugError::Injected { step: st, .. } if st == *step),
                "{err}"
            );
            let leaks = vireo::plug::leak::scan(&[frag(&v), s.id.clone()]).unwrap();
            assert!(leaks.is_empty(), "{form:?} {step:?}: {leaks}");
            assert!(!p.wiring().wired().contains(&v.id));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_bridge_is_used_not_recreated() {
    let mut s = Scene::new();
    let br = s.linux_bridge();
    run("ip", &["link", "add", &br, "type", "bridge"]);
    let ifindex = sysfs(&br, "ifindex");
    let p = plugger();
    let v = lb_vif(&br, 1500);
    s.watch(&v);
    let c = ctx(DomainForm::PreCreated);
    let plugged = p.plug(&c, &v).await.unwrap();
    assert_eq!(plugged.created, vec![HostDevice::Tap(v.tap_name())]);
    assert_eq!(sysfs(&br, "ifindex"), ifindex);
    p.unplug(&c, &v).await.unwrap();
}
