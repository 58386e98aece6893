//! The wiring watcher against changes made by others (ovs-vsctl, ip), not by vireo: it must
//! see OVS Interfaces with an iface-id get and lose an ofport, and report the current set to
//! a watcher started later. Also: the leak guard itself fails on a leak.

mod plug_support;

use std::time::Duration;

use plug_support::*;
use uuid::Uuid;
use vireo_actors::plug::VifPlugger;
use vireo_actors::vif::PortId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ovs_interfaces_plugged_by_others_are_seen() {
    let mut s = Scene::new();
    let p = plugger();
    let w = p.host_wiring().clone();
    assert!(w.ovs_synced(Duration::from_secs(10)).await);
    let mut rx = p.wiring().subscribe();
    let port = PortId(Uuid::new_v4());
    let tap = format!("tap{}", &port.to_string()[..11]);
    s.guard.watch(&port.to_string()[..11]);
    let iface_id = format!("external_ids:iface-id={port}");

    vsctl(&[
        "add-br",
        &s.bridge,
        "--",
        "set",
        "Bridge",
        &s.bridge,
        "datapath_type=netdev",
    ]);
    // No device behind the port: ofport -1, not wired.
    vsctl(&[
        "add-port",
        &s.bridge,
        &tap,
        "--",
        "set",
        "Interface",
        &tap,
        &iface_id,
    ]);
    assert_eq!(vsctl(&["get", "Interface", &tap, "ofport"]), "-1");
    // The device appears (re-adding makes ovs-vswitchd open it): wired.
    vsctl(&["del-port", &tap]);
    run("ip", &["tuntap", "add", "dev", &tap, "mode", "tap"]);
    vsctl(&[
        "add-port",
        &s.bridge,
        &tap,
        "--",
        "set",
        "Interface",
        &tap,
        &iface_id,
    ]);
    let c = wait_wired(&mut rx, port, true, Some(&tap)).await;
    assert_eq!(c.device, tap);
    assert!(p.wiring().wired().contains(&port));

    // A watcher started now reports it in its first snapshot.
    let late = plugger();
    assert!(late.host_wiring().ovs_synced(Duration::from_secs(10)).await);
    assert!(late.wiring().wired().contains(&port));

    // The iface-id removed: unwired.
    vsctl(&["remove", "Interface", &tap, "external_ids", "iface-id"]);
    wait_wired(&mut rx, port, false, Some(&tap)).await;
    // Back, then the port deleted: unwired.
    vsctl(&["set", "Interface", &tap, &iface_id]);
    wait_wired(&mut rx, port, true, Some(&tap)).await;
    vsctl(&["del-port", &tap]);
    wait_wired(&mut rx, port, false, Some(&tap)).await;
    assert!(!p.wiring().wired().contains(&port));
    run("ip", &["link", "del", &tap]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_enslaved_by_others_is_seen_once_registered() {
    let mut s = Scene::new();
    let br = s.linux_bridge();
    let p = plugger();
    let mut rx = p.wiring().subscribe();
    let port = PortId(Uuid::new_v4());
    let tap = format!("tap{}", &port.to_string()[..11]);
    s.guard.watch(&port.to_string()[..11]);
    run("ip", &["link", "add", &br, "type", "bridge"]);
    run("ip", &["tuntap", "add", "dev", &tap, "mode", "tap"]);
    p.host_wiring().register_bridge_tap(&tap, port).await;
    run("ip", &["link", "set", &tap, "master", &br]);
    wait_wired(&mut rx, port, true, Some(&tap)).await;
    run("ip", &["link", "set", &tap, "nomaster"]);
    wait_wired(&mut rx, port, false, Some(&tap)).await;
    run("ip", &["link", "set", &tap, "master", &br]);
    wait_wired(&mut rx, port, true, Some(&tap)).await;
    run("ip", &["link", "del", &tap]);
    wait_wired(&mut rx, port, false, Some(&tap)).await;
    // An unregistered tap is not reported.
    let other = PortId(Uuid::new_v4());
    let tap2 = format!("tap{}", &other.to_string()[..11]);
    s.guard.watch(&other.to_string()[..11]);
    run("ip", &["tuntap", "add", "dev", &tap2, "mode", "tap"]);
    run("ip", &["link", "set", &tap2, "master", &br]);
    // Register after the fact: the registration reads the current state.
    p.host_wiring().register_bridge_tap(&tap2, other).await;
    assert!(p.wiring().wired().contains(&other));
    p.host_wiring().forget_bridge_tap(&tap2);
    wait_wired(&mut rx, other, false, Some(&tap2)).await;
    run("ip", &["link", "del", &tap2]);
}

#[test]
fn the_leak_guard_fails_on_a_leak_and_cleans_it() {
    let id = uniq();
    let tap = format!("vpk{id}");
    let result = std::panic::catch_unwind(|| {
        let _guard = vireo::plug::leak::LeakGuard::new([id.clone()]);
        run("ip", &["tuntap", "add", "dev", &tap, "mode", "tap"]);
    });
    let msg = result.unwrap_err();
    let text = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(text.contains(&tap), "{text}");
    assert!(!link_exists(&tap), "the guard removed the leak");
}
