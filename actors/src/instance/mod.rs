//! One actor per instance: the lifecycle state machine, one operation at a time, and the
//! flows (spawn, power, reboot, resize with confirm/revert, live migration with rollback,
//! interface attach/detach, reschedule clean-up) with their rollbacks.
//!
//! # Layout
//! - [`admission`]: the instance's answer to a request: a [`Ticket`] or an [`AdmissionError`].
//! - [`operation`]: the one operation type in (the API's, the driver's and the actor's).
//! - [`types`]: the operations' arguments, the reply and error enums out, reports and views.
//! - [`deps`]: what the actors of a host share (libvirt, events, plugger, network, peers).
//! - [`record`]: what an actor knows of its instance, as stored in the domain metadata, and
//!   the domain XML built from it.
//! - [`in_flight`]: the typed operation in flight, as `<vireo:operation>` records it.
//! - [`journal`]: the builds that allocate ports, until their domain exists.
//! - [`op`] (private): one operation's context and timed building blocks.
//! - [`ops`] (private): the operations, one module per family.
//! - [`actor`]: the actix actor.

pub mod actor;
pub mod admission;
pub mod deps;
pub mod in_flight;
pub mod journal;
pub(crate) mod op;
pub mod operation;
mod ops;
pub mod record;
pub mod types;

pub use actor::{error_chain, InstanceActor};
pub use admission::{AdmissionError, Admitted, Completion, Ticket};
pub use deps::{DetachPolicy, HostDeps, InstanceConfig, MigrationPolicy, PeerHost, Peers};
pub use in_flight::{InFlight, InFlightError, Interrupted, Marker};
pub use journal::{
    BuildEntry, BuildJournal, JournalError, LiveMigrationEntry, LiveMigrationJournal,
};
pub use op::ALIAS_PREFIX;
pub use operation::{cleanup_flags, CallerTask, LiveMigrateArgs, Operation, ResizeArgs};
pub use record::{BootSource, DomainSettings, InstanceRecord, RecordError, StorageRecord};
pub use types::*;
