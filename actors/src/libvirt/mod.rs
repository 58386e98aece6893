//! The libvirt layer: every libvirt call vireo makes goes through here, on dedicated threads.
//! Actors never call libvirt directly; they hold a [`LibvirtHandle`].
//!
//! # What it owns
//! - **Worker threads** (`vireo-libvirt-0` ..): blocking libvirt calls, at most
//!   `workers` (≤ [`MAX_WORKERS`] = 4) in flight per connection — libvirtd serves 5 concurrent
//!   requests per client. Each call has a deadline ([`LibvirtError::Timeout`]); a timed-out call
//!   keeps its worker (and its in-flight slot) until libvirt returns, which keepalive bounds on
//!   remote connections.
//! - **One supervisor thread** (`vireo-lv-super`) per handle: opens the connection, sets
//!   keepalive on remote connections, registers the callbacks, notices loss, reconnects with
//!   backoff, re-registers the callbacks, lists every domain and reports
//!   [`LibvirtEvent::Reconnected`].
//! - **The process-wide event loop thread** (`vireo-lv-events`, [`init_event_loop`]), registered
//!   before any connection opens.
//! - **The callback FFI** (`ffi`, private): the only `unsafe` code in vireo. Lifecycle and
//!   device-removed events and the close callback only forward `(uuid, event, detail)` into the
//!   event channel.
//!
//! # Use
//! ```no_run
//! # async fn demo() -> Result<(), vireo_actors::libvirt::LibvirtError> {
//! use vireo_actors::libvirt::{Libvirt, LibvirtConfig, LibvirtEvent};
//!
//! let handle = Libvirt::open(LibvirtConfig::for_uri("qemu:///system")).await?;
//! let mut events = handle.events(); // subscribe before acting
//! let id = handle.define_xml("<domain type='kvm'>...</domain>", true).await?;
//! handle.start(id.uuid, false).await?;
//! while let Some(event) = events.recv().await {
//!     match event {
//!         LibvirtEvent::Reconnected { .. } | LibvirtEvent::Lagged { .. } => { /* resync all */ }
//!         other => println!("{other:?}"),
//!     }
//! }
//! // Anything without a typed helper:
//! let hostname = handle.call("hostname", |conn| conn.hostname()).await?;
//! # let _ = hostname; Ok(()) }
//! ```
//!
//! # Errors
//! [`LibvirtError`] maps libvirt's `VIR_ERR_*` codes to kinds (no-domain, operation-invalid,
//! unsupported, invalid XML, conflict, no-device, timeout, connection lost, ...) and keeps
//! libvirt's code, origin and message. While the connection is down every call fails at once with
//! [`LibvirtError::ConnectionLost`]; the event stream reports [`LibvirtEvent::ConnectionLost`]
//! and later [`LibvirtEvent::Reconnected`] with the full domain list.
//!
//! # Shutdown
//! Dropping the last handle stops the supervisor and the workers and joins them, waiting at most
//! `join_timeout_ms`; a thread still stuck in libvirt is left to finish on its own.

mod config;
mod error;
mod event;
// The one module where `unsafe` is allowed (the workspace denies it everywhere else).
#[allow(unsafe_code)]
mod ffi;
mod handle;
mod ops;
mod schema;
mod supervisor;
mod types;

pub use config::{Keepalive, LibvirtConfig, MAX_WORKERS};
pub use error::LibvirtError;
pub use event::{
    init_event_loop, CloseReason, EventStream, LibvirtEvent, LifecycleEvent, EVENT_THREAD_NAME,
};
pub use handle::{Libvirt, LibvirtHandle, SUPERVISOR_THREAD_NAME, WORKER_THREAD_PREFIX};
pub use ops::PausedStart;
pub use types::{
    Affect, DomainId, DomainInfo, DomainState, DomainSummary, JobProgress, Metadata, NodeFacts,
};
/// Re-exported for [`LibvirtHandle::migrate`].
pub use virt::domain::MigrateParameters;
