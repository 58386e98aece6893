//! The main job on real KVM and devices: `vireo demo --libvirt qemu:///system` walks every
//! scenario with h1 on this machine's libvirtd, Open vSwitch and kernel bridges, with no
//! timeout and nothing left behind (its own leak check, plus one from the outside here).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use vireo::demo::{run, DemoOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_on_qemu_system_completes_without_timeouts_or_leaks() {
    let dir = tempfile::tempdir().unwrap();
    let bridge = format!("br-vdemo{}", std::process::id() % 10_000);
    let opts = DemoOptions {
        libvirt: Some("qemu:///system".into()),
        event_delay: Duration::from_millis(50),
        timeout: Duration::from_secs(60),
        state_dir: dir.path().join("state"),
        bridge: bridge.clone(),
        // Plain progress lines on stderr, as the CLI prints them off a terminal.
        progress: Some(false),
    };
    let mut out = Vec::new();
    let summary = run(opts, &mut out).await;
    let text = String::from_utf8_lossy(&out);
    let summary = summary.unwrap_or_else(|e| panic!("demo failed: {e:?}\n{text}"));
    assert!(summary.leaks.is_empty(), "{:?}\n{text}", summary.leaks);
    assert_eq!(summary.timeouts, 0, "{text}");
    assert_eq!(summary.seeds_ok.len(), 4, "{:?}\n{text}", summary.seeds_ok);
    // From the outside: no demo domain, no bridge, no device named after its ports.
    let list = Command::new("virsh")
        .args(["-c", "qemu:///system", "list", "--all", "--name"])
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&list.stdout);
    assert!(
        !names.lines().any(|n| n.starts_with("vm-")),
        "domains left: {names}"
    );
    assert!(!std::path::Path::new("/sys/class/net")
        .join(&bridge)
        .exists());
    let br = Command::new("ovs-vsctl").arg("list-br").output().unwrap();
    assert!(!String::from_utf8_lossy(&br.stdout).contains(&bridge));
}
