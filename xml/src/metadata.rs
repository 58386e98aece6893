//! vireo's instance facts in the domain's `<metadata>`: instance uuid, flavor,
//! `network_info`, the in-flight operation and vireo's own record (lifecycle state, boot
//! source, a resize waiting for confirm or revert), so a restarted agent recovers from libvirt
//! alone.
//!
//! In a domain document the element is `<vireo:instance xmlns:vireo=NAMESPACE_URI>` with
//! every child prefixed. [`VireoMetadata::to_xml`] writes the unprefixed fragment libvirt's
//! `virDomainSetMetadata(type=ELEMENT, key=NAMESPACE_PREFIX, uri=NAMESPACE_URI)` expects, and
//! [`VireoMetadata::from_xml`] reads either form (and what `virDomainGetMetadata` returns).
//!
//! ```xml
//! <vireo:instance xmlns:vireo="https://vireo.dev/xmlns/libvirt/instance/1.0">
//!   <vireo:uuid>…</vireo:uuid>
//!   <vireo:flavor name="m1.small" vcpus="1" memory_mb="2048" root_gb="20">
//!     <vireo:extra_spec key="hw:cpu_policy" value="dedicated"/>
//!   </vireo:flavor>
//!   <vireo:network_info>[…Nova network_info JSON…]</vireo:network_info>
//!   <vireo:operation id="…" kind="resize" phase="…" started_at="1764000000000">{…}</vireo:operation>
//!   <vireo:record>{"host": "compute-1", "state": "running", "boot": {…}, "resize": null}</vireo:record>
//! </vireo:instance>
//! ```

use std::collections::BTreeMap;

use quick_xml::events::Event;
use quick_xml::name::ResolveResult;
use quick_xml::NsReader;
use serde::Deserialize;
use uuid::Uuid;

use crate::error::XmlError;
use crate::parse::{self, req, Str};
use crate::write::Writer;

/// The namespace of vireo's metadata element (accepted by libvirt's set-metadata API).
pub const NAMESPACE_URI: &str = "https://vireo.dev/xmlns/libvirt/instance/1.0";
/// The prefix vireo writes.
pub const NAMESPACE_PREFIX: &str = "vireo";
/// The metadata element's local name.
pub const ELEMENT: &str = "instance";

/// The flavor the instance was built with.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Flavor {
    /// Flavor name.
    pub name: String,
    /// vCPUs.
    pub vcpus: u32,
    /// RAM in MiB.
    pub memory_mb: u64,
    /// Root disk in GiB (0: the image's size).
    #[serde(default)]
    pub root_gb: u64,
    /// Ephemeral disk in GiB (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ephemeral_gb: u64,
    /// Swap disk in MiB (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub swap_mb: u64,
    /// Extra specs (`hw:vif_multiqueue_enabled`, `quota:vif_*`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_specs: BTreeMap<String, String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// An operation that was running when the metadata was written: after a restart, vireo
/// resumes or rolls it back from here.
#[derive(Debug, Clone, PartialEq)]
pub struct InFlightOperation {
    /// Operation id (request id).
    pub id: String,
    /// What it is (`spawn`, `resize_revert`, ...).
    pub kind: String,
    /// How far it got.
    pub phase: String,
    /// Start time, Unix milliseconds.
    pub started_at: u64,
    /// Whatever the operation needs to resume or roll back.
    pub data: serde_json::Value,
}

/// vireo's metadata element.
#[derive(Debug, Clone, PartialEq)]
pub struct VireoMetadata {
    /// The instance (Nova's instance uuid; also the domain uuid).
    pub instance_uuid: Uuid,
    /// The flavor.
    pub flavor: Flavor,
    /// Nova-format `network_info`, stored as received.
    pub network_info: serde_json::Value,
    /// The operation in flight, if any.
    pub operation: Option<InFlightOperation>,
    /// vireo's own record of the instance (owning host, lifecycle state, boot source, resize in
    /// progress, ...), as JSON. Opaque to this crate.
    pub record: Option<serde_json::Value>,
}

struct Names {
    root: &'static str,
    uuid: &'static str,
    flavor: &'static str,
    spec: &'static str,
    net: &'static str,
    op: &'static str,
    record: &'static str,
}

const PREFIXED: Names = Names {
    root: "vireo:instance",
    uuid: "vireo:uuid",
    flavor: "vireo:flavor",
    spec: "vireo:extra_spec",
    net: "vireo:network_info",
    op: "vireo:operation",
    record: "vireo:record",
};

const PLAIN: Names = Names {
    root: "instance",
    uuid: "uuid",
    flavor: "flavor",
    spec: "extra_spec",
    net: "network_info",
    op: "operation",
    record: "record",
};

impl VireoMetadata {
    /// The unprefixed fragment for `virDomainSetMetadata` (with
    /// key [`NAMESPACE_PREFIX`] and uri [`NAMESPACE_URI`]).
    pub fn to_xml(&self) -> Result<String, XmlError> {
        let mut w = Writer::with_capacity(1024);
        self.write(&mut w, false)?;
        Ok(w.out)
    }

    /// Parse the element: prefixed as in a domain document, or unprefixed as
    /// `virDomainGetMetadata` returns it. A root in another namespace is refused.
    pub fn from_xml(xml: &str) -> Result<Self, XmlError> {
        check_ns_root(xml)?;
        Self::from_checked_xml(xml)
    }

    /// Parse an element whose namespace the caller has already resolved (inside a domain
    /// document the prefix may be declared on an ancestor, out of the fragment's sight).
    pub(crate) fn from_checked_xml(xml: &str) -> Result<Self, XmlError> {
        let wire: InstanceW<'_> = crate::parse::de(xml)?;
        VireoMetadata::from_wire(wire)
    }

    pub(crate) fn write(&self, w: &mut Writer, prefixed: bool) -> Result<(), XmlError> {
        let n = if prefixed { &PREFIXED } else { &PLAIN };
        w.open(n.root);
        if prefixed {
            w.attr_raw("xmlns:vireo", NAMESPACE_URI);
        }
        w.close_start();
        w.open(n.uuid);
        w.close_start();
        let mut buf = Uuid::encode_buffer();
        w.raw(self.instance_uuid.hyphenated().encode_lower(&mut buf));
        w.end(n.uuid);

        let f = &self.flavor;
        w.open(n.flavor);
        w.attr("name", &f.name)?;
        w.attr_u64("vcpus", u64::from(f.vcpus));
        w.attr_u64("memory_mb", f.memory_mb);
        w.attr_u64("root_gb", f.root_gb);
        // Written only when set: metadata of flavors without them reads as before.
        if f.ephemeral_gb != 0 {
            w.attr_u64("ephemeral_gb", f.ephemeral_gb);
        }
        if f.swap_mb != 0 {
            w.attr_u64("swap_mb", f.swap_mb);
        }
        if f.extra_specs.is_empty() {
            w.close_empty();
        } else {
            w.close_start();
            for (k, v) in &f.extra_specs {
                w.open(n.spec);
                w.attr("key", k)?;
                w.attr("value", v)?;
                w.close_empty();
            }
            w.end(n.flavor);
        }

        let json = serde_json::to_string(&self.network_info).map_err(|source| XmlError::Json {
            field: "network_info",
            source,
        })?;
        w.text_elem(n.net, &json)?;

        if let Some(op) = &self.operation {
            w.open(n.op);
            w.attr("id", &op.id)?;
            w.attr("kind", &op.kind)?;
            w.attr("phase", &op.phase)?;
            w.attr_u64("started_at", op.started_at);
            w.close_start();
            let json = serde_json::to_string(&op.data).map_err(|source| XmlError::Json {
                field: "operation",
                source,
            })?;
            w.text(&json)?;
            w.end(n.op);
        }
        if let Some(record) = &self.record {
            let json = serde_json::to_string(record).map_err(|source| XmlError::Json {
                field: "record",
                source,
            })?;
            w.text_elem(n.record, &json)?;
        }
        w.end(n.root);
        Ok(())
    }

    fn from_wire(i: InstanceW<'_>) -> Result<Self, XmlError> {
        let uuid = req(i.uuid, || "instance/uuid".to_owned())?;
        let f = i
            .flavor
            .ok_or_else(|| XmlError::missing("instance/flavor"))?;
        let mut extra_specs = BTreeMap::new();
        for (n, s) in f.extra_spec.into_iter().enumerate() {
            extra_specs.insert(
                req(s.key, || format!("instance/flavor/extra_spec[{n}]/@key"))?.into_string(),
                req(s.value, || {
                    format!("instance/flavor/extra_spec[{n}]/@value")
                })?
                .into_string(),
            );
        }
        let flavor = Flavor {
            name: req(f.name, || "instance/flavor/@name".to_owned())?.into_string(),
            vcpus: parse::num(
                &req(f.vcpus, || "instance/flavor/@vcpus".to_owned())?,
                || "instance/flavor/@vcpus".to_owned(),
            )?,
            memory_mb: parse::num(
                &req(f.memory_mb, || "instance/flavor/@memory_mb".to_owned())?,
                || "instance/flavor/@memory_mb".to_owned(),
            )?,
            root_gb: parse::num(
                &req(f.root_gb, || "instance/flavor/@root_gb".to_owned())?,
                || "instance/flavor/@root_gb".to_owned(),
            )?,
            ephemeral_gb: f
                .ephemeral_gb
                .map(|v| parse::num(&v, || "instance/flavor/@ephemeral_gb".to_owned()))
                .transpose()?
                .unwrap_or(0),
            swap_mb: f
                .swap_mb
                .map(|v| parse::num(&v, || "instance/flavor/@swap_mb".to_owned()))
                .transpose()?
                .unwrap_or(0),
            extra_specs,
        };
        let net = req(i.network_info, || "instance/network_info".to_owned())?;
        let network_info = serde_json::from_str(&net).map_err(|source| XmlError::Json {
            field: "network_info",
            source,
        })?;
        let operation = match i.operation {
            None => None,
            Some(op) => Some(InFlightOperation {
                id: req(op.id, || "instance/operation/@id".to_owned())?.into_string(),
                kind: req(op.kind, || "instance/operation/@kind".to_owned())?.into_string(),
                phase: req(op.phase, || "instance/operation/@phase".to_owned())?.into_string(),
                started_at: parse::num(
                    &req(op.started_at, || {
                        "instance/operation/@started_at".to_owned()
                    })?,
                    || "instance/operation/@started_at".to_owned(),
                )?,
                data: serde_json::from_str(&op.data).map_err(|source| XmlError::Json {
                    field: "operation",
                    source,
                })?,
            }),
        };
        let record = match i.record {
            None => None,
            Some(text) => Some(
                serde_json::from_str(&text).map_err(|source| XmlError::Json {
                    field: "record",
                    source,
                })?,
            ),
        };
        Ok(VireoMetadata {
            instance_uuid: parse::uuid(&uuid, || "instance/uuid".to_owned())?,
            flavor,
            network_info,
            operation,
            record,
        })
    }
}

/// The root must be `instance`, in vireo's namespace or in none.
fn check_ns_root(xml: &str) -> Result<(), XmlError> {
    let mut reader = NsReader::from_str(xml);
    loop {
        match reader.read_resolved_event()? {
            (ns, Event::Start(e) | Event::Empty(e)) => {
                let ours = match ns {
                    ResolveResult::Unbound => true,
                    ResolveResult::Bound(n) => n.as_ref() == NAMESPACE_URI.as_bytes(),
                    ResolveResult::Unknown(_) => false,
                };
                if ours && e.local_name().as_ref() == ELEMENT.as_bytes() {
                    return Ok(());
                }
                return Err(XmlError::WrongRoot {
                    expected: "vireo:instance",
                    found: String::from_utf8_lossy(e.name().as_ref()).into_owned(),
                });
            }
            (_, Event::Eof) => {
                return Err(XmlError::WrongRoot {
                    expected: "vireo:instance",
                    found: String::new(),
                })
            }
            _ => {}
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct InstanceW<'a> {
    #[serde(borrow)]
    uuid: Option<Str<'a>>,
    #[serde(borrow)]
    flavor: Option<FlavorW<'a>>,
    #[serde(borrow)]
    network_info: Option<Str<'a>>,
    #[serde(borrow)]
    operation: Option<OperationW<'a>>,
    #[serde(borrow)]
    record: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct FlavorW<'a> {
    #[serde(borrow, rename = "@name")]
    name: Option<Str<'a>>,
    #[serde(borrow, rename = "@vcpus")]
    vcpus: Option<Str<'a>>,
    #[serde(borrow, rename = "@memory_mb")]
    memory_mb: Option<Str<'a>>,
    #[serde(borrow, rename = "@root_gb")]
    root_gb: Option<Str<'a>>,
    #[serde(borrow, rename = "@ephemeral_gb")]
    ephemeral_gb: Option<Str<'a>>,
    #[serde(borrow, rename = "@swap_mb")]
    swap_mb: Option<Str<'a>>,
    #[serde(borrow, default)]
    extra_spec: Vec<SpecW<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct SpecW<'a> {
    #[serde(borrow, rename = "@key")]
    key: Option<Str<'a>>,
    #[serde(borrow, rename = "@value")]
    value: Option<Str<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct OperationW<'a> {
    #[serde(borrow, rename = "@id")]
    id: Option<Str<'a>>,
    #[serde(borrow, rename = "@kind")]
    kind: Option<Str<'a>>,
    #[serde(borrow, rename = "@phase")]
    phase: Option<Str<'a>>,
    #[serde(borrow, rename = "@started_at")]
    started_at: Option<Str<'a>>,
    #[serde(borrow, rename = "$text", default)]
    data: Str<'a>,
}
