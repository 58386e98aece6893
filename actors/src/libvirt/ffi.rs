//! The only `unsafe` code in vireo: libvirt's domain-event and connection-close callbacks, and
//! the two domain calls the `virt` crate does not wrap (`virDomainDetachDeviceAlias`,
//! `virDomainAbortJob`), all through `virt::sys`.
//!
//! # Ownership of the opaque pointers
//! Each registration hands libvirt a `Box` turned into a raw pointer (`opaque`) together with a
//! free callback that turns it back into a `Box` and drops it. From a successful registration
//! on, libvirt owns the pointer: it passes it to every invocation of the callback and calls the
//! free callback exactly once, after the last invocation, when the callback is deregistered or the
//! connection is disposed. When a registration fails libvirt has not kept the pointer, and this
//! module frees it at once. The boxes hold an [`EventSink`] (a broadcast sender) or a
//! [`CloseHandler`] (a closure over a std sync sender): both are `Send + Sync`, and dropping them
//! calls no libvirt API (libvirt forbids that in a free callback).
//!
//! # Threads
//! libvirt invokes the callbacks on the event-loop thread (the close callback possibly on
//! whichever thread notices the socket died). They read the domain's UUID (a field of the
//! domain object, no RPC), forward into a channel without blocking, and return. They never call
//! back into libvirt and cannot panic.
//!
//! # Deregistration
//! A [`Registration`] deregisters what it registered when dropped (or via
//! [`Registration::deregister`]); libvirt then calls the free callbacks. It holds a reference on
//! the connection, so the connection outlives it. On a connection that is already dead,
//! deregistration removes the callbacks locally and fails the RPC fast.
//!
//! # Which callbacks
//! `VIR_DOMAIN_EVENT_ID_LIFECYCLE` and `VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED` for every domain
//! (`virConnectDomainEventRegisterAny` with a NULL domain), and optionally the connection close
//! callback (`virConnectRegisterCloseCallback`). The close callback is only registered on
//! connections whose driver implements it (remote ones): libvirt silently ignores it elsewhere
//! and would never free its box.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;
use std::sync::Arc;

use uuid::Uuid;
use virt::connect::Connect;
use virt::domain::Domain;
use virt::error::Error as VirtError;
use virt::sys;

use super::event::{CloseReason, EventSink};

/// What the close callback calls.
pub(crate) type CloseHandler = Box<dyn Fn(CloseReason) + Send + Sync + 'static>;

/// `virConnectDomainEventCallback`: the signature libvirt calls for `..._ID_LIFECYCLE`.
type LifecycleCallback =
    unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, c_int, c_int, *mut c_void) -> c_int;
/// `virConnectDomainEventDeviceRemovedCallback`.
type DeviceRemovedCallback =
    unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, *const c_char, *mut c_void);
/// `virConnectDomainEventGenericCallback`: the type `virConnectDomainEventRegisterAny` takes.
type GenericCallback = unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, *mut c_void);

const EVENT_ID_LIFECYCLE: c_int = sys::VIR_DOMAIN_EVENT_ID_LIFECYCLE as c_int;
const EVENT_ID_DEVICE_REMOVED: c_int = sys::VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED as c_int;

/// Callbacks registered on one connection; deregistered on drop.
#[derive(Debug)]
pub(crate) struct Registration {
    conn: Arc<Connect>,
    lifecycle: Option<c_int>,
    device_removed: Option<c_int>,
    close: bool,
}

/// Registers the lifecycle and device-removed callbacks (forwarding into `sink`) and, when
/// `on_close` is given, the close callback. On error, whatever was registered is deregistered.
pub(crate) fn register(
    conn: &Arc<Connect>,
    sink: &EventSink,
    on_close: Option<CloseHandler>,
) -> Result<Registration, VirtError> {
    let mut registration = Registration {
        conn: Arc::clone(conn),
        lifecycle: None,
        device_removed: None,
        close: false,
    };
    registration.lifecycle = Some(register_domain_event(
        conn,
        EVENT_ID_LIFECYCLE,
        lifecycle_as_generic(),
        sink,
    )?);
    registration.device_removed = Some(register_domain_event(
        conn,
        EVENT_ID_DEVICE_REMOVED,
        device_removed_as_generic(),
        sink,
    )?);
    if let Some(handler) = on_close {
        register_close(conn, handler)?;
        registration.close = true;
    }
    Ok(registration)
}

impl Registration {
    /// Deregisters everything; the first failure is returned (the rest are still attempted).
    pub(crate) fn deregister(mut self) -> Result<(), VirtError> {
        self.release()
    }

    fn release(&mut self) -> Result<(), VirtError> {
        let mut first_error = None;
        for id in [self.lifecycle.take(), self.device_removed.take()]
            .into_iter()
            .flatten()
        {
            // SAFETY: `self.conn` holds a reference, so the connection pointer is valid; `id` was
            // returned by virConnectDomainEventRegisterAny on this connection and is deregistered
            // only once (it was taken out of `self`).
            let rc = unsafe { sys::virConnectDomainEventDeregisterAny(self.conn.as_ptr(), id) };
            if rc < 0 {
                first_error.get_or_insert_with(VirtError::last_error);
            }
        }
        if std::mem::take(&mut self.close) {
            // SAFETY: the connection pointer is valid (see above) and `on_close` is the callback
            // this registration registered on it, unregistered only once.
            let rc = unsafe {
                sys::virConnectUnregisterCloseCallback(self.conn.as_ptr(), Some(on_close))
            };
            if rc < 0 {
                first_error.get_or_insert_with(VirtError::last_error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Err(error) = self.release() {
            tracing::debug!(%error, "deregistering libvirt callbacks");
        }
    }
}

fn register_domain_event(
    conn: &Connect,
    event_id: c_int,
    callback: GenericCallback,
    sink: &EventSink,
) -> Result<c_int, VirtError> {
    let opaque = Box::into_raw(Box::new(sink.clone())).cast::<c_void>();
    // SAFETY: the connection pointer is valid while `conn` is borrowed; a NULL domain means "all
    // domains"; `callback` has the signature libvirt uses for `event_id` (see the `*_as_generic`
    // functions); `opaque` is a live `Box<EventSink>` that libvirt owns from success on and frees
    // with `free_sink`.
    let id = unsafe {
        sys::virConnectDomainEventRegisterAny(
            conn.as_ptr(),
            ptr::null_mut(),
            event_id,
            Some(callback),
            opaque,
            Some(free_sink),
        )
    };
    if id < 0 {
        let error = VirtError::last_error();
        // SAFETY: the registration failed, so libvirt kept neither the pointer nor the free
        // callback; `opaque` still is the Box created above, freed here once.
        drop(unsafe { Box::from_raw(opaque.cast::<EventSink>()) });
        return Err(error);
    }
    Ok(id)
}

fn register_close(conn: &Connect, handler: CloseHandler) -> Result<(), VirtError> {
    let opaque = Box::into_raw(Box::new(handler)).cast::<c_void>();
    // SAFETY: the connection pointer is valid while `conn` is borrowed; `on_close` has the
    // `virConnectCloseFunc` signature; `opaque` is a live `Box<CloseHandler>` that libvirt owns
    // from success on and frees with `free_close`.
    let rc = unsafe {
        sys::virConnectRegisterCloseCallback(
            conn.as_ptr(),
            Some(on_close),
            opaque,
            Some(free_close),
        )
    };
    if rc < 0 {
        let error = VirtError::last_error();
        // SAFETY: the registration failed, so libvirt did not keep `opaque`; it is still the Box
        // created above, freed here once.
        drop(unsafe { Box::from_raw(opaque.cast::<CloseHandler>()) });
        return Err(error);
    }
    Ok(())
}

fn lifecycle_as_generic() -> GenericCallback {
    let typed: LifecycleCallback = on_lifecycle;
    // SAFETY: libvirt calls a callback registered for VIR_DOMAIN_EVENT_ID_LIFECYCLE with the
    // `virConnectDomainEventCallback` signature (C callers cast with VIR_DOMAIN_EVENT_CALLBACK,
    // this is the same cast); both are `extern "C"` function pointers of the same size, and this
    // pointer is only ever registered for that event ID.
    unsafe { std::mem::transmute::<LifecycleCallback, GenericCallback>(typed) }
}

fn device_removed_as_generic() -> GenericCallback {
    let typed: DeviceRemovedCallback = on_device_removed;
    // SAFETY: as in `lifecycle_as_generic`, for VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED and its
    // `virConnectDomainEventDeviceRemovedCallback` signature.
    unsafe { std::mem::transmute::<DeviceRemovedCallback, GenericCallback>(typed) }
}

/// The domain's UUID, or `None` if libvirt cannot give it.
///
/// # Safety
/// `dom` must be a valid domain pointer for the duration of the call.
unsafe fn domain_uuid(dom: sys::virDomainPtr) -> Option<Uuid> {
    let mut raw = [0u8; sys::VIR_UUID_BUFLEN as usize];
    // SAFETY: the caller guarantees `dom`; `raw` has the VIR_UUID_BUFLEN bytes virDomainGetUUID
    // writes.
    let rc = unsafe { sys::virDomainGetUUID(dom, raw.as_mut_ptr()) };
    (rc == 0).then(|| Uuid::from_bytes(raw))
}

unsafe extern "C" fn on_lifecycle(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    event: c_int,
    detail: c_int,
    opaque: *mut c_void,
) -> c_int {
    // SAFETY: `opaque` is the `Box<EventSink>` registered with this callback; libvirt keeps it
    // alive until `free_sink`, which runs after the last invocation. Only shared access.
    let sink = unsafe { &*opaque.cast::<EventSink>() };
    // SAFETY: libvirt passes a domain pointer valid for the duration of the callback.
    if let Some(uuid) = unsafe { domain_uuid(dom) } {
        sink.lifecycle(uuid, event, detail);
    }
    0
}

unsafe extern "C" fn on_device_removed(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    alias: *const c_char,
    opaque: *mut c_void,
) {
    // SAFETY: as in `on_lifecycle`.
    let sink = unsafe { &*opaque.cast::<EventSink>() };
    if alias.is_null() {
        return;
    }
    // SAFETY: libvirt passes a NUL-terminated alias valid for the duration of the callback.
    let alias = unsafe { CStr::from_ptr(alias) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: libvirt passes a domain pointer valid for the duration of the callback.
    if let Some(uuid) = unsafe { domain_uuid(dom) } {
        sink.device_removed(uuid, alias);
    }
}

unsafe extern "C" fn free_sink(opaque: *mut c_void) {
    // SAFETY: `opaque` came from `Box::into_raw(Box<EventSink>)` in `register_domain_event` and
    // libvirt calls the free callback exactly once, after the last invocation.
    drop(unsafe { Box::from_raw(opaque.cast::<EventSink>()) });
}

unsafe extern "C" fn on_close(_conn: sys::virConnectPtr, reason: c_int, opaque: *mut c_void) {
    // SAFETY: `opaque` is the `Box<CloseHandler>` registered with this callback; libvirt keeps it
    // alive until `free_close`. Only shared access.
    let handler = unsafe { &*opaque.cast::<CloseHandler>() };
    handler(CloseReason::from_raw(reason));
}

unsafe extern "C" fn free_close(opaque: *mut c_void) {
    // SAFETY: `opaque` came from `Box::into_raw(Box<CloseHandler>)` in `register_close` and
    // libvirt calls the free callback exactly once.
    drop(unsafe { Box::from_raw(opaque.cast::<CloseHandler>()) });
}

/// `virDomainDetachDeviceAlias` (not wrapped by `virt` 0.5).
pub(crate) fn detach_device_alias(dom: &Domain, alias: &str, flags: u32) -> Result<(), VirtError> {
    let alias = CString::new(alias)?;
    // SAFETY: `dom` holds a reference on the domain for the duration of the call; `alias` is
    // NUL-terminated and outlives the call.
    let rc = unsafe { sys::virDomainDetachDeviceAlias(dom.as_ptr(), alias.as_ptr(), flags) };
    if rc < 0 {
        return Err(VirtError::last_error());
    }
    Ok(())
}

/// `virDomainAbortJob` (not wrapped by `virt` 0.5).
pub(crate) fn abort_job(dom: &Domain) -> Result<(), VirtError> {
    // SAFETY: `dom` holds a reference on the domain for the duration of the call.
    let rc = unsafe { sys::virDomainAbortJob(dom.as_ptr()) };
    if rc < 0 {
        return Err(VirtError::last_error());
    }
    Ok(())
}
