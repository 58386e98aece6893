//! [`predict_json`]: prediction straight from `network_info` JSON text, reading only the
//! fields prediction needs (`id`, `type`, `vnic_type`, `active`, `details.ovs_hybrid_plug`)
//! with the same strict rules and [`Problem`]s as the full model in [`crate::vif`]; every
//! other key is skipped unparsed. A key given twice counts once, with its last value, as in
//! the full parser (`serde_json::Value`). An item that is not an object is reported as
//! [`VifError::Json`]; a `details` that is not an object as the full parser reports it.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use super::{classify, table_cell, Operation, PredictError, Prediction, VifPrediction, Wiring};
use crate::vif::{PortId, Problem, VifError, VifType, VnicType};

/// A JSON scalar as prediction needs it, or anything else (always an error for the fields
/// read, kept whole so the error shows it as the full parser does).
#[derive(Debug)]
enum Scalar<'a> {
    Bool(bool),
    Str(Cow<'a, str>),
    Other(Value),
}

impl<'de: 'a, 'a> Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Scalar<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Bool(v))
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Other(Value::from(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Other(Value::from(v)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Other(Value::from(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, a: A) -> Result<Scalar<'a>, A::Error> {
                Value::deserialize(SeqAccessDeserializer::new(a)).map(Scalar::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, a: A) -> Result<Scalar<'a>, A::Error> {
                Value::deserialize(MapAccessDeserializer::new(a)).map(Scalar::Other)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// `details`, as far as prediction reads it.
#[derive(Debug, Default)]
enum LeanDetails<'a> {
    /// Absent or null.
    #[default]
    Absent,
    /// An object: its (last) `ovs_hybrid_plug`.
    Object(Option<Scalar<'a>>),
    /// Anything else.
    NotObject,
}

#[derive(Debug, Default)]
struct LeanVif<'a> {
    id: Option<Scalar<'a>>,
    vif_type: Option<Scalar<'a>>,
    vnic_type: Option<Scalar<'a>>,
    active: Option<Scalar<'a>>,
    details: LeanDetails<'a>,
}

/// A key of a VIF dict (or of its `details`): the ones prediction reads, or any other.
enum Key {
    Id,
    Type,
    VnicType,
    Active,
    Details,
    OvsHybridPlug,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "id" => Key::Id,
                    "type" => Key::Type,
                    "vnic_type" => Key::VnicType,
                    "active" => Key::Active,
                    "details" => Key::Details,
                    "ovs_hybrid_plug" => Key::OvsHybridPlug,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for LeanVif<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = LeanVif<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a VIF object")
            }
            // Later keys overwrite earlier ones, as in `serde_json::Value`.
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<LeanVif<'a>, A::Error> {
                let mut v = LeanVif::default();
                while let Some(key) = a.next_key::<Key>()? {
                    match key {
                        Key::Id => v.id = a.next_value()?,
                        Key::Type => v.vif_type = a.next_value()?,
                        Key::VnicType => v.vnic_type = a.next_value()?,
                        Key::Active => v.active = a.next_value()?,
                        Key::Details => v.details = a.next_value()?,
                        Key::OvsHybridPlug | Key::Other => {
                            a.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(v)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for LeanDetails<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = LeanDetails<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<LeanDetails<'a>, E> {
                Ok(LeanDetails::Absent)
            }
            fn visit_none<E>(self) -> Result<LeanDetails<'a>, E> {
                Ok(LeanDetails::Absent)
            }
            fn visit_bool<E>(self, _: bool) -> Result<LeanDetails<'a>, E> {
                Ok(LeanDetails::NotObject)
            }
            fn visit_i64<E>(self, _: i64) -> Result<LeanDetails<'a>, E> {
                Ok(LeanDetails::NotObject)
            }
            fn visit_u64<E>(self, _: u64) -> Result<LeanDetails<'a>, E> {
                Ok(LeanDetails::NotObject)
            }
            fn visit_f64<E>(self, _: f64) -> Result<LeanDetails<'a>, E> {
                Ok(LeanDetails::NotObject)
            }
            fn visit_str<E>(self, _: &str) -> Result<LeanDetails<'a>, E> {
                Ok(LeanDetails::NotObject)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<LeanDetails<'a>, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(LeanDetails::NotObject)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<LeanDetails<'a>, A::Error> {
                let mut hybrid = None;
                while let Some(key) = a.next_key::<Key>()? {
                    match key {
                        Key::OvsHybridPlug => hybrid = a.next_value()?,
                        _ => {
                            a.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(LeanDetails::Object(hybrid))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

struct Ctx<'a> {
    index: usize,
    port: &'a str,
}

impl Ctx<'_> {
    fn err(&self, field: &str, problem: Problem) -> PredictError {
        PredictError::NetworkInfo(VifError::Field {
            index: self.index,
            port: self.port.to_owned(),
            field: field.to_owned(),
            problem,
        })
    }

    fn str<'s>(
        &self,
        v: &'s Option<Scalar<'_>>,
        field: &str,
    ) -> Result<Option<&'s str>, PredictError> {
        match v {
            None => Ok(None),
            Some(Scalar::Str(s)) => Ok(Some(s)),
            Some(_) => Err(self.err(field, Problem::NotString)),
        }
    }

    fn bool(&self, v: &Option<Scalar<'_>>, field: &str) -> Result<bool, PredictError> {
        match v {
            None => Ok(false),
            Some(Scalar::Bool(b)) => Ok(*b),
            Some(Scalar::Str(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
            Some(Scalar::Str(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
            // The value as JSON text, as the full parser shows it.
            Some(Scalar::Str(s)) => Err(self.err(
                field,
                Problem::NotBool(Value::String(s.to_string()).to_string()),
            )),
            Some(Scalar::Other(v)) => Err(self.err(field, Problem::NotBool(v.to_string()))),
        }
    }
}

/// Predict from `network_info` JSON text. Same result as parsing with
/// [`crate::vif::NetworkInfo::parse`] and calling [`super::predict`], for any `network_info`
/// the full parser accepts; it checks only the fields it reads.
pub fn predict_json(
    operation: &Operation,
    network_info: &str,
    wiring: &Wiring,
) -> Result<Prediction, PredictError> {
    let column = operation.column()?;
    let list: Vec<LeanVif<'_>> = serde_json::from_str(network_info).map_err(|e| {
        PredictError::NetworkInfo(
            if e.classify() == serde_json::error::Category::Data
                && network_info.trim_start().starts_with('{')
            {
                VifError::NotAList
            } else {
                VifError::Json(e.to_string())
            },
        )
    })?;
    let mut out = Vec::with_capacity(list.len());
    let mut seen: HashSet<PortId> = HashSet::new();
    for (index, v) in list.iter().enumerate() {
        let port_text = match &v.id {
            Some(Scalar::Str(s)) => s.as_ref(),
            _ => "?",
        };
        let c = Ctx {
            index,
            port: port_text,
        };
        let port: PortId = match c.str(&v.id, "id")? {
            None => return Err(c.err("id", Problem::Missing)),
            Some(s) => s.parse().map_err(|p| c.err("id", p))?,
        };
        let vif_type: VifType = match c.str(&v.vif_type, "type")? {
            None => return Err(c.err("type", Problem::Missing)),
            Some(s) => s.parse().map_err(|p| c.err("type", p))?,
        };
        let vnic_type: VnicType = match c.str(&v.vnic_type, "vnic_type")? {
            None => VnicType::Normal,
            Some(s) => s.parse().map_err(|p| c.err("vnic_type", p))?,
        };
        let active = c.bool(&v.active, "active")?;
        let hybrid = match &v.details {
            LeanDetails::Absent => false,
            LeanDetails::Object(h) => c.bool(h, "details.ovs_hybrid_plug")?,
            LeanDetails::NotObject => return Err(c.err("details", Problem::NotObject)),
        };
        // Instances have a handful of VIFs: a linear scan beats hashing up to a few dozen.
        let dup = if out.len() < 32 {
            out.iter().position(|p: &VifPrediction| p.port == port)
        } else if !seen.insert(port) {
            out.iter().position(|p: &VifPrediction| p.port == port)
        } else {
            None
        };
        if let Some(first) = dup {
            return Err(c.err("id", Problem::Duplicate(first)));
        }
        if out.len() == 31 {
            seen.extend(out.iter().map(|p| p.port));
            seen.insert(port);
        }
        let kind = classify(vif_type, vnic_type, hybrid, wiring).map_err(|why| {
            PredictError::Unsupported {
                index,
                port,
                vif_type,
                vnic_type,
                why,
            }
        })?;
        let cell = table_cell(column, kind, active);
        out.push(VifPrediction {
            index,
            port,
            kind,
            timing: cell.timing,
            reason: cell.reason,
        });
    }
    Ok(Prediction { column, vifs: out })
}
