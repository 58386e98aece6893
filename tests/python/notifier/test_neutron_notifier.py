"""The agent's external-events endpoint, with Neutron's own Nova notifier as the client.

Each test posts through ``neutron.notifiers.nova.Notifier`` (its ``send_events``, or the
novaclient it builds with its Keystone session) to a real agent, and checks what Neutron sees
and logs: per-event answers also when no event was taken, microversion headers, Nova's tags
and microversion gating, Nova's faults, batches of any size, request ids Neutron can match.
"""

import logging
import re
import uuid

from novaclient import api_versions
from novaclient import client as nova_client
from novaclient import exceptions as nova_exceptions
import pytest

REQ_ID = re.compile(r'^req-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$')


def plugged(server, port=None, status='completed'):
    return {'name': 'network-vif-plugged', 'server_uuid': server,
            'tag': port or str(uuid.uuid4()), 'status': status}


def client_at(notifier, version):
    """A novaclient on the notifier's own session, at another microversion (as Cinder and
    Cyborg call the same endpoint)."""
    return nova_client.Client(api_versions.APIVersion(version), session=notifier.session,
                              extensions=notifier.extensions)


def delivered(agent):
    return agent.metric('vireo_external_events_total{code="200"}')


def test_events_are_taken_and_neutron_logs_the_request_id_it_can_match(
        agent, notifier, caplog):
    server = agent.create()
    before = delivered(agent)
    with caplog.at_level(logging.DEBUG):
        notifier.send_events([plugged(server), {'name': 'network-changed',
                                                'server_uuid': server}])
    assert delivered(agent) == before + 2
    # Neutron's own line: "Nova event matching ['req-...'] response: {...}".
    matched = re.findall(r"Nova event matching \['(req-[^']+)'\] response", caplog.text)
    assert len(matched) == 2, caplog.text
    assert REQ_ID.match(matched[0]), matched
    assert 'does not support microversions' not in caplog.text


def test_the_callers_global_request_id_is_in_the_agents_log(agent, notifier):
    server = agent.create()
    client = notifier._get_nova_client()
    global_id = client.client.global_request_id
    assert REQ_ID.match(global_id)
    answer = client.server_external_events.create([plugged(server)])
    local_id = answer.request_ids[0]
    assert REQ_ID.match(local_id) and local_id != global_id
    log = agent.log_path.read_text()
    lines = [line for line in log.splitlines()
             if 'external events' in line and local_id in line]
    assert lines, log[-2000:]
    assert global_id in lines[0], lines[0]


def test_when_no_event_is_taken_neutron_still_gets_every_events_answer(
        agent, notifier, caplog):
    stranger = str(uuid.uuid4())
    with caplog.at_level(logging.DEBUG):
        notifier.send_events([plugged(stranger), plugged(stranger)])
    # A 404 made novaclient raise NotFound and Neutron logged only "Nova returned NotFound".
    assert 'Nova returned NotFound' not in caplog.text
    failed = [r for r in caplog.records if 'returned with failed status' in r.getMessage()]
    assert len(failed) == 2, caplog.text
    assert "'code': 404" in failed[0].getMessage()


def test_answers_carry_the_microversion_headers(agent, notifier):
    server = agent.create()
    client = notifier._get_nova_client()
    resp, _ = client.client.post('/os-server-external-events',
                                 body={'events': [plugged(server)]})
    assert resp.headers['X-OpenStack-Nova-API-Version'] == '2.1'
    assert resp.headers['OpenStack-API-Version'] == 'compute 2.1'
    assert 'OpenStack-API-Version' in resp.headers['Vary']
    resp, _ = client_at(notifier, '2.93').client.post(
        '/os-server-external-events', body={'events': [plugged(server)]})
    assert resp.headers['OpenStack-API-Version'] == 'compute 2.93'


def test_event_names_are_gated_by_microversion_as_novas_schema_gates_them(agent, notifier):
    server = agent.create()
    cases = [('volume-extended', '2.51'), ('power-update', '2.76'),
             ('accelerator-request-bound', '2.82'), ('volume-reimaged', '2.93')]
    for name, since in cases:
        event = {'name': name, 'server_uuid': server, 'tag': 'x'}
        # Neutron's client (2.1) and the version just before: the whole request refused,
        # with Nova's fault body (novaclient reads its message).
        major, minor = since.split('.')
        for version in ('2.1', '%s.%d' % (major, int(minor) - 1)):
            with pytest.raises(nova_exceptions.BadRequest) as e:
                client_at(notifier, version).server_external_events.create([event])
            assert name in str(e.value), (name, version, str(e.value))
        answer = client_at(notifier, since).server_external_events.create([event])
        assert answer[0]['code'] == 200, (name, answer)


def test_a_tag_is_required_where_nova_requires_it(agent, notifier):
    server = agent.create()
    events = [{'name': n, 'server_uuid': server}
              for n in ('volume-extended', 'power-update', 'accelerator-request-bound',
                        'volume-reimaged')]
    answer = client_at(notifier, '2.93').server_external_events.create(events)
    assert [e['code'] for e in answer] == [400, 400, 400, 200]


def test_a_refused_batch_is_logged_by_neutron_with_novas_message(agent, notifier, caplog):
    bad = [{'name': 'network-changed', 'server_uuid': 'not-a-uuid'}]
    with caplog.at_level(logging.DEBUG):
        notifier.send_events(bad)
    assert 'Failed to notify nova on events' in caplog.text
    assert 'is not a UUID' in caplog.text, caplog.text
    # novaclient reads Nova's fault and the request id of the refusal.
    with pytest.raises(nova_exceptions.BadRequest) as e:
        notifier._get_nova_client().server_external_events.create(bad)
    assert REQ_ID.match(e.value.request_id or ''), e.value.request_id
    # The body is Nova's fault, on Neutron's own Keystone session.
    resp = notifier.session.post('/os-server-external-events', json={'events': bad},
                                 endpoint_filter={'service_type': 'compute'},
                                 raise_exc=False)
    assert resp.status_code == 400
    assert resp.json()['badRequest']['code'] == 400, resp.text
    assert 'is not a UUID' in resp.json()['badRequest']['message']


def test_a_large_batch_is_taken_whole(agent, notifier, caplog):
    server = agent.create()
    before = delivered(agent)
    batch = [plugged(server) for _ in range(1500)]
    with caplog.at_level(logging.INFO):
        notifier.send_events(batch)
    assert delivered(agent) == before + 1500
    assert 'Failed to notify nova' not in caplog.text


def test_an_endpoint_with_the_project_id_is_served(agent, project_notifier, caplog):
    server = agent.create()
    before = delivered(agent)
    with caplog.at_level(logging.INFO):
        project_notifier.send_events([plugged(server)])
    assert delivered(agent) == before + 1
    assert 'Nova event matching' in caplog.text


def test_neutron_with_another_token_is_refused(agent, wrong_token_notifier, caplog):
    server = agent.create()
    before = delivered(agent)
    with caplog.at_level(logging.DEBUG):
        wrong_token_notifier.send_events([plugged(server)])
    assert delivered(agent) == before
    assert 'Failed to notify nova on events' in caplog.text
    assert 'Unauthorized' in caplog.text or '401' in caplog.text, caplog.text
