//! Validating defines from several threads at once, in a fresh process each time.
//!
//! libxml2 builds its schema datatype tables on the first schema parse of a process, without a
//! lock (`libvirt::schema`); so the race exists once per process, at its first validations.
//! `concurrent_validating_defines_in_fresh_processes` therefore runs the scenario in many fresh
//! child processes (this test binary re-executed on `scenario_in_this_process`). The scenario's
//! first validated define is malformed: it fails before any schema is read, which a "first
//! define runs alone" guard took for the schema being loaded.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::process::Command;

use common::{unique, TestNode};
use vireo_actors::libvirt::{Libvirt, LibvirtConfig, LibvirtError};

/// Set in the children: run the scenario, nothing else.
const CHILD: &str = "VIREO_VALIDATE_CHILD";
const CHILDREN: usize = 24;
const HANDLES: usize = 4;
const DEFINES_PER_HANDLE: usize = 2;

/// A q35 KVM domain with disks, NICs and the usual devices, as vireo writes (the document the
/// xml crate's live tests define): a long validation.
fn q35_domain_xml(name: &str, uuid: uuid::Uuid) -> String {
    let fixture = include_str!("../../xml/tests/fixtures/inactive-kvm-q35.xml");
    let start = fixture.find("<name>").unwrap();
    let end = fixture.find("</uuid>").unwrap() + "</uuid>".len();
    format!(
        "{}<name>{name}</name>\n  <uuid>{uuid}</uuid>{}",
        &fixture[..start],
        &fixture[end..]
    )
}

async fn scenario() {
    // Every handle opens and validates at once, as the hosts of a local cloud do at start.
    let nodes: Vec<TestNode> = (0..HANDLES).map(|_| TestNode::new()).collect();
    let runs = nodes.iter().enumerate().map(|(n, node)| async move {
        let lv = Libvirt::open(LibvirtConfig {
            workers: 4,
            ..node.config()
        })
        .await
        .unwrap();
        if n == 0 {
            let err = lv.define_xml("<domain", true).await.unwrap_err();
            assert!(matches!(err, LibvirtError::InvalidXml { .. }), "{err:?}");
        }
        let defines = (0..DEFINES_PER_HANDLE).map(|_| {
            let (name, uuid) = unique("validate");
            let lv = &lv;
            async move { (uuid, lv.define_xml(q35_domain_xml(&name, uuid), true).await) }
        });
        let results = futures::future::join_all(defines).await;
        let failed: Vec<_> = results
            .iter()
            .filter_map(|(_, r)| r.as_ref().err().map(|e| format!("{e:?}")))
            .collect();
        for (uuid, result) in &results {
            if result.is_ok() {
                lv.undefine(*uuid).await.unwrap();
            }
        }
        assert!(lv.list_all().await.unwrap().is_empty());
        failed
    });
    let failed: Vec<String> = futures::future::join_all(runs)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert!(failed.is_empty(), "{} failed: {failed:#?}", failed.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_in_this_process() {
    scenario().await;
}

#[test]
fn concurrent_validating_defines_in_fresh_processes() {
    if std::env::var_os(CHILD).is_some() {
        return; // a child runs only the scenario
    }
    let exe = std::env::current_exe().unwrap();
    let mut failures = Vec::new();
    for n in 0..CHILDREN {
        let out = Command::new(&exe)
            .args(["--exact", "scenario_in_this_process", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        if !out.status.success() {
            failures.push(format!(
                "child {n}: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}/{CHILDREN} fresh processes failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
