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

import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from unittest import mock  # noqa: E402
import uuid  # noqa: E402

import pytest  # noqa: E402
import requests  # noqa: E402

import nova.virt  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / 'tests' / 'python'))

from vireo_agent import Agent  # noqa: E402
from vireo_agent import free_port  # noqa: E402
from vireo_agent import stop_process  # noqa: E402
# Nova 26's nova.virt is a pkg_resources namespace: the package is found beside Nova's own
# drivers once installed (driver/nova/install.sh); here the checkout's copy comes first.
nova.virt.__path__.insert(0, str(HERE.parent / 'nova' / 'virt'))

import nova.conf  # noqa: E402
from nova import objects  # noqa: E402
from nova import rpc  # noqa: E402

CONF = nova.conf.CONF
HOST = 'compute-test'


@pytest.fixture(scope='session')
def agent(tmp_path_factory):
    a = Agent(tmp_path_factory.mktemp('agent'), HOST)
    yield a
    a.stop()


class Glance(object):
    """A running glance-api on a private sqlite database and file store."""

    def __init__(self, root):
        self.port = free_port()
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
        '[vireo]\nagent_url = %s\ntoken_file = %s\n'
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
