//! Cross-crate tests live in `tests/tests/`; this library holds shared test helpers.
//!
//! - [`private_libvirtd`]: a libvirtd of the test's own (test driver over a unix socket) to
//!   kill, restart, freeze and thaw.

pub mod private_libvirtd;
