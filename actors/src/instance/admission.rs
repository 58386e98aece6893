//! Admission: whether an instance takes a request now, answered at once by its actor.
//!
//! A request is admitted or refused exactly once, by the instance actor, from what only it
//! knows for sure: whether an operation runs (or a destroy waits behind one), whether the
//! actor is stopping, the lifecycle state, and the record (a port to detach must be
//! attached). The caller gets the answer before the operation runs: a [`Ticket`] for an
//! admitted request, an [`AdmissionError`] for a refused one. A caller that wants to know
//! whether the instance would take a request does not ask first and submit later (the
//! answer could be stale by then); it submits and reads the answer.
//!
//! The ticket carries the operation's completion. Dropping it does not cancel the
//! operation: an admitted operation always runs to its end (or its rollback), whether
//! anyone waits for it or not.

use futures::channel::oneshot;
use uuid::Uuid;

use crate::events::OpId;
use crate::lifecycle::{InstanceState, Request};
use crate::vif::PortId;

use super::types::{InstanceError, InstanceReply};

/// Why an instance refused a request. Nothing was started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// Another operation runs on the instance (or a destroy already waits behind one).
    #[error("operation {running} in progress")]
    Busy {
        /// The running operation.
        running: Request,
    },
    /// The request is not allowed in the instance's state.
    #[error("{request} is not allowed while {state}")]
    IllegalState {
        /// The state.
        state: InstanceState,
        /// The request.
        request: Request,
    },
    /// The instance is not on this host.
    #[error("instance {0} not found on this host")]
    NotFound(Uuid),
    /// A detach names a port the instance does not have.
    #[error("port {port} is not attached to the instance")]
    NotAttached {
        /// The port.
        port: PortId,
    },
    /// The instance's actor is stopping or gone (the host shuts down, or the actor left as
    /// the request reached it).
    #[error("instance actor unavailable")]
    Unavailable,
    /// A resize or live migration to another host that this host cannot reach: a vireo
    /// agent is one host, and moves between hosts are Nova's to orchestrate (each host's
    /// half through its own agent).
    #[error(
        "{host} is another host and this one reaches no other: moves between hosts run under \
         Nova (nova-compute with compute_driver = vireo.VireoDriver, see docs/NOVA.md)"
    )]
    CrossHost {
        /// The destination asked for.
        host: String,
    },
}

impl AdmissionError {
    /// A stable, machine-readable code (the same codes the API answers).
    pub fn code(&self) -> &'static str {
        match self {
            AdmissionError::Busy { .. } => "busy",
            AdmissionError::IllegalState { .. } => "illegal-state",
            AdmissionError::NotFound(_) => "not-found",
            AdmissionError::NotAttached { .. } => "invalid",
            AdmissionError::Unavailable => "unavailable",
            AdmissionError::CrossHost { .. } => "cross-host",
        }
    }
}

/// The completion of an admitted operation.
pub type Completion = Result<InstanceReply, InstanceError>;

/// How a request was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// It runs now, as this operation.
    Started(OpId),
    /// A destroy next to a running operation: that operation's waits are cancelled so it
    /// rolls back, and the destroy runs right after it.
    Queued,
    /// A destroy with nothing of the instance on this host: done already (destroy is
    /// idempotent).
    NothingHere,
    /// A live migration's hand-over this host completed already: the source asks again
    /// because the answer was lost (this host's agent died after it saved the guest as its
    /// own). Done, with the state the guest is in.
    DoneAlready,
}

/// An admitted request: what runs, how it was admitted, and its completion.
#[derive(Debug)]
pub struct Ticket {
    request: Request,
    admitted: Admitted,
    done: oneshot::Receiver<Completion>,
}

impl Ticket {
    /// A ticket for `request`, completed through the returned sender.
    pub fn new(request: Request, admitted: Admitted) -> (Ticket, oneshot::Sender<Completion>) {
        let (tx, done) = oneshot::channel();
        (
            Ticket {
                request,
                admitted,
                done,
            },
            tx,
        )
    }

    /// A destroy of nothing: completed already.
    pub fn nothing_here(request: Request, completion: Completion) -> Ticket {
        let (ticket, tx) = Ticket::new(request, Admitted::NothingHere);
        let _ = tx.send(completion);
        ticket
    }

    /// A request this host carried out already: completed at once.
    pub fn done_already(request: Request, completion: Completion) -> Ticket {
        let (ticket, tx) = Ticket::new(request, Admitted::DoneAlready);
        let _ = tx.send(completion);
        ticket
    }

    /// What was admitted.
    pub fn request(&self) -> Request {
        self.request
    }

    /// How it was admitted.
    pub fn admitted(&self) -> Admitted {
        self.admitted
    }

    /// The operation's id on this host, when it started at admission.
    pub fn op_id(&self) -> Option<OpId> {
        match self.admitted {
            Admitted::Started(id) => Some(id),
            Admitted::Queued | Admitted::NothingHere | Admitted::DoneAlready => None,
        }
    }

    /// Wait for the operation to end. An actor that went away without answering (the host
    /// shut down under it) is [`InstanceError::Unavailable`].
    pub async fn finished(self) -> Completion {
        self.done.await.unwrap_or(Err(InstanceError::Unavailable))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_api_codes() {
        let port: PortId = "5a0c6b2e-1f3a-4e4b-9d3e-2a1b3c4d5e6f".parse().unwrap();
        let cases = [
            (
                AdmissionError::Busy {
                    running: Request::Spawn,
                },
                "busy",
            ),
            (
                AdmissionError::IllegalState {
                    state: InstanceState::Stopped,
                    request: Request::Pause,
                },
                "illegal-state",
            ),
            (AdmissionError::NotFound(Uuid::nil()), "not-found"),
            (AdmissionError::NotAttached { port }, "invalid"),
            (AdmissionError::Unavailable, "unavailable"),
        ];
        for (e, code) in cases {
            assert_eq!(e.code(), code, "{e}");
            assert_eq!(InstanceError::from(e).code(), code);
        }
    }

    #[tokio::test]
    async fn a_ticket_whose_actor_went_away_is_unavailable() {
        let (ticket, tx) = Ticket::new(Request::PowerOn, Admitted::Started(OpId(7)));
        assert_eq!(ticket.op_id(), Some(OpId(7)));
        assert_eq!(ticket.request(), Request::PowerOn);
        drop(tx);
        let err = ticket.finished().await.unwrap_err();
        assert!(matches!(err, InstanceError::Unavailable), "{err:?}");
    }
}
