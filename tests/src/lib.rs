//! Cross-crate tests live in `tests/tests/`; this library holds shared test helpers.
