//! `vireo events explain` through the built binary: stdin in, stdout/stderr and exit code out.

// Test helpers outside `#[test]` functions: clippy's allow-unwrap-in-tests does not reach them.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

const HYBRID: &str = "a4c4d6c2-1111-4c3b-9a55-0e5c4c7b0001";
const NORMAL: &str = "a4c4d6c2-2222-4c3b-9a55-0e5c4c7b0002";
const SRIOV: &str = "a4c4d6c2-3333-4c3b-9a55-0e5c4c7b0003";

/// A network_info entry as Nova's cache stores it (subnets, IPs, meta and all).
fn nova_vif(id: &str, mac: &str, vif_type: &str, vnic: &str, hybrid: bool, active: bool) -> Value {
    json!({
        "id": id,
        "address": mac,
        "network": {
            "id": "5f0b0f3e-6f7a-4c4e-9a55-2a6a3a0c1b2d",
            "bridge": "br-int",
            "label": "private",
            "subnets": [{
                "cidr": "10.0.0.0/26",
                "dns": [],
                "gateway": {"address": "10.0.0.1", "type": "gateway", "version": 4, "meta": {}},
                "ips": [{"address": "10.0.0.5", "type": "fixed", "version": 4, "meta": {},
                         "floating_ips": []}],
                "routes": [],
                "version": 4,
                "meta": {"enable_dhcp": true, "dhcp_server": "10.0.0.2"}
            }],
            "meta": {"injected": false, "tenant_id": "3c8b5a2e9d1f4e6a8b7c6d5e4f3a2b1c",
                     "mtu": 1442, "physical_network": null, "tunneled": true}
        },
        "type": vif_type,
        "details": {"connectivity": "l2", "port_filter": true, "ovs_hybrid_plug": hybrid,
                    "datapath_type": "system", "bridge_name": "br-int"},
        "devname": format!("tap{}", &id[..11]),
        "ovs_interfaceid": id,
        "qbh_params": null,
        "qbg_params": null,
        "active": active,
        "vnic_type": vnic,
        "profile": {},
        "preserve_on_delete": false,
        "delegate_create": true,
        "meta": {}
    })
}

fn vireo(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vireo"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn revert(source: &str, dest: &str) -> String {
    json!({
        "operation": "revert-resize",
        "network_info": [
            nova_vif(HYBRID, "fa:16:3e:12:34:01", "ovs", "normal", true, true),
            nova_vif(NORMAL, "fa:16:3e:12:34:02", "ovs", "normal", false, true),
        ],
        "migration": {"source_compute": source, "dest_compute": dest}
    })
    .to_string()
}

/// `vireo events explain --json` of `stdin`, which must succeed.
fn explain_json(stdin: &str) -> Value {
    let out = vireo(&["events", "explain", "--json"], stdin);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn tags(v: &Value, list: &str) -> Vec<String> {
    v[list]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["tag"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn nova_revert_cases_through_the_binary() {
    let out = vireo(&["events", "explain", "--json"], &revert("h1", "h2"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(tags(&v, "bind_time"), vec![HYBRID]);
    assert_eq!(tags(&v, "plug_time"), vec![NORMAL]);
    assert!(tags(&v, "none").is_empty());
    assert_eq!(v["bind_time"][0]["name"], "network-vif-plugged");

    // Same host: the devices stay wired; only the tap libvirt recreates reports again.
    let out = vireo(&["events", "explain", "--json"], &revert("h1", "h1"));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(tags(&v, "bind_time").is_empty());
    assert_eq!(tags(&v, "plug_time"), vec![NORMAL]);
    assert_eq!(tags(&v, "none"), vec![HYBRID]);
}

#[test]
fn ml2_ovn_ports_are_told_by_their_bound_driver() {
    // Nova's network_info for an ML2/OVN port: no bridge, no hybrid plug, `bound_drivers`.
    let ovn = |op: &str| {
        let mut v = nova_vif(NORMAL, "fa:16:3e:12:34:02", "ovs", "normal", false, true);
        v["details"] = json!({"connectivity": "l2", "port_filter": true,
                              "bound_drivers": {"0": "ovn"}});
        json!({"operation": op, "network_info": [
            v, nova_vif(HYBRID, "fa:16:3e:12:34:01", "ovs", "normal", true, true)]})
        .to_string()
    };
    let v = explain_json(&ovn("update-binding-profile"));
    assert_eq!(tags(&v, "bind_time"), vec![NORMAL, HYBRID]);
    // Clearing migrating_to leaves an ML2/OVN port DOWN: nothing comes, nothing is awaited;
    // the OVS agent's port is re-reported as before.
    let v = explain_json(&ovn("clear-binding-profile"));
    assert_eq!(tags(&v, "bind_time"), vec![HYBRID]);
    assert_eq!(tags(&v, "none"), vec![NORMAL]);
    let out = vireo(&["events", "explain"], &ovn("clear-binding-profile"));
    let text = String::from_utf8(out.stdout).unwrap();
    let row = text.lines().find(|l| l.contains(NORMAL)).unwrap();
    assert!(row.contains("ml2-ovn") && row.contains("none"), "{text}");
}

#[test]
fn spawn_with_a_pasted_network_info_prints_a_table() {
    let doc = json!({
        "operation": "spawn",
        "network_info": [
            nova_vif(HYBRID, "fa:16:3e:12:34:01", "ovs", "normal", true, false),
            nova_vif(NORMAL, "fa:16:3e:12:34:02", "ovs", "normal", false, true),
            nova_vif(SRIOV, "fa:16:3e:12:34:03", "ovs", "remote-managed", false, false),
        ]
    });
    let out = vireo(&["events", "explain"], &doc.to_string());
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let row = |id: &str| text.lines().find(|l| l.contains(id)).unwrap().to_owned();
    assert!(row(HYBRID).contains("plug-time"), "{text}");
    assert!(row(NORMAL).contains("none") && row(NORMAL).contains("already ACTIVE"));
    assert!(row(SRIOV).contains("remote-managed") && row(SRIOV).contains("none"));
    assert!(out.stderr.is_empty());
}

#[test]
fn invalid_input_exits_2_with_the_typed_error_on_stderr() {
    for (input, kind) in [
        ("[]".to_owned(), "json"),
        (
            json!({"operation": "resize", "network_info": []}).to_string(),
            "unknown-operation",
        ),
        (
            json!({"operation": "live-migration", "network_info": []}).to_string(),
            "missing-migration",
        ),
    ] {
        let out = vireo(&["events", "explain", "--json"], &input);
        assert_eq!(out.status.code(), Some(2), "{input}");
        assert!(out.stdout.is_empty());
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(
            err.starts_with(&format!("vireo events explain: error[{kind}]")),
            "{err}"
        );
    }
    let mut bad = nova_vif(NORMAL, "fa:16:3e:12:34:02", "ovs", "normal", false, true);
    bad["address"] = json!("fa:16:3e:12:34");
    let out = vireo(
        &["events", "explain"],
        &json!({"operation": "spawn", "network_info": [bad]}).to_string(),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("error[network-info]") && err.contains(NORMAL) && err.contains("address"));
}

#[test]
fn bad_arguments_exit_2_and_help_exits_0() {
    let out = vireo(&["events", "explain", "--bogus"], "");
    assert_eq!(out.status.code(), Some(2));
    let out = vireo(&["events", "explain", "--help"], "");
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8(out.stdout).unwrap().contains("--json"));
}
