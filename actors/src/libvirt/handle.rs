//! [`Libvirt::open`], the [`LibvirtHandle`], its worker threads and the call path.
//!
//! A call is a closure sent over a queue to one of `workers` threads (`vireo-libvirt-N`). A
//! worker runs one call at a time, so at most `workers` calls are ever in flight on the
//! connection, also when callers have stopped waiting: a caller whose deadline passes gets
//! [`LibvirtError::Timeout`] while the worker stays busy until libvirt returns. A call still
//! queued when its caller gave up is skipped.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use virt::connect::Connect;
use virt::error::Error as VirtError;

use super::config::LibvirtConfig;
use super::error::LibvirtError;
use super::event::{init_event_loop, CloseReason, EventSink, EventStream};
use super::supervisor;

/// The supervisor thread's name.
pub const SUPERVISOR_THREAD_NAME: &str = "vireo-lv-super";
/// Worker threads are named this plus their index.
pub const WORKER_THREAD_PREFIX: &str = "vireo-libvirt-";

const CTRL_CAPACITY: usize = 64;

/// The open connection, as the workers see it.
#[derive(Debug)]
pub(crate) struct Live {
    /// Which connection (1 for the first, +1 per reconnect).
    pub(crate) generation: u64,
    pub(crate) conn: Arc<Connect>,
}

/// Messages to the supervisor.
#[derive(Debug)]
pub(crate) enum Ctrl {
    /// Connection `generation` is dead.
    Lost {
        generation: u64,
        reason: CloseReason,
    },
    /// The last handle is gone.
    Shutdown,
}

/// State shared by the handle, the workers and the supervisor.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: LibvirtConfig,
    live: RwLock<Option<Arc<Live>>>,
    pub(crate) sink: EventSink,
    pub(crate) ctrl: SyncSender<Ctrl>,
    stopping: AtomicBool,
    in_flight: AtomicUsize,
    peak_in_flight: AtomicUsize,
    /// The driver refused `VIR_DOMAIN_START_PAUSED` once (libvirt's test driver): later paused
    /// starts go straight to start + suspend instead of failing a call first.
    start_paused_refused: AtomicBool,
}

impl Shared {
    /// The open connection, if any.
    pub(crate) fn current(&self) -> Option<Arc<Live>> {
        self.live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the published connection; returns the previous one.
    pub(crate) fn publish(&self, live: Option<Arc<Live>>) -> Option<Arc<Live>> {
        std::mem::replace(
            &mut *self.live.write().unwrap_or_else(PoisonError::into_inner),
            live,
        )
    }

    /// Unpublishes the connection if it still is `generation`.
    pub(crate) fn unpublish(&self, generation: u64) -> Option<Arc<Live>> {
        let mut live = self.live.write().unwrap_or_else(PoisonError::into_inner);
        if live.as_ref().is_some_and(|l| l.generation == generation) {
            live.take()
        } else {
            None
        }
    }

    pub(crate) fn report_lost(&self, generation: u64, reason: CloseReason) {
        // A full queue means the supervisor already has plenty to read; it also polls liveness.
        let _ = self.ctrl.try_send(Ctrl::Lost { generation, reason });
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Runs `f` on the current connection (on the calling worker thread).
    fn run<T, F, M>(&self, what: &'static str, f: F, map: M) -> Result<T, LibvirtError>
    where
        F: FnOnce(&Connect) -> Result<T, VirtError>,
        M: FnOnce(&'static str, VirtError) -> LibvirtError,
    {
        let Some(live) = self.current() else {
            return Err(LibvirtError::ConnectionLost { what, source: None });
        };
        let outcome = {
            let _slot = InFlight::enter(self);
            catch_unwind(AssertUnwindSafe(|| f(&live.conn)))
        };
        match outcome {
            Err(_panic) => Err(LibvirtError::Panicked { what }),
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                if live.conn.is_alive().unwrap_or(false) {
                    Err(map(what, error))
                } else {
                    self.report_lost(live.generation, CloseReason::Detected);
                    Err(LibvirtError::ConnectionLost {
                        what,
                        source: Some(error),
                    })
                }
            }
        }
    }
}

/// Counts a call in flight for as long as it lives.
struct InFlight<'a>(&'a Shared);

impl<'a> InFlight<'a> {
    fn enter(shared: &'a Shared) -> Self {
        let now = shared.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        shared.peak_in_flight.fetch_max(now, Ordering::AcqRel);
        Self(shared)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

type Job = Box<dyn FnOnce(&Shared) + Send + 'static>;

/// Opens the libvirt layer.
#[derive(Debug)]
pub struct Libvirt;

impl Libvirt {
    /// Validates `config`, starts the process-wide event loop (once), the supervisor thread and
    /// `config.workers` worker threads, and waits (up to `config.call_timeout_ms`) for the first
    /// connection. Fails if that first connection cannot be opened; later losses are retried by
    /// the supervisor. Must be awaited inside a tokio runtime (actix's is one).
    ///
    /// `virConnectOpen` itself has no timeout: if the first open outlives the deadline (a frozen
    /// daemon), this returns [`LibvirtError::Timeout`] after dropping the handle, which waits up
    /// to `join_timeout_ms` for the supervisor before leaving it behind.
    pub async fn open(config: LibvirtConfig) -> Result<LibvirtHandle, LibvirtError> {
        config.validate()?;
        init_event_loop()?;
        let workers = config.workers;
        let open_timeout = config.call_timeout();
        let join_timeout = config.join_timeout();
        let (ctrl_tx, ctrl_rx) = mpsc::sync_channel(CTRL_CAPACITY);
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let (done_tx, done_rx) = mpsc::sync_channel::<()>(1);
        let shared = Arc::new(Shared {
            sink: EventSink::new(config.event_capacity),
            config,
            live: RwLock::new(None),
            ctrl: ctrl_tx,
            stopping: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            peak_in_flight: AtomicUsize::new(0),
            start_paused_refused: AtomicBool::new(false),
        });
        let mut inner = Inner {
            shared: Arc::clone(&shared),
            jobs: Some(jobs_tx),
            threads: Vec::with_capacity(workers + 1),
            done_tx: Some(done_tx),
            done_rx: Mutex::new(done_rx),
            join_timeout,
        };

        let (ready_tx, ready_rx) = oneshot::channel();
        let supervised = Arc::clone(&shared);
        inner.spawn(SUPERVISOR_THREAD_NAME.to_owned(), move || {
            supervisor::run(supervised, ctrl_rx, ready_tx);
        })?;
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        for n in 0..workers {
            let shared = Arc::clone(&shared);
            let jobs = Arc::clone(&jobs_rx);
            inner.spawn(format!("{WORKER_THREAD_PREFIX}{n}"), move || {
                work(&shared, &jobs);
            })?;
        }
        inner.done_tx = None;
        let handle = LibvirtHandle {
            inner: Arc::new(inner),
        };

        match tokio::time::timeout(open_timeout, ready_rx).await {
            Ok(Ok(Ok(()))) => Ok(handle),
            Ok(Ok(Err(error))) => Err(error),
            Ok(Err(_gone)) => Err(LibvirtError::ShutDown { what: "open" }),
            Err(_elapsed) => Err(LibvirtError::Timeout {
                what: "open",
                after: open_timeout,
            }),
        }
    }
}

fn work(shared: &Shared, jobs: &Mutex<Receiver<Job>>) {
    loop {
        let next = jobs.lock().unwrap_or_else(PoisonError::into_inner).recv();
        match next {
            Ok(job) => job(shared),
            Err(_closed) => return,
        }
    }
}

/// Owns the threads; shuts them down when the last handle drops.
#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    jobs: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    /// Cloned into every thread, never sent on: the channel disconnects when all threads ended.
    done_tx: Option<SyncSender<()>>,
    /// In a mutex only to make `Inner` `Sync`; used by `drop` alone.
    done_rx: Mutex<Receiver<()>>,
    join_timeout: Duration,
}

impl Inner {
    fn spawn(
        &mut self,
        name: String,
        body: impl FnOnce() + Send + 'static,
    ) -> Result<(), LibvirtError> {
        let done = self.done_tx.clone();
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let _done = done;
                body();
            })
            .map_err(|source| LibvirtError::Spawn { name, source })?;
        self.threads.push(thread);
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.done_tx = None;
        self.shared.stopping.store(true, Ordering::Release);
        self.jobs = None;
        let _ = self.shared.ctrl.try_send(Ctrl::Shutdown);
        let deadline = Instant::now() + self.join_timeout;
        let done = self
            .done_rx
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let all_done = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match done.recv_timeout(left) {
                Ok(()) => {}
                Err(RecvTimeoutError::Disconnected) => break true,
                Err(RecvTimeoutError::Timeout) => break false,
            }
        };
        if !all_done {
            let busy: Vec<_> = self
                .threads
                .iter()
                .filter(|t| !t.is_finished())
                .filter_map(|t| t.thread().name().map(str::to_owned))
                .collect();
            tracing::warn!(
                ?busy,
                after = ?self.join_timeout,
                "libvirt threads still busy; leaving them to finish"
            );
        }
        for thread in self.threads.drain(..) {
            // When `all_done`, every thread has left its body: joining only waits for its exit.
            if all_done || thread.is_finished() {
                let _ = thread.join();
            }
        }
    }
}

/// A cheap, cloneable handle on one libvirt connection, its workers and its events.
///
/// Every method runs its libvirt calls on a worker thread and is cancel-safe for the caller
/// (dropping the future abandons the wait, not the call). Dropping the last clone stops and
/// joins the threads (bounded by `join_timeout_ms`).
#[derive(Debug, Clone)]
pub struct LibvirtHandle {
    inner: Arc<Inner>,
}

impl LibvirtHandle {
    /// Runs `f` with the connection on a worker thread, with the default deadline. `what` names
    /// the operation in errors. Fails fast with [`LibvirtError::ConnectionLost`] while the layer
    /// is reconnecting; libvirt's errors are mapped by [`LibvirtError::from_virt`].
    ///
    /// `f` must not keep libvirt objects (domains, ...) beyond the call.
    pub async fn call<T, F>(&self, what: &'static str, f: F) -> Result<T, LibvirtError>
    where
        T: Send + 'static,
        F: FnOnce(&Connect) -> Result<T, VirtError> + Send + 'static,
    {
        self.call_with_timeout(what, self.config().call_timeout(), f)
            .await
    }

    /// [`Self::call`] with its own deadline.
    pub async fn call_with_timeout<T, F>(
        &self,
        what: &'static str,
        timeout: Duration,
        f: F,
    ) -> Result<T, LibvirtError>
    where
        T: Send + 'static,
        F: FnOnce(&Connect) -> Result<T, VirtError> + Send + 'static,
    {
        self.submit(what, timeout, f, LibvirtError::from_virt).await
    }

    /// The call path: `map` turns libvirt's error into ours (unless the connection died).
    pub(crate) async fn submit<T, F, M>(
        &self,
        what: &'static str,
        timeout: Duration,
        f: F,
        map: M,
    ) -> Result<T, LibvirtError>
    where
        T: Send + 'static,
        F: FnOnce(&Connect) -> Result<T, VirtError> + Send + 'static,
        M: FnOnce(&'static str, VirtError) -> LibvirtError + Send + 'static,
    {
        if self.inner.shared.current().is_none() {
            return Err(LibvirtError::ConnectionLost { what, source: None });
        }
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |shared: &Shared| {
            if tx.is_closed() {
                return;
            }
            let _ = tx.send(shared.run(what, f, map));
        });
        let queued = self.inner.jobs.as_ref().map(|jobs| jobs.send(job));
        if !matches!(queued, Some(Ok(()))) {
            return Err(LibvirtError::ShutDown { what });
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_dropped)) => Err(LibvirtError::ShutDown { what }),
            Err(_elapsed) => Err(LibvirtError::Timeout {
                what,
                after: timeout,
            }),
        }
    }

    /// Set once the driver has refused `VIR_DOMAIN_START_PAUSED`.
    pub(crate) fn start_paused_refused(&self) -> &AtomicBool {
        &self.inner.shared.start_paused_refused
    }

    /// A new subscription to the layer's events (see [`EventStream`]).
    pub fn events(&self) -> EventStream {
        self.inner.shared.sink.subscribe()
    }

    /// True while a connection is open (calls are accepted).
    pub fn is_connected(&self) -> bool {
        self.inner.shared.current().is_some()
    }

    /// Which connection is open: 1 for the first, +1 per reconnect; `None` while disconnected.
    pub fn generation(&self) -> Option<u64> {
        self.inner.shared.current().map(|live| live.generation)
    }

    /// Calls running in libvirt right now (including ones whose caller gave up).
    pub fn in_flight(&self) -> usize {
        self.inner.shared.in_flight.load(Ordering::Acquire)
    }

    /// The most calls that were ever in flight at once.
    pub fn peak_in_flight(&self) -> usize {
        self.inner.shared.peak_in_flight.load(Ordering::Acquire)
    }

    /// The configuration in use.
    pub fn config(&self) -> &LibvirtConfig {
        &self.inner.shared.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shareable<T: Clone + Send + Sync + 'static>() {}

    #[test]
    fn the_handle_is_cheap_to_share_across_threads() {
        shareable::<LibvirtHandle>();
        assert_eq!(
            std::mem::size_of::<LibvirtHandle>(),
            std::mem::size_of::<usize>()
        );
    }
}
