//! SR-IOV plugging. This machine has no SR-IOV hardware: the topology is a FABRICATED sysfs
//! tree and the VF control is the RECORDING FAKE, except in
//! `the_real_vf_control_reaches_the_kernel`, which sends the real IFLA_VFINFO_LIST request to
//! a real (non-SR-IOV) veth. macvtap cannot exist here either: the macvtap kinds are checked
//! up to what libvirt would be given.

// Test helpers below panic on failure, like the tests.
#![allow(clippy::unwrap_used)]

mod plug_support;

use std::sync::Arc;

use plug_support::*;
use serde_json::json;
use uuid::Uuid;
use vireo::plug::netlink::Netlink;
use vireo::plug::sriov::{
    fabricate_pf, NetlinkVfControl, RecordingVfControl, SysfsSriov, SysfsTopology, VfControl,
    VfSettings,
};
use vireo_actors::plug::{
    Attachment, DomainForm, HostDevice, MacvtapMode, PlugError, PlugKind, VifPlugger,
};
use vireo_actors::vif::Vif;
use vireo_xml::types::PciAddress;

const PF: &str = "0000:81:00.0";
const VF0: &str = "0000:81:10.0";
const VF1: &str = "0000:81:10.2";

fn pci(s: &str) -> PciAddress {
    s.parse().unwrap()
}

struct Fab {
    _dir: tempfile::TempDir,
    control: Arc<RecordingVfControl>,
    sriov: Arc<SysfsSriov>,
}

fn fabricated() -> Fab {
    let dir = tempfile::tempdir().unwrap();
    fabricate_pf(
        dir.path(),
        pci(PF),
        "enp129s0f0",
        &[(pci(VF0), Some("enp129s0f0v0")), (pci(VF1), None)],
    )
    .unwrap();
    let control = Arc::new(RecordingVfControl::new());
    let sriov = Arc::new(SysfsSriov {
        topology: SysfsTopology::new(dir.path()),
        control: control.clone(),
    });
    Fab {
        _dir: dir,
        control,
        sriov,
    }
}

fn sriov_vif(vif_type: &str, vnic: &str, slot: &str, vlan: u16, trusted: bool) -> Vif {
    vif(json!({
        "id": Uuid::new_v4().to_string(), "address": mac(), "type": vif_type,
        "vnic_type": vnic,
        "details": {"vlan": vlan},
        "profile": {"pci_slot": slot, "physical_network": "physnet1", "trusted": trusted},
        "network": {"id": "n1", "meta": {"mtu": 1500}}
    }))
}

#[tokio::test]
async fn vf_gets_mac_vlan_and_trust_through_the_pf_and_unplug_resets_them() {
    let f = fabricated();
    let p = plugger_with_sriov(f.sriov.clone());
    let v = sriov_vif("hw_veb", "direct", VF1, 100, true);
    for form in DomainForm::ALL {
        let c = ctx(form);
        let plugged = p.plug(&c, &v).await.unwrap();
        assert_eq!(plugged.kind, PlugKind::SriovVf);
        assert_eq!(
            plugged.attachment,
            Attachment::HostdevVf {
                pci: pci(VF1),
                vlan: 100
            }
        );
        assert_eq!(
            plugged.created,
            vec![HostDevice::VfSettings {
                pf: "enp129s0f0".into(),
                vf: 1
            }]
        );
        assert_eq!(
            f.control.current("enp129s0f0", 1),
            Some(VfSettings {
                mac: v.address.octets(),
                vlan: 100,
                trust: true
            })
        );
        p.unplug(&c, &v).await.unwrap();
        assert_eq!(f.control.current("enp129s0f0", 1), Some(VfSettings::RESET));
    }
    assert_eq!(f.control.current("enp129s0f0", 0), None, "VF0 untouched");
}

#[tokio::test]
async fn vf_macvtap_needs_the_vf_netdev() {
    let f = fabricated();
    let p = plugger_with_sriov(f.sriov.clone());
    let c = ctx(DomainForm::LibvirtManaged);
    let v = sriov_vif("hw_veb", "macvtap", VF0, 0, false);
    let plugged = p.plug(&c, &v).await.unwrap();
    assert_eq!(
        plugged.attachment,
        Attachment::Direct {
            dev: "enp129s0f0v0".into(),
            mode: MacvtapMode::Passthrough
        }
    );
    assert_eq!(f.control.current("enp129s0f0", 0).unwrap().vlan, 0);
    p.unplug(&c, &v).await.unwrap();

    let no_netdev = sriov_vif("hw_veb", "macvtap", VF1, 0, false);
    let err = p.plug(&c, &no_netdev).await.unwrap_err();
    assert!(matches!(err, PlugError::Locate { .. }), "{err}");
    assert_eq!(f.control.current("enp129s0f0", 1), None, "nothing was set");
}

#[tokio::test]
async fn pf_passthrough_has_nothing_to_plug() {
    let f = fabricated();
    let p = plugger_with_sriov(f.sriov.clone());
    let c = ctx(DomainForm::LibvirtManaged);
    let v = sriov_vif("hostdev_physical", "direct-physical", PF, 0, false);
    let plugged = p.plug(&c, &v).await.unwrap();
    assert_eq!(plugged.attachment, Attachment::HostdevPf { pci: pci(PF) });
    assert!(plugged.created.is_empty());
    p.unplug(&c, &v).await.unwrap();
    assert!(f.control.calls().is_empty());

    // A VF address where a PF is expected, and an absent device, are typed errors.
    let vf_as_pf = sriov_vif("hostdev_physical", "direct-physical", VF0, 0, false);
    assert!(matches!(
        p.plug(&c, &vf_as_pf).await,
        Err(PlugError::Locate { .. })
    ));
    let absent = sriov_vif("hw_veb", "direct", "0000:99:00.1", 0, false);
    let err = p.plug(&c, &absent).await.unwrap_err();
    assert!(
        matches!(err, PlugError::Locate { ref device, .. } if device == "0000:99:00.1"),
        "{err}"
    );
    // Unplug of a VF that is gone succeeds.
    p.unplug(&c, &absent).await.unwrap();
}

#[tokio::test]
async fn failures_are_typed_and_leave_the_vf_untouched() {
    let f = fabricated();
    let p = plugger_with_sriov(f.sriov.clone());
    let c = ctx(DomainForm::LibvirtManaged);
    let v = sriov_vif("hw_veb", "direct", VF0, 5, false);

    f.control.set_failing(true);
    let err = p.plug(&c, &v).await.unwrap_err();
    assert!(
        matches!(err, PlugError::SetVf { ref device, vf: 0, .. } if device == "enp129s0f0"),
        "{err}"
    );
    f.control.set_failing(false);
    assert_eq!(f.control.current("enp129s0f0", 0), None);

    for step in PlugKind::SriovVf.plug_steps(DomainForm::LibvirtManaged) {
        p.faults().fail_once(*step, Some(v.id));
        assert!(matches!(
            p.plug(&c, &v).await,
            Err(PlugError::Injected { step: s, .. }) if s == *step
        ));
        assert_eq!(f.control.current("enp129s0f0", 0), None, "{step:?}");
    }
    let missing = vif(json!({"id": Uuid::new_v4().to_string(), "address": mac(),
        "type": "hw_veb", "vnic_type": "direct"}));
    assert!(matches!(
        p.plug(&c, &missing).await,
        Err(PlugError::Missing {
            field: "profile.pci_slot",
            ..
        })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_vf_control_reaches_the_kernel() {
    // A real veth has no SR-IOV: the kernel parses the IFLA_VFINFO_LIST request and answers
    // EOPNOTSUPP (a malformed request would get EINVAL).
    let mut s = Scene::new();
    let a = format!("vpv{}", s.id);
    let b = format!("vpw{}", s.id);
    s.guard.fixture(vireo::plug::leak::Fixture::Link(a.clone()));
    run(
        "ip",
        &["link", "add", &a, "type", "veth", "peer", "name", &b],
    );
    let control = NetlinkVfControl::new(Arc::new(Netlink::open().unwrap()));
    let err = control
        .set_vf(
            &a,
            0,
            &VfSettings {
                mac: [0xfa, 0x16, 0x3e, 0, 0, 1],
                vlan: 10,
                trust: true,
            },
        )
        .await
        .unwrap_err();
    let vireo::plug::sriov::SriovError::Control { source, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(source.errno(), Some(libc::EOPNOTSUPP), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn macvtap_mechanism_driver_needs_its_physical_interface() {
    let mut s = Scene::new();
    let a = format!("vpv{}", s.id);
    let b = format!("vpw{}", s.id);
    s.guard.fixture(vireo::plug::leak::Fixture::Link(a.clone()));
    run(
        "ip",
        &["link", "add", &a, "type", "veth", "peer", "name", &b],
    );
    let p = plugger();
    let c = ctx(DomainForm::LibvirtManaged);
    let v = vif(json!({"id": Uuid::new_v4().to_string(), "address": mac(),
        "type": "macvtap", "details": {"physical_interface": a, "macvtap_mode": "vepa"}}));
    let plugged = p.plug(&c, &v).await.unwrap();
    assert_eq!(
        plugged.attachment,
        Attachment::Direct {
            dev: a.clone(),
            mode: MacvtapMode::Vepa
        }
    );
    p.unplug(&c, &v).await.unwrap();
    let gone = vif(json!({"id": Uuid::new_v4().to_string(), "address": mac(),
        "type": "macvtap", "details": {"physical_interface": format!("vpn{}", s.id)}}));
    assert!(matches!(
        p.plug(&c, &gone).await,
        Err(PlugError::Locate { .. })
    ));
}
