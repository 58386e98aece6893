"""The integration tier's small OpenStack, driven through the `openstack` CLI.

Needs ``integration/host-setup.sh up --with-neutron`` and ``host-setup.sh nova-up`` (placement,
glance, nova-api, -conductor, -scheduler, nova-compute with ``vireo.VireoDriver`` and its vireo
agent on ``qemu:///system``, Neutron posting its events to nova-api).  Every scenario ends with
vireo's leak check on this host and a Neutron check.
"""

import json
import os
import pathlib
import signal
import subprocess
import time
import uuid

import pytest
import requests

STATE_DIR = pathlib.Path(os.environ.get('VIREO_STATE_DIR', '/var/lib/vireo-integration'))
ETC = STATE_DIR / 'etc'
LOG = STATE_DIR / 'log'
AGENT_URL = 'http://127.0.0.1:%s' % os.environ.get('VIREO_NOVA_AGENT_PORT', '8775')


def _nova_network():
    """The tier's Neutron and vireo's OVS port form (`host-setup.sh nova-network`)."""
    path = STATE_DIR / 'nova-network'
    words = path.read_text().split() if path.is_file() else []
    return (words + ['ovs', 'pre-created'][len(words):])[:2]


# ML2/openvswitch's server and OVS agents, ML2/OVN's server (a second neutron-server, its
# chassis named after the compute hosts while the tier runs on it), or ML2/openvswitch's
# Linux bridge agents (the nova-computes then run as their hosts).
NOVA_NETWORK, OVS_FORM = _nova_network()
OVN = NOVA_NETWORK == 'ovn'
LB = NOVA_NETWORK == 'lb'
NEUTRON_URL = 'http://127.0.0.1:%d' % (9796 if OVN else 9696)
# The integration bridge vireo plugs native OVS ports into on each host.
BRIDGE = 'br-ovn' if OVN else 'br-int'
NOVA_URL = 'http://127.0.0.1:%s/v2.1' % os.environ.get('VIREO_NOVA_API_PORT', '18774')
HOSTB_ADDR = os.environ.get('VIREO_HOSTB_ADDR', '198.51.100.2')
TWO_HOST = pathlib.Path(__file__).resolve().parents[1] / 'two-host.sh'
HOST_SETUP = pathlib.Path(__file__).resolve().parents[1] / 'host-setup.sh'


def write_halting_image(path):
    """A 1 MiB raw disk whose boot sector disables interrupts and halts (`cli; hlt`, then a
    jump back to the `hlt`), with the boot signature. The firmware boots it at once and the
    guest then idles: no OS, so it honours no ACPI request (shutdown, device removal), like
    a disk of zeros, but a disk of zeros keeps the firmware looking for something to boot,
    which kept one of this machine's two CPUs busy for as long as each guest ran."""
    disk = bytearray(1 << 20)
    disk[0:4] = b'\xfa\xf4\xeb\xfd'
    disk[510:512] = b'\x55\xaa'
    path.write_bytes(bytes(disk))


def upload_halting_image(cloud, prefix):
    """The halting image, written under the state directory and uploaded to Glance as
    `<prefix>-<8 hex>`; returns its id."""
    path = STATE_DIR / 'nova-test-image.raw'
    write_halting_image(path)
    name = '%s-%s' % (prefix, uuid.uuid4().hex[:8])
    return cloud.cli('image', 'create', '--disk-format', 'raw', '--container-format', 'bare',
                     '--file', str(path), name, '-f', 'json')['id']


def _env_file():
    values = {}
    for line in (STATE_DIR / 'neutron.env').read_text().splitlines():
        key, _, value = line.partition('=')
        values[key] = value
    return values


class Cloud(object):
    """The `openstack` CLI on the tier's clouds.yaml, the agent and Neutron's API."""

    def __init__(self):
        if not (ETC / 'clouds.yaml').is_file():
            pytest.fail('no Nova tier here: run integration/host-setup.sh nova-up first')
        env = _env_file()
        self.network = env['VIREO_OVN_NETWORK_ID' if OVN else
                           'VIREO_NEUTRON_LB_NETWORK_ID' if LB else 'VIREO_NEUTRON_NETWORK_ID']
        self.host = env['VIREO_NEUTRON_LB_HOST' if LB else 'VIREO_NEUTRON_HOST']
        self.env = dict(os.environ, OS_CLIENT_CONFIG_FILE=str(ETC / 'clouds.yaml'),
                        OS_CLOUD='vireo')
        token = (ETC / 'vireo-agent-token').read_text().strip()
        self.agent = requests.Session()
        self.agent.headers['X-Auth-Token'] = token
        self.host_a = Host(self.host, AGENT_URL, token, 'qemu:///system',
                           STATE_DIR / 'vireo-agent', LOG / 'nova-compute.log',
                           agent_pid=STATE_DIR / 'run' / 'vireo-agent.pid',
                           agent_log=LOG / 'vireo-agent.log',
                           agent_up=['bash', str(HOST_SETUP), 'vireo-agent-up'])
        self.host_b = None
        hb_dir = pathlib.Path(os.environ.get('VIREO_HB_DIR', STATE_DIR / 'hostb'))
        if (hb_dir / 'nova' / 'nova.conf').is_file():
            hb_name = os.environ.get('VIREO_HOSTB_NAME', 'vireo-hb')
            if LB:
                hb_name = os.environ.get('VIREO_HOSTB_LB_HOST', hb_name + '-lb')
            self.host_b = Host(
                hb_name,
                'http://%s:8775' % HOSTB_ADDR, token, 'qemu+tcp://%s/system' % HOSTB_ADDR,
                hb_dir / 'vireo-agent', hb_dir / 'log' / 'nova-compute.log',
                wrap=['bash', str(TWO_HOST), 'exec'],
                agent_pid=hb_dir / 'run' / 'vireo-agent.pid',
                agent_log=hb_dir / 'log' / 'vireo-agent.log',
                agent_up=['bash', str(TWO_HOST), 'nova-up'])

    def cli(self, *args, check=True):
        """`openstack ARGS -f json`'s answer (or None for commands that print nothing)."""
        run = subprocess.run(['openstack', *args], env=self.env, capture_output=True,
                             text=True, timeout=600)
        if check and run.returncode != 0:
            raise AssertionError('openstack %s: %s' % (' '.join(args), run.stderr.strip()))
        out = run.stdout.strip()
        return json.loads(out) if out.startswith(('{', '[')) else out

    def nova(self, method, path, body=None, version='2.53'):
        """nova-api directly (some CLI commands trip over noauth2's version discovery)."""
        r = requests.request(method, NOVA_URL + path, json=body, timeout=30,
                             headers={'X-Auth-Token': 'admin:admin',
                                      'OpenStack-API-Version': 'compute %s' % version})
        assert r.ok, '%s %s: %s %s' % (method, path, r.status_code, r.text[:500])
        return r.json() if r.content else None

    def compute_service(self, host, enabled):
        """Enable or disable `host`'s nova-compute for the scheduler."""
        services = self.nova('GET', '/os-services?binary=nova-compute&host=%s' % host)
        for service in services['services']:
            self.nova('PUT', '/os-services/%s' % service['id'],
                      {'status': 'enabled' if enabled else 'disabled'})

    def server(self, name):
        return self.cli('server', 'show', name, '-f', 'json')

    def wait_status(self, name, status, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            server = self.server(name)
            if server['status'] == status:
                return server
            assert server['status'] != 'ERROR', server.get('fault')
            assert time.monotonic() < deadline, 'server %s is %s, not %s after %d s' % (
                name, server['status'], status, timeout)
            time.sleep(1)

    def agent_instances(self):
        r = self.agent.get(AGENT_URL + '/v1/instances', timeout=10)
        r.raise_for_status()
        return r.json()['instances']

    def agent_instance(self, server_id):
        r = self.agent.get(AGENT_URL + '/v1/instances/' + server_id, timeout=10)
        r.raise_for_status()
        return r.json()

    def neutron_port_create(self, name):
        """A port made by the user (project `admin`, noauth2's project) before the server."""
        r = requests.post(NEUTRON_URL + '/v2.0/ports', timeout=10,
                          headers={'X-Project-Id': 'admin', 'X-Roles': 'admin'},
                          json={'port': {'network_id': self.network, 'name': name,
                                         'tenant_id': 'admin'}})
        r.raise_for_status()
        return r.json()['port']

    def neutron_port_delete(self, port_id):
        requests.delete(NEUTRON_URL + '/v2.0/ports/' + port_id, timeout=10,
                        headers={'X-Project-Id': 'admin', 'X-Roles': 'admin'})

    @staticmethod
    def _neutron_get(path, **query):
        """Neutron's answer to an admin's GET of `path` (noauth: the headers are the
        caller)."""
        r = requests.get(NEUTRON_URL + path, params=query, timeout=10,
                         headers={'X-Project-Id': 'vireo', 'X-Roles': 'admin'})
        r.raise_for_status()
        return r.json()

    def neutron_bindings(self, port_id):
        """A port's bindings (Neutron's binding-extended API): one per host it is bound to."""
        return self._neutron_get('/v2.0/ports/%s/bindings' % port_id)['bindings']

    def neutron_ports(self, **query):
        return self._neutron_get('/v2.0/ports', **query)['ports']

    def wait_ovn_port_up(self, port_id, timeout=30):
        """Wait until OVN's northbound database has the logical port up."""
        nb = _env_file()['VIREO_OVN_NB_DB']
        deadline = time.monotonic() + timeout
        while True:
            up = subprocess.run(['ovn-nbctl', '--db=%s' % nb, 'lsp-get-up', port_id],
                                capture_output=True, text=True, check=True).stdout.strip()
            if up == 'up':
                return
            assert time.monotonic() < deadline, 'logical port %s is %s in OVN' % (port_id, up)
            time.sleep(0.2)

    def hybrid_plug(self, host):
        """Whether `host`'s Neutron OVS agent asks for hybrid plug (its firewall driver);
        ML2/OVN and the Linux bridge agent never do."""
        if OVN or LB:
            return False
        [agent] = self._neutron_get('/v2.0/agents', binary='neutron-openvswitch-agent',
                                    host=host)['agents']
        return agent['configurations'].get('ovs_hybrid_plug', False)


class Host(object):
    """One compute host of the tier: its nova-compute, vireo agent, libvirtd and devices."""

    def __init__(self, name, agent_url, token, libvirt_uri, state_dir, log, wrap=(),
                 agent_pid=None, agent_up=None, agent_log=None):
        self.name = name
        self.agent_log = agent_log
        self._agent_pid = agent_pid  # the agent's pid file (its process group's leader)
        self._agent_up = agent_up  # the set-up command that starts it again
        self.agent_url = agent_url
        self.libvirt_uri = libvirt_uri
        self.state_dir = state_dir
        self.log = log
        self._wrap = list(wrap)  # runs a command inside the host's namespaces
        self.agent = requests.Session()
        self.agent.headers['X-Auth-Token'] = token

    def run(self, *args):
        return subprocess.run([*self._wrap, *args], capture_output=True, text=True,
                              check=True).stdout

    def _root_disk(self, server_id):
        """The server's root disk as this host's agent holds it: (path, format)."""
        [root] = [d for d in self.agent_instance(server_id)['disks'] if d['role'] == 'root']
        return root['path'], root['format']

    def disk_write(self, server_id, offset, pattern):
        """Write 64 KiB of byte `pattern` at `offset` of the server's root disk as the guest
        sees it (into its overlay), with qemu-io inside this host's namespaces. Only while
        no guest runs on the disk."""
        path, fmt = self._root_disk(server_id)
        self.run('qemu-io', '-f', fmt, '-c', 'write -P %d %d 64k' % (pattern, offset), path)

    def disk_holds(self, server_id, offset, pattern):
        """Do the 64 KiB at `offset` of the server's root disk here, as the guest sees it
        (through its backing chain), all hold byte `pattern`? Read-only, with qemu-io."""
        path, fmt = self._root_disk(server_id)
        read = subprocess.run([*self._wrap, 'qemu-io', '-r', '-f', fmt, '-c',
                               'read -P %d %d 64k' % (pattern, offset), path],
                              capture_output=True, text=True)
        return read.returncode == 0 and 'read 65536/65536 bytes' in read.stdout

    def kill_agent(self):
        """SIGKILL this host's vireo agent (its process group) and wait until its API is
        gone."""
        os.killpg(int(self._agent_pid.read_text()), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.agent.get(self.agent_url + '/healthz', timeout=1)
            except requests.RequestException:
                return
            assert time.monotonic() < deadline, '%s\'s agent still answers' % self.name
            time.sleep(0.1)

    def start_agent(self):
        """Start this host's vireo agent again as the set-up did (a running one is kept);
        returns once it answers."""
        run = subprocess.run(self._agent_up, capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stderr[-2000:]

    def agent_instances(self):
        r = self.agent.get(self.agent_url + '/v1/instances', timeout=10)
        r.raise_for_status()
        return r.json()['instances']

    def agent_instance(self, server_id):
        r = self.agent.get(self.agent_url + '/v1/instances/' + server_id, timeout=10)
        r.raise_for_status()
        return r.json()

    def operations(self, server_id):
        """The agent's operations of an instance, newest first."""
        r = self.agent.get(self.agent_url + '/v1/operations', params={'instance': server_id},
                           timeout=10)
        r.raise_for_status()
        return r.json()['operations']

    def holds(self, server_id):
        return any(i['uuid'] == server_id for i in self.agent_instances())

    def domains(self):
        return subprocess.run(['virsh', '-c', self.libvirt_uri, 'list', '--all', '--uuid'],
                              capture_output=True, text=True, check=True).stdout.split()

    def migrating_out(self, server_id):
        """True while libvirt on this host runs an outgoing migration job of the server's
        domain (`virsh domjobinfo`): the agent names its phase before its call reaches
        libvirt."""
        info = subprocess.run(['virsh', '-c', self.libvirt_uri, 'domjobinfo', server_id],
                              capture_output=True, text=True).stdout
        return 'Outgoing migration' in info

    def log_offset(self, log=None):
        log = log or self.log
        return log.stat().st_size if log.exists() else 0

    def log_since(self, offset, log=None):
        """nova-compute's log (or `log`) from `offset` on."""
        with open(log or self.log, 'rb') as f:
            f.seek(offset)
            return f.read().decode('utf-8', 'replace')

    def wired(self, device, network):
        """Is `device` wired to `network` here: in its Linux bridge (brq + the network's
        id) with the Linux bridge agent, in the integration bridge with Open vSwitch?"""
        if LB:
            link = self.run('ip', '-o', 'link', 'show', 'dev', device).split()
            return 'master' in link and link[link.index('master') + 1] == 'brq' + network[:11]
        return device in self.run('ovs-vsctl', 'list-ports', BRIDGE).split()

    def leaks(self, server_id, ports, disks=True):
        """What this host still holds of a server gone from it: domain, devices, disks (not
        asked for on a shared instances directory, where they are the server's own)."""
        found = []
        if server_id in self.domains():
            found.append('%s: domain %s' % (self.name, server_id))
        if self.holds(server_id):
            found.append('%s: agent instance %s' % (self.name, server_id))
        instance_dir = self.state_dir / 'instances' / server_id
        if disks and instance_dir.exists():
            found.append('%s: instance directory %s' % (self.name, instance_dir))
        links = self.run('ip', '-o', 'link')
        ovs = self.run('ovs-vsctl', 'list-ports', BRIDGE).split()
        for port in ports:
            short = port[:11]
            for prefix in ('tap', 'qbr', 'qvb', 'qvo'):
                if ' %s%s' % (prefix, short) in links or '%s%s' % (prefix, short) in ovs:
                    found.append('%s: device %s%s' % (self.name, prefix, short))
        return found

    def leaks_once_removed(self, server_id, ports, within=10):
        """`leaks` once this host's removal of a server that left it ended (at most
        `within` s): a confirmed resize's source answers Nova once the old instance is off
        and recorded as gone, and removes it right after."""
        deadline = time.monotonic() + within
        while True:
            found = self.leaks(server_id, ports)
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.1)


def compute_log_offset():
    path = LOG / 'nova-compute.log'
    return path.stat().st_size if path.exists() else 0


def compute_log_since(offset):
    with open(LOG / 'nova-compute.log', 'rb') as f:
        f.seek(offset)
        return f.read().decode('utf-8', 'replace')


def leaks(cloud, server_id, ports, hosts=None):
    """What the hosts (this one by default) still hold of a deleted server, and the ports
    Neutron still has on it."""
    found = []
    for host in hosts or [cloud.host_a]:
        found.extend(host.leaks(server_id, ports))
    for port in cloud.neutron_ports(device_id=server_id):
        found.append('port %s still on the server (%s)' % (port['id'], port['status']))
    return found


@pytest.fixture(scope='session')
def cloud():
    return Cloud()


@pytest.fixture(scope='session')
def host_b(cloud):
    """Host B as a second nova-compute (`two-host.sh nova-up`); the test fails without it."""
    if cloud.host_b is None:
        pytest.fail('no second nova-compute: run integration/two-host.sh nova-up first')
    return cloud.host_b


@pytest.fixture(scope='session')
def shared_instances(host_b):
    """Does host B's agent use host A's instances directory (`two-host.sh nova-instances
    shared`) rather than its own?"""
    hb_dir = pathlib.Path(os.environ.get('VIREO_HB_DIR', STATE_DIR / 'hostb'))
    mode = hb_dir / 'instances-mode'
    return mode.is_file() and mode.read_text().strip() == 'shared'


@pytest.fixture(scope='session')
def hybrid(cloud):
    """Do the hosts' Neutron OVS agents run the iptables_hybrid firewall, so that ports are
    plugged through qbr/qvb/qvo? Never on ML2/OVN. Read from the agents' own reports, not
    from the set-up's record: `host-setup.sh neutron-firewall` switches host A alone and host
    B follows at `two-host.sh up`, so the two can differ; a scenario that expects one plug on
    both hosts fails here, naming the cause, rather than in an assertion on vireo."""
    hosts = [cloud.host_a] + ([cloud.host_b] if cloud.host_b is not None else [])
    plugs = {host.name: cloud.hybrid_plug(host.name) for host in hosts}
    if len(set(plugs.values())) != 1:
        pytest.fail('the OVS agents disagree on hybrid plug %s: run integration/two-host.sh '
                    'up after host-setup.sh neutron-firewall' % plugs)
    return plugs[cloud.host_a.name]


@pytest.fixture(scope='session')
def kept_wired(hybrid):
    """Does a resize's source keep its ports wired while the guest is away (hybrid plug's
    qvo, or a tap vireo made itself: the pre-created form, which applies to native OVS ports
    only; a Linux bridge tap is always libvirt's), so that Neutron reports them up again as
    soon as Nova binds them back?"""
    return hybrid or (OVS_FORM == 'pre-created' and not LB)


@pytest.fixture(scope='session')
def image(cloud):
    """The halting image (`write_halting_image`): domains start and VIFs plug; no guest OS
    is needed for Nova."""
    image_id = upload_halting_image(cloud, 'vireo-test')
    yield image_id
    cloud.cli('image', 'delete', image_id, check=False)


def _flavor(cloud, vcpus, ram, disk):
    name = 'vireo-test-%s' % uuid.uuid4().hex[:8]
    cloud.cli('flavor', 'create', '--vcpus', str(vcpus), '--ram', str(ram), '--disk', str(disk),
              name, '-f', 'json')
    return name


@pytest.fixture(scope='session')
def flavor(cloud):
    name = _flavor(cloud, 1, 128, 1)
    yield name
    cloud.cli('flavor', 'delete', name, check=False)


@pytest.fixture(scope='session')
def larger_flavors(cloud):
    """Two flavors to resize to: more of everything, and another with the same disk."""
    names = [_flavor(cloud, 2, 192, 2), _flavor(cloud, 1, 160, 2)]
    yield names
    for name in names:
        cloud.cli('flavor', 'delete', name, check=False)
