//! Smoke test on the real `qemu:///system`: a diskless KVM domain (TCG where `/dev/kvm` is
//! missing) with a unique name is defined, started paused, resumed, gets a USB tablet attached
//! and detached by alias, is destroyed and undefined, with every step's event observed. A guard
//! destroys and undefines it if the test fails half-way.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::time::Duration;

use common::{next_lifecycle, unique, wait_for};
use uuid::Uuid;
use vireo_actors::libvirt::{
    Affect, DomainState, Libvirt, LibvirtConfig, LibvirtError, LibvirtEvent, LifecycleEvent,
};
use virt::sys;

const URI: &str = "qemu:///system";

/// Destroys and undefines the domain on drop, whatever state the test left it in.
struct DomainGuard(Uuid);

impl Drop for DomainGuard {
    fn drop(&mut self) {
        let Ok(conn) = virt::connect::Connect::open(Some(URI)) else {
            return;
        };
        if let Ok(dom) = conn.lookup_domain_by_uuid(self.0) {
            let _ = dom.destroy();
            let _ = dom.undefine_flags(
                sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | sys::VIR_DOMAIN_UNDEFINE_NVRAM,
            );
        }
    }
}

fn domain_xml(name: &str, uuid: Uuid) -> String {
    let kind = if std::path::Path::new("/dev/kvm").exists() {
        "kvm"
    } else {
        "qemu"
    };
    format!(
        "<domain type='{kind}'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit='MiB'>128</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <devices>
    <controller type='usb' model='qemu-xhci'/>
    <memballoon model='none'/>
  </devices>
</domain>"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diskless_domain_lives_and_dies_on_qemu_system() {
    let lv = Libvirt::open(LibvirtConfig::for_uri(URI)).await.unwrap();
    let mut events = lv.events();
    let (name, uuid) = unique("vireo-lvtest");
    let _guard = DomainGuard(uuid);

    let id = lv.define_xml(domain_xml(&name, uuid), true).await.unwrap();
    assert_eq!((id.uuid, id.name.as_str()), (uuid, name.as_str()));
    assert_eq!(
        next_lifecycle(&mut events, uuid).await,
        LifecycleEvent::Defined
    );

    // QEMU supports START_PAUSED.
    lv.start(uuid, true).await.unwrap();
    assert_eq!(
        next_lifecycle(&mut events, uuid).await,
        LifecycleEvent::Started
    );
    assert_eq!(
        next_lifecycle(&mut events, uuid).await,
        LifecycleEvent::Suspended
    );
    assert_eq!(lv.info(uuid).await.unwrap().state, DomainState::Paused);
    lv.resume(uuid).await.unwrap();
    assert_eq!(
        next_lifecycle(&mut events, uuid).await,
        LifecycleEvent::Resumed
    );
    assert_eq!(lv.info(uuid).await.unwrap().state, DomainState::Running);

    // QEMU reports state errors as VIR_ERR_OPERATION_INVALID.
    let err = lv.start(uuid, false).await.unwrap_err();
    assert!(
        matches!(err, LibvirtError::OperationInvalid { what: "start", .. }),
        "{err:?}"
    );

    // USB unplug needs no guest cooperation: DEVICE_REMOVED follows the detach.
    let tablet = "<input type='tablet' bus='usb'><alias name='ua-vireo-tablet'/></input>";
    lv.attach_device(uuid, tablet, Affect::Live).await.unwrap();
    assert!(lv
        .xml_desc(uuid, false)
        .await
        .unwrap()
        .contains("ua-vireo-tablet"));
    lv.detach_device_alias(uuid, "ua-vireo-tablet", Affect::Live)
        .await
        .unwrap();
    let removed = wait_for(
        &mut events,
        Duration::from_secs(30),
        |e| matches!(e, LibvirtEvent::DeviceRemoved { uuid: u, .. } if *u == uuid),
    )
    .await;
    assert_eq!(
        removed,
        LibvirtEvent::DeviceRemoved {
            uuid,
            alias: "ua-vireo-tablet".into()
        }
    );
    let err = lv
        .detach_device_alias(uuid, "ua-vireo-tablet", Affect::Live)
        .await
        .unwrap_err();
    assert!(matches!(err, LibvirtError::NoDevice { .. }), "{err:?}");

    lv.destroy(uuid).await.unwrap();
    // QEMU may report SHUTDOWN (the process went away) before STOPPED.
    let stopped = wait_for(&mut events, Duration::from_secs(30), |e| {
        matches!(e, LibvirtEvent::Lifecycle { uuid: u, event: LifecycleEvent::Stopped, .. } if *u == uuid)
    })
    .await;
    assert!(matches!(
        stopped,
        LibvirtEvent::Lifecycle { detail, .. } if detail == sys::VIR_DOMAIN_EVENT_STOPPED_DESTROYED as i32
    ));
    lv.undefine(uuid).await.unwrap();
    assert_eq!(
        next_lifecycle(&mut events, uuid).await,
        LifecycleEvent::Undefined
    );
    assert!(lv.list_all().await.unwrap().iter().all(|d| d.uuid != uuid));
}
