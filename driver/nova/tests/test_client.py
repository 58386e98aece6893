"""The agent client against connections that close before any answer, and its errors as faults.

A server that closes a keep-alive connection for idleness just as the client sends on it
looks, to the client, like a connection closed without an answer (``RemoteDisconnected``).
"""

import json
import socket
import threading

import pytest

from oslo_context import context as oslo_context

from nova.compute import utils as compute_utils
from nova.virt.vireo import client as vclient


class DroppingServer(object):
    """Answers HTTP requests on 127.0.0.1, closing the first ``drops`` connections unanswered
    after reading their request."""

    def __init__(self, drops):
        self.drops = drops
        self.requests = []
        self.heads = []
        self.sock = socket.socket()
        self.sock.bind(('127.0.0.1', 0))
        self.sock.listen(8)
        self.url = 'http://127.0.0.1:%d' % self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                head = b''
                while b'\r\n\r\n' not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    head += chunk
                if not head:
                    continue
                self.requests.append(head.split(b' ', 2)[:2])
                self.heads.append(head.decode('latin-1'))
                if self.drops > 0:
                    self.drops -= 1
                    continue
                body = json.dumps({'instances': []}).encode()
                conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n'
                             b'Content-Length: %d\r\nConnection: close\r\n\r\n%s'
                             % (len(body), body))

    def close(self):
        self.sock.close()


@pytest.fixture
def dropping():
    servers = []

    def start(drops):
        servers.append(DroppingServer(drops))
        return servers[-1]
    yield start
    for s in servers:
        s.close()


def test_an_idempotent_request_is_sent_again_on_a_connection_closed_unanswered(dropping):
    server = dropping(1)
    agent = vclient.AgentClient(server.url, 't' * 32, request_timeout=5)
    assert agent.instances() == []
    assert server.requests == [[b'GET', b'/v1/instances']] * 2


def test_an_operation_is_never_sent_twice(dropping):
    server = dropping(1)
    agent = vclient.AgentClient(server.url, 't' * 32, request_timeout=5)
    with pytest.raises(vclient.AgentUnavailable) as e:
        agent.action('3f0f6c0e-8d5e-4a55-9d3c-6a3c2b7b7c11', {'action': 'reboot-hard'})
    assert e.value.agent_code == 'unavailable'
    assert len(server.requests) == 1


def test_a_second_drop_is_an_error_not_a_loop(dropping):
    server = dropping(2)
    agent = vclient.AgentClient(server.url, 't' * 32, request_timeout=5)
    with pytest.raises(vclient.AgentUnavailable):
        agent.instances()
    assert len(server.requests) == 2


def test_a_request_names_the_nova_request_it_serves(dropping):
    # A context made is current (oslo.context's store; Nova's RequestContext, a subclass,
    # is made for every request nova-compute serves): the agent's log lines then carry
    # Nova's request id.
    server = dropping(0)
    agent = vclient.AgentClient(server.url, 't' * 32, request_timeout=5)
    ctx = oslo_context.RequestContext()
    assert ctx.request_id.startswith('req-')
    agent.instances()
    child = oslo_context.RequestContext(global_request_id=ctx.request_id)
    agent.instances()
    assert child.request_id != ctx.request_id
    first, second = server.heads
    assert 'x-openstack-request-id: %s\r\n' % ctx.request_id in first.lower()
    # A request that continues another (a global request id) carries that one.
    assert 'x-openstack-request-id: %s\r\n' % ctx.request_id in second.lower()


def test_an_agent_error_is_a_fault_nova_can_store():
    # Nova stores an instance fault's code as an integer (InstanceFault.code): the agent's
    # own code is kept apart from it.
    fault = compute_utils.exception_to_dict(vclient.AgentUnavailable('unavailable', 'gone'))
    assert fault['code'] == 500
    assert 'unavailable' in fault['message']
    fault = compute_utils.exception_to_dict(
        vclient.AgentError('illegal-state', 'stopped', status=409))
    assert fault['code'] == 409
