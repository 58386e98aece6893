#!/usr/bin/python3
"""vireo.VireoDriver and Nova's own libvirt.LibvirtDriver side by side on one cloud.

    integration/nova/side_by_side.py [--runs 5] [--moves] [--only delete|revert] [--cpu]
                                     [--settle] [--json FILE] [--markdown FILE]

The same server goes through the same operations on host A's nova-compute, once on each
driver per run, the drivers' order alternating from run to run (vireo first in even runs).
Between drivers `host-setup.sh nova-compute-driver` restarts nova-compute on the other one;
the cloud (Neutron, its OVS agent and firewall driver, Glance, the image, the flavors,
qemu:///system) stays the same. Each operation is timed from the API call that starts it to
the server's arrival in its end state, polled every 0.2 s through nova-api; interface attach
is a synchronous call and is timed as such. After each driver's turn: the event timeouts and
unexpected plug events nova-compute logged meanwhile, and what the host still holds of the
deleted server (domain, devices, instance directories, ports). With --cpu, also the CPU time
each of the tier's processes (by kind and host) spent during each operation, from /proc.
With --settle, each operation on a running server starts once its guest has gone idle (as a
user acts on a server they have seen up, not in its first second); the wait is not timed.

Needs `host-setup.sh up --with-neutron` and `host-setup.sh nova-up`; host B's nova-compute,
if it runs, is disabled meanwhile so that every resize stays on host A. Leaves host A's
nova-compute on vireo.

With --only, one operation and only what it needs (`FOCUS`): many runs of it in little time.
`delete`: the boot, with --moves the cold migration to host B and its confirm, the delete;
`revert`: the boot, the resize (with --moves to host B), its revert, the delete. Every table
also splits the delete as nova-compute logs it: the driver's destroy, then the network's
deallocation through Neutron.

With --moves, the moves between hosts instead: boot on host A, a live migration to host B and
one back, a resize to host B reverted, a cold migration to host B confirmed, delete, with both
hosts' nova-computes on one driver per turn (`two-host.sh nova-up` first; `two-host.sh
nova-compute-driver` switches host B's). The disks are copied by each move (the hosts share no
instances directory): vireo's destination over the libvirt connection, Nova's libvirt driver
over SSH (for its turn `two-host.sh nova-compute-driver libvirt` runs an sshd in host B that
takes host A's root with a key of the tier's). Leaves both on vireo.
"""

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
import uuid

import requests

from conftest import Cloud
from conftest import leaks
from conftest import NOVA_URL
from conftest import STATE_DIR
from conftest import upload_halting_image

HOST_SETUP = pathlib.Path(__file__).resolve().parents[1] / 'host-setup.sh'
TWO_HOST = pathlib.Path(__file__).resolve().parents[1] / 'two-host.sh'
DRIVERS = ('vireo', 'libvirt')
TIMEOUT = re.compile(r'Timeout waiting for')
# nova-compute's own account of a delete (ComputeManager._shutdown_instance): the driver's
# destroy, then the network's deallocation through Neutron.
DELETE_PARTS = (
    ('delete: driver destroy', re.compile(
        r'Took ([0-9.]+) seconds to destroy the instance on the hypervisor')),
    ('delete: deallocate network', re.compile(
        r'Took ([0-9.]+) seconds to deallocate network for instance')),
)
UNEXPECTED = re.compile(r'Received unexpected event network-vif-plugged')
# --cpu: the tier's processes by what their command line holds, first match wins; host B's
# (under its state directory; a qemu by its libvirtd's `tini`) get " B". A process's CPU time
# is its user + system time and that of the children it waited for (a short-lived `ip` or
# `iptables-restore` counts for the agent that ran it); the `tini`s that reap each libvirtd's
# guests are left out (a guest's whole life would count for its end).
CPU_GROUPS = (
    ('neutron-ovn.conf', 'neutron-server (OVN)'), ('neutron-server', 'neutron-server'),
    ('neutron-openvswitch-agent', 'neutron OVS agent'),
    ('neutron-linuxbridge-agent', 'neutron LB agent'), ('privsep-helper', 'neutron privsep'),
    ('nova.cmd.api', 'nova-api'), ('nova.cmd.conductor', 'nova-conductor'),
    ('nova.cmd.scheduler', 'nova-scheduler'), ('nova.cmd.compute', 'nova-compute'),
    ('vireo agent', 'vireo agent'), ('libvirtd', 'libvirtd'), ('qemu-system', 'qemu'),
    ('ovs-vswitchd', 'ovs-vswitchd'), ('ovsdb-server', 'ovsdb-server'), ('ovn-', 'OVN'),
    ('mariadbd', 'MariaDB'), ('beam.smp', 'RabbitMQ'), ('glance-api', 'glance-api'),
)
CLK_TCK = os.sysconf('SC_CLK_TCK')
POLL = 0.2
# --settle: the guests are idle when they spend at most this share of one CPU over the window.
SETTLE_IDLE = 0.1
SETTLE_WINDOW = 1.0
SETTLE_LIMIT = 60.0
# One operation may take Nova's whole vif_plugging_timeout (300 s) and its clean-up.
OP_DEADLINE = 420


class OperationFailed(Exception):
    pass


class Server(object):
    """One server through nova-api: actions and the wait for their end state."""

    def __init__(self, cloud, server_id):
        self.cloud = cloud
        self.id = server_id

    def show(self):
        return self.cloud.nova('GET', '/servers/%s' % self.id)['server']

    def on(self, host):
        """Raise unless the server is on `host` now."""
        there = self.show()['OS-EXT-SRV-ATTR:host']
        if there != host.name:
            raise OperationFailed('on %s, not %s' % (there, host.name))

    def wait(self, status):
        deadline = time.monotonic() + OP_DEADLINE
        while True:
            server = self.show()
            if server['status'] == status and server['OS-EXT-STS:task_state'] is None:
                return server
            if server['status'] == 'ERROR':
                raise OperationFailed('ERROR: %s' % server.get('fault', {}).get('message'))
            if time.monotonic() > deadline:
                raise OperationFailed('%s, not %s after %d s' % (
                    server['status'], status, OP_DEADLINE))
            time.sleep(POLL)

    def act(self, body, status, version='2.53'):
        self.cloud.nova('POST', '/servers/%s/action' % self.id, body, version=version)
        self.wait(status)

    def gone(self):
        self.cloud.nova('DELETE', '/servers/%s' % self.id)
        deadline = time.monotonic() + OP_DEADLINE
        while time.monotonic() < deadline:
            r = requests.get('%s/servers/%s' % (NOVA_URL, self.id), timeout=30,
                             headers={'X-Auth-Token': 'admin:admin'})
            if r.status_code == 404:
                return
            time.sleep(POLL)
        raise OperationFailed('still there %d s after the delete' % OP_DEADLINE)


def flavor(cloud, vcpus, ram, disk):
    name = 'vireo-sbs-%s' % uuid.uuid4().hex[:8]
    body = {'flavor': {'name': name, 'vcpus': vcpus, 'ram': ram, 'disk': disk}}
    return cloud.nova('POST', '/flavors', body)['flavor']['id']


def operations(cloud, image, flavors):
    """(name, run(state)) in the order one turn runs them; state carries the server."""
    small, larger, other = flavors

    def boot(state):
        body = {'server': {
            'name': 'vireo-sbs-%s' % uuid.uuid4().hex[:8], 'imageRef': image,
            'flavorRef': small, 'networks': [{'uuid': cloud.network}],
            'availability_zone': 'nova:%s' % cloud.host}}
        server = Server(cloud, cloud.nova('POST', '/servers', body)['server']['id'])
        state['server'] = server
        server.wait('ACTIVE')

    def attach(state):
        body = {'interfaceAttachment': {'net_id': cloud.network}}
        cloud.nova('POST', '/servers/%s/os-interface' % state['server'].id, body)

    def act(body, status):
        return lambda state: state['server'].act(body, status)

    return [
        ('boot', boot),
        ('soft reboot', act({'reboot': {'type': 'SOFT'}}, 'ACTIVE')),
        ('hard reboot', act({'reboot': {'type': 'HARD'}}, 'ACTIVE')),
        ('stop', act({'os-stop': None}, 'SHUTOFF')),
        ('start', act({'os-start': None}, 'ACTIVE')),
        ('pause', act({'pause': None}, 'PAUSED')),
        ('unpause', act({'unpause': None}, 'ACTIVE')),
        ('suspend', act({'suspend': None}, 'SUSPENDED')),
        ('resume', act({'resume': None}, 'ACTIVE')),
        ('resize (same host)', act({'resize': {'flavorRef': larger}}, 'VERIFY_RESIZE')),
        ('confirm resize', act({'confirmResize': None}, 'ACTIVE')),
        ('resize again', act({'resize': {'flavorRef': other}}, 'VERIFY_RESIZE')),
        ('revert resize', act({'revertResize': None}, 'ACTIVE')),
        ('interface attach', attach),
        ('delete', lambda state: state['server'].gone()),
    ]


def moves(cloud, image, flavors):
    """The moves between hosts: (name, run(state)) as `operations`."""
    boot = operations(cloud, image, flavors)[0]
    larger = flavors[1]

    def resize_to_b(state):
        # The scheduler sees host B only (host A's service disabled meanwhile: both drivers
        # pay the same two calls).
        server = state['server']
        cloud.compute_service(cloud.host_a.name, enabled=False)
        try:
            server.act({'resize': {'flavorRef': larger}}, 'VERIFY_RESIZE')
        finally:
            cloud.compute_service(cloud.host_a.name, enabled=True)
        server.on(cloud.host_b)

    def then_on(body, status, host, version='2.53'):
        """The action, its end state, and the host the server must be on then."""
        def run(state):
            state['server'].act(body, status, version)
            state['server'].on(host)
        return run

    def live_migrate(host):
        return then_on({'os-migrateLive': {'host': host.name, 'block_migration': 'auto'}},
                       'ACTIVE', host, '2.30')

    return [
        boot,
        ('live migration A > B', live_migrate(cloud.host_b)),
        ('live migration B > A', live_migrate(cloud.host_a)),
        ('resize A > B', resize_to_b),
        ('revert resize (back on A)', then_on({'revertResize': None}, 'ACTIVE', cloud.host_a)),
        ('cold migration A > B', then_on({'migrate': {'host': cloud.host_b.name}},
                                         'VERIFY_RESIZE', cloud.host_b, '2.56')),
        ('confirm (on B)', then_on({'confirmResize': None}, 'ACTIVE', cloud.host_b)),
        ('delete', lambda state: state['server'].gone()),
    ]


# --only: the operations of a turn that one operation needs, by its name; those of `ops` (one
# host) or of `moves` (--moves) that are named here run, in their order. Every turn ends with
# the delete (the leak check follows it).
FOCUS = {
    'delete': ('boot', 'cold migration A > B', 'confirm (on B)', 'delete'),
    'revert': ('boot', 'resize again', 'revert resize', 'resize A > B',
               'revert resize (back on A)', 'delete'),
}


def focus(ops, only):
    """Only what the operation `only` needs of `ops` (see FOCUS)."""
    return [(name, op) for name, op in ops if name in FOCUS[only]]


def switch(driver, hosts):
    """Host A's nova-compute (and host B's, if among `hosts`) on `driver`."""
    commands = [['bash', str(HOST_SETUP), 'nova-compute-driver', driver]]
    if len(hosts) > 1:
        commands.append(['bash', str(TWO_HOST), 'nova-compute-driver', driver])
    for command in commands:
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit('%s failed:\n%s' % (' '.join(command[1:]), run.stderr[-2000:]))


def leftovers(cloud, server_id, ports, hosts):
    """The tier's leak check (the hosts, Neutron), and Nova's libvirt driver's own
    directories (host B's own one is under its state directory)."""
    found = leaks(cloud, server_id, ports, hosts=hosts)
    dirs = [STATE_DIR / 'nova' / 'instances']
    if len(hosts) > 1:
        dirs.append(hosts[1].state_dir.parent / 'nova' / 'instances')
    for host, base in zip(hosts, dirs):
        if (base / server_id).exists():
            found.append('%s: instance directory %s' % (host.name, base / server_id))
    return found


def cpu_ticks():
    """{pid: (group, CPU ticks)} of the tier's processes, and the machine's busy ticks."""
    found, args = {}, {}
    for entry in os.scandir('/proc'):
        if not entry.name.isdigit():
            continue
        try:
            with open('/proc/%s/cmdline' % entry.name, 'rb') as f:
                args[entry.name] = f.read().replace(b'\0', b' ').decode(errors='replace')
            with open('/proc/%s/stat' % entry.name) as f:
                found[entry.name] = f.read().rsplit(')', 1)[1].split()
        except OSError:
            found.pop(entry.name, None)
    groups = {}
    for pid, fields in found.items():
        group = next((g for key, g in CPU_GROUPS if key in args[pid]), None)
        if group is None or args[pid].startswith('tini '):
            continue
        # After the command name: the parent is field 4, utime..cstime are fields 14-17.
        where = args.get(fields[1], '') if group == 'qemu' else args[pid]
        if 'hostb' in where:
            group += ' B'
        groups[int(pid)] = (group, sum(int(x) for x in fields[11:15]))
    with open('/proc/stat') as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    busy = sum(cpu) - cpu[3] - cpu[4]
    return groups, busy


def cpu_spent(before, after):
    """CPU seconds per group between two `cpu_ticks`, and the machine's ('all')."""
    (procs0, busy0), (procs1, busy1) = before, after
    spent = {'all': (busy1 - busy0) / CLK_TCK}
    for pid, (group, ticks) in procs1.items():
        was = procs0.get(pid)
        ticks -= was[1] if was and was[0] == group else 0
        spent[group] = spent.get(group, 0) + ticks / CLK_TCK
    return {g: round(s, 2) for g, s in spent.items() if s > 0}


def settle(limit=SETTLE_LIMIT):
    """Waits until the tier's guests spend at most SETTLE_IDLE of a CPU over SETTLE_WINDOW
    (a guest that booted the halting image, once its firmware is done), at most `limit`
    seconds; returns the seconds waited."""
    start = time.monotonic()
    while True:
        before = cpu_ticks()
        time.sleep(SETTLE_WINDOW)
        spent = cpu_spent(before, cpu_ticks())
        guests = sum(s for g, s in spent.items() if g.startswith('qemu'))
        waited = time.monotonic() - start
        if guests <= SETTLE_IDLE * SETTLE_WINDOW or waited >= limit:
            return round(waited, 2)


def turn(cloud, ops, hosts, cpu=False, settled=False):
    """One driver's pass: seconds per operation (with `cpu`, the CPU seconds of the tier's
    processes meanwhile; with `settled`, each operation on a running server started once its
    guest was idle), failures, log findings, leftovers."""
    offsets = [h.log_offset() for h in hosts]
    state, times, failed, cpus, waits = {}, {}, None, {}, {}
    ports = set()
    for name, op in ops:
        if settled and 'server' in state:
            waits[name] = settle()
        ticks = cpu_ticks() if cpu else None
        start = time.monotonic()
        try:
            op(state)
        except (OperationFailed, AssertionError, requests.RequestException) as e:
            failed = '%s: %s' % (name, e)
            break
        times[name] = round(time.monotonic() - start, 2)
        if cpu:
            cpus[name] = cpu_spent(ticks, cpu_ticks())
        if 'server' in state and name != 'delete':
            ports.update(p['id'] for p in cloud.neutron_ports(device_id=state['server'].id))
    if failed and 'server' in state:
        server = state['server']
        try:
            cloud.nova('POST', '/servers/%s/action' % server.id, {'os-resetState': {
                'state': 'error'}})
            server.gone()
        except (OperationFailed, AssertionError, requests.RequestException) as e:
            failed += '; the clean-up failed too: %s' % e
    log = ''.join(h.log_since(o) for h, o in zip(hosts, offsets))
    if 'delete' in times:
        # The turn's last delete is the server's (a build's clean-up logs the same lines).
        for part, pattern in DELETE_PARTS:
            found = pattern.findall(log)
            if found:
                times[part] = float(found[-1])
    server_id = state['server'].id if 'server' in state else None
    return {
        'seconds': times,
        'cpu': cpus,
        'settled': waits,
        'failed': failed,
        'timeouts': len(TIMEOUT.findall(log)),
        'unexpected_plug_events': len(UNEXPECTED.findall(log)),
        'left_behind': (leftovers(cloud, server_id, sorted(ports), hosts)
                        if server_id else []),
    }


def table(results, names):
    rows = ['| operation | vireo s, median (min–max) | libvirt s, median (min–max) '
            '| vireo / libvirt |', '|---|---|---|---|']
    medians = {}
    for name in names:
        cells = []
        for driver in DRIVERS:
            xs = [t['seconds'][name] for t in results[driver] if name in t['seconds']]
            if not xs:
                cells.append('—')
                continue
            medians[(driver, name)] = statistics.median(xs)
            cells.append('%.2f (%.2f–%.2f), n=%d' % (
                statistics.median(xs), min(xs), max(xs), len(xs)))
        ratio = '—'
        if ('vireo', name) in medians and ('libvirt', name) in medians:
            ratio = '%.2f' % (medians[('vireo', name)] / medians[('libvirt', name)])
        rows.append('| %s | %s | %s | %s |' % (name, cells[0], cells[1], ratio))
    for label, key in (('event timeouts', 'timeouts'),
                       ('unexpected plug events', 'unexpected_plug_events')):
        rows.append('| %s | %d | %d | |' % (
            label, *(sum(t[key] for t in results[d]) for d in DRIVERS)))
    rows.append('| failed operations | %d | %d | |' % tuple(
        sum(1 for t in results[d] if t['failed']) for d in DRIVERS))
    rows.append('| left behind | %d | %d | |' % tuple(
        sum(len(t['left_behind']) for t in results[d]) for d in DRIVERS))
    return '\n'.join(rows)


def cpu_table(results, name):
    """The median CPU seconds per process group during the operation `name`, by driver."""
    per = {d: [t['cpu'][name] for t in results[d] if name in t.get('cpu', {})]
           for d in DRIVERS}
    groups = sorted({g for d in DRIVERS for c in per[d] for g in c})

    def median(d, g):
        return statistics.median([c.get(g, 0) for c in per[d]]) if per[d] else 0

    groups.sort(key=lambda g: -max(median(d, g) for d in DRIVERS))
    rows = ['| CPU s during %s (median) | vireo | libvirt |' % name, '|---|---|---|']
    for g in groups:
        if g == 'all' or max(median(d, g) for d in DRIVERS) >= 0.02:
            rows.append('| %s | %.2f | %.2f |' % (g, median('vireo', g), median('libvirt', g)))
    return '\n'.join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--runs', type=int, default=5)
    parser.add_argument('--moves', action='store_true',
                        help='moves between hosts A and B instead')
    parser.add_argument('--only', choices=sorted(FOCUS),
                        help='one operation and only what it needs (see FOCUS)')
    parser.add_argument('--cpu', action='store_true',
                        help="the CPU time of the tier's processes during each operation")
    parser.add_argument('--settle', action='store_true',
                        help='start each operation on a running server once its guest is idle')
    parser.add_argument('--json', type=pathlib.Path)
    parser.add_argument('--markdown', type=pathlib.Path)
    args = parser.parse_args()

    cloud = Cloud()
    firewall = (STATE_DIR / 'firewall').read_text().strip()
    image = upload_halting_image(cloud, 'vireo-sbs')
    flavors = [flavor(cloud, 1, 128, 1), flavor(cloud, 2, 192, 2), flavor(cloud, 1, 160, 2)]
    hosts = [cloud.host_a]
    if args.moves:
        if cloud.host_b is None:
            sys.exit('--moves needs host B\'s nova-compute: two-host.sh nova-up first')
        hosts.append(cloud.host_b)
        ops = moves(cloud, image, flavors)
    else:
        ops = operations(cloud, image, flavors)
        if cloud.host_b is not None:
            cloud.compute_service(cloud.host_b.name, enabled=False)
    if args.only:
        ops = focus(ops, args.only)
    results = {d: [] for d in DRIVERS}
    try:
        for run in range(args.runs):
            for driver in (DRIVERS if run % 2 == 0 else DRIVERS[::-1]):
                switch(driver, hosts)
                result = turn(cloud, ops, hosts, args.cpu, args.settle)
                result['run'] = run
                results[driver].append(result)
                print('run %d %-7s %s' % (run, driver, json.dumps(result)), flush=True)
    finally:
        switch('vireo', hosts)
        if cloud.host_b is not None and not args.moves:
            cloud.compute_service(cloud.host_b.name, enabled=True)
        for f in flavors:
            cloud.nova('DELETE', '/flavors/%s' % f)
        cloud.cli('image', 'delete', image, check=False)
    markdown = table(results, [name for name, _ in ops] + [p for p, _ in DELETE_PARTS])
    if args.cpu:
        markdown += ''.join('\n\n' + cpu_table(results, name) for name, _ in ops)
    print('\nfirewall driver: %s, %d runs\n\n%s' % (firewall, args.runs, markdown))
    if args.json:
        args.json.write_text(json.dumps({'firewall': firewall, 'results': results}, indent=1))
    if args.markdown:
        args.markdown.write_text(markdown + '\n')
    clean = all(not t['failed'] and not t['timeouts'] and not t['left_behind']
                for d in DRIVERS for t in results[d] if d == 'vireo')
    return 0 if clean else 1


if __name__ == '__main__':
    sys.exit(main())
