//! Property tests: every domain, interface and metadata element the model can hold —
//! names and values with `<>&'"`, whitespace and any Unicode included — survives
//! `from_xml(to_xml(x)) == x`; invalid values are typed errors.

#![allow(clippy::unwrap_used)]

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use serde_json::Value;
use vireo_xml::*;

/// Any text XML can carry: metacharacters, whitespace (also at the edges) and Unicode.
fn text() -> impl Strategy<Value = String> {
    vec(
        prop_oneof![
            3 => "[<>&'\" \t\n\r]",
            3 => "[a-zA-Z0-9/._-]",
            2 => "\\PC",
        ],
        0..12,
    )
    .prop_map(|v| v.concat())
}

fn domain_name() -> impl Strategy<Value = DomainName> {
    text().prop_filter_map("valid domain name", |s| DomainName::new(s).ok())
}

fn device_name() -> impl Strategy<Value = DeviceName> {
    "[a-zA-Z0-9._<>&'\"é-]{1,7}".prop_filter_map("valid device name", |s| DeviceName::new(s).ok())
}

fn mac() -> impl Strategy<Value = MacAddress> {
    any::<[u8; 6]>().prop_map(MacAddress)
}

fn pci() -> impl Strategy<Value = PciAddress> {
    (any::<u16>(), any::<u8>(), 0u8..32, 0u8..8).prop_map(|(domain, bus, slot, function)| {
        PciAddress {
            domain,
            bus,
            slot,
            function,
        }
    })
}

fn uuid() -> impl Strategy<Value = uuid::Uuid> {
    any::<u128>().prop_map(uuid::Uuid::from_u128)
}

fn keyword<T: Copy + std::fmt::Debug + 'static>(all: &'static [T]) -> impl Strategy<Value = T> {
    proptest::sample::select(all)
}

fn address() -> impl Strategy<Value = DeviceAddress> {
    prop_oneof![
        pci().prop_map(DeviceAddress::Pci),
        any::<[u32; 4]>().prop_map(|[controller, bus, target, unit]| DeviceAddress::Drive {
            controller,
            bus,
            target,
            unit
        }),
    ]
}

fn interface_kind() -> impl Strategy<Value = InterfaceKind> {
    prop_oneof![
        (
            device_name(),
            option::of((uuid(), option::of(text()))),
            option::of(device_name())
        )
            .prop_map(|(bridge, vp, target)| InterfaceKind::Bridge {
                bridge,
                virtualport: vp.map(|(interface_id, profile_id)| OvsPort {
                    interface_id,
                    profile_id
                }),
                target,
            }),
        option::of((device_name(), option::of(any::<bool>()))).prop_map(|t| {
            InterfaceKind::Ethernet {
                target: t.map(|(dev, managed)| EthernetTarget { dev, managed }),
            }
        }),
        (pci(), any::<bool>())
            .prop_map(|(source, managed)| InterfaceKind::Hostdev { source, managed }),
        (
            device_name(),
            keyword(DirectMode::ALL),
            option::of(device_name())
        )
            .prop_map(|(source, mode, target)| InterfaceKind::Direct {
                source,
                mode,
                target
            }),
        (
            text(),
            keyword(VhostUserMode::ALL),
            option::of(device_name())
        )
            .prop_map(|(path, mode, target)| InterfaceKind::VhostUser {
                path,
                mode,
                target
            }),
        text().prop_map(|dev| InterfaceKind::Vdpa { dev }),
        (text(), option::of(device_name()))
            .prop_map(|(network, target)| InterfaceKind::Network { network, target }),
    ]
}

fn rate() -> impl Strategy<Value = Rate> {
    (
        any::<u64>(),
        option::of(any::<u64>()),
        option::of(any::<u64>()),
    )
        .prop_map(|(average, peak, burst)| Rate {
            average,
            peak,
            burst,
        })
}

fn interface() -> impl Strategy<Value = Interface> {
    (
        interface_kind(),
        option::of(mac()),
        option::of(keyword(NicModel::ALL)),
        option::of(any::<u32>()),
        option::of(0u16..=4095),
        option::of((
            option::of(keyword(NetDriverName::ALL)),
            option::of(any::<u32>()),
            option::of(any::<u32>()),
            option::of(any::<u32>()),
        )),
        option::of((option::of(rate()), option::of(rate()))),
        option::of(text()),
        option::of(address()),
    )
        .prop_map(
            |(kind, mac, model, mtu, vlan, driver, bandwidth, alias, address)| Interface {
                kind,
                mac,
                model,
                mtu,
                vlan,
                driver: driver.map(|(name, queues, rx_queue_size, tx_queue_size)| NetDriver {
                    name,
                    queues,
                    rx_queue_size,
                    tx_queue_size,
                }),
                // An empty <bandwidth> is not written: generate only non-empty ones.
                bandwidth: bandwidth
                    .filter(|(i, o)| i.is_some() || o.is_some())
                    .map(|(inbound, outbound)| Bandwidth { inbound, outbound }),
                alias,
                address,
            },
        )
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map(text(), inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn metadata() -> impl Strategy<Value = VireoMetadata> {
    (
        uuid(),
        (
            text(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            btree_map(text(), text(), 0..4),
        ),
        json(),
        option::of((text(), text(), text(), any::<u64>(), json())),
        option::of(json()),
    )
        .prop_map(
            |(instance_uuid, f, network_info, op, record)| VireoMetadata {
                instance_uuid,
                flavor: Flavor {
                    name: f.0,
                    vcpus: f.1,
                    memory_mb: f.2,
                    root_gb: f.3,
                    ephemeral_gb: 0,
                    swap_mb: 0,
                    extra_specs: f.4,
                },
                network_info,
                operation: op.map(|(id, kind, phase, started_at, data)| InFlightOperation {
                    id,
                    kind,
                    phase,
                    started_at,
                    data,
                }),
                record,
            },
        )
}

fn disk() -> impl Strategy<Value = Disk> {
    let source = prop_oneof![
        text().prop_map(|path| DiskSource::File { path }),
        text().prop_map(|dev| DiskSource::Block { dev }),
        (
            text(),
            vec((text(), option::of(any::<u16>())), 0..3),
            option::of((text(), uuid()))
        )
            .prop_map(|(name, hosts, auth)| DiskSource::Rbd {
                name,
                hosts: hosts
                    .into_iter()
                    .map(|(name, port)| RbdHost { name, port })
                    .collect(),
                auth: auth.map(|(username, secret_uuid)| DiskAuth {
                    username,
                    secret_uuid
                }),
            }),
    ];
    (
        keyword(DiskDevice::ALL),
        source,
        option::of((
            keyword(DiskFormat::ALL),
            option::of(keyword(DiskCache::ALL)),
            any::<bool>(),
        )),
        text(),
        keyword(DiskBus::ALL),
        any::<bool>(),
        option::of(text()),
        option::of(text()),
        option::of(address()),
    )
        .prop_map(
            |(device, source, driver, target_dev, target_bus, readonly, serial, alias, address)| {
                Disk {
                    device,
                    source,
                    driver: driver.map(|(format, cache, discard_unmap)| DiskDriver {
                        format,
                        cache,
                        discard_unmap,
                    }),
                    target_dev,
                    target_bus,
                    readonly,
                    serial,
                    alias,
                    address,
                }
            },
        )
}

fn char_source() -> impl Strategy<Value = CharSource> {
    prop_oneof![
        option::of(text()).prop_map(|path| CharSource::Pty { path }),
        (text(), option::of(any::<bool>()))
            .prop_map(|(path, append)| CharSource::File { path, append }),
        (text(), keyword(UnixMode::ALL)).prop_map(|(path, mode)| CharSource::Unix { path, mode }),
    ]
}

fn hostdev() -> impl Strategy<Value = Hostdev> {
    (
        pci(),
        any::<bool>(),
        option::of(text()),
        option::of(address()),
    )
        .prop_map(|(source, managed, alias, address)| Hostdev {
            source,
            managed,
            alias,
            address,
        })
}

fn domain() -> impl Strategy<Value = Domain> {
    let head = (
        keyword(DomainType::ALL),
        option::of(any::<u32>()),
        domain_name(),
        option::of(uuid()),
        option::of(metadata()),
        any::<u64>(),
        option::of(any::<u64>()),
        any::<u32>(),
        option::of((
            keyword(CpuMode::ALL),
            option::of(text()),
            option::of(any::<[u32; 3]>()),
        )),
    );
    let os = (
        option::of(text()),
        option::of(text()),
        option::of(text()),
        option::of(text()),
        option::of(text()),
        vec(keyword(BootDevice::ALL), 0..3),
    )
        .prop_map(|(arch, machine, kernel, initrd, cmdline, boot)| Os {
            arch,
            machine,
            kernel,
            initrd,
            cmdline,
            boot,
        });
    let rest = (
        os,
        any::<[bool; 4]>(),
        option::of(any::<bool>()),
        option::of((
            keyword(ClockOffset::ALL),
            vec(
                (
                    keyword(TimerName::ALL),
                    option::of(keyword(TickPolicy::ALL)),
                    option::of(any::<bool>()),
                ),
                0..3,
            ),
        )),
        [
            option::of(keyword(LifecycleAction::ALL)),
            option::of(keyword(LifecycleAction::ALL)),
            option::of(keyword(LifecycleAction::ALL)),
        ],
    );
    let devices = (
        option::of(text()),
        vec(disk(), 0..3),
        vec(interface(), 0..5),
        vec(hostdev(), 0..2),
        vec(
            (
                char_source(),
                option::of((text(), option::of(any::<bool>()))),
                option::of(any::<u32>()),
                option::of(text()),
            ),
            0..2,
        ),
        vec(
            (
                char_source(),
                option::of(keyword(ConsoleTarget::ALL)),
                option::of(any::<u32>()),
                option::of(text()),
            ),
            0..2,
        ),
    )
        .prop_map(
            |(emulator, disks, interfaces, hostdevs, serials, consoles)| Devices {
                emulator,
                disks,
                interfaces,
                hostdevs,
                serials: serials
                    .into_iter()
                    .map(|(source, log, port, alias)| Serial {
                        source,
                        log: log.map(|(file, append)| CharLog { file, append }),
                        port,
                        alias,
                    })
                    .collect(),
                consoles: consoles
                    .into_iter()
                    .map(|(source, target, port, alias)| Console {
                        source,
                        target,
                        port,
                        alias,
                    })
                    .collect(),
            },
        );
    (head, rest, devices).prop_map(|(h, r, devices)| {
        let (domain_type, id, name, uuid, metadata, memory_kib, current_memory_kib, vcpus, cpu) = h;
        let (os, [acpi, apic, pae, vmcoreinfo], vmport, clock, [on_poweroff, on_reboot, on_crash]) =
            r;
        Domain {
            domain_type,
            id,
            name,
            uuid,
            metadata,
            memory_kib,
            current_memory_kib,
            vcpus,
            cpu: cpu.map(|(mode, model, topo)| Cpu {
                mode,
                model,
                topology: topo.map(|[sockets, cores, threads]| CpuTopology {
                    sockets,
                    cores,
                    threads,
                }),
            }),
            os,
            features: Features {
                acpi,
                apic,
                pae,
                vmcoreinfo,
                vmport,
            },
            clock: clock.map(|(offset, timers)| Clock {
                offset,
                timers: timers
                    .into_iter()
                    .map(|(name, tickpolicy, present)| Timer {
                        name,
                        tickpolicy,
                        present,
                    })
                    .collect(),
            }),
            on_poweroff,
            on_reboot,
            on_crash,
            devices,
        }
    })
}

proptest! {
    // 256 cases by default; PROPTEST_CASES=N runs more.
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn interface_round_trips(i in interface()) {
        let xml = i.to_xml().unwrap();
        prop_assert_eq!(Interface::from_xml(&xml).unwrap(), i, "{}", xml);
    }

    #[test]
    fn metadata_round_trips(m in metadata()) {
        let xml = m.to_xml().unwrap();
        prop_assert_eq!(VireoMetadata::from_xml(&xml).unwrap(), m, "{}", xml);
    }

    #[test]
    fn disk_and_hostdev_round_trip(d in disk(), h in hostdev()) {
        let xml = d.to_xml().unwrap();
        prop_assert_eq!(Disk::from_xml(&xml).unwrap(), d, "{}", xml);
        let xml = h.to_xml().unwrap();
        prop_assert_eq!(Hostdev::from_xml(&xml).unwrap(), h, "{}", xml);
    }

    #[test]
    fn domain_round_trips(d in domain()) {
        let xml = d.to_xml().unwrap();
        let back = Domain::from_xml(&xml);
        prop_assert!(back.is_ok(), "{:?}\n{}", back.err(), xml);
        prop_assert_eq!(back.unwrap(), d, "{}", xml);
    }

    #[test]
    fn bad_macs_are_typed_errors(s in "[0-9a-fA-F:]{0,20}|\\PC{0,20}") {
        prop_assume!(s.parse::<MacAddress>().is_err());
        let xml = format!("<interface type='ethernet'><mac address='{}'/></interface>",
            s.replace('&', "&amp;").replace('<', "&lt;").replace('\'', "&apos;"));
        let err = Interface::from_xml(&xml).unwrap_err();
        prop_assert!(matches!(err, XmlError::Invalid { ref field, source: types::ValueError::Mac(_) }
            if field == "interface/mac/@address"), "{}", err);
    }

    #[test]
    fn bad_uuids_are_typed_errors(s in "[0-9a-f-]{0,40}") {
        prop_assume!(uuid::Uuid::parse_str(&s).is_err());
        let xml = format!("<domain type='kvm'><name>x</name><uuid>{s}</uuid>\
            <memory>1</memory><os><type>hvm</type></os></domain>");
        let err = Domain::from_xml(&xml).unwrap_err();
        prop_assert!(matches!(err, XmlError::Invalid { ref field, source: types::ValueError::Uuid(_) }
            if field == "domain/uuid"), "{}", err);
    }

    #[test]
    fn bad_pci_addresses_are_typed_errors(slot in 32u32..1000, function in 8u32..100) {
        for (s, f) in [(slot, 0), (0, function)] {
            let xml = format!("<hostdev mode='subsystem' type='pci'><source><address \
                domain='0x0000' bus='0x81' slot='{s:#x}' function='{f:#x}'/></source></hostdev>");
            let err = Hostdev::from_xml(&xml).unwrap_err();
            prop_assert!(matches!(err, XmlError::Invalid { source: types::ValueError::Pci(_), .. }),
                "{}", err);
        }
    }

    #[test]
    fn blank_names_are_typed_errors(s in "[ \t\n]{0,4}") {
        let xml = format!("<domain type='kvm'><name>{s}</name><memory>1</memory>\
            <os><type>hvm</type></os></domain>");
        let err = Domain::from_xml(&xml).unwrap_err();
        prop_assert!(matches!(err, XmlError::Invalid { ref field, source: types::ValueError::DomainName(_) }
            if field == "domain/name"), "{}", err);
    }

    #[test]
    fn arbitrary_input_never_panics(s in "\\PC{0,200}|<domain[ -~]{0,200}") {
        let _ = Domain::from_xml(&s);
        let _ = Interface::from_xml(&s);
        let _ = VireoMetadata::from_xml(&s);
        let _ = vireo_xml::live::rewrite(&s, &[vireo_xml::live::Edit::RemoveMetadata]);
    }
}
