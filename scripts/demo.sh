#!/usr/bin/env bash
# The main job: builds vireo and runs `vireo demo` on the embedded default (libvirt's test:///
# driver and the in-process network service). Installs what it needs on a fresh Debian 12
# machine (run as root). Extra arguments go to `vireo demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash integration/host-setup.sh build-deps
cargo build --release --locked -p vireo --bin vireo
exec target/release/vireo demo "$@"
