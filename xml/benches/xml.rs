//! Speed goals (issue "Foundation", part 7): one interface element built and serialized in
//! <= 1.5 us; a whole 4-VIF domain built, serialized and parsed back in <= 30 us.
//!
//! Every benchmark runs twice: `wall/...` with criterion's wall clock and `cpu/...` with the
//! benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`). On a shared, loaded
//! machine the wall clock also counts the time the thread waited for a core; the CPU time
//! is what the work itself costs.

#![allow(clippy::unwrap_used, missing_docs)]

use std::hint::black_box;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::json;
use uuid::Uuid;
use vireo_xml::*;

const PORTS: [&str; 4] = [
    "3b2c4d5e-0000-4000-8000-000000000001",
    "3b2c4d5e-0000-4000-8000-000000000002",
    "3b2c4d5e-0000-4000-8000-000000000003",
    "3b2c4d5e-0000-4000-8000-000000000004",
];

/// An OVS port as Nova writes it: bridge + virtualport + tap + virtio + MTU, from strings.
fn ovs_interface(port: &str, mac: &str) -> Interface {
    let id: Uuid = port.parse().unwrap();
    let tap = format!("tap{}", &port[..11]);
    Interface {
        mac: Some(mac.parse().unwrap()),
        model: Some(NicModel::Virtio),
        mtu: Some(1450),
        ..Interface::new(InterfaceKind::Bridge {
            bridge: DeviceName::new("br-int").unwrap(),
            virtualport: Some(OvsPort {
                interface_id: id,
                profile_id: None,
            }),
            target: Some(DeviceName::new(tap).unwrap()),
        })
    }
}

fn four_vifs() -> Vec<Interface> {
    vec![
        ovs_interface(PORTS[0], "fa:16:3e:00:00:01"),
        Interface {
            mac: Some("fa:16:3e:00:00:02".parse().unwrap()),
            model: Some(NicModel::Virtio),
            mtu: Some(1450),
            ..Interface::new(InterfaceKind::Bridge {
                bridge: DeviceName::new("qbr3b2c4d5e-00").unwrap(),
                virtualport: None,
                target: Some(DeviceName::new("tap3b2c4d5e-00").unwrap()),
            })
        },
        Interface {
            mac: Some("fa:16:3e:00:00:03".parse().unwrap()),
            model: Some(NicModel::Virtio),
            ..Interface::new(InterfaceKind::Ethernet {
                target: Some(EthernetTarget {
                    dev: DeviceName::new("tap3b2c4d5e-03").unwrap(),
                    managed: Some(false),
                }),
            })
        },
        Interface {
            mac: Some("fa:16:3e:00:00:04".parse().unwrap()),
            vlan: Some(100),
            ..Interface::new(InterfaceKind::Hostdev {
                source: "0000:81:10.2".parse().unwrap(),
                managed: true,
            })
        },
    ]
}

fn domain(with_metadata: bool) -> Domain {
    let mut d = Domain::new(DomainName::new("instance-0000002a").unwrap());
    d.uuid = Some("6f1c1b0e-1111-4222-8333-444455556666".parse().unwrap());
    d.memory_kib = 2 * 1024 * 1024;
    d.vcpus = 2;
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
    d.devices.disks = vec![Disk::virtio(
        DiskSource::File {
            path: "/var/lib/vireo/instances/6f1c1b0e/disk".into(),
        },
        "vda",
    )];
    d.devices.interfaces = four_vifs();
    d.devices.serials = vec![Serial::pty()];
    d.devices.consoles = vec![Console::pty_serial()];
    if with_metadata {
        let vifs: Vec<_> = PORTS
            .iter()
            .enumerate()
            .map(|(i, p)| {
                json!({"id": p, "address": format!("fa:16:3e:00:00:0{}", i + 1), "type": "ovs",
                "vnic_type": "normal", "active": false, "devname": format!("tap{}", &p[..11]),
                "details": {"port_filter": true, "ovs_hybrid_plug": false},
                "network": {"id": "a1b2c3d4-e5f6-4000-8000-000000000009", "bridge": "br-int",
                    "label": "private", "meta": {"mtu": 1450}}})
            })
            .collect();
        d.metadata = Some(VireoMetadata {
            instance_uuid: d.uuid.unwrap(),
            flavor: Flavor {
                name: "m1.small".into(),
                vcpus: 2,
                memory_mb: 2048,
                root_gb: 20,
                ephemeral_gb: 0,
                swap_mb: 0,
                extra_specs: Default::default(),
            },
            network_info: serde_json::Value::Array(vifs),
            operation: None,
            record: None,
        });
    }
    d
}

/// Thread CPU time in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
struct CpuTime;

fn thread_cpu_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap();
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

impl Measurement for CpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &NsFormatter
    }
}

struct NsFormatter;

impl ValueFormatter for NsFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = if typical < 1e3 {
            (1.0, "ns")
        } else if typical < 1e6 {
            (1e-3, "µs")
        } else {
            (1e-6, "ms")
        };
        values.iter_mut().for_each(|v| *v *= factor);
        unit
    }
    fn scale_throughputs(&self, _: f64, _: &Throughput, _: &mut [f64]) -> &'static str {
        "-"
    }
    fn scale_for_machines(&self, _: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn wall(c: &mut Criterion) {
    benches(c, "wall");
}

fn cpu(c: &mut Criterion<CpuTime>) {
    benches(c, "cpu");
}

fn benches<M: Measurement + 'static>(c: &mut Criterion<M>, clock: &str) {
    c.bench_function(&format!("{clock}/interface/ovs build+serialize"), |b| {
        b.iter(|| {
            let i = ovs_interface(black_box(PORTS[0]), black_box("fa:16:3e:00:00:01"));
            black_box(i.to_xml().unwrap())
        })
    });
    let ovs = ovs_interface(PORTS[0], "fa:16:3e:00:00:01");
    c.bench_function(&format!("{clock}/interface/ovs serialize"), |b| {
        b.iter(|| black_box(black_box(&ovs).to_xml().unwrap()))
    });
    let ovs_xml = ovs.to_xml().unwrap();
    c.bench_function(&format!("{clock}/interface/ovs parse"), |b| {
        b.iter(|| black_box(Interface::from_xml(black_box(&ovs_xml)).unwrap()))
    });
    for meta in [false, true] {
        let name = if meta {
            "domain/4 vifs + metadata build+serialize+parse"
        } else {
            "domain/4 vifs build+serialize+parse"
        };
        c.bench_function(&format!("{clock}/{name}"), |b| {
            b.iter(|| {
                let d = domain(black_box(meta));
                let xml = d.to_xml().unwrap();
                black_box(Domain::from_xml(&xml).unwrap())
            })
        });
    }
    let d = domain(true);
    c.bench_function(
        &format!("{clock}/domain/4 vifs + metadata serialize"),
        |b| b.iter(|| black_box(black_box(&d).to_xml().unwrap())),
    );
    let xml = d.to_xml().unwrap();
    c.bench_function(&format!("{clock}/domain/4 vifs + metadata parse"), |b| {
        b.iter(|| black_box(Domain::from_xml(black_box(&xml)).unwrap()))
    });
    let xml = domain(false).to_xml().unwrap();
    c.bench_function(&format!("{clock}/domain/4 vifs parse"), |b| {
        b.iter(|| black_box(Domain::from_xml(black_box(&xml)).unwrap()))
    });
    let live = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/live-kvm-q35.xml"
    ))
    .unwrap();
    c.bench_function(&format!("{clock}/domain/parse live fixture"), |b| {
        b.iter(|| black_box(Domain::from_xml(black_box(&live)).unwrap()))
    });
    let new = ovs_interface(PORTS[3], "fa:16:3e:00:00:f2");
    c.bench_function(&format!("{clock}/live/rewrite replace interface"), |b| {
        b.iter(|| {
            black_box(
                live::rewrite(
                    black_box(&live),
                    &[live::Edit::ReplaceInterface(
                        live::Selector::Alias("net1".into()),
                        new.clone(),
                    )],
                )
                .unwrap(),
            )
        })
    });
}

criterion_group!(wall_group, wall);
criterion_group! {
    name = cpu_group;
    config = Criterion::default().with_measurement(CpuTime);
    targets = cpu
}
criterion_main!(wall_group, cpu_group);
