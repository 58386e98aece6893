//! Shared parts of vireo's fuzz targets: an allocation-bounding global allocator, the
//! operations the event model is fuzzed with, and checks that every typed error names its
//! field.
//!
//! Every target runs its body inside [`bounded`]: the peak of live heap bytes the body
//! allocates must stay under [`alloc_budget`] for the input's length, and no single allocation
//! may exceed [`MAX_SINGLE_ALLOC`]. Both catch "unbounded allocation" (a size or count taken
//! from the input) without a sanitizer; libFuzzer's `-rss_limit_mb` is the outer fence.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use vireo_actors::predict::{DeviceForm, EventOp, Wiring};
use vireo_xml::XmlError;

/// Largest single allocation any target may make (far above anything a 64 KiB input needs).
pub const MAX_SINGLE_ALLOC: usize = 64 << 20;

/// Heap bytes (peak live) a target may use for an input of `len` bytes: a fixed allowance
/// plus a generous linear factor (JSON values and XML wire structs are ~30x their text, and
/// `network_info` is kept raw beside the parsed model).
pub fn alloc_budget(len: usize) -> usize {
    (4 << 20) + len.saturating_mul(512)
}

/// The counting allocator installed in every fuzz target.
#[derive(Debug)]
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

impl Counting {
    fn grew(size: usize) {
        let now = LIVE.fetch_add(size, Ordering::Relaxed) + size;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's layout and pointer unchanged;
// the counters are plain atomics. An over-large request returns null, which Rust turns into
// `handle_alloc_error` (an abort libFuzzer reports as a crash).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_SINGLE_ALLOC {
            return std::ptr::null_mut();
        }
        Self::grew(layout.size());
        // SAFETY: forwarded as received.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_SINGLE_ALLOC {
            return std::ptr::null_mut();
        }
        Self::grew(layout.size());
        // SAFETY: forwarded as received.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > MAX_SINGLE_ALLOC {
            return std::ptr::null_mut();
        }
        Self::grew(new_size);
        // SAFETY: forwarded as received.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            LIVE.fetch_sub(new_size, Ordering::Relaxed);
        } else {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

/// Run `f` and panic if the heap it used peaked above [`alloc_budget`]`(len)`.
pub fn bounded<R>(len: usize, f: impl FnOnce() -> R) -> R {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let r = f();
    let used = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    assert!(
        used <= alloc_budget(len),
        "unbounded allocation: {used} bytes peak for a {len}-byte input (budget {})",
        alloc_budget(len)
    );
    r
}

/// The operations the event model is fuzzed under: every column of the table, plus one
/// invalid migration (source = destination) that must be refused the same way everywhere.
pub fn operation(selector: u8) -> EventOp {
    let h = |s: &str| s.to_owned();
    match selector % 13 {
        0 => EventOp::Spawn,
        1 => EventOp::AttachInterface,
        2 => EventOp::HardReboot,
        3 => EventOp::PowerOn,
        4 => EventOp::FinishResize { same_host: false },
        5 => EventOp::FinishResize { same_host: true },
        6 => EventOp::RevertResize {
            source: h("h1"),
            dest: h("h2"),
        },
        7 => EventOp::RevertResize {
            source: h("h1"),
            dest: h("h1"),
        },
        8 => EventOp::LiveMigration {
            source: h("h1"),
            dest: h("h2"),
        },
        9 => EventOp::PostLiveMigration {
            source: h("h1"),
            dest: h("h2"),
        },
        10 => EventOp::UpdateBindingProfile,
        11 => EventOp::ClearBindingProfile,
        _ => EventOp::LiveMigration {
            source: h("h1"),
            dest: h("h1"),
        },
    }
}

/// The wiring for a selector byte (independent bits from the operation's).
pub fn wiring(selector: u8) -> Wiring {
    let form = |bit: u8| {
        if (selector / 12) & bit != 0 {
            DeviceForm::PreCreated
        } else {
            DeviceForm::LibvirtManaged
        }
    };
    Wiring {
        ovs_native: form(1),
        linux_bridge: form(2),
    }
}

/// Split a fuzz input into its selector byte and the UTF-8 text after it.
pub fn selector_and_text(data: &[u8]) -> Option<(u8, &str)> {
    let (&sel, rest) = data.split_first()?;
    std::str::from_utf8(rest).ok().map(|t| (sel, t))
}

/// An XML error that points at a place must name it.
pub fn assert_names_its_field(e: &XmlError) {
    match e {
        XmlError::Invalid { field, .. }
        | XmlError::Missing { field }
        | XmlError::Unsupported { field, .. }
        | XmlError::Number { field, .. } => {
            assert!(!field.is_empty(), "error without a field: {e:?}");
        }
        _ => {}
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;
