"""Seed bug 3 inside Nova 26: an event that arrives before the wait is lost, unless kept."""

import logging
import uuid

import eventlet
import pytest

from nova.compute import manager as compute_manager
from nova.compute import task_states
from nova import objects
from nova.virt.vireo import driver as vdriver
from nova.virt.vireo import events as vevents

from conftest import make_event
from conftest import make_instance


def _deliver(manager, context, instance, event):
    """The path nova-api's cast takes into the compute manager."""
    manager.external_instance_event(context, [instance], [event])


def _wait(manager, instance, tag, deadline):
    with manager.driver.virtapi.wait_for_instance_event(
            instance, [('network-vif-plugged', tag)], deadline=deadline):
        pass


def test_nova_loads_the_driver_by_name_and_it_installs_the_keeping_registry(manager):
    assert isinstance(manager.driver, vdriver.VireoDriver)
    assert isinstance(manager.instance_events, vevents.KeepingInstanceEvents)
    assert manager.driver.kept_events is manager.instance_events


def test_novas_own_registry_loses_an_event_that_came_before_the_wait(
        manager, context, caplog):
    manager.instance_events = compute_manager.InstanceEvents()
    instance = make_instance(task_state=task_states.RESIZE_REVERTING, vm_state='resized')
    port = str(uuid.uuid4())
    with caplog.at_level(logging.WARNING):
        _deliver(manager, context, instance, make_event(instance, port))
        with pytest.raises(eventlet.timeout.Timeout):
            _wait(manager, instance, port, deadline=0.5)
    assert 'Received unexpected event' in caplog.text


def test_an_event_that_came_before_the_wait_of_its_task_is_kept_and_handed_over(
        manager, context, caplog):
    instance = make_instance(task_state=task_states.RESIZE_REVERTING, vm_state='resized')
    port = str(uuid.uuid4())
    with caplog.at_level(logging.WARNING):
        _deliver(manager, context, instance, make_event(instance, port))
        assert manager.instance_events.kept_count(instance.uuid) == 1
        with eventlet.timeout.Timeout(5):
            _wait(manager, instance, port, deadline=300)
    assert 'Received unexpected event' not in caplog.text
    assert manager.instance_events.kept_count(instance.uuid) == 0


def test_a_waiter_registered_first_still_gets_its_event(manager, context):
    instance = make_instance(task_state=task_states.SPAWNING)
    port = str(uuid.uuid4())
    with eventlet.timeout.Timeout(5):
        with manager.driver.virtapi.wait_for_instance_event(
                instance, [('network-vif-plugged', port)], deadline=300):
            _deliver(manager, context, instance, make_event(instance, port))
    assert manager.instance_events.kept_count(instance.uuid) == 0


def test_a_failed_event_is_kept_as_failed(manager, context):
    instance = make_instance(task_state=task_states.RESIZE_REVERTING, vm_state='resized')
    port = str(uuid.uuid4())
    _deliver(manager, context, instance, make_event(instance, port, status='failed'))
    seen = []

    def error_callback(name, inst):
        seen.append(name)
        return False

    with manager.driver.virtapi.wait_for_instance_event(
            instance, [('network-vif-plugged', port)], deadline=1,
            error_callback=error_callback):
        pass
    assert seen == ['network-vif-plugged-%s' % port]


def test_steps_of_one_task_share_kept_events(manager, context):
    # Bound while the build is in `networking`, awaited in `spawning`: one task.
    instance = make_instance(task_state=task_states.NETWORKING, vm_state='building')
    port = str(uuid.uuid4())
    _deliver(manager, context, instance, make_event(instance, port))
    instance.task_state = task_states.SPAWNING
    with eventlet.timeout.Timeout(5):
        _wait(manager, instance, port, deadline=300)


def test_an_event_kept_for_one_task_does_not_serve_another(manager, context):
    instance = make_instance(task_state=task_states.RESIZE_REVERTING, vm_state='resized')
    port = str(uuid.uuid4())
    _deliver(manager, context, instance, make_event(instance, port))
    instance.task_state = task_states.REBOOTING_HARD
    with pytest.raises(eventlet.timeout.Timeout):
        _wait(manager, instance, port, deadline=0.5)


def test_an_event_kept_in_one_resize_does_not_serve_the_next(manager, context):
    # Two resizes in a row are one task family but two tasks: their migrations differ.
    instance = make_instance(task_state=task_states.RESIZE_MIGRATED, vm_state='active')
    instance.migration_context = objects.MigrationContext(instance_uuid=instance.uuid,
                                                          migration_id=1)
    port = str(uuid.uuid4())
    _deliver(manager, context, instance, make_event(instance, port))
    assert len(manager.instance_events.task_events(instance)) == 1
    instance.migration_context = objects.MigrationContext(instance_uuid=instance.uuid,
                                                          migration_id=2)
    assert manager.instance_events.task_events(instance) == []
    with pytest.raises(eventlet.timeout.Timeout):
        _wait(manager, instance, port, deadline=0.5)


def test_nothing_is_kept_for_an_instance_with_no_task(manager, context):
    instance = make_instance(task_state=None)
    _deliver(manager, context, instance, make_event(instance, str(uuid.uuid4())))
    assert manager.instance_events.kept_count(instance.uuid) == 0


def test_only_network_events_are_kept(manager, context):
    instance = make_instance(task_state=task_states.RESIZE_REVERTING, vm_state='resized')
    _deliver(manager, context, instance,
             make_event(instance, 'vol-1', name='volume-reimaged'))
    assert manager.instance_events.kept_count(instance.uuid) == 0


def test_a_duplicate_after_the_handover_fires_nothing_twice(manager, context):
    instance = make_instance(task_state=task_states.RESIZE_REVERTING, vm_state='resized')
    port = str(uuid.uuid4())
    _deliver(manager, context, instance, make_event(instance, port))
    with eventlet.timeout.Timeout(5):
        with manager.driver.virtapi.wait_for_instance_event(
                instance, [('network-vif-plugged', port)], deadline=300):
            # The handed-over waiter is not registered: a duplicate is kept, not re-sent.
            _deliver(manager, context, instance, make_event(instance, port))
    assert manager.instance_events.kept_count(instance.uuid) == 1


def test_kept_events_are_bounded_per_instance_oldest_first_out():
    registry = vevents.KeepingInstanceEvents(limit=3)
    instance = make_instance(task_state=task_states.RESIZE_REVERTING, vm_state='resized')
    tags = ['port-%d' % i for i in range(4)]
    for tag in tags:
        assert registry.pop_instance_event(instance, make_event(instance, tag)) is not None
    assert registry.kept_count(instance.uuid) == 3
    assert not registry.prepare_for_instance_event(
        instance, 'network-vif-plugged', tags[0]).ready()
    for tag in tags[1:]:
        assert registry.prepare_for_instance_event(
            instance, 'network-vif-plugged', tag).ready()


def test_a_kept_event_expires():
    now = [100.0]
    registry = vevents.KeepingInstanceEvents(max_age=300, clock=lambda: now[0])
    instance = make_instance(task_state=task_states.RESIZE_REVERTING, vm_state='resized')
    registry.pop_instance_event(instance, make_event(instance, 'a'))
    registry.pop_instance_event(instance, make_event(instance, 'b'))
    now[0] += 299
    assert registry.prepare_for_instance_event(instance, 'network-vif-plugged', 'a').ready()
    now[0] += 2
    assert not registry.prepare_for_instance_event(
        instance, 'network-vif-plugged', 'b').ready()


def test_the_events_of_the_task_under_way_are_handed_to_the_agent_and_stay_kept():
    now = [100.0]
    registry = vevents.KeepingInstanceEvents(max_age=300, clock=lambda: now[0])
    instance = make_instance(task_state=task_states.RESIZE_REVERTING, vm_state='resized')
    registry.pop_instance_event(instance, make_event(instance, 'a'))
    registry.pop_instance_event(instance, make_event(instance, 'b', status='failed'))
    assert registry.task_events(instance) == [
        {'name': 'network-vif-plugged', 'server_uuid': instance.uuid, 'status': 'completed',
         'tag': 'a'},
        {'name': 'network-vif-plugged', 'server_uuid': instance.uuid, 'status': 'failed',
         'tag': 'b'}]
    assert registry.kept_count(instance.uuid) == 2
    # Another task's, or an expired one, is not.
    instance.task_state = task_states.REBOOTING
    assert registry.task_events(instance) == []
    instance.task_state = task_states.RESIZE_REVERTING
    now[0] += 301
    assert registry.task_events(instance) == []


def test_clearing_an_instance_drops_its_kept_events():
    registry = vevents.KeepingInstanceEvents()
    instance = make_instance(task_state=task_states.RESIZE_REVERTING, vm_state='resized')
    registry.pop_instance_event(instance, make_event(instance, 'a'))
    registry.clear_events_for_instance(instance)
    assert registry.kept_count(instance.uuid) == 0


def test_in_shutdown_no_event_is_kept_and_no_wait_registered():
    registry = vevents.KeepingInstanceEvents()
    instance = make_instance(task_state=task_states.RESIZE_REVERTING, vm_state='resized')
    registry.cancel_all_events()
    assert registry.pop_instance_event(instance, make_event(instance, 'a')) is None
    with pytest.raises(Exception, match='In shutdown'):
        registry.prepare_for_instance_event(instance, 'network-vif-plugged', 'a')


def test_network_events_nova_receives_reach_the_agent(manager, context, agent):
    # The agent's per-code event counter moves by one for an instance it holds.
    def accepted():
        for line in agent.get('/metrics').text.splitlines():
            if line.startswith('vireo_external_events_total{code="200"}'):
                return float(line.split()[-1])
        return 0.0

    before = accepted()
    instance = make_instance(uuid_=agent.create(), task_state=None)
    _deliver(manager, context, instance, make_event(instance, str(uuid.uuid4())))
    deadline = eventlet.timeout.Timeout(10)
    try:
        while accepted() < before + 1:
            eventlet.sleep(0.05)
    finally:
        deadline.cancel()
