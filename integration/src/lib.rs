//! Integration-tier helpers; the tests live in `integration/tests/`.
