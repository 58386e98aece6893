//! The `vireo` binary.
fn main() {}
