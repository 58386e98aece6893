//! The plain tap kind (`vif_type` tap, routed networking): pre-created, vireo makes a
//! persistent tap a real domain attaches to; libvirt-managed, vireo creates nothing.

mod plug_support;

use plug_support::*;
use serde_json::json;
use uuid::Uuid;
use vireo_actors::plug::{Attachment, DomainForm, HostDevice, PlugError, PlugKind, VifPlugger};

fn tap_vif() -> vireo_actors::vif::Vif {
    vif(
        json!({"id": Uuid::new_v4().to_string(), "address": mac(), "type": "tap",
        "network": {"id": "n", "meta": {"mtu": 1500}}}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precreated_tap_with_a_domain_then_removed() {
    let mut s = Scene::new();
    let p = plugger();
    let v = tap_vif();
    s.watch(&v);
    let dom = s.domain();
    let c = ctx(DomainForm::PreCreated);
    let tap = v.tap_name();
    let plugged = p.plug(&c, &v).await.unwrap();
    assert_eq!(plugged.kind, PlugKind::Tap);
    assert_eq!(plugged.created, vec![HostDevice::Tap(tap.clone())]);
    let l = ip_link(&tap).unwrap();
    assert_eq!(l["linkinfo"]["info_data"]["type"], "tap");
    assert!(master_of(&tap).is_none());
    start_domain(
        &dom,
        &format!(
            "<interface type='ethernet'><mac address='{}'/><target dev='{tap}' managed='no'/>\
             <model type='virtio'/></interface>",
            v.address
        ),
    );
    destroy_domain(&dom);
    p.unplug(&c, &v).await.unwrap();
    assert!(!link_exists(&tap));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libvirt_managed_tap_creates_nothing() {
    let mut s = Scene::new();
    let p = plugger();
    let v = tap_vif();
    s.watch(&v);
    let c = ctx(DomainForm::LibvirtManaged);
    let plugged = p.plug(&c, &v).await.unwrap();
    assert_eq!(
        plugged.attachment,
        Attachment::Ethernet {
            tap: v.tap_name(),
            precreated: false
        }
    );
    assert!(plugged.created.is_empty());
    assert!(!link_exists(&v.tap_name()));
    p.unplug(&c, &v).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_tap_device_with_the_tap_name_is_refused_and_kept() {
    let mut s = Scene::new();
    let p = plugger();
    let v = tap_vif();
    s.watch(&v);
    let peer = format!("vpq{}", s.id);
    run(
        "ip",
        &[
            "link",
            "add",
            &v.tap_name(),
            "type",
            "veth",
            "peer",
            "name",
            &peer,
        ],
    );
    let err = p.plug(&ctx(DomainForm::PreCreated), &v).await.unwrap_err();
    assert!(
        matches!(err, PlugError::NameTaken { ref found, wanted: "tun", .. } if found == "veth"),
        "{err}"
    );
    assert!(link_exists(&v.tap_name()), "not vireo's: left alone");
    // A failed build unplugs every VIF: that must not delete a device that is not a tap
    // (plug refused it as not vireo's).
    p.unplug(&ctx(DomainForm::PreCreated), &v).await.unwrap();
    assert!(link_exists(&v.tap_name()), "unplug deleted a foreign veth");
    run("ip", &["link", "del", &v.tap_name()]);
}
