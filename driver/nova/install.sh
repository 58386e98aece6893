#!/usr/bin/env bash
# Installs the driver beside Debian's python3-nova, where nova-compute's
# `compute_driver = vireo.VireoDriver` finds it (Nova 26's nova.virt is a pkg_resources
# namespace rooted in Nova's own directory). Run as root; safe to run again.
set -euo pipefail
src="$(cd "$(dirname "$0")" && pwd)/nova/virt/vireo"
virt=$(/usr/bin/python3 -c 'import os, nova.virt; print(os.path.dirname(nova.virt.__file__))')
install -d -m 0755 "$virt/vireo"
install -m 0644 "$src"/*.py "$virt/vireo/"
/usr/bin/python3 -c 'import nova.virt.vireo as v; print("installed", v.__file__)'
