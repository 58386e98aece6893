"""A real ``vireo agent`` process for Python tests: libvirt's test driver (a private node
file), the embedded network service, a private state directory, tokens in 0600 files.

Used by the Nova driver's tests (driver/nova/tests) and the external-events tests that post
with Neutron's own notifier (tests/python/notifier).
"""

import os
import pathlib
import socket
import subprocess
import time
import uuid

import requests

REPO = pathlib.Path(__file__).resolve().parents[2]
TOKEN = 'vireo-python-tests-token-0123456789'
EVENTS_TOKEN = 'vireo-python-tests-events-token-0123'


def free_port():
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


def _secret_file(path, secret):
    path.write_text(secret + '\n')
    path.chmod(0o600)
    return path


class Agent(object):
    """A running ``vireo agent`` process on host ``host``."""

    def __init__(self, root, host, token=TOKEN, events_token=None):
        self.root = root
        self.port = free_port()
        self.url = 'http://127.0.0.1:%d' % self.port
        self.token_file = _secret_file(root / 'api-token', token)
        events = ''
        if events_token is not None:
            path = _secret_file(root / 'events-token', events_token)
            events = 'events_token_file = "%s"\n' % path
        (root / 'images').mkdir()
        config_file = root / 'agent.toml'
        config_file.write_text(
            'host = "%s"\nlisten = "127.0.0.1:%d"\napi_token_file = "%s"\n%s'
            '[libvirt]\nuri = "test://%s"\n'
            '[instances]\nstate_dir = "%s"\nimage_dirs = ["%s"]\ndomain_type = "test"\n'
            'power_off_timeout = 2\nsoft_reboot_timeout = 2\n'
            '[events]\nvif_plugging_timeout = 30\n'
            '[network]\nkind = "embedded"\n'
            % (host, self.port, self.token_file, events, root / 'node.xml', root / 'state',
               root / 'images'))
        (root / 'node.xml').write_text('<node/>\n')
        binary = os.environ.get('VIREO_BIN', str(REPO / 'target' / 'debug' / 'vireo'))
        if not os.access(binary, os.X_OK):
            raise RuntimeError('no vireo binary at %s: run `cargo build -p vireo` first '
                               '(or set VIREO_BIN)' % binary)
        self.log_path = root / 'agent.log'
        self.log = open(self.log_path, 'wb')
        self.proc = subprocess.Popen([binary, 'agent', '--config', str(config_file)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.session = requests.Session()
        self.session.headers['X-Auth-Token'] = token
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.session.get(self.url + '/healthz', timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError('the vireo agent did not start: %s'
                                   % self.log_path.read_text())
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

    def metric(self, line_prefix):
        """The value of the first /metrics sample starting with ``line_prefix`` (0 if none)."""
        for line in self.get('/metrics').text.splitlines():
            if line.startswith(line_prefix):
                return float(line.rsplit(' ', 1)[1])
        return 0.0

    def stop(self):
        stop_process(self.proc, self.log)
