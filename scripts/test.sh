#!/usr/bin/env bash
# The test job. On a fresh Debian 12 machine, as root: installs and starts everything the tests
# need — libvirt/QEMU from bookworm-backports, libvirtd, Open vSwitch, a real Neutron (MariaDB,
# RabbitMQ, ML2/OVS), a second libvirt host in its own namespaces — then runs the format and
# lint checks, every test tier of the workspace, the Nova driver's tests, the Nova tier (a small
# OpenStack with vireo as nova-compute's driver) and the bounded fuzz runs. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

section() {
  printf '\n=== %s (%s, %s free)\n' "$1" "$(date +%T)" "$(df -h --output=avail . | tail -n1 | tr -d ' ')"
}

# One build per clone: incremental state would only double the target directory.
export CARGO_INCREMENTAL=0

section "host set-up"
bash integration/host-setup.sh up --with-neutron
bash integration/two-host.sh up

section "format"
cargo fmt --all -- --check

section "lint"
cargo clippy --locked --workspace --all-targets -- -D warnings

section "tests"
cargo test --locked --workspace --no-fail-fast

section "the agent binary has no test doubles"
# Built as it ships (`-p vireo`, no test-support feature): none of plug::testing may be in it.
cargo build --locked -p vireo --bin vireo
if nm -C target/debug/vireo | grep -E 'RecordingPlugger|FaultPlan|plug::testing'; then
  echo "test doubles are compiled into the vireo binary" >&2
  exit 1
fi

section "systemd unit (packaging/vireo.service under systemd in a Debian 12 container)"
VIREO_BIN=target/debug/vireo bash integration/systemd-unit.sh check

section "nova driver (pytest: Nova's own ComputeManager, the agent binary on the test driver)"
# Debian's interpreter: the python3 first on PATH may be another build without Debian's packages.
(cd driver/nova && /usr/bin/python3 -m flake8 .)
VIREO_BIN=target/debug/vireo /usr/bin/python3 -m pytest -q -p no:cacheprovider driver/nova/tests

section "events endpoint (pytest: Neutron's own Nova notifier posting to the agent)"
/usr/bin/python3 -m flake8 --max-line-length 99 tests/python
VIREO_BIN=target/debug/vireo /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python/notifier

section "nova tier (placement, glance, Nova services, nova-compute with vireo.VireoDriver)"
# Neutron posts its events to nova-api while this tier is up; nova-down gives them back to
# vireo's own agents.
bash integration/host-setup.sh nova-up
# Host B (two-host.sh) as the second nova-compute: moves between hosts go through Nova.
bash integration/two-host.sh nova-up
/usr/bin/python3 -m flake8 --max-line-length 99 integration/nova integration/setup/*.py
# With each of Neutron's OVS firewall drivers: hybrid plug (qbr/qvb/qvo) and native OVS ports;
# `two-host.sh up` gives host B's Neutron agent the same driver.
for firewall in iptables_hybrid openvswitch; do
  bash integration/host-setup.sh neutron-firewall "$firewall"
  bash integration/two-host.sh up >/dev/null
  /usr/bin/python3 -m pytest -q -p no:cacheprovider integration/nova
done
# Hosts apart (an upgrade between firewall drivers): host A hybrid plug, host B (still on
# `openvswitch`) native OVS; a live migration each way plugs each host by its own binding.
bash integration/host-setup.sh neutron-firewall iptables_hybrid
/usr/bin/python3 -m pytest -q -p no:cacheprovider integration/nova -k plug_differently
bash integration/two-host.sh up >/dev/null
# Host B's agent on host A's instances directory: live migrations that copy no disk.
section "nova tier on a shared instances directory"
bash integration/two-host.sh nova-instances shared
/usr/bin/python3 -m pytest -q -p no:cacheprovider integration/nova -k shared_instances
bash integration/two-host.sh nova-instances own
# vireo's other form of a native OVS port (the passes above use the default, pre-created),
# then the other networks under Nova: ML2/OVN in both forms, then the Linux bridge agents.
# nova-network moves every Nova service and host A's agent to that network (on lb,
# nova-compute runs as the Linux bridge agent's host), two-host.sh nova-up host B; then a move
# to host B with a resize back reverted, and a live migration each way.
nova_network_pass() { # nova_network_pass NETWORK [FORM]
  section "nova tier on $*"
  bash integration/host-setup.sh nova-network "$@" >/dev/null
  bash integration/two-host.sh nova-up >/dev/null
  /usr/bin/python3 -m pytest -q -p no:cacheprovider integration/nova \
    -k 'moves_to_host_b or live_migrates_to_host_b'
}
# libvirt-managed taps on br-int: the native OVS firewall driver (hybrid plug has no tap there).
bash integration/host-setup.sh neutron-firewall openvswitch
bash integration/two-host.sh up >/dev/null
nova_network_pass ovs libvirt-managed
bash integration/host-setup.sh neutron-firewall iptables_hybrid
bash integration/two-host.sh up >/dev/null
nova_network_pass ovn libvirt-managed
nova_network_pass ovn pre-created
nova_network_pass lb
bash integration/two-host.sh nova-down
bash integration/host-setup.sh nova-down

if [[ -x scripts/fuzz.sh ]]; then
  section "fuzz (bounded)"
  bash scripts/fuzz.sh
fi

section "done"
du -sh target fuzz/target 2>/dev/null || true
