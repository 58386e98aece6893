//! Shared test helpers: sample devices of every form and validators against real libvirt.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use serde_json::json;
use uuid::Uuid;
use vireo_xml::*;

pub const PORT1: &str = "3b2c4d5e-0000-4000-8000-000000000001";

pub fn dev(s: &str) -> DeviceName {
    DeviceName::new(s).unwrap()
}

pub fn mac(n: u8) -> MacAddress {
    MacAddress([0xfa, 0x16, 0x3e, 0, 0, n])
}

/// One interface of every form vireo writes, with the options each form takes.
pub fn every_interface() -> Vec<(&'static str, Interface)> {
    let port: Uuid = PORT1.parse().unwrap();
    vec![
        (
            "ovs",
            Interface {
                mac: Some(mac(1)),
                model: Some(NicModel::Virtio),
                mtu: Some(1450),
                driver: Some(NetDriver {
                    name: Some(NetDriverName::Vhost),
                    queues: Some(4),
                    rx_queue_size: Some(512),
                    tx_queue_size: Some(512),
                }),
                vlan: Some(42),
                bandwidth: Some(Bandwidth {
                    inbound: Some(Rate {
                        average: 1000,
                        peak: Some(2000),
                        burst: Some(512),
                    }),
                    outbound: Some(Rate {
                        average: 800,
                        peak: None,
                        burst: None,
                    }),
                }),
                ..Interface::new(InterfaceKind::Bridge {
                    bridge: dev("br-int"),
                    virtualport: Some(OvsPort {
                        interface_id: port,
                        profile_id: None,
                    }),
                    target: Some(dev("tap3b2c4d5e-00")),
                })
            },
        ),
        (
            "ovs-hybrid-qbr",
            Interface {
                mac: Some(mac(2)),
                model: Some(NicModel::Virtio),
                mtu: Some(1450),
                ..Interface::new(InterfaceKind::Bridge {
                    bridge: dev("qbr3b2c4d5e-00"),
                    virtualport: None,
                    target: Some(dev("tap3b2c4d5e-00")),
                })
            },
        ),
        (
            "linux-bridge",
            Interface {
                mac: Some(mac(3)),
                model: Some(NicModel::Virtio),
                ..Interface::new(InterfaceKind::Bridge {
                    bridge: dev("brqa1b2c3d4-e5"),
                    virtualport: None,
                    target: Some(dev("tap3b2c4d5e-01")),
                })
            },
        ),
        (
            "ethernet-precreated",
            Interface {
                mac: Some(mac(4)),
                model: Some(NicModel::Virtio),
                mtu: Some(9000),
                ..Interface::new(InterfaceKind::Ethernet {
                    target: Some(EthernetTarget {
                        dev: dev("tap3b2c4d5e-02"),
                        managed: Some(false),
                    }),
                })
            },
        ),
        (
            "hostdev-vf",
            Interface {
                mac: Some(mac(5)),
                vlan: Some(100),
                driver: Some(NetDriver {
                    name: Some(NetDriverName::Vfio),
                    ..NetDriver::default()
                }),
                ..Interface::new(InterfaceKind::Hostdev {
                    source: "0000:81:10.2".parse().unwrap(),
                    managed: true,
                })
            },
        ),
        (
            "direct-macvtap",
            Interface {
                mac: Some(mac(6)),
                model: Some(NicModel::Virtio),
                ..Interface::new(InterfaceKind::Direct {
                    source: dev("enp129s0f0v3"),
                    mode: DirectMode::Passthrough,
                    target: None,
                })
            },
        ),
        (
            "vhostuser",
            Interface {
                mac: Some(mac(7)),
                model: Some(NicModel::Virtio),
                mtu: Some(1500),
                driver: Some(NetDriver {
                    queues: Some(2),
                    ..NetDriver::default()
                }),
                ..Interface::new(InterfaceKind::VhostUser {
                    path: "/var/run/openvswitch/vhu3b2c4d5e-00".into(),
                    mode: VhostUserMode::Server,
                    target: None,
                })
            },
        ),
        (
            "vdpa",
            Interface {
                mac: Some(mac(8)),
                model: Some(NicModel::Virtio),
                ..Interface::new(InterfaceKind::Vdpa {
                    dev: "/dev/vhost-vdpa-0".into(),
                })
            },
        ),
    ]
}

pub fn metadata() -> VireoMetadata {
    VireoMetadata {
        instance_uuid: "6f1c1b0e-1111-4222-8333-444455556666".parse().unwrap(),
        flavor: Flavor {
            name: "m1.<small> & 'co'".into(),
            vcpus: 2,
            memory_mb: 2048,
            root_gb: 20,
            ephemeral_gb: 0,
            swap_mb: 0,
            extra_specs: [
                ("hw:cpu_policy".to_owned(), "dedicated".to_owned()),
                ("quota:vif_inbound_average".to_owned(), "1000".to_owned()),
            ]
            .into_iter()
            .collect(),
        },
        network_info: json!([{"id": PORT1, "address": "fa:16:3e:00:00:01", "type": "ovs",
            "network": {"label": "net <1> & \"x\"", "meta": {"mtu": 1450}}}]),
        operation: Some(InFlightOperation {
            id: "req-<1>".into(),
            kind: "spawn".into(),
            phase: "plugging".into(),
            started_at: 1_764_000_000_000,
            data: json!({"ports": [PORT1]}),
        }),
        record: Some(json!({"state": "running", "boot": {"type": "none"}})),
    }
}

/// A whole domain using every device kind (all interface forms included).
pub fn full_domain(name: &str, kind: DomainType) -> Domain {
    let mut d = Domain::new(DomainName::new(name).unwrap());
    d.domain_type = kind;
    d.uuid = Some("6f1c1b0e-1111-4222-8333-444455556666".parse().unwrap());
    d.metadata = Some(metadata());
    d.memory_kib = 2 * 1024 * 1024;
    d.current_memory_kib = Some(2 * 1024 * 1024);
    d.vcpus = 2;
    d.cpu = Some(Cpu {
        mode: CpuMode::Custom,
        model: Some("qemu64".into()),
        topology: Some(CpuTopology {
            sockets: 1,
            cores: 2,
            threads: 1,
        }),
    });
    d.os = Os {
        arch: Some("x86_64".into()),
        machine: Some("q35".into()),
        kernel: Some("/var/lib/vireo/kernel".into()),
        initrd: Some("/var/lib/vireo/initrd".into()),
        cmdline: Some("console=ttyS0 root=/dev/vda quiet".into()),
        boot: vec![BootDevice::Hd],
    };
    d.features = Features {
        acpi: true,
        apic: true,
        pae: false,
        vmcoreinfo: true,
        vmport: Some(false),
    };
    d.clock = Some(Clock {
        offset: ClockOffset::Utc,
        timers: vec![
            Timer {
                name: TimerName::Pit,
                tickpolicy: Some(TickPolicy::Delay),
                present: None,
            },
            Timer {
                name: TimerName::Hpet,
                tickpolicy: None,
                present: Some(false),
            },
        ],
    });
    d.on_poweroff = Some(LifecycleAction::Destroy);
    d.on_reboot = Some(LifecycleAction::Restart);
    d.on_crash = Some(LifecycleAction::Destroy);
    d.devices = Devices {
        emulator: None,
        disks: vec![
            Disk {
                driver: Some(DiskDriver {
                    format: DiskFormat::Qcow2,
                    cache: Some(DiskCache::None),
                    discard_unmap: true,
                }),
                serial: Some("vol-1".into()),
                ..Disk::virtio(
                    DiskSource::File {
                        path: "/var/lib/vireo/instances/x/disk".into(),
                    },
                    "vda",
                )
            },
            Disk {
                driver: Some(DiskDriver {
                    format: DiskFormat::Raw,
                    cache: None,
                    discard_unmap: false,
                }),
                ..Disk::virtio(
                    DiskSource::Block {
                        dev: "/dev/mapper/vol-2".into(),
                    },
                    "vdb",
                )
            },
            Disk {
                driver: Some(DiskDriver {
                    format: DiskFormat::Raw,
                    cache: Some(DiskCache::Writeback),
                    discard_unmap: false,
                }),
                ..Disk::virtio(
                    DiskSource::Rbd {
                        name: "vms/6f1c1b0e_disk".into(),
                        hosts: vec![
                            RbdHost {
                                name: "10.0.0.1".into(),
                                port: Some(6789),
                            },
                            RbdHost {
                                name: "ceph-mon-2".into(),
                                port: None,
                            },
                        ],
                        auth: Some(DiskAuth {
                            username: "openstack".into(),
                            secret_uuid: "a1b2c3d4-0000-4000-8000-000000000001".parse().unwrap(),
                        }),
                    },
                    "vdc",
                )
            },
            Disk {
                device: DiskDevice::Cdrom,
                target_bus: DiskBus::Sata,
                readonly: true,
                driver: Some(DiskDriver {
                    format: DiskFormat::Raw,
                    cache: None,
                    discard_unmap: false,
                }),
                ..Disk::virtio(
                    DiskSource::File {
                        path: "/var/lib/vireo/instances/x/disk.config".into(),
                    },
                    "sda",
                )
            },
        ],
        interfaces: every_interface().into_iter().map(|(_, i)| i).collect(),
        hostdevs: vec![Hostdev::pci("0000:82:00.0".parse().unwrap())],
        serials: vec![Serial {
            log: Some(CharLog {
                file: "/var/lib/vireo/instances/x/console.log".into(),
                append: Some(false),
            }),
            ..Serial::pty()
        }],
        consoles: vec![Console::pty_serial()],
    };
    d
}

/// Run `virt-xml-validate FILE domain`; Err(output) when it rejects the document.
pub fn virt_xml_validate(xml: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("domain.xml");
    std::fs::write(&path, xml).unwrap();
    let out = Command::new("virt-xml-validate")
        .arg(&path)
        .arg("domain")
        .output()
        .expect("virt-xml-validate runs");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}\n{xml}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A private libvirt test-driver connection backed by its own node file.
pub struct TestConn {
    pub conn: virt::connect::Connect,
    _dir: tempfile::TempDir,
}

impl TestConn {
    pub fn open() -> TestConn {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("node.xml");
        std::fs::write(&node, "<node/>").unwrap();
        let uri = format!("test://{}", node.display());
        let conn = virt::connect::Connect::open(Some(&uri)).unwrap();
        // libxml2 2.9 builds its schema datatype tables on the first schema parse of the process,
        // without a lock: tests validating on several threads at once race on it (an "Error type
        // 'integer' is not exported by type library" failure). Parse the schema once first, as
        // vireo's libvirt layer does when it opens an in-process driver (actors libvirt::schema).
        static PRIMED: std::sync::Once = std::sync::Once::new();
        PRIMED.call_once(|| {
            let probe =
                conn.define_domain_xml_flags("<domain/>", virt::sys::VIR_DOMAIN_DEFINE_VALIDATE);
            assert!(probe.is_err(), "the schema probe must be refused");
        });
        TestConn { conn, _dir: dir }
    }

    /// Define with VIR_DOMAIN_DEFINE_VALIDATE; returns libvirt's XML of the defined domain.
    pub fn define_validated(&self, xml: &str) -> Result<String, virt::error::Error> {
        let dom = self
            .conn
            .define_domain_xml_flags(xml, virt::sys::VIR_DOMAIN_DEFINE_VALIDATE)?;
        let out = dom.xml_desc(0)?;
        dom.undefine()?;
        Ok(out)
    }
}

pub fn fixtures_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures"))
}

/// Drop what libvirt assigns on define (guest address, a target name where we gave none)
/// so an interface libvirt gave back compares with the one we wrote.
pub fn strip_assigned(got: &mut Interface, ours: &Interface) {
    got.address = None;
    if ours.kind.target_dev().is_none() {
        match &mut got.kind {
            InterfaceKind::Bridge { target, .. }
            | InterfaceKind::Direct { target, .. }
            | InterfaceKind::VhostUser { target, .. }
            | InterfaceKind::Network { target, .. } => *target = None,
            InterfaceKind::Ethernet { target } => *target = None,
            InterfaceKind::Hostdev { .. } | InterfaceKind::Vdpa { .. } => {}
        }
    }
}
