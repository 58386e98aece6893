//! Prints the domain `tests/fixtures/capture.sh` starts on `qemu:///system` to capture live
//! XML: a diskless q35 KVM domain with an OVS port, a Linux bridge port, a pre-created tap
//! and a serial console, built with vireo-xml itself.
//!
//! Usage: `fixture_domain NAME OVS_BRIDGE LINUX_BRIDGE LINUX_BRIDGE_TAP TAP [qemu|kvm]`.
//! The OVS port gets no tap name (libvirt picks `vnetN`); the Linux bridge port gets
//! `LINUX_BRIDGE_TAP`, as Nova names taps.

use std::process::ExitCode;

use serde_json::json;
use vireo_xml::*;

fn build(args: &[String]) -> Result<String, Box<dyn std::error::Error>> {
    let [name, ovs, lb, lb_tap, tap, rest @ ..] = args else {
        return Err(
            "usage: fixture_domain NAME OVS_BRIDGE LINUX_BRIDGE LINUX_BRIDGE_TAP TAP [qemu|kvm]"
                .into(),
        );
    };
    let domain_type = match rest.first().map(String::as_str) {
        None | Some("kvm") => DomainType::Kvm,
        Some("qemu") => DomainType::Qemu,
        Some(other) => return Err(format!("unknown domain type {other}").into()),
    };
    let port: uuid::Uuid = "3b2c4d5e-0000-4000-8000-0000000000f1".parse()?;
    let mut d = Domain::new(DomainName::new(name.as_str())?);
    d.domain_type = domain_type;
    d.uuid = Some("6f1c1b0e-1111-4222-8333-4444555566f1".parse()?);
    d.memory_kib = 256 * 1024;
    d.os.machine = Some("q35".into());
    d.features = Features {
        acpi: true,
        apic: true,
        ..Features::default()
    };
    d.clock = Some(Clock {
        offset: ClockOffset::Utc,
        timers: vec![],
    });
    d.on_crash = Some(LifecycleAction::Destroy);
    d.metadata = Some(VireoMetadata {
        instance_uuid: d.uuid.unwrap_or_default(),
        flavor: Flavor {
            name: "fixture <tiny> & 'co'".into(),
            vcpus: 1,
            memory_mb: 256,
            root_gb: 0,
            ephemeral_gb: 0,
            swap_mb: 0,
            extra_specs: [("hw:vif_multiqueue_enabled".into(), "true".into())]
                .into_iter()
                .collect(),
        },
        network_info: json!([{"id": port.to_string(), "type": "ovs",
            "address": "fa:16:3e:00:00:f1", "network": {"label": "a<b>&c"}}]),
        operation: None,
        record: None,
    });
    let mac = |n| Some(MacAddress([0xfa, 0x16, 0x3e, 0, 0, n]));
    d.devices.interfaces = vec![
        Interface {
            mac: mac(0xf1),
            model: Some(NicModel::Virtio),
            mtu: Some(1450),
            ..Interface::new(InterfaceKind::Bridge {
                bridge: DeviceName::new(ovs.as_str())?,
                virtualport: Some(OvsPort {
                    interface_id: port,
                    profile_id: None,
                }),
                target: None,
            })
        },
        Interface {
            mac: mac(0xf2),
            model: Some(NicModel::Virtio),
            ..Interface::new(InterfaceKind::Bridge {
                bridge: DeviceName::new(lb.as_str())?,
                virtualport: None,
                target: Some(DeviceName::new(lb_tap.as_str())?),
            })
        },
        Interface {
            mac: mac(0xf3),
            model: Some(NicModel::Virtio),
            ..Interface::new(InterfaceKind::Ethernet {
                target: Some(EthernetTarget {
                    dev: DeviceName::new(tap.as_str())?,
                    managed: Some(false),
                }),
            })
        },
    ];
    d.devices.serials = vec![Serial::pty()];
    d.devices.consoles = vec![Console::pty_serial()];
    Ok(d.to_xml()?)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match build(&args) {
        Ok(xml) => {
            println!("{xml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fixture_domain: {e}");
            ExitCode::FAILURE
        }
    }
}
