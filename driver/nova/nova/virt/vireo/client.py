"""A small client of the vireo agent's HTTP API (docs/AGENT.md), safe under eventlet.

nova-compute monkey-patches the standard library before it loads a driver, so ``requests``
sockets are green: a request or a long poll of a running operation never blocks the hub.
Every request carries the global id of the Nova request it serves (``X-OpenStack-Request-ID``,
from the oslo context Nova made current for it), which the agent's log lines carry beside
their own request id: one grep follows an operation from nova-api to the agent.
Errors keep the agent's stable code (``agent_code``: ``busy``,
``illegal-state``, ``not-found``, ``build-failed``, ...) so the driver can map each to Nova's
exception.
"""

import os
import stat
import time

from oslo_context import context as oslo_context
import requests
from requests import adapters
from urllib3.util import retry

from nova import exception
from nova.i18n import _


class AgentError(exception.NovaException):
    """The agent refused a request or an operation it ran failed.

    ``agent_code`` is the agent's stable error code; ``code`` stays an HTTP status as Nova
    expects of its exceptions (an instance fault stores it as an integer): the agent's answer,
    else 500.
    """

    msg_fmt = _('vireo agent: %(agent_code)s: %(reason)s')

    def __init__(self, agent_code, reason, status=None):
        self.agent_code = agent_code
        self.reason = reason
        self.status = status
        super().__init__(agent_code=agent_code, reason=reason, code=status or 500)


class AgentUnavailable(AgentError):
    """The agent could not be reached, or answered 503."""


class AgentLost(AgentUnavailable):
    """The agent went away while an operation it had taken ran: the operation may have
    done anything up to its end (the agent's recovery finishes or undoes it when it is
    back)."""


class OperationTimeout(AgentError):
    """An operation did not finish within ``[vireo] operation_timeout``."""


def read_token(path):
    """The agent's API token, held to the agent's own file rules (a 0600 regular file)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise AgentError('token-file', 'cannot read %s: %s' % (path, e.strerror))
    if not stat.S_ISREG(st.st_mode):
        raise AgentError('token-file', '%s is not a regular file' % path)
    if st.st_mode & 0o077:
        raise AgentError('token-file', '%s: mode %o lets group/others read the token; '
                         'chmod 600 it' % (path, stat.S_IMODE(st.st_mode)))
    with open(path, encoding='ascii') as f:
        token = f.read().strip()
    if len(token) < 16:
        raise AgentError('token-file', '%s holds no token of at least 16 characters' % path)
    return token


class AgentClient(object):
    """One agent: ``url`` is its API, ``token`` its API token."""

    # Seconds one long poll of a running operation waits at the agent (its limit is 30).
    OPERATION_WAIT = 25

    def __init__(self, url, token, request_timeout=30.0, operation_timeout=3600,
                 session=None):
        self.url = url.rstrip('/')
        self._timeout = request_timeout
        self._operation_timeout = operation_timeout
        self._session = session or self._new_session()
        self._session.headers.update({'X-Auth-Token': token,
                                      'Content-Type': 'application/json'})

    @staticmethod
    def _new_session():
        """A session that sends an idempotent request (GET, DELETE) once more when its
        connection was closed before any answer: a pooled keep-alive connection the agent
        closed for idleness just as the request went out.  A POST (an operation, events) is
        never resent: the agent may have taken it."""
        session = requests.Session()
        again = retry.Retry(total=1, connect=1, read=1, redirect=0, status=0, other=0,
                            allowed_methods=frozenset(['GET', 'HEAD', 'DELETE']),
                            raise_on_status=False)
        session.mount('http://', adapters.HTTPAdapter(max_retries=again))
        session.mount('https://', adapters.HTTPAdapter(max_retries=again))
        return session

    # -- plain requests -------------------------------------------------------------------

    def request(self, method, path, body=None, params=None, timeout=None):
        try:
            resp = self._session.request(method, self.url + path, json=body, params=params,
                                         headers=self._request_id(),
                                         timeout=timeout or self._timeout)
        except requests.RequestException as e:
            raise AgentUnavailable('unavailable', '%s %s: %s' % (method, path, e))
        if resp.status_code >= 400:
            code, message = 'http-%d' % resp.status_code, resp.text[:500]
            try:
                err = resp.json().get('error') or {}
                code = err.get('code', code)
                message = err.get('message', message)
            except ValueError:
                pass
            cls = AgentUnavailable if resp.status_code == 503 else AgentError
            raise cls(code, message, status=resp.status_code)
        if not resp.content:
            return None
        return resp.json()

    @staticmethod
    def _request_id():
        """The header naming the Nova request this call serves: its global id (oslo.context's
        ``global_id``: the caller's global request id, else its own), when one is current."""
        rid = getattr(oslo_context.get_current(), 'global_id', None)
        return {'X-OpenStack-Request-ID': rid} if rid else None

    def health(self):
        return self.request('GET', '/healthz')

    def instances(self):
        return self.request('GET', '/v1/instances')['instances']

    def instance(self, uuid):
        return self.request('GET', '/v1/instances/%s' % uuid)

    def console(self, uuid):
        """The end of the instance's serial console log (at most 100 KiB)."""
        return self.request('GET', '/v1/instances/%s/console' % uuid)['output']

    def lifecycle(self, after=None, wait=0):
        """The guests' power changes after number ``after`` (None: only the newest number),
        waiting up to ``wait`` seconds for one."""
        params = {'wait': int(wait)}
        if after is not None:
            params['after'] = after
        return self.request('GET', '/v1/lifecycle-events', params=params,
                            timeout=self._timeout + wait)

    def post_events(self, events):
        """Post Nova-shaped external events; the per-event answers come back."""
        return self.request('POST', '/os-server-external-events', {'events': events})

    # -- operations -----------------------------------------------------------------------

    def create(self, body):
        return self._run('POST', '/v1/instances', body)

    def action(self, uuid, body):
        return self._run('POST', '/v1/instances/%s/action' % uuid, body)

    def delete(self, uuid, deallocate_network=False):
        params = {'deallocate_network': 'true' if deallocate_network else 'false'}
        return self._run('DELETE', '/v1/instances/%s' % uuid, params=params)

    def host_half(self, uuid, body):
        """Run one host's half of a move that Nova orchestrates (``finish-resize``,
        ``confirm-resize-source``, ``finish-revert-resize``): synchronous, answered with
        ``{"state", "report"}`` once it ended, within the operation timeout."""
        return self.request('POST', '/v1/instances/%s/half' % uuid, body,
                            timeout=self._operation_timeout)

    def _run(self, method, path, body=None, params=None):
        """Start an operation and wait for it: its report, or AgentError with its code."""
        op = self.request(method, path, body, params)['operation']
        deadline = time.monotonic() + self._operation_timeout
        while op['state'] == 'running':
            left = deadline - time.monotonic()
            if left <= 0:
                raise OperationTimeout(
                    'operation-timeout', 'operation %s (%s of %s) still running after %d s'
                    % (op['id'], op['kind'], op['instance'], self._operation_timeout))
            # A long poll: the agent answers as the operation finishes (no sleep between
            # reads, so no latency added to any operation), or after `wait` seconds.
            wait = max(1, min(self.OPERATION_WAIT, int(left)))
            try:
                op = self.request('GET', '/v1/operations/%s' % op['id'],
                                  params={'wait': wait}, timeout=self._timeout + wait)
            except AgentUnavailable as e:
                raise AgentLost('agent-lost', 'operation %s (%s of %s): %s'
                                % (op['id'], op['kind'], op['instance'], e.reason))
        if op['state'] != 'succeeded':
            err = op.get('error') or {}
            raise AgentError(err.get('code', 'failed'),
                             err.get('message', 'operation %s failed' % op['id']))
        return op.get('report')
