//! [`predict_json`]: prediction straight from `network_info` JSON text, reading only the
//! fields prediction needs (`id`, `type`, `vnic_type`, `active`, `details.ovs_hybrid_plug`)
//! with the same strict rules and [`Problem`]s as the full model in [`crate::vif`]; every
//! other key is skipped unparsed. Structural errors (an item that is not an object, a
//! `details` that is not an object) are reported as [`VifError::Json`].

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::{classify, table_cell, Operation, PredictError, Prediction, VifPrediction, Wiring};
use crate::vif::{PortId, Problem, VifError, VifType, VnicType};

/// A JSON scalar as prediction needs it, or the text of anything else.
#[derive(Debug)]
enum Scalar<'a> {
    Bool(bool),
    Str(Cow<'a, str>),
    Other(String),
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
                Ok(Scalar::Other(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Other(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Scalar<'a>, E> {
                Ok(Scalar::Other(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Scalar<'a>, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other("[...]".to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Scalar<'a>, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other("{...}".to_owned()))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

#[derive(Debug, Deserialize)]
struct LeanDetails<'a> {
    #[serde(borrow, default)]
    ovs_hybrid_plug: Option<Scalar<'a>>,
}

#[derive(Debug, Deserialize)]
struct LeanVif<'a> {
    #[serde(borrow, default)]
    id: Option<Scalar<'a>>,
    #[serde(rename = "type", borrow, default)]
    vif_type: Option<Scalar<'a>>,
    #[serde(borrow, default)]
    vnic_type: Option<Scalar<'a>>,
    #[serde(borrow, default)]
    active: Option<Scalar<'a>>,
    #[serde(borrow, default)]
    details: Option<LeanDetails<'a>>,
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
            Some(Scalar::Str(s)) => Err(self.err(field, Problem::NotBool(format!("{s:?}")))),
            Some(Scalar::Other(t)) => Err(self.err(field, Problem::NotBool(t.clone()))),
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
            None => false,
            Some(d) => c.bool(&d.ovs_hybrid_plug, "details.ovs_hybrid_plug")?,
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
