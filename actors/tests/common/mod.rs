//! Helpers shared by the libvirt-layer tests: private `test:///` connections and event waits.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use tempfile::TempDir;
use uuid::Uuid;
use vireo_actors::libvirt::{
    EventStream, Libvirt, LibvirtConfig, LibvirtEvent, LibvirtHandle, LifecycleEvent,
};

/// A private test-driver node: its own file, so its own in-memory state.
pub struct TestNode {
    pub dir: TempDir,
    pub path: PathBuf,
}

impl TestNode {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.xml");
        std::fs::write(&path, NODE_XML).unwrap();
        Self { dir, path }
    }

    /// `test:///ABS/PATH.xml`.
    pub fn uri(&self) -> String {
        format!("test://{}", self.path.display())
    }

    pub fn config(&self) -> LibvirtConfig {
        LibvirtConfig::for_uri(self.uri())
    }

    pub async fn open(&self) -> LibvirtHandle {
        Libvirt::open(self.config()).await.unwrap()
    }
}

/// A minimal node: no domains, a 4-CPU 8 GiB host.
pub const NODE_XML: &str = "<node>
  <cpu><mhz>2000</mhz><model>x86_64</model><active>4</active><nodes>1</nodes>\
<sockets>1</sockets><cores>4</cores><threads>1</threads></cpu>
  <memory>8388608</memory>
</node>
";

/// A test-driver domain.
pub fn test_domain_xml(name: &str, uuid: Uuid) -> String {
    format!(
        "<domain type='test'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit='KiB'>65536</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
</domain>"
    )
}

/// A unique domain name and its UUID.
pub fn unique(prefix: &str) -> (String, Uuid) {
    let uuid = Uuid::new_v4();
    (
        format!("{prefix}-{}", &uuid.simple().to_string()[..8]),
        uuid,
    )
}

/// The next event matching `pred`, skipping others; panics after `within`.
pub async fn wait_for(
    events: &mut EventStream,
    within: Duration,
    mut pred: impl FnMut(&LibvirtEvent) -> bool,
) -> LibvirtEvent {
    tokio::time::timeout(within, async {
        loop {
            match events.recv().await {
                Some(event) if pred(&event) => return event,
                Some(_) => {}
                None => panic!("event stream closed"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no matching event within {within:?}"))
}

/// The next lifecycle event of `uuid`, skipping others.
pub async fn next_lifecycle(events: &mut EventStream, uuid: Uuid) -> LifecycleEvent {
    match wait_for(
        events,
        Duration::from_secs(10),
        |e| matches!(e, LibvirtEvent::Lifecycle { uuid: u, .. } if *u == uuid),
    )
    .await
    {
        LibvirtEvent::Lifecycle { event, .. } => event,
        other => unreachable!("{other:?}"),
    }
}
