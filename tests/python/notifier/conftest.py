"""Fixtures: a real ``vireo agent`` and Neutron's own Nova notifier (Debian's python3-neutron)
configured to post to it directly, as docs/AGENT.md tells an operator to configure Neutron:
``[nova] auth_type = admin_token``, ``token`` = the agent's events token, ``endpoint`` = the
agent's ``/v2.1``. No proxy, no Keystone.
"""

import eventlet

eventlet.monkey_patch()

import pathlib  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
from oslo_config import cfg  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from vireo_agent import Agent  # noqa: E402
from vireo_agent import EVENTS_TOKEN  # noqa: E402

from neutron.common import config as neutron_config  # noqa: E402
from neutron.notifiers import nova as nova_notifier  # noqa: E402

HOST = 'notifier-test'
PROJECT = '1d2b9ce5f0a94a1fa1b1c7c5e7d0a3b4'


@pytest.fixture(scope='session')
def agent(tmp_path_factory):
    a = Agent(tmp_path_factory.mktemp('agent'), HOST, events_token=EVENTS_TOKEN)
    yield a
    a.stop()


def _configure(path, endpoint, token):
    path.write_text(
        '[DEFAULT]\nsend_events_interval = 2\nhttp_retries = 0\n'
        '[nova]\nauth_type = admin_token\nendpoint = %s\ntoken = %s\n' % (endpoint, token))
    neutron_config.register_common_config_options()
    cfg.CONF(['--config-file', str(path)], project='neutron')


@pytest.fixture
def notifier(agent, tmp_path):
    """Neutron's Notifier, its endpoint the agent's ``/v2.1``."""
    _configure(tmp_path / 'neutron.conf', agent.url + '/v2.1', EVENTS_TOKEN)
    yield nova_notifier.Notifier()
    cfg.CONF.reset()


@pytest.fixture
def project_notifier(agent, tmp_path):
    """Neutron's Notifier with an old-style catalog endpoint: ``/v2.1/<project_id>``."""
    _configure(tmp_path / 'neutron.conf', '%s/v2.1/%s' % (agent.url, PROJECT), EVENTS_TOKEN)
    yield nova_notifier.Notifier()
    cfg.CONF.reset()


@pytest.fixture
def wrong_token_notifier(agent, tmp_path):
    _configure(tmp_path / 'neutron.conf', agent.url + '/v2.1', 'not-the-events-token-000')
    yield nova_notifier.Notifier()
    cfg.CONF.reset()
