//! The thread the actors live on.
//!
//! [`ActorSystem`] runs an actix system on one named thread (`vireo-actors`). Actors are
//! started on it from any thread; their addresses work from any async runtime (the compute
//! agent's HTTP server, a test's tokio runtime). Blocking libvirt calls never run here: they
//! go to the libvirt layer's worker threads.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_rt::{ArbiterHandle, System};

use crate::events::{EventConfig, EventsHandle, NetworkEventActor};
use crate::host::{HostActor, HostHandle};
use crate::instance::HostDeps;

/// The actor thread's name.
pub const ACTOR_THREAD_NAME: &str = "vireo-actors";

/// Why the actor system could not start.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The thread could not be spawned.
    #[error("spawn the actor thread")]
    Spawn(#[source] std::io::Error),
    /// The thread died before it was ready.
    #[error("the actor thread stopped during start-up")]
    StartUp,
}

/// An actix system on its own thread.
#[derive(Debug)]
pub struct ActorSystem {
    system: System,
    arbiter: ArbiterHandle,
    thread: Option<JoinHandle<()>>,
    join_timeout: Duration,
}

impl ActorSystem {
    /// Start the thread and its system.
    pub fn start() -> Result<Self, RuntimeError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(ACTOR_THREAD_NAME.to_owned())
            .spawn(move || {
                let runner = System::new();
                runner.block_on(async move {
                    let _ = tx.send((System::current(), Arbiter::current()));
                });
                let _ = runner.run();
            })
            .map_err(RuntimeError::Spawn)?;
        let (system, arbiter) = rx.recv().map_err(|_| RuntimeError::StartUp)?;
        Ok(ActorSystem {
            system,
            arbiter,
            thread: Some(thread),
            join_timeout: Duration::from_secs(5),
        })
    }

    /// The arbiter actors are started on.
    pub fn arbiter(&self) -> &ArbiterHandle {
        &self.arbiter
    }

    /// Start a network-event actor.
    pub fn start_events(&self, cfg: EventConfig) -> EventsHandle {
        EventsHandle::from_addr(NetworkEventActor::start_in_arbiter(
            &self.arbiter,
            move |_| NetworkEventActor::new(cfg),
        ))
    }

    /// Start a host actor.
    pub fn start_host(
        &self,
        deps: std::sync::Arc<HostDeps>,
        migration_uri: Option<String>,
    ) -> HostHandle {
        let name = deps.host.clone();
        let addr = HostActor::start_in_arbiter(&self.arbiter, move |_| HostActor::new(deps));
        HostHandle::new(addr, name, migration_uri)
    }
}

impl Drop for ActorSystem {
    /// Stops the system and joins the thread, waiting at most the join timeout.
    fn drop(&mut self) {
        self.system.stop();
        if let Some(t) = self.thread.take() {
            let deadline = Instant::now() + self.join_timeout;
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::warn!("actor thread did not stop within {:?}", self.join_timeout);
            }
        }
    }
}
