#!/usr/bin/env bash
# The test job: installs and starts everything the tests need on a fresh Debian 12 machine (run
# as root): libvirt/QEMU from bookworm-backports, libvirtd, Open vSwitch, a real Neutron; then
# runs format and lint checks, the whole workspace's tests (unit, test:///, integration) and
# the bounded fuzz/bench smoke runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash integration/host-setup.sh up --with-neutron
cargo fmt --all -- --check
cargo clippy --locked --workspace --all-targets -- -D warnings
cargo test --locked --workspace --no-fail-fast
