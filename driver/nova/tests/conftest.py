"""Fixtures: Nova 26 (Debian's python3-nova) in-process, a real vireo agent, a real Glance.

The compute manager is Nova's own ``ComputeManager``, which loads the driver by name exactly as
nova-compute does (``compute_driver='vireo.VireoDriver'``).  Its placement client is the one
thing replaced: constructing it performs endpoint discovery against a placement service these
unit tests do not run.  The agent is the ``vireo`` binary of this checkout on libvirt's test
driver (a private node file per test run) with its embedded network service.  Images come from
Debian's glance-api (sqlite, a file store, no Keystone: its unauthenticated pipeline).
"""

import eventlet

eventlet.monkey_patch()

import os  # noqa: E402
import pathlib  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from unittest import mock  # noqa: E402
import uuid  # noqa: E402

import pytest  # noqa: E402
import requests  # noqa: E402

import nova.virt  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
# Nova 26's nova.virt is a pkg_resources namespace: the package is found beside Nova's own
# drivers once installed (driver/nova/install.sh); here the checkout's copy comes first.
nova.virt.__path__.insert(0, str(HERE.parent / 'nova' / 'virt'))

import nova.conf  # noqa: E402
from nova import objects  # noqa: E402
from nova import rpc  # noqa: E402

CONF = nova.conf.CONF
TOKEN = 'vireo-nova-tests-token-0123456789'
HOST = 'compute-test'


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def stop_process(proc, log):
    """TERM, KILL after 30 s; the log file closed."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


class Agent(object):
    """A running ``vireo agent`` process."""

    def __init__(self, root):
        self.root = root
        self.port = _free_port()
        self.url = 'http://127.0.0.1:%d' % self.port
        self.token_file = root / 'api-token'
        self.token_file.write_text(TOKEN + '\n')
        self.token_file.chmod(0o600)
        (root / 'images').mkdir()
        config_file = root / 'agent.toml'
        config_file.write_text(
            'host = "%s"\nlisten = "127.0.0.1:%d"\napi_token_file = "%s"\n'
            '[libvirt]\nuri = "test://%s"\n'
            '[instances]\nstate_dir = "%s"\nimage_dirs = ["%s"]\ndomain_type = "test"\n'
            'power_off_timeout = 2\nsoft_reboot_timeout = 2\n'
            '[events]\nvif_plugging_timeout = 30\n'
            '[network]\nkind = "embedded"\n'
            % (HOST, self.port, self.token_file, root / 'node.xml', root / 'state',
               root / 'images'))
        (root / 'node.xml').write_text('<node/>\n')
        binary = os.environ.get('VIREO_BIN', str(REPO / 'target' / 'debug' / 'vireo'))
        if not os.access(binary, os.X_OK):
            pytest.fail('no vireo binary at %s: run `cargo build -p vireo` first '
                        '(or set VIREO_BIN)' % binary)
        self.log = open(root / 'agent.log', 'wb')
        self.proc = subprocess.Popen([binary, 'agent', '--config', str(config_file)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.session = requests.Session()
        self.session.headers['X-Auth-Token'] = TOKEN
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.session.get(self.url + '/healthz', timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError('the vireo agent did not start: %s'
                                   % (root / 'agent.log').read_text())
            time.sleep(0.05)

    def create(self, power_on=True):
        """A diskless instance made through the agent's own API; its uuid."""
        instance = str(uuid.uuid4())
        body = {'uuid': instance, 'name': 'instance-%s' % instance[:8],
                'flavor': {'name': 'm1.tiny', 'vcpus': 1, 'memory_mb': 64},
                'power_on': power_on}
        op = self.session.post(self.url + '/v1/instances', json=body).json()['operation']
        deadline = time.monotonic() + 30
        while op['state'] == 'running' and time.monotonic() < deadline:
            time.sleep(0.05)
            op = self.session.get(self.url + '/v1/operations/' + op['id']).json()
        assert op['state'] == 'succeeded', op
        return instance

    def get(self, path):
        return self.session.get(self.url + path, timeout=10)

    def stop(self):
        stop_process(self.proc, self.log)


@pytest.fixture(scope='session')
def agent(tmp_path_factory):
    a = Agent(tmp_path_factory.mktemp('agent'))
    yield a
    a.stop()


class Glance(object):
    """A running glance-api on a private sqlite database and file store."""

    def __init__(self, root):
        self.port = _free_port()
        self.url = 'http://127.0.0.1:%d' % self.port
        conf = root / 'glance-api.conf'
        conf.write_text(
            '[DEFAULT]\nbind_host = 127.0.0.1\nbind_port = %d\nworkers = 1\n'
            'enabled_backends = fs:file\n'
            '[database]\nconnection = sqlite:///%s\n'
            '[glance_store]\ndefault_backend = fs\n'
            '[fs]\nfilesystem_store_datadir = %s\n'
            '[os_glance_tasks_store]\nfilesystem_store_datadir = %s\n'
            '[os_glance_staging_store]\nfilesystem_store_datadir = %s\n'
            % (self.port, root / 'glance.db', root / 'images', root / 'tasks',
               root / 'staging'))
        subprocess.run(['/usr/bin/glance-manage', '--config-file', str(conf), 'db_sync'],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.log = open(root / 'glance-api.log', 'wb')
        self.proc = subprocess.Popen(['/usr/bin/glance-api', '--config-file', str(conf)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while True:
            try:
                if requests.get(self.url + '/v2/images', timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError('glance-api did not start: %s'
                                   % (root / 'glance-api.log').read_text())
            time.sleep(0.1)

    def upload(self, data, disk_format='raw'):
        """An active image holding ``data``; Glance's image record."""
        image = requests.post(self.url + '/v2/images', timeout=30, json={
            'name': 'vireo-test', 'disk_format': disk_format,
            'container_format': 'bare'}).json()
        requests.put(self.url + '/v2/images/%s/file' % image['id'], data=data, timeout=60,
                     headers={'Content-Type': 'application/octet-stream'}
                     ).raise_for_status()
        return requests.get(self.url + '/v2/images/%s' % image['id'], timeout=30).json()

    def stop(self):
        stop_process(self.proc, self.log)


@pytest.fixture(scope='session')
def glance_api(tmp_path_factory):
    g = Glance(tmp_path_factory.mktemp('glance'))
    yield g
    g.stop()


@pytest.fixture(scope='session')
def nova_conf(tmp_path_factory, agent, glance_api):
    conf_file = tmp_path_factory.mktemp('nova') / 'nova.conf'
    conf_file.write_text(
        '[DEFAULT]\ntransport_url = fake:/\nhost = %s\nmy_ip = 192.0.2.10\n'
        'vif_plugging_timeout = 300\n'
        '[glance]\napi_servers = %s\n'
        '[vireo]\nagent_url = %s\ntoken_file = %s\npoll_interval = 0.02\n'
        % (HOST, glance_api.url, agent.url, agent.token_file))
    CONF(['--config-file', str(conf_file)], project='nova')
    objects.register_all()
    rpc.init(CONF)
    yield CONF


@pytest.fixture
def manager(nova_conf):
    """Nova's ComputeManager with this package loaded as its driver, by name."""
    from nova.compute import manager as compute_manager

    with mock.patch('nova.scheduler.client.report.SchedulerReportClient'):
        return compute_manager.ComputeManager(compute_driver='vireo.VireoDriver')


@pytest.fixture
def context():
    from nova import context as nova_context

    return nova_context.get_admin_context()


def make_instance(uuid_=None, task_state=None, vm_state='active'):
    return objects.Instance(uuid=uuid_ or str(uuid.uuid4()), task_state=task_state,
                            vm_state=vm_state, host=HOST)


def make_event(instance, tag, name='network-vif-plugged', status='completed'):
    return objects.InstanceExternalEvent(instance_uuid=instance.uuid, name=name, tag=tag,
                                         status=status, data={})
