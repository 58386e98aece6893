"""Network events that arrive before Nova waits for them are kept, not lost.

Nova's ``InstanceEvents`` drops an external event nobody waits for ("Received unexpected
event").  Since Zed (26.0) the compute manager moves a reverted instance's port bindings back
to the source (``migrate_instance_finish``) *before* it calls the driver's
``finish_revert_migration``; a driver that keeps the source's devices wired through a resize
(vireo does, for OVS hybrid plug) gets ``network-vif-plugged`` at bind time, before anything
waits, and the later wait times out after ``vif_plugging_timeout`` -- the bug vireo was
written against.

``KeepingInstanceEvents`` replaces the manager's ``instance_events`` (it exists before the
driver is loaded; the driver reaches it through ``virtapi._compute``).  An unmatched network
event for an instance with a task under way is kept, at most ``limit`` per instance (oldest
first out, as vireo's own early-event buffer) and for at most ``max_age`` seconds; a waiter
registered later for the same event *in the same task* gets it at once.  The task is compared
by family (a build's ``networking`` and ``spawning`` are one task, a resize's four steps are
one) and, for a move, by its migration (two resizes in a row are two tasks), so an event kept
for one task never satisfies a wait of the next.  Every network event is also handed to
``forward`` (the driver posts it to its vireo agent, whose own waits follow vireo's
prediction); the driver hands the agent the events kept for the task it asks it to finish.
"""

import collections
import time

import eventlet.event
from oslo_log import log as logging

from nova.compute import manager
from nova.compute import task_states
from nova import exception
from nova import utils

LOG = logging.getLogger(__name__)

NETWORK_EVENTS = frozenset(('network-vif-plugged', 'network-vif-unplugged'))

# Task states that are steps of one task: an event kept in one step serves a later step.
_FAMILIES = {
    'build': (task_states.SCHEDULING, task_states.BLOCK_DEVICE_MAPPING,
              task_states.NETWORKING, task_states.SPAWNING),
    'rebuild': (task_states.REBUILDING, task_states.REBUILD_BLOCK_DEVICE_MAPPING,
                task_states.REBUILD_SPAWNING),
    'reboot': (task_states.REBOOTING, task_states.REBOOT_PENDING,
               task_states.REBOOT_STARTED),
    'reboot-hard': (task_states.REBOOTING_HARD, task_states.REBOOT_PENDING_HARD,
                    task_states.REBOOT_STARTED_HARD),
    'resize': (task_states.RESIZE_PREP, task_states.RESIZE_MIGRATING,
               task_states.RESIZE_MIGRATED, task_states.RESIZE_FINISH),
}
_FAMILY_OF = {state: family for family, states in _FAMILIES.items() for state in states}


def task_family(task_state):
    """The task a task state is a step of; None when no task is under way."""
    if task_state is None:
        return None
    return _FAMILY_OF.get(task_state, task_state)


def task_of(instance):
    """The task under way for an instance: its family and, for a move, the migration (two
    resizes in a row are two tasks of one family); None when no task is under way."""
    family = task_family(instance.task_state)
    if family is None:
        return None
    moving = None
    if instance.obj_attr_is_set('migration_context') and instance.migration_context:
        moving = instance.migration_context.migration_id
    return family, moving


Kept = collections.namedtuple('Kept', ('event', 'task', 'at'))


class KeepingInstanceEvents(manager.InstanceEvents):
    """Nova's waiter registry, keeping early network events for a task under way."""

    def __init__(self, forward=None, limit=32, max_age=300.0, clock=time.monotonic):
        super().__init__()
        if limit < 1:
            raise ValueError('limit must be at least 1')
        self._forward = forward
        self._limit = limit
        self._max_age = max_age
        self._clock = clock
        # instance uuid -> OrderedDict((name, tag) -> Kept), oldest first.
        self._kept = {}

    @classmethod
    def install(cls, compute, **kwargs):
        """Replace ``compute.instance_events`` (a ComputeManager) with a keeping one.

        Waiters already registered (there are none while the driver loads) are carried over.
        """
        keeping = cls(**kwargs)
        previous = getattr(compute, 'instance_events', None)
        if previous is not None and previous._events:
            keeping._events = previous._events
        compute.instance_events = keeping
        return keeping

    def kept_count(self, instance_uuid):
        """How many events are kept for an instance (for tests and logs)."""
        return len(self._kept.get(instance_uuid, ()))

    def task_events(self, instance):
        """The network events kept for the instance's task under way, oldest first, as the
        agent takes them (``caller.events``); they stay kept for Nova's own waiters."""
        task = task_of(instance)
        kept = self._kept.get(instance.uuid) or {}
        now = self._clock()
        events = []
        for k in list(kept.values()):
            if task is None or k.task != task or now - k.at > self._max_age:
                continue
            event = {'name': k.event.name, 'server_uuid': instance.uuid,
                     'status': k.event.status}
            if k.event.tag is not None:
                event['tag'] = k.event.tag
            events.append(event)
        return events

    def prepare_for_instance_event(self, instance, name, tag):
        @utils.synchronized(self._lock_name(instance))
        def _prepare():
            if self._events is None:
                raise exception.NovaException(
                    'In shutdown, no new events can be scheduled')
            kept = self._take(instance, name, tag)
            if kept is not None:
                # Already here: a waiter that is fired at once and never registered, so a
                # later duplicate of the event finds no waiter to fire twice.
                fired = eventlet.event.Event()
                fired.send(kept.event)
                return fired
            waiters = self._events.setdefault(instance.uuid, {})
            return waiters.setdefault((name, tag), eventlet.event.Event())

        waiter = _prepare()
        if waiter.ready():
            LOG.info('Event %(name)s-%(tag)s arrived before its wait; handing over the kept '
                     'one', {'name': name, 'tag': tag}, instance=instance)
        return waiter

    def pop_instance_event(self, instance, event):
        if self._forward is not None and event.name in NETWORK_EVENTS:
            try:
                self._forward(instance, event)
            except Exception:  # noqa: B902 - forwarding must never lose Nova's own handling
                LOG.exception('Forwarding event %s to the vireo agent failed', event.key,
                              instance=instance)

        @utils.synchronized(self._lock_name(instance))
        def _pop():
            if self._events is None:
                return None, False
            waiters = self._events.get(instance.uuid)
            if waiters:
                waiter = waiters.pop((event.name, event.tag), None)
                if not waiters:
                    del self._events[instance.uuid]
                if waiter is not None:
                    return waiter, False
            task = task_of(instance)
            if task is None or event.name not in NETWORK_EVENTS:
                return None, False
            self._keep(instance.uuid, event, task)
            return None, True

        waiter, kept = _pop()
        if waiter is not None:
            return waiter
        if kept:
            # Debug: under vireo most network events are awaited by the agent, not by Nova.
            LOG.debug('Keeping event %(event)s that no waiter took (task %(task)s)',
                      {'event': event.key, 'task': instance.task_state}, instance=instance)
            # Handled: the manager fires this throwaway instead of logging the event as
            # unexpected; the kept copy goes to the task's later waiter.
            return eventlet.event.Event()
        return None

    def clear_events_for_instance(self, instance):
        self._kept.pop(instance.uuid, None)
        return super().clear_events_for_instance(instance)

    def cancel_all_events(self):
        self._kept.clear()
        super().cancel_all_events()

    def _keep(self, uuid, event, task):
        kept = self._kept.setdefault(uuid, collections.OrderedDict())
        key = (event.name, event.tag)
        kept.pop(key, None)
        kept[key] = Kept(event, task, self._clock())
        while len(kept) > self._limit:
            (name, tag), _ = kept.popitem(last=False)
            LOG.warning('Dropping the oldest kept event %(name)s-%(tag)s of instance '
                        '%(uuid)s: more than %(limit)d kept',
                        {'name': name, 'tag': tag, 'uuid': uuid, 'limit': self._limit})

    def _take(self, instance, name, tag):
        kept = self._kept.get(instance.uuid)
        if not kept:
            return None
        now = self._clock()
        for key in [k for k, v in kept.items() if now - v.at > self._max_age]:
            del kept[key]
        found = kept.get((name, tag))
        if found is not None and found.task == task_of(instance):
            del kept[(name, tag)]
        else:
            found = None
        if not kept:
            del self._kept[instance.uuid]
        return found
