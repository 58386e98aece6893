//! Property tests of the strict `network_info` parser on generated documents.
//!
//! - Valid documents (every vif_type and vnic_type, booleans and numbers in each spelling Nova
//!   uses, free-text fields full of XML and shell metacharacters, unknown keys) always parse,
//!   with the same VIF count, in order, holding what was generated; `predict` runs on them
//!   under every operation and wiring, naming a refused VIF by its index and port.
//! - One fault put into one VIF of a valid document (a wrong JSON type in any field, a value
//!   out of range, a device name with metacharacters or over 15 bytes, a bad UUID, MAC or PCI
//!   address, an unknown or unusable vif_type, an unknown vnic_type, a missing required key, a
//!   duplicated port id or MAC) is always exactly the typed error naming that VIF's index, its
//!   port and the field's dotted path, with the expected problem; never a panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Map, Value};
use vireo_actors::predict::{predict, DeviceForm, EventOp, PredictError, Wiring};
use vireo_actors::vif::{NetworkInfo, Problem, VifError, VifType, VnicType};

/// Free text with XML and shell metacharacters, whitespace and any Unicode.
fn hostile() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            3 => "[<>&'\"]",
            3 => "[;|$()`\\\\]",
            2 => "[a-z0-9 ._/-]",
            1 => "\\PC",
        ],
        0..24,
    )
    .prop_map(|v| v.concat())
}

/// A valid Linux interface name as the parser accepts it.
fn ifname() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_.-]{1,15}".prop_filter("not . or ..", |s| s != "." && s != "..")
}

/// A boolean in every spelling the parser accepts, with its meaning (`None`: leave it out).
fn boolean() -> impl Strategy<Value = Option<(Value, bool)>> {
    prop_oneof![
        Just(None),
        any::<bool>().prop_map(|b| Some((json!(b), b))),
        (any::<bool>(), select(vec![0usize, 1, 2])).prop_map(|(b, case)| {
            let s = match (b, case) {
                (true, 0) => "true",
                (true, 1) => "True",
                (true, _) => "TRUE",
                (false, 0) => "false",
                (false, 1) => "False",
                (false, _) => "FALSE",
            };
            Some((json!(s), b))
        }),
    ]
}

/// An integer in `min..=max`, as a JSON number or a decimal string.
fn int_in(min: u64, max: u64) -> impl Strategy<Value = Value> {
    (min..=max, any::<bool>()).prop_map(|(n, s)| if s { json!(n.to_string()) } else { json!(n) })
}

fn pci() -> impl Strategy<Value = String> {
    (any::<u16>(), any::<u8>(), 0u8..32, 0u8..8)
        .prop_map(|(d, b, s, f)| format!("{d:04x}:{b:02x}:{s:02x}.{f:x}"))
}

/// What a generated VIF must parse to (the fields checked after parsing).
#[derive(Debug, Clone)]
struct Want {
    vif_type: VifType,
    vnic_type: VnicType,
    active: bool,
    hybrid: bool,
}

/// One valid VIF dict; `n` makes its port id and MAC unique in the document.
fn vif(n: u16) -> impl Strategy<Value = (Value, Want)> {
    let head = (
        any::<u64>(),
        any::<bool>(),
        any::<u8>(),
        select(VifType::ALL.to_vec()),
        proptest::option::of(select(VnicType::ALL.to_vec())),
        boolean(),
        boolean(),
        proptest::option::of(ifname()),
    );
    let details = (
        boolean(),
        proptest::option::of(int_in(0, 4095)),
        proptest::option::of(ifname()),
        proptest::option::of(hostile()),
        proptest::option::of(hostile()),
        proptest::option::of(ifname()),
    );
    let rest = (
        proptest::option::of(pci()),
        proptest::option::of(hostile()),
        proptest::option::of(ifname()),
        hostile(),
        proptest::option::of(int_in(68, 65535)),
        hostile(),
        boolean(),
    );
    (head, details, rest).prop_map(
        move |(
            (rand, upper, oui, vif_type, vnic, active, preserve, devname),
            (hybrid, vlan, bridge_name, socket, mode, phys),
            (pci_slot, physnet, bridge, label, mtu, extra, trusted),
        )| {
            let id = uuid::Uuid::from_u128((u128::from(rand) << 16) | u128::from(n)).to_string();
            let mac = format!("fa:16:{oui:02x}:00:{:02x}:{:02x}", n >> 8, n & 0xff);
            let (id, mac) = if upper {
                (id.to_uppercase(), mac.to_uppercase())
            } else {
                (id, mac)
            };
            let mut v = Map::new();
            v.insert("id".into(), json!(id));
            v.insert("address".into(), json!(mac));
            v.insert("type".into(), json!(vif_type.as_str()));
            if let Some(t) = vnic {
                v.insert("vnic_type".into(), json!(t.as_str()));
            }
            if let Some((b, _)) = &active {
                v.insert("active".into(), b.clone());
            }
            if let Some((b, _)) = &preserve {
                v.insert("preserve_on_delete".into(), b.clone());
            }
            if let Some(d) = devname {
                v.insert("devname".into(), json!(d));
            }
            let mut d = Map::new();
            if let Some((b, _)) = &hybrid {
                d.insert("ovs_hybrid_plug".into(), b.clone());
            }
            if let Some(t) = vlan {
                d.insert("vlan".into(), t);
            }
            if let Some(b) = bridge_name {
                d.insert("bridge_name".into(), json!(b));
            }
            if let Some(s) = socket {
                d.insert("vhostuser_socket".into(), json!(s));
            }
            if let Some(m) = mode {
                d.insert("macvtap_mode".into(), json!(m));
            }
            if let Some(p) = phys {
                d.insert("physical_interface".into(), json!(p));
            }
            d.insert("x-unknown".into(), json!([extra.clone(), {"k": null}]));
            v.insert("details".into(), Value::Object(d));
            let mut p = Map::new();
            if let Some(s) = pci_slot {
                p.insert("pci_slot".into(), json!(s));
            }
            if let Some(s) = physnet {
                p.insert("physical_network".into(), json!(s));
            }
            if let Some((b, _)) = &trusted {
                p.insert("trusted".into(), b.clone());
            }
            v.insert("profile".into(), Value::Object(p));
            let mut meta = Map::new();
            if let Some(m) = mtu {
                meta.insert("mtu".into(), m);
            }
            meta.insert("tunneled".into(), json!(true));
            v.insert(
                "network".into(),
                json!({"id": "net-1", "bridge": bridge, "label": label, "meta": meta,
                       "subnets": [{"cidr": "10.0.0.0/26", "ips": []}]}),
            );
            v.insert("qbh_params".into(), Value::Null);
            v.insert("x-extra".into(), json!(extra));
            let want = Want {
                vif_type,
                vnic_type: vnic.unwrap_or_default(),
                active: active.is_some_and(|(_, b)| b),
                hybrid: hybrid.is_some_and(|(_, b)| b),
            };
            (Value::Object(v), want)
        },
    )
}

/// A valid `network_info` of 1..=6 VIFs.
fn network_info() -> impl Strategy<Value = Vec<(Value, Want)>> {
    (1usize..=6).prop_flat_map(|n| (0..n).map(|i| vif(i as u16)).collect::<Vec<_>>())
}

/// Set `path` (dotted) in `v`, creating objects on the way; `None` removes the key.
fn set_path(v: &mut Value, path: &str, new: Option<Value>) {
    let mut cur = v;
    let mut keys: Vec<&str> = path.split('.').collect();
    let last = keys.pop().unwrap();
    for k in keys {
        let obj = cur.as_object_mut().unwrap();
        let next = obj.entry(k).or_insert_with(|| json!({}));
        if !next.is_object() {
            *next = json!({});
        }
        cur = next;
    }
    let obj = cur.as_object_mut().unwrap();
    match new {
        Some(x) => {
            obj.insert(last.to_owned(), x);
        }
        None => {
            obj.remove(last);
        }
    }
}

const STRING_FIELDS: &[&str] = &[
    "id",
    "address",
    "type",
    "vnic_type",
    "devname",
    "details.bridge_name",
    "details.datapath_type",
    "details.vhostuser_socket",
    "details.vhostuser_mode",
    "details.physical_interface",
    "details.macvtap_mode",
    "details.macvtap_source",
    "details.connectivity",
    "profile.pci_slot",
    "profile.physical_network",
    "profile.pci_vendor_info",
    "profile.migrating_to",
    "network.id",
    "network.bridge",
    "network.label",
    "network.meta.physical_network",
];
const BOOL_FIELDS: &[&str] = &[
    "active",
    "preserve_on_delete",
    "details.ovs_hybrid_plug",
    "details.port_filter",
    "details.vhostuser_ovs_plug",
    "profile.trusted",
];
const OBJECT_FIELDS: &[&str] = &["details", "profile", "network", "network.meta"];
const NAME_FIELDS: &[&str] = &[
    "devname",
    "details.bridge_name",
    "details.physical_interface",
    "details.macvtap_source",
    "network.bridge",
];

/// A fault: the field it breaks, the value put there (`None`: removed), and the problem the
/// parser must report.
#[derive(Debug, Clone)]
struct Fault {
    field: &'static str,
    value: Option<Value>,
    problem: Problem,
}

fn fault() -> impl Strategy<Value = Fault> {
    let not_string = (
        select(STRING_FIELDS),
        select(vec![
            json!(7),
            json!(true),
            json!([]),
            json!({"a": 1}),
            json!(-1.5),
        ]),
    )
        .prop_map(|(field, value)| Fault {
            field,
            value: Some(value),
            problem: Problem::NotString,
        });
    let not_bool = (
        select(BOOL_FIELDS),
        select(vec![
            json!(1),
            json!(0),
            json!("yes"),
            json!(""),
            json!("1"),
            json!(" true"),
            json!([]),
            json!({}),
        ]),
    )
        .prop_map(|(field, value)| Fault {
            field,
            problem: Problem::NotBool(value.to_string()),
            value: Some(value),
        });
    let out_of_range = (
        select(vec![
            ("details.vlan", 0u64, 4095u64),
            ("network.meta.mtu", 68, 65535),
        ]),
        any::<u8>(),
    )
        .prop_map(|((field, min, max), pick)| {
            let value = match pick % 9 {
                0 => json!(max + 1),
                1 => json!(-1),
                2 => json!(1.5),
                3 => json!("12a"),
                4 => json!(""),
                5 => json!("+5"),
                6 => json!(true),
                7 => json!("99999999999999999999999"),
                _ if min > 0 => json!(min - 1),
                _ => json!((max + 1).to_string()),
            };
            Fault {
                field,
                problem: Problem::OutOfRange {
                    value: value.to_string(),
                    min,
                    max,
                },
                value: Some(value),
            }
        });
    let not_object = (
        select(OBJECT_FIELDS),
        select(vec![json!("x"), json!(1), json!([{}]), json!(false)]),
    )
        .prop_map(|(field, value)| Fault {
            field,
            value: Some(value),
            problem: Problem::NotObject,
        });
    let bad_name = (
        select(NAME_FIELDS),
        prop_oneof![
            // Metacharacters.
            "[a-z]{0,4}[<>&'\";|$()`\\\\ /:*?\\[\\]{}!#%^=+,~]{1,3}[a-z]{0,4}",
            // Over IFNAMSIZ - 1.
            "[a-z0-9_.-]{16,40}",
            // Non-ASCII or control characters.
            "[a-z]{0,4}[é\u{0}\t\n\u{202e}][a-z]{0,4}",
            Just(String::new()),
            Just(".".to_owned()),
            Just("..".to_owned()),
        ],
    )
        .prop_map(|(field, name)| Fault {
            field,
            value: Some(json!(name)),
            problem: Problem::BadDevName(name),
        });
    let bad_id = prop_oneof![
        Just("not-a-uuid".to_owned()),
        "[0-9a-f]{32}",
        "\\{[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\\}",
        "urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-g]{4}-[g-z][0-9a-f]{3}-[0-9a-f]{12}",
        "[<>&;|$`]{1,36}",
    ]
    .prop_map(|s| Fault {
        field: "id",
        value: Some(json!(s)),
        problem: Problem::BadUuid(s),
    });
    let bad_mac = prop_oneof![
        "fa:16:3e:[0-9a-f]{2}:[0-9a-f]{2}",
        "fa:16:3e:[0-9a-f]{2}:[0-9a-f]{2}:[g-z]{2}",
        "[0-9a-f][13579bdf](:[0-9a-f]{2}){5}",
        Just("00:00:00:00:00:00".to_owned()),
        Just("fa:16:3e:00:00:01:02".to_owned()),
        Just("fa16.3e00.0001".to_owned()),
        "[<>&;|$`]{1,17}",
    ]
    .prop_map(|s| Fault {
        field: "address",
        value: Some(json!(s)),
        problem: Problem::BadMac(s),
    });
    let bad_type = prop_oneof![
        select(vec!["other", "unbound", "binding_failed"]).prop_map(|s| Fault {
            field: "type",
            value: Some(json!(s)),
            problem: Problem::UnusableVifType(s.to_owned()),
        }),
        hostile()
            .prop_filter("not a known vif_type", |s| {
                s.parse::<VifType>().is_err()
                    && !["other", "unbound", "binding_failed"].contains(&s.as_str())
            })
            .prop_map(|s| Fault {
                field: "type",
                value: Some(json!(s)),
                problem: Problem::UnknownVifType(s),
            }),
        select(vec![
            "802.qbh", "802.qbg", "ivs", "iovisor", "midonet", "OVS", "ovs "
        ])
        .prop_map(|s| Fault {
            field: "type",
            value: Some(json!(s)),
            problem: Problem::UnknownVifType(s.to_owned()),
        }),
    ];
    let bad_vnic = prop_oneof![
        hostile(),
        Just("Normal".to_owned()),
        Just("direct_physical".to_owned())
    ]
    .prop_filter("not a known vnic_type", |s| s.parse::<VnicType>().is_err())
    .prop_map(|s| Fault {
        field: "vnic_type",
        value: Some(json!(s)),
        problem: Problem::UnknownVnicType(s),
    });
    let bad_pci = prop_oneof![
        "0000:[0-9a-f]{2}:[2-9][0-9a-f]\\.[0-7]",
        "0000:[0-9a-f]{2}:[01][0-9a-f]\\.[89a-f]",
        "[0-9a-f]{5}:00:00\\.0",
        Just(String::new()),
        "[<>&;|$`]{1,12}",
    ]
    .prop_map(|s| Fault {
        field: "profile.pci_slot",
        value: Some(json!(s)),
        problem: Problem::BadPci(s),
    });
    let missing =
        (select(vec!["id", "address", "type"]), any::<bool>()).prop_map(|(field, null)| Fault {
            field,
            value: null.then_some(Value::Null),
            problem: Problem::Missing,
        });
    prop_oneof![
        not_string,
        not_bool,
        out_of_range,
        not_object,
        bad_name,
        bad_id,
        bad_mac,
        bad_type,
        bad_vnic,
        bad_pci,
        missing
    ]
}

fn text_of(vifs: &[(Value, Want)]) -> String {
    Value::Array(vifs.iter().map(|(v, _)| v.clone()).collect()).to_string()
}

fn port_of(v: &Value) -> String {
    v.get("id")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_owned()
}

fn assert_names(err: &VifError, index: usize, port: &str, field: &str) {
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("VIF {index} (port {port}): field `{field}`: ")),
        "{msg}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn valid_documents_parse_whole(vifs in network_info()) {
        let text = text_of(&vifs);
        let ni = NetworkInfo::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        prop_assert_eq!(ni.vifs.len(), vifs.len());
        for (i, (v, (raw, want))) in ni.vifs.iter().zip(&vifs).enumerate() {
            prop_assert_eq!(v.index, i);
            prop_assert_eq!(&v.raw_value(), raw);
            prop_assert_eq!(v.id.to_string(), raw["id"].as_str().unwrap().to_lowercase());
            prop_assert_eq!(
                v.address.to_string(),
                raw["address"].as_str().unwrap().to_lowercase()
            );
            prop_assert_eq!(v.vif_type, want.vif_type);
            prop_assert_eq!(v.vnic_type, want.vnic_type);
            prop_assert_eq!(v.active, want.active);
            prop_assert_eq!(v.details.ovs_hybrid_plug, want.hybrid);
            prop_assert_eq!(v.network.label.as_deref(), raw["network"]["label"].as_str());
        }
        prop_assert_eq!(NetworkInfo::parse(&ni.to_value().to_string()), Ok(ni));
    }

    #[test]
    fn predict_names_a_refused_vif_on_valid_documents(
        vifs in network_info(),
        column in 0usize..11,
        pre in any::<bool>(),
    ) {
        let text = text_of(&vifs);
        let op = match column {
            0 => EventOp::Spawn,
            1 => EventOp::AttachInterface,
            2 => EventOp::HardReboot,
            3 => EventOp::PowerOn,
            4 => EventOp::FinishResize { same_host: pre },
            5 => EventOp::RevertResize { source: "a".into(), dest: "b".into() },
            6 => EventOp::LiveMigration { source: "a".into(), dest: "b".into() },
            7 => EventOp::PostLiveMigration { source: "a".into(), dest: "b".into() },
            8 => EventOp::UpdateBindingProfile,
            9 => EventOp::ClearBindingProfile,
            _ => EventOp::LiveMigration { source: "a".into(), dest: "a".into() },
        };
        let form = if pre { DeviceForm::PreCreated } else { DeviceForm::LibvirtManaged };
        let w = Wiring { ovs_native: form, linux_bridge: form };
        let ni = NetworkInfo::parse(&text).unwrap();
        if let Err(PredictError::Unsupported { index, port, .. }) = predict(&op, &ni.vifs, &w) {
            prop_assert_eq!(port, ni.vifs[index].id);
        }
    }

    #[test]
    fn one_fault_is_the_typed_error_naming_vif_port_and_field(
        (vifs, at) in network_info().prop_flat_map(|v| { let n = v.len(); (Just(v), 0..n) }),
        fault in fault(),
    ) {
        let mut docs: Vec<Value> = vifs.iter().map(|(v, _)| v.clone()).collect();
        set_path(&mut docs[at], fault.field, fault.value.clone());
        let text = Value::Array(docs.clone()).to_string();
        let err = NetworkInfo::parse(&text).unwrap_err();
        let port = port_of(&docs[at]);
        prop_assert_eq!(
            &err,
            &VifError::Field {
                index: at,
                port: port.clone(),
                field: fault.field.to_owned(),
                problem: fault.problem.clone(),
            },
            "{}", text
        );
        assert_names(&err, at, &port, fault.field);
    }

    #[test]
    fn duplicate_port_ids_and_macs_name_the_later_vif(
        (vifs, i, j) in (2usize..=6)
            .prop_flat_map(|n| (0..n).map(|k| vif(k as u16)).collect::<Vec<_>>())
            .prop_flat_map(|v| {
                let n = v.len();
                (Just(v), 0..n - 1).prop_flat_map(move |(v, i)| (Just(v), Just(i), i + 1..n))
            }),
        mac in any::<bool>(),
        case in any::<bool>(),
    ) {
        let mut docs: Vec<Value> = vifs.iter().map(|(v, _)| v.clone()).collect();
        let key = if mac { "address" } else { "id" };
        let same = docs[i][key].as_str().unwrap();
        // Another spelling of the same value is still a duplicate.
        let same = if case { same.to_uppercase() } else { same.to_lowercase() };
        let same = if mac && case { same.replace(':', "-") } else { same };
        docs[j][key] = json!(same);
        let text = Value::Array(docs.clone()).to_string();
        let err = NetworkInfo::parse(&text).unwrap_err();
        let port = port_of(&docs[j]);
        prop_assert_eq!(
            &err,
            &VifError::Field { index: j, port: port.clone(), field: key.to_owned(), problem: Problem::Duplicate(i) }
        );
        assert_names(&err, j, &port, key);
    }

    #[test]
    fn any_json_in_any_field_is_ok_or_a_named_error(
        (vifs, at) in network_info().prop_flat_map(|v| { let n = v.len(); (Just(v), 0..n) }),
        field in select([STRING_FIELDS, BOOL_FIELDS, OBJECT_FIELDS, &["details.vlan", "network.meta.mtu"]].concat()),
        value in proptest::arbitrary::any::<u8>().prop_flat_map(|_| json_value()),
    ) {
        let mut docs: Vec<Value> = vifs.iter().map(|(v, _)| v.clone()).collect();
        set_path(&mut docs[at], field, Some(value));
        let text = Value::Array(docs.clone()).to_string();
        match NetworkInfo::parse(&text) {
            Ok(ni) => prop_assert_eq!(ni.vifs.len(), docs.len()),
            Err(VifError::Field { index, field: got, port, .. }) => {
                prop_assert_eq!(index, at);
                prop_assert_eq!(got, field);
                prop_assert_eq!(port, port_of(&docs[at]));
            }
            Err(e) => prop_assert!(false, "{e}"),
        }
    }
}

/// Any JSON value, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        hostile().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
