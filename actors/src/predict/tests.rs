//! Tests of the event prediction: every cell of docs/EVENT_MODEL.md, Nova's own cases, errors.

use super::*;
use crate::vif::{NetworkInfo, Problem, VifError};
use serde_json::{json, Value};

const DOC: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../docs/EVENT_MODEL.md"
));

fn port(n: u32) -> String {
    format!("3b2c4d5e-0000-4000-8000-{n:012}")
}

fn vif_json(n: u32, vif_type: &str, vnic: &str, hybrid: bool, active: bool) -> Value {
    json!({
        "id": port(n),
        "address": format!("fa:16:3e:00:00:{:02x}", n),
        "type": vif_type,
        "vnic_type": vnic,
        "active": active,
        "details": {"ovs_hybrid_plug": hybrid, "port_filter": true},
        "network": {"id": "net-1", "bridge": "br-int", "meta": {"mtu": 1450}},
    })
}

/// A VIF of a table row: `variant` names ML2/OVN's rows, whose binding names its driver.
fn row_vif(vif_type: &str, vnic: &str, variant: &str, hybrid: bool, active: bool) -> Value {
    let mut v = vif_json(1, vif_type, vnic, hybrid, active);
    if variant.starts_with("ML2/OVN") {
        v["details"]["bound_drivers"] = json!({"0": OVN_DRIVER});
    }
    v
}

fn vifs(items: Vec<Value>) -> Vec<Vif> {
    NetworkInfo::from_value(&Value::Array(items)).unwrap().vifs
}

/// The markdown table rows between `<!-- {tag}:begin -->` and `<!-- {tag}:end -->`, header and
/// separator dropped, cells trimmed.
fn doc_rows(tag: &str) -> Vec<Vec<String>> {
    let begin = format!("<!-- {tag}:begin -->");
    let end = format!("<!-- {tag}:end -->");
    let start = DOC.find(&begin).unwrap() + begin.len();
    let stop = DOC.find(&end).unwrap();
    DOC[start..stop]
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

fn timing_of(s: &str) -> Timing {
    match s {
        "bind" => Timing::BindTime,
        "plug" => Timing::PlugTime,
        "none" => Timing::None,
        other => panic!("bad cell {other:?}"),
    }
}

fn wiring_of(variant: &str) -> (bool, Wiring) {
    let form = if variant.contains("pre-created") {
        DeviceForm::PreCreated
    } else {
        DeviceForm::LibvirtManaged
    };
    (
        variant == "hybrid",
        Wiring {
            ovs_native: form,
            linux_bridge: form,
        },
    )
}

/// A representative operation for each column, with hosts.
fn op_for(column: Column) -> EventOp {
    let h = |s: &str| s.to_owned();
    match column {
        Column::Spawn => EventOp::Spawn,
        Column::AttachInterface => EventOp::AttachInterface,
        Column::HardReboot => EventOp::HardReboot,
        Column::PowerOn => EventOp::PowerOn,
        Column::FinishResizeCrossHost => EventOp::FinishResize { same_host: false },
        Column::FinishResizeSameHost => EventOp::FinishResize { same_host: true },
        Column::RevertResizeCrossHost => EventOp::RevertResize {
            source: h("h1"),
            dest: h("h2"),
        },
        Column::RevertResizeSameHost => EventOp::RevertResize {
            source: h("h1"),
            dest: h("h1"),
        },
        Column::LiveMigrationSource => EventOp::LiveMigration {
            source: h("h1"),
            dest: h("h2"),
        },
        Column::PostLiveMigrationDest => EventOp::PostLiveMigration {
            source: h("h1"),
            dest: h("h2"),
        },
        Column::UpdateBindingProfile => EventOp::UpdateBindingProfile,
        Column::ClearBindingProfile => EventOp::ClearBindingProfile,
    }
}

#[test]
fn every_cell_of_the_documented_table_holds() {
    let rows = doc_rows("cells");
    assert_eq!(rows.len(), Kind::ALL.len(), "one row per kind");
    let mut kinds_seen = Vec::new();
    let mut cells = 0;
    for row in &rows {
        assert_eq!(row.len(), 3 + Column::ALL.len(), "{row:?}");
        let (hybrid, wiring) = wiring_of(&row[2]);
        for vnic in row[1].split(", ") {
            for (i, column) in Column::ALL.into_iter().enumerate() {
                let text = &row[3 + i];
                let (inactive, active) = match text.split_once('/') {
                    Some((a, b)) => {
                        assert!(column.uses_active(), "{column:?} has no a/b cell");
                        (timing_of(a), timing_of(b))
                    }
                    None => {
                        assert!(!column.uses_active(), "{column:?} needs an a/b cell");
                        (timing_of(text), timing_of(text))
                    }
                };
                for (flag, want) in [(false, inactive), (true, active)] {
                    let v = vifs(vec![row_vif(&row[0], vnic, &row[2], hybrid, flag)]);
                    let p = predict(&op_for(column), &v, &wiring).unwrap();
                    assert_eq!(
                        p.vifs[0].timing, want,
                        "{}/{vnic}/{} active={flag} {column:?}: {}",
                        row[0], row[2], p.vifs[0].reason
                    );
                    assert_eq!(p.column, column);
                    cells += 1;
                }
                let v = vifs(vec![row_vif(&row[0], vnic, &row[2], hybrid, false)]);
                kinds_seen.push(predict(&op_for(column), &v, &wiring).unwrap().vifs[0].kind);
            }
        }
    }
    for k in Kind::ALL {
        assert!(kinds_seen.contains(&k), "{k:?} has no row in the doc");
    }
    // 11 (vif, vnic, variant) rows x 12 columns x both values of `active`.
    assert_eq!(cells, 11 * 12 * 2);
}

#[test]
fn every_vif_type_vnic_type_pair_is_documented_and_classified() {
    let rows = doc_rows("kinds");
    let header: Vec<&str> = DOC[DOC.find("<!-- kinds:begin -->").unwrap()..]
        .lines()
        .find(|l| l.starts_with('|'))
        .unwrap()
        .trim_matches('|')
        .split('|')
        .map(str::trim)
        .skip(1)
        .collect();
    let vnics: Vec<VnicType> = header.iter().map(|h| h.parse().unwrap()).collect();
    assert_eq!(
        vnics,
        VnicType::ALL.to_vec(),
        "columns are VnicType::ALL in order"
    );
    let types: Vec<VifType> = rows.iter().map(|r| vif_type_of(&r[0])).collect();
    assert_eq!(
        types,
        VifType::ALL.to_vec(),
        "rows are VifType::ALL in order"
    );
    let wiring = Wiring::default();
    let mut pairs = 0;
    for row in &rows {
        let vt = vif_type_of(&row[0]);
        for (j, vnic) in vnics.iter().enumerate() {
            let want = &row[1 + j];
            for hybrid in [false, true] {
                let got = match classify(vt, *vnic, hybrid, None, &wiring) {
                    Ok(Kind::OvsHybrid | Kind::OvsNative(_)) => "ovs".to_owned(),
                    Ok(Kind::LinuxBridge(_)) => "linux-bridge".to_owned(),
                    Ok(k) => k.label(),
                    Err(e) => e.code().to_owned(),
                };
                assert_eq!(&got, want, "{vt}/{vnic} hybrid={hybrid}");
            }
            // And through `predict`, as a typed error naming the VIF.
            if let Err(why) = classify(vt, *vnic, false, None, &wiring) {
                let v = vifs(vec![
                    vif_json(1, "ovs", "normal", false, false),
                    vif_json(2, vt.as_str(), vnic.as_str(), false, false),
                ]);
                let err = predict(&EventOp::Spawn, &v, &wiring).unwrap_err();
                assert_eq!(
                    err,
                    PredictError::Unsupported {
                        index: 1,
                        port: port(2).parse().unwrap(),
                        vif_type: vt,
                        vnic_type: *vnic,
                        why,
                    }
                );
                assert!(err.to_string().contains(&port(2)), "{err}");
            }
            pairs += 1;
        }
    }
    assert_eq!(pairs, VifType::ALL.len() * VnicType::ALL.len());
}

fn vif_type_of(s: &str) -> VifType {
    VifType::ALL.into_iter().find(|t| t.as_str() == s).unwrap()
}

#[test]
fn every_reason_is_one_non_empty_line() {
    for column in Column::ALL {
        for kind in Kind::ALL {
            for active in [false, true] {
                let c = table_cell(column, kind, active);
                assert!(!c.reason.is_empty() && !c.reason.contains('\n'));
                assert!(c.reason.len() < 200, "{}", c.reason);
            }
        }
    }
}

// Nova's own cases (nova/tests/unit/network/test_network_info.py, test_get_events, and the
// libvirt driver's _get_neutron_events).

fn hybrid_and_normal() -> Vec<Vif> {
    vifs(vec![
        vif_json(1, "ovs", "normal", true, false),
        vif_json(2, "ovs", "normal", false, false),
    ])
}

#[test]
fn nova_revert_cross_host_hybrid_is_bind_time_normal_is_plug_time() {
    let op = EventOp::RevertResize {
        source: "h1".into(),
        dest: "h2".into(),
    };
    let p = predict(&op, &hybrid_and_normal(), &Wiring::default()).unwrap();
    let p1: PortId = port(1).parse().unwrap();
    let p2: PortId = port(2).parse().unwrap();
    assert_eq!(p.bind_time_events(), vec![ExpectedEvent::plugged(p1)]);
    assert_eq!(p.plug_time_events(), vec![ExpectedEvent::plugged(p2)]);
}

/// Nova's model lists every VIF plug-time on a same-host revert, but Nova 26's libvirt driver
/// awaits none there (`_get_neutron_events` skips ports already active). vireo keeps the
/// devices wired and waits only for the tap libvirt recreates (docs/EVENT_MODEL.md §5, 9).
#[test]
fn revert_same_host_waits_only_for_the_recreated_tap() {
    let op = EventOp::RevertResize {
        source: "h1".into(),
        dest: "h1".into(),
    };
    let p = predict(&op, &hybrid_and_normal(), &Wiring::default()).unwrap();
    assert_eq!(p.bind_time_events(), vec![]);
    let tap = ExpectedEvent::plugged(port(2).parse().unwrap());
    assert_eq!(p.plug_time_events(), vec![tap]);
    let pre_created = Wiring {
        ovs_native: DeviceForm::PreCreated,
        ..Wiring::default()
    };
    let p = predict(&op, &hybrid_and_normal(), &pre_created).unwrap();
    assert_eq!(p.plug_time_events(), vec![]);
}

#[test]
fn nova_spawn_waits_only_on_inactive_vifs_and_never_on_remote_managed() {
    let v = vifs(vec![
        vif_json(1, "ovs", "normal", true, false),
        vif_json(2, "ovs", "normal", false, true),
        vif_json(3, "ovs", "remote-managed", false, false),
        vif_json(4, "hw_veb", "direct", false, false),
        vif_json(5, "bridge", "normal", false, true),
    ]);
    let p = predict(&EventOp::Spawn, &v, &Wiring::default()).unwrap();
    let plug: Vec<u32> = [1, 4].to_vec();
    assert_eq!(
        p.plug_time_events(),
        plug.iter()
            .map(|n| ExpectedEvent::plugged(port(*n).parse().unwrap()))
            .collect::<Vec<_>>()
    );
    assert!(p.bind_time_events().is_empty());
    let none: Vec<PortId> = p.not_waited().map(|v| v.port).collect();
    assert_eq!(
        none,
        [2, 3, 5]
            .map(|n| port(n).parse::<PortId>().unwrap())
            .to_vec()
    );
}

#[test]
fn a_missing_active_flag_counts_as_inactive() {
    let mut raw = vif_json(1, "ovs", "normal", false, false);
    raw.as_object_mut().unwrap().remove("active");
    let p = predict(&EventOp::Spawn, &vifs(vec![raw]), &Wiring::default()).unwrap();
    assert_eq!(p.vifs[0].timing, Timing::PlugTime);
}

#[test]
fn no_double_waits_an_empty_plug_list_stays_empty() {
    // Nova fell back to every inactive port when its plug-time list was empty; vireo does
    // not: a hard reboot of pre-created and hybrid VIFs waits on nothing.
    let v = vifs(vec![
        vif_json(1, "ovs", "normal", true, false),
        vif_json(2, "ovs", "normal", false, false),
    ]);
    let w = Wiring {
        ovs_native: DeviceForm::PreCreated,
        linux_bridge: DeviceForm::PreCreated,
    };
    let p = predict(&EventOp::HardReboot, &v, &w).unwrap();
    assert!(p.plug_time_events().is_empty() && p.bind_time_events().is_empty());
    assert_eq!(p.not_waited().count(), 2);
}

#[test]
fn string_false_hybrid_flag_means_native() {
    let mut raw = vif_json(1, "ovs", "normal", false, false);
    raw["details"]["ovs_hybrid_plug"] = json!("False");
    let op = EventOp::RevertResize {
        source: "h1".into(),
        dest: "h2".into(),
    };
    let p = predict(&op, &vifs(vec![raw]), &Wiring::default()).unwrap();
    assert_eq!(p.vifs[0].kind, Kind::OvsNative(DeviceForm::LibvirtManaged));
    assert_eq!(p.vifs[0].timing, Timing::PlugTime);
}

#[test]
fn every_vif_lands_in_exactly_one_list_in_order() {
    let v = vifs(vec![
        vif_json(1, "ovs", "normal", true, false),
        vif_json(2, "hostdev_physical", "direct-physical", false, false),
        vif_json(3, "hw_veb", "macvtap", false, false),
        vif_json(4, "ovs", "normal", false, false),
    ]);
    for column in Column::ALL {
        let p = predict(&op_for(column), &v, &Wiring::default()).unwrap();
        let total =
            p.bind_time_events().len() + p.plug_time_events().len() + p.not_waited().count();
        assert_eq!(total, 4, "{column:?}");
        let order: Vec<usize> = p.vifs.iter().map(|v| v.index).collect();
        assert_eq!(order, vec![0, 1, 2, 3]);
    }
}

#[test]
fn migrations_with_bad_hosts_are_errors() {
    let v = hybrid_and_normal();
    let w = Wiring::default();
    let same = EventOp::LiveMigration {
        source: "h1".into(),
        dest: "h1".into(),
    };
    assert!(matches!(
        predict(&same, &v, &w),
        Err(PredictError::InvalidMigration {
            operation: "live-migration",
            ..
        })
    ));
    let same = EventOp::PostLiveMigration {
        source: "h1".into(),
        dest: "h1".into(),
    };
    assert!(predict(&same, &v, &w).is_err());
    let empty = EventOp::RevertResize {
        source: String::new(),
        dest: "h2".into(),
    };
    let err = predict(&empty, &v, &w).unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
}

#[test]
fn operation_names_and_forms_round_trip() {
    for f in [DeviceForm::LibvirtManaged, DeviceForm::PreCreated] {
        assert_eq!(f.as_str().parse::<DeviceForm>(), Ok(f));
    }
    assert!("managed".parse::<DeviceForm>().is_err());
    let names: Vec<&str> = Column::ALL.into_iter().map(|c| op_for(c).name()).collect();
    assert!(names.contains(&"update-binding-profile") && names.contains(&"spawn"));
    assert!(names.contains(&"clear-binding-profile"));
}

#[test]
fn agent_served_matches_the_rule() {
    // Agentless kinds never get plug-time anywhere; agent-served kinds never get bind-time
    // at spawn.
    for kind in Kind::ALL {
        for column in Column::ALL {
            let c = table_cell(column, kind, false);
            if !kind.agent_served() {
                assert_ne!(c.timing, Timing::PlugTime, "{kind:?} {column:?}");
            } else if column == Column::Spawn {
                assert_eq!(c.timing, Timing::PlugTime, "{kind:?}");
            }
        }
    }
}

// The strict parser on `network_info` text, then the model.

fn parse(text: &str) -> Result<Vec<Vif>, VifError> {
    NetworkInfo::parse(text).map(|ni| ni.vifs)
}

fn full(op: &EventOp, text: &str, w: &Wiring) -> Result<Prediction, PredictError> {
    let vifs = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    predict(op, &vifs, w)
}

#[test]
fn a_bad_field_of_a_vif_is_a_field_error() {
    let mut cases: Vec<Value> = Vec::new();
    let base = vif_json(1, "ovs", "normal", true, false);
    for (path, bad) in [
        ("active", json!("no")),
        ("active", json!(1)),
        ("id", json!(7)),
        ("id", json!("not-a-uuid")),
        ("id", Value::Null),
        ("type", json!("802.qbh")),
        ("type", json!("binding_failed")),
        ("type", Value::Null),
        ("vnic_type", json!("fancy")),
        ("vnic_type", json!(false)),
    ] {
        let mut v = base.clone();
        v[path] = bad;
        cases.push(Value::Array(vec![
            vif_json(2, "ovs", "normal", false, false),
            v,
        ]));
    }
    let mut v = base.clone();
    v["details"]["ovs_hybrid_plug"] = json!("yes");
    cases.push(Value::Array(vec![v]));
    cases.push(Value::Array(vec![base.clone(), {
        let mut d = vif_json(2, "ovs", "normal", true, false);
        d["id"] = base["id"].clone();
        d
    }]));
    for case in cases {
        let text = case.to_string();
        let err = parse(&text).unwrap_err();
        assert!(matches!(err, VifError::Field { .. }), "{text}: {err}");
    }
}

#[test]
fn duplicates_are_found_in_long_lists_too() {
    for (len, dup_of) in [(3usize, 1u32), (33, 2), (40, 35)] {
        let mut items: Vec<Value> = (0..len as u32)
            .map(|n| vif_json(n, "ovs", "normal", false, false))
            .collect();
        let mut d = vif_json(200, "ovs", "normal", false, false);
        d["id"] = json!(port(dup_of));
        items.push(d);
        let text = Value::Array(items).to_string();
        let err = parse(&text).unwrap_err();
        assert!(
            matches!(err, VifError::Field { problem: Problem::Duplicate(i), .. } if i == dup_of as usize)
        );
    }
}

// A key given twice: the full parser takes the last value (a last null is as absent).
#[test]
fn the_last_of_duplicate_keys_counts() {
    let w = Wiring::default();
    let op = EventOp::HardReboot;
    let p1 = port(1);
    let texts = [
        // `type` twice: the last one (bridge) counts.
        format!(
            r#"[{{"id":"{p1}","address":"fa:16:3e:00:00:01","type":"hw_veb","type":"bridge"}}]"#
        ),
        // `id`, `active` and `details.ovs_hybrid_plug` twice, `details` twice.
        format!(
            r#"[{{"id":"x","id":"{p1}","address":"fa:16:3e:00:00:01","type":"ovs",
               "active":"no","active":true,"details":7,
               "details":{{"ovs_hybrid_plug":"bad","ovs_hybrid_plug":true}}}}]"#
        ),
        // Last value null: as absent.
        format!(
            r#"[{{"id":"{p1}","address":"fa:16:3e:00:00:01","type":"ovs","vnic_type":"x",
               "vnic_type":null,"details":{{"ovs_hybrid_plug":1,"ovs_hybrid_plug":null}}}}]"#
        ),
    ];
    for text in texts {
        let got = full(&op, &text, &w);
        assert!(got.is_ok(), "{text}: {got:?}");
    }
    let want_kind = [
        Kind::LinuxBridge(DeviceForm::LibvirtManaged),
        Kind::OvsHybrid,
    ];
    for (text, kind) in [
        format!(r#"[{{"id":"{p1}","address":"fa:16:3e:00:00:01","type":"hw_veb","type":"bridge"}}]"#),
        format!(r#"[{{"id":"{p1}","address":"fa:16:3e:00:00:01","type":"ovs","details":{{"ovs_hybrid_plug":false,"ovs_hybrid_plug":true}}}}]"#),
    ]
    .iter()
    .zip(want_kind)
    {
        assert_eq!(full(&op, text, &w).unwrap().vifs[0].kind, kind);
    }
}

#[test]
fn a_non_object_details_or_vif_is_refused() {
    let mut v = vif_json(1, "ovs", "normal", true, false);
    for bad in [json!(7), json!("x"), json!([1]), json!(true)] {
        v["details"] = bad;
        let text = Value::Array(vec![v.clone()]).to_string();
        assert!(matches!(
            parse(&text).unwrap_err(),
            VifError::Field { ref field, problem: Problem::NotObject, .. } if field == "details"
        ));
    }
    // A VIF given as a list is not a VIF (serde derive once accepted a struct as a sequence).
    let text = format!(r#"[["{}","ovs"]]"#, port(1));
    assert_eq!(parse(&text), Err(VifError::NotAnObject { index: 0 }));
}

// Found by actors/tests/prop_network_info.rs: a non-boolean list, object, float or a string
// with characters Rust and JSON escape differently is shown as its JSON text.
#[test]
fn a_bad_boolean_is_shown_as_its_json_text() {
    for bad in [
        json!([]),
        json!({"a": [1]}),
        json!(1.0),
        json!("\u{1}\u{7f}x"),
        json!(-0.5),
    ] {
        for path in ["active", "details.ovs_hybrid_plug"] {
            let mut v = vif_json(1, "ovs", "normal", true, false);
            match path {
                "active" => v["active"] = bad.clone(),
                _ => v["details"]["ovs_hybrid_plug"] = bad.clone(),
            }
            let text = Value::Array(vec![v]).to_string();
            assert_eq!(
                parse(&text),
                Err(VifError::Field {
                    index: 0,
                    port: port(1),
                    field: path.into(),
                    problem: Problem::NotBool(bad.to_string()),
                })
            );
        }
    }
}
