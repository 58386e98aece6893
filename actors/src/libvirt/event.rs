//! What the libvirt layer reports: domain lifecycle and device-removed events, connection loss
//! and recovery; and the process-wide libvirt event loop that makes them (and keepalive) work.
//!
//! # Delivery
//! Events go to a `tokio::sync::broadcast` channel of `LibvirtConfig::event_capacity` slots
//! shared by every [`EventStream`] (from [`crate::libvirt::LibvirtHandle::events`]). Senders
//! never wait: libvirt's callbacks run on the event-loop thread and only forward. A stream that
//! falls more than the capacity behind loses the oldest events and receives
//! [`LibvirtEvent::Lagged`] instead; like [`LibvirtEvent::Reconnected`], that means "resync every
//! domain" (the consumer lists all domains and compares). A stream sees only events sent after it
//! was created: subscribe first, then list.
//!
//! # The event loop
//! libvirt needs an event-loop implementation registered before the first connection opens
//! (for domain events, the close callback and keepalive). [`init_event_loop`] registers
//! libvirt's default implementation once per process and runs it on one thread named
//! `vireo-lv-events` for the life of the process (it owns no per-handle state, so no handle
//! joins it). [`crate::libvirt::Libvirt::open`] calls it; a process that opens libvirt
//! connections by other means must call it first.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::sync::broadcast;
use uuid::Uuid;
use virt::sys;

use super::error::LibvirtError;
use super::types::DomainSummary;

/// A domain lifecycle event (`virDomainEventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LifecycleEvent {
    /// `VIR_DOMAIN_EVENT_DEFINED`.
    Defined,
    /// `VIR_DOMAIN_EVENT_UNDEFINED`.
    Undefined,
    /// `VIR_DOMAIN_EVENT_STARTED`.
    Started,
    /// `VIR_DOMAIN_EVENT_SUSPENDED`.
    Suspended,
    /// `VIR_DOMAIN_EVENT_RESUMED`.
    Resumed,
    /// `VIR_DOMAIN_EVENT_STOPPED`.
    Stopped,
    /// `VIR_DOMAIN_EVENT_SHUTDOWN`: the guest began or finished shutting down.
    Shutdown,
    /// `VIR_DOMAIN_EVENT_PMSUSPENDED`.
    PmSuspended,
    /// `VIR_DOMAIN_EVENT_CRASHED`.
    Crashed,
    /// A value this build does not know.
    Unknown(i32),
}

impl LifecycleEvent {
    /// From libvirt's raw `virDomainEventType`.
    pub fn from_raw(raw: i32) -> Self {
        let Ok(code) = u32::try_from(raw) else {
            return Self::Unknown(raw);
        };
        match code {
            sys::VIR_DOMAIN_EVENT_DEFINED => Self::Defined,
            sys::VIR_DOMAIN_EVENT_UNDEFINED => Self::Undefined,
            sys::VIR_DOMAIN_EVENT_STARTED => Self::Started,
            sys::VIR_DOMAIN_EVENT_SUSPENDED => Self::Suspended,
            sys::VIR_DOMAIN_EVENT_RESUMED => Self::Resumed,
            sys::VIR_DOMAIN_EVENT_STOPPED => Self::Stopped,
            sys::VIR_DOMAIN_EVENT_SHUTDOWN => Self::Shutdown,
            sys::VIR_DOMAIN_EVENT_PMSUSPENDED => Self::PmSuspended,
            sys::VIR_DOMAIN_EVENT_CRASHED => Self::Crashed,
            _ => Self::Unknown(raw),
        }
    }
}

/// Why a connection was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// `VIR_CONNECT_CLOSE_REASON_ERROR`: an I/O error.
    Error,
    /// `VIR_CONNECT_CLOSE_REASON_EOF`: the daemon closed the socket (it died or restarted).
    Eof,
    /// `VIR_CONNECT_CLOSE_REASON_KEEPALIVE`: the daemon stopped answering keepalive probes.
    Keepalive,
    /// `VIR_CONNECT_CLOSE_REASON_CLIENT`: closed on this side.
    Client,
    /// vireo found the connection dead (a call failed and `virConnectIsAlive` said no) before
    /// libvirt's close callback reported it.
    Detected,
    /// A reason this build does not know.
    Other(i32),
}

impl CloseReason {
    /// From libvirt's raw `virConnectCloseReason`.
    pub fn from_raw(raw: i32) -> Self {
        let Ok(code) = u32::try_from(raw) else {
            return Self::Other(raw);
        };
        match code {
            sys::VIR_CONNECT_CLOSE_REASON_ERROR => Self::Error,
            sys::VIR_CONNECT_CLOSE_REASON_EOF => Self::Eof,
            sys::VIR_CONNECT_CLOSE_REASON_KEEPALIVE => Self::Keepalive,
            sys::VIR_CONNECT_CLOSE_REASON_CLIENT => Self::Client,
            _ => Self::Other(raw),
        }
    }
}

/// One report from the libvirt layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibvirtEvent {
    /// A domain lifecycle event. `detail` is libvirt's raw per-event detail
    /// (`virDomainEvent*DetailType`, e.g. `VIR_DOMAIN_EVENT_STOPPED_DESTROYED`).
    Lifecycle {
        /// The domain.
        uuid: Uuid,
        /// What happened.
        event: LifecycleEvent,
        /// libvirt's detail code.
        detail: i32,
    },
    /// A device was removed from a running domain (hot-unplug finished).
    DeviceRemoved {
        /// The domain.
        uuid: Uuid,
        /// The device's alias.
        alias: String,
    },
    /// The connection was lost. Calls fail fast with
    /// [`LibvirtError::ConnectionLost`] until [`LibvirtEvent::Reconnected`].
    ConnectionLost {
        /// Why.
        reason: CloseReason,
    },
    /// The supervisor is about to try connection `attempt` (1, 2, ...) of this outage.
    Reconnecting {
        /// Attempt number within the current outage.
        attempt: u32,
    },
    /// A new connection is up, every callback is registered again, and `domains` is the full
    /// domain list read after registering (events after it are delivered). Resync every domain.
    Reconnected {
        /// Every domain, as listed on the new connection.
        domains: Vec<DomainSummary>,
    },
    /// This stream fell behind and lost `missed` events. Resync every domain.
    Lagged {
        /// How many events were lost.
        missed: u64,
    },
}

/// A subscription to the layer's events (see the module docs for delivery rules).
#[derive(Debug)]
pub struct EventStream {
    rx: broadcast::Receiver<LibvirtEvent>,
}

impl EventStream {
    pub(crate) fn new(rx: broadcast::Receiver<LibvirtEvent>) -> Self {
        Self { rx }
    }

    /// The next event; `None` once the layer is shut down and every event was read.
    pub async fn recv(&mut self) -> Option<LibvirtEvent> {
        match self.rx.recv().await {
            Ok(event) => Some(event),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                Some(LibvirtEvent::Lagged { missed })
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// The next event if one is queued, without waiting.
    pub fn try_recv(&mut self) -> Option<LibvirtEvent> {
        match self.rx.try_recv() {
            Ok(event) => Some(event),
            Err(broadcast::error::TryRecvError::Lagged(missed)) => {
                Some(LibvirtEvent::Lagged { missed })
            }
            Err(_) => None,
        }
    }
}

/// Where libvirt's callbacks forward to. Cloned into each registration; never blocks.
#[derive(Debug, Clone)]
pub(crate) struct EventSink {
    tx: broadcast::Sender<LibvirtEvent>,
}

impl EventSink {
    pub(crate) fn new(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity);
        Self { tx }
    }

    pub(crate) fn subscribe(&self) -> EventStream {
        EventStream::new(self.tx.subscribe())
    }

    /// Forwards one event. With no subscriber the event is dropped (nobody can miss it).
    pub(crate) fn emit(&self, event: LibvirtEvent) {
        // An error only means "no subscriber right now".
        let _ = self.tx.send(event);
    }

    pub(crate) fn lifecycle(&self, uuid: Uuid, event: i32, detail: i32) {
        self.emit(LibvirtEvent::Lifecycle {
            uuid,
            event: LifecycleEvent::from_raw(event),
            detail,
        });
    }

    pub(crate) fn device_removed(&self, uuid: Uuid, alias: String) {
        self.emit(LibvirtEvent::DeviceRemoved { uuid, alias });
    }
}

/// The event loop thread's name.
pub const EVENT_THREAD_NAME: &str = "vireo-lv-events";

static EVENT_LOOP: OnceLock<Result<(), String>> = OnceLock::new();

/// Registers libvirt's default event loop and starts its thread, once per process (later calls
/// return the first call's outcome). Also silences libvirt's default error printer: errors
/// reach callers as [`LibvirtError`]s instead.
///
/// Must run before the process opens its first libvirt connection.
pub fn init_event_loop() -> Result<(), LibvirtError> {
    EVENT_LOOP
        .get_or_init(|| {
            virt::error::clear_error_callback();
            virt::event::event_register_default_impl()
                .map_err(|e| format!("registering the default event loop: {e}"))?;
            std::thread::Builder::new()
                .name(EVENT_THREAD_NAME.to_owned())
                .spawn(run_event_loop)
                .map(|_detached| ())
                .map_err(|e| format!("starting {EVENT_THREAD_NAME}: {e}"))
        })
        .clone()
        .map_err(|detail| LibvirtError::EventLoop { detail })
}

fn run_event_loop() {
    loop {
        if let Err(error) = virt::event::event_run_default_impl() {
            tracing::warn!(%error, "libvirt event loop iteration failed");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_events_from_raw() {
        let all = [
            (0, LifecycleEvent::Defined),
            (1, LifecycleEvent::Undefined),
            (2, LifecycleEvent::Started),
            (3, LifecycleEvent::Suspended),
            (4, LifecycleEvent::Resumed),
            (5, LifecycleEvent::Stopped),
            (6, LifecycleEvent::Shutdown),
            (7, LifecycleEvent::PmSuspended),
            (8, LifecycleEvent::Crashed),
            (9, LifecycleEvent::Unknown(9)),
            (-1, LifecycleEvent::Unknown(-1)),
        ];
        for (raw, event) in all {
            assert_eq!(LifecycleEvent::from_raw(raw), event);
        }
    }

    #[test]
    fn close_reasons_from_raw() {
        assert_eq!(CloseReason::from_raw(0), CloseReason::Error);
        assert_eq!(CloseReason::from_raw(1), CloseReason::Eof);
        assert_eq!(CloseReason::from_raw(2), CloseReason::Keepalive);
        assert_eq!(CloseReason::from_raw(3), CloseReason::Client);
        assert_eq!(CloseReason::from_raw(4), CloseReason::Other(4));
        assert_eq!(CloseReason::from_raw(-2), CloseReason::Other(-2));
    }

    #[tokio::test]
    async fn a_lagging_stream_is_told_how_much_it_missed() {
        let sink = EventSink::new(2);
        let mut stream = sink.subscribe();
        for detail in 0..5 {
            sink.lifecycle(Uuid::nil(), 2, detail);
        }
        let started = |detail| LibvirtEvent::Lifecycle {
            uuid: Uuid::nil(),
            event: LifecycleEvent::Started,
            detail,
        };
        assert_eq!(
            stream.recv().await,
            Some(LibvirtEvent::Lagged { missed: 3 })
        );
        assert_eq!(stream.recv().await, Some(started(3)));
        assert_eq!(stream.recv().await, Some(started(4)));
        assert_eq!(stream.try_recv(), None);
    }

    #[tokio::test]
    async fn a_stream_ends_when_the_sink_is_gone() {
        let sink = EventSink::new(4);
        let mut stream = sink.subscribe();
        sink.lifecycle(Uuid::nil(), 2, 0);
        drop(sink);
        assert_eq!(
            stream.recv().await,
            Some(LibvirtEvent::Lifecycle {
                uuid: Uuid::nil(),
                event: LifecycleEvent::Started,
                detail: 0
            })
        );
        assert_eq!(stream.recv().await, None);
    }
}
