//! The supervisor thread (`vireo-lv-super`): owns opening the connection, noticing its loss,
//! and reconnecting.
//!
//! Opening a connection: `virConnectOpen`, keepalive (`virConnectSetKeepAlive`; a driver that
//! does not support it runs in-process and cannot be lost), the event callbacks and, on remote
//! connections, the close callback; then the connection is published to the workers.
//!
//! A connection is lost when libvirt's close callback fires (EOF, keepalive timeout, I/O
//! error), when a worker's call fails and `virConnectIsAlive` says no, or when the supervisor's
//! own once-a-second `virConnectIsAlive` check says no. Then the supervisor unpublishes it (new
//! calls fail fast with `ConnectionLost`; calls in flight fail as libvirt fails them), emits
//! [`LibvirtEvent::ConnectionLost`], deregisters the callbacks, drops the connection and
//! reconnects with exponential backoff (`reconnect_min_ms` doubling to `reconnect_max_ms`),
//! emitting [`LibvirtEvent::Reconnecting`] before each attempt.
//! After a reconnect it lists every domain on the new connection (after the callbacks are
//! registered, so nothing falls between) and emits [`LibvirtEvent::Reconnected`].
//!
//! `virConnectOpen` has no timeout: against a frozen daemon it waits until the daemon resumes
//! or dies. Callers are not affected (they fail fast while disconnected); only the handle's
//! drop gives up waiting for this thread after `join_timeout_ms`.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use virt::connect::Connect;
use virt::sys;

use super::config::Keepalive;
use super::error::LibvirtError;
use super::event::{CloseReason, LibvirtEvent};
use super::ffi::{self, CloseHandler, Registration};
use super::handle::{Ctrl, Live, Shared};
use super::ops::list_domains;
use super::schema;
use super::types::DomainSummary;

/// How often the supervisor checks `virConnectIsAlive` on its own.
const LIVENESS_PERIOD: Duration = Duration::from_secs(1);

/// One open connection with its callbacks.
#[derive(Debug)]
struct Session {
    generation: u64,
    conn: Arc<Connect>,
    registration: Option<Registration>,
}

impl Session {
    /// Opens, configures, registers and publishes connection `generation`; with `resync`, also
    /// lists every domain.
    fn open(
        shared: &Shared,
        generation: u64,
        resync: bool,
    ) -> Result<(Self, Vec<DomainSummary>), LibvirtError> {
        let uri = &shared.config.uri;
        let conn = Connect::open(Some(uri)).map_err(|source| LibvirtError::Connect {
            uri: uri.clone(),
            source,
        })?;
        let conn = Arc::new(conn);
        let remote = set_keepalive(&conn, shared.config.keepalive)?;
        if !remote {
            // This driver validates in this process: build libxml2's schema tables once,
            // before any worker can validate concurrently (see `schema`).
            schema::prime(&conn);
        }
        let on_close = remote.then(|| close_handler(shared, generation));
        let registration = ffi::register(&conn, &shared.sink, on_close)
            .map_err(|e| LibvirtError::from_virt("register callbacks", e))?;
        let domains = if resync {
            list_domains(&conn).map_err(|e| LibvirtError::from_virt("list_all", e))?
        } else {
            Vec::new()
        };
        shared.publish(Some(Arc::new(Live {
            generation,
            conn: Arc::clone(&conn),
        })));
        tracing::info!(%uri, generation, remote, "libvirt connection open");
        Ok((
            Self {
                generation,
                conn,
                registration: Some(registration),
            },
            domains,
        ))
    }

    /// Unpublishes, deregisters and drops the connection (on this thread, so a slow close never
    /// lands on a caller).
    fn close(mut self, shared: &Shared) {
        drop(shared.unpublish(self.generation));
        if let Some(registration) = self.registration.take() {
            if let Err(error) = registration.deregister() {
                tracing::debug!(%error, "deregistering callbacks of a closed connection");
            }
        }
    }
}

/// Sets keepalive; `Ok(true)` when the driver supports it (a remote connection).
fn set_keepalive(conn: &Connect, keepalive: Keepalive) -> Result<bool, LibvirtError> {
    let interval = i32::try_from(keepalive.interval_s).unwrap_or(i32::MAX);
    match conn.set_keep_alive(interval, keepalive.count) {
        Ok(()) => Ok(true),
        Err(e) if e.code().to_raw() == sys::VIR_ERR_NO_SUPPORT => Ok(false),
        Err(e) => Err(LibvirtError::from_virt("set_keep_alive", e)),
    }
}

fn close_handler(shared: &Shared, generation: u64) -> CloseHandler {
    let ctrl = shared.ctrl.clone();
    Box::new(move |reason| {
        let _ = ctrl.try_send(Ctrl::Lost { generation, reason });
    })
}

/// The supervisor thread's body. Reports the first connection's outcome on `ready`.
pub(crate) fn run(
    shared: Arc<Shared>,
    ctrl: Receiver<Ctrl>,
    ready: oneshot::Sender<Result<(), LibvirtError>>,
) {
    let mut generation = 1;
    let mut session = match Session::open(&shared, generation, false) {
        Ok((session, _)) => {
            let _ = ready.send(Ok(()));
            session
        }
        Err(error) => {
            let _ = ready.send(Err(error));
            return;
        }
    };
    loop {
        let Some(reason) = watch(&shared, &ctrl, &session) else {
            session.close(&shared);
            return;
        };
        tracing::warn!(uri = %shared.config.uri, ?reason, generation, "libvirt connection lost");
        drop(shared.unpublish(session.generation));
        shared.sink.emit(LibvirtEvent::ConnectionLost { reason });
        session.close(&shared);

        let mut delay = shared.config.reconnect_min();
        let mut attempt = 0u32;
        session = loop {
            if !pause(&shared, &ctrl, delay) {
                return;
            }
            attempt = attempt.saturating_add(1);
            shared.sink.emit(LibvirtEvent::Reconnecting { attempt });
            generation += 1;
            match Session::open(&shared, generation, true) {
                Ok((session, domains)) => {
                    shared.sink.emit(LibvirtEvent::Reconnected { domains });
                    break session;
                }
                Err(error) => {
                    tracing::warn!(%error, ?delay, "libvirt reconnect failed");
                    delay = (delay * 2).min(shared.config.reconnect_max());
                }
            }
        };
    }
}

/// Waits until the session's connection is lost (`Some(reason)`) or the layer stops (`None`).
fn watch(shared: &Shared, ctrl: &Receiver<Ctrl>, session: &Session) -> Option<CloseReason> {
    loop {
        if shared.stopping() {
            return None;
        }
        match ctrl.recv_timeout(LIVENESS_PERIOD) {
            Ok(Ctrl::Shutdown) | Err(RecvTimeoutError::Disconnected) => return None,
            Ok(Ctrl::Lost { generation, reason }) if generation == session.generation => {
                return Some(reason)
            }
            Ok(Ctrl::Lost { .. }) => {}
            Err(RecvTimeoutError::Timeout) => {
                if !session.conn.is_alive().unwrap_or(false) {
                    return Some(CloseReason::Detected);
                }
            }
        }
    }
}

/// Sleeps `delay` unless the layer stops meanwhile (then `false`).
fn pause(shared: &Shared, ctrl: &Receiver<Ctrl>, delay: Duration) -> bool {
    let until = Instant::now() + delay;
    loop {
        if shared.stopping() {
            return false;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        match ctrl.recv_timeout(left) {
            Ok(Ctrl::Shutdown) | Err(RecvTimeoutError::Disconnected) => return false,
            Ok(Ctrl::Lost { .. }) => {}
            Err(RecvTimeoutError::Timeout) => return true,
        }
    }
}
