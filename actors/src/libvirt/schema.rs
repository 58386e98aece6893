//! Making libvirt's schema validation safe under concurrency in this process.
//!
//! `VIR_DOMAIN_DEFINE_VALIDATE` makes libvirt check a document against its RelaxNG schemas.
//! Drivers that run inside this process (the test driver, vireo's embedded default) do that with
//! this process's libxml2, and libxml2 2.9 (Debian 12's) builds its RelaxNG and XML-Schema
//! datatype libraries lazily, on the first schema parse, without a lock. Two threads that parse a
//! schema for the first time at once race on those tables; the loser fails with "Unable to parse
//! RelaxNG schema … Error type 'integer' is not exported by type library". Once the tables exist
//! they are only read, and concurrent validations are safe.
//!
//! So the first in-process connection of the process makes libvirt parse its domain schema once,
//! on the supervisor thread, before the handle is ready and any worker can run a call: it defines
//! a document that parses but can never pass the schema (`<domain/>`, no `type`), which loads
//! the schema and builds both datatype libraries, and fails without creating anything. Callers
//! that open concurrently wait for that one priming ([`std::sync::Once`]). Remote connections
//! (`qemu:///system`) validate inside the daemon, not here, and are not primed.
//!
//! The alternative — serialising every validating define of an in-process driver behind one
//! lock — was measured against this in docs/ARCHITECTURE.md ("Schema validation"): priming costs
//! one schema parse per process; the lock costs every define its neighbours' schema parses.

use std::sync::Once;

use virt::connect::Connect;
use virt::sys;

/// A document that parses, has the root libvirt expects and fails schema validation.
const PROBE: &str = "<domain/>";

static PRIMED: Once = Once::new();

/// Parses libvirt's domain schema once in this process (see the module docs). Cheap after the
/// first call; concurrent first callers wait for the one that primes.
pub(crate) fn prime(conn: &Connect) {
    PRIMED.call_once(|| {
        match conn.define_domain_xml_flags(PROBE, sys::VIR_DOMAIN_DEFINE_VALIDATE) {
            Err(error) => tracing::debug!(
                code = error.code().to_raw(),
                "schema validation primed (probe refused as expected)"
            ),
            // Cannot happen with libvirt's schema; if it ever does, remove what it made.
            Ok(dom) => {
                tracing::warn!("schema probe was accepted; undefining it");
                if let Err(error) = dom.undefine() {
                    tracing::warn!(%error, "undefining the schema probe");
                }
            }
        }
    });
}
