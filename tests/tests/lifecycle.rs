//! Instance lifecycle on libvirt's test driver with the embedded network service.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod faults_support;

use std::time::Duration;

use common::*;
use vireo::compute::{ComputeDriver, ComputeOps};
use vireo_actors::instance::{AdmissionError, DestroyArgs, InstanceError, RebootKind};
use vireo_actors::lifecycle::InstanceState;
use vireo_actors::network::NetworkApi;
use vireo_actors::predict::Timing;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_then_destroy_leaves_nothing() {
    let c = spec(&["h1"]).timeout(Duration::from_secs(10)).start().await;
    let h1 = &c.hosts[0];
    let id = uuid();
    let report = h1
        .spawn_on(
            id,
            "vm-spawn",
            vec![on(NET_HYBRID), on(NET_NATIVE), on(NET_LB)],
        )
        .await;
    // Every port was new (not active): all three wait at plug time, and every wait completed.
    let plug = report
        .waits
        .iter()
        .find(|w| w.timing == Timing::PlugTime)
        .unwrap();
    assert_eq!(plug.expected.len(), 3, "{report:#?}");
    assert!(report.waits.iter().all(|w| w.complete), "{report:#?}");
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.vifs.len(), 3);
    assert_eq!(h1.plugger.plugged().len(), 3);
    let ports = ports(&view);
    for p in &ports {
        let port = c.network.get_port(*p).await.unwrap();
        assert_eq!(port.host_id, "h1");
    }

    h1.driver
        .destroy(
            id,
            DestroyArgs {
                deallocate_network: true,
            },
        )
        .await
        .unwrap();
    assert!(h1.plugger.plugged().is_empty());
    assert!(matches!(
        h1.driver.show(id).await,
        Err(InstanceError::Refused(AdmissionError::NotFound(_)))
    ));
    let domains = h1.driver.libvirt().list_all().await.unwrap();
    assert!(domains.iter().all(|d| d.uuid != id), "{domains:?}");
    for p in &ports {
        assert!(c.network.port_status(*p).is_none(), "port {p} left behind");
    }
    // Destroy is idempotent.
    h1.driver.destroy(id, DestroyArgs::default()).await.unwrap();
    let stats = h1.driver.events().stats().await.unwrap();
    assert_eq!(stats.waits_now, 0, "{stats:?}");
    c.assert_clean(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cycle_and_reboots() {
    let c = spec(&["h1"]).timeout(Duration::from_secs(10)).start().await;
    let h1 = &c.hosts[0];
    let id = uuid();
    h1.spawn_on(id, "vm-power", vec![on(NET_HYBRID), on(NET_NATIVE)])
        .await;
    h1.driver.power_off(id, None).await.unwrap();
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Stopped
    );
    let r = h1.driver.power_on(id).await.unwrap();
    // Only the libvirt-managed native OVS tap is recreated: one plug-time event.
    let plug = r
        .waits
        .iter()
        .find(|w| w.timing == Timing::PlugTime)
        .unwrap();
    assert_eq!(plug.expected.len(), 1, "{r:#?}");
    assert!(plug.complete);
    let r = h1.driver.reboot(id, RebootKind::Hard).await.unwrap();
    let plug = r
        .waits
        .iter()
        .find(|w| w.timing == Timing::PlugTime)
        .unwrap();
    assert_eq!(plug.expected.len(), 1, "{r:#?}");
    assert!(plug.complete);
    h1.driver.reboot(id, RebootKind::Soft).await.unwrap();
    h1.driver.pause(id).await.unwrap();
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Paused
    );
    h1.driver.unpause(id).await.unwrap();
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Running
    );
    h1.driver
        .destroy(
            id,
            DestroyArgs {
                deallocate_network: true,
            },
        )
        .await
        .unwrap();
    c.assert_clean(&[]).await;
}
