"""``compute_driver = vireo.VireoDriver``: nova-compute's hypervisor layer is a vireo agent.

Nova orchestrates (API, conductor, scheduler, the compute manager: port allocation, binding
moves, migrations between hosts); this driver forwards each call the manager makes to the
vireo agent on the same host (docs/NOVA.md), which owns the domains, disks, VIF plugging and
the event waits.  Every call is an HTTP request on green sockets; a long operation is polled
until it ends, with ``eventlet.sleep`` between polls.

What is here so far: loading, the kept-events registry (events.py), host queries and
resources, spawn from a Glance image (the agent fetches it into its image cache), the lifecycle
of an instance (power, reboot, pause, suspend, destroy, resume on host boot) and its lifecycle
events (``emit_event``), its console output, interface attach/detach, and resize and cold
migration on this host or to another with confirm and revert (each host's half is the agent's:
the source hands the instance over through Nova, the destination copies the disks from the
source's libvirtd), and live migration (the destination prepares disks and devices, the
source migrates and cleans up, Nova moves the bindings).  ``capabilities`` claims nothing that
is not here.
"""

import base64
import binascii
import time
import uuid

import eventlet

import os_resource_classes as orc
from oslo_log import log as logging
from oslo_serialization import jsonutils

import nova.conf
from nova.compute import power_state
from nova.compute import task_states
from nova.objects import fields
from nova import exception
from nova import objects
from nova.image import glance
from nova.network import model as network_model
from nova import utils
from nova.virt import configdrive
from nova.virt import driver
from nova.virt import event as virtevent
from nova.virt import hardware
from nova.virt.vireo import client as vclient
from nova.virt.vireo import conf as vconf
from nova.virt.vireo import events as vevents

LOG = logging.getLogger(__name__)
CONF = nova.conf.CONF
vconf.register_opts(CONF)

# The agent's `power_state` (docs/AGENT.md, Instance) as Nova's power_state codes.
POWER_STATES = {
    'running': power_state.RUNNING,
    'paused': power_state.PAUSED,
    'shutoff': power_state.SHUTDOWN,
    'suspended': power_state.SUSPENDED,
    'unknown': power_state.NOSTATE,
}

# The agent's lifecycle transitions (docs/AGENT.md, the lifecycle feed) as Nova's events.
TRANSITIONS = {
    'started': virtevent.EVENT_LIFECYCLE_STARTED,
    'stopped': virtevent.EVENT_LIFECYCLE_STOPPED,
    'paused': virtevent.EVENT_LIFECYCLE_PAUSED,
    'resumed': virtevent.EVENT_LIFECYCLE_RESUMED,
    'suspended': virtevent.EVENT_LIFECYCLE_SUSPENDED,
}

# Seconds one read of the lifecycle feed waits for an event (the agent's bound).
LIFECYCLE_WAIT = 30
# Seconds before the feed is read again after the agent could not be reached.
LIFECYCLE_RETRY = 5


class VireoDriver(driver.ComputeDriver):
    """A ComputeDriver whose every call is a request to this host's vireo agent."""

    capabilities = dict(
        driver.ComputeDriver.capabilities,
        supports_attach_interface=True,
        supports_image_type_raw=True,
        supports_image_type_qcow2=True,
    )

    def __init__(self, virtapi, agent=None):
        super().__init__(virtapi)
        self._agent = agent
        self._nodename = None
        self._lifecycle = None
        self._held_stops = {}
        # Live migrations coming here: uuid -> (migration, handover), from pre_live_migration
        # to post- or rollback_live_migration_at_destination.
        self._incoming = {}
        self.kept_events = None
        compute = getattr(virtapi, '_compute', None)
        if compute is not None:
            self.kept_events = vevents.KeepingInstanceEvents.install(
                compute, forward=self._forward_event,
                limit=CONF.vireo.kept_events_per_instance,
                max_age=float(max(CONF.vif_plugging_timeout, 1)))

    # -- the agent ------------------------------------------------------------------------

    @property
    def agent(self):
        if self._agent is None:
            self._agent = vclient.AgentClient(
                CONF.vireo.agent_url, vclient.read_token(CONF.vireo.token_file),
                request_timeout=CONF.vireo.request_timeout,
                operation_timeout=CONF.vireo.operation_timeout)
        return self._agent

    def _forward_event(self, instance, event):
        """Hand a network event Nova received to the agent (in its own green thread)."""
        body = {'name': event.name, 'server_uuid': event.instance_uuid,
                'status': event.status}
        if event.tag is not None:
            body['tag'] = event.tag
        utils.spawn_n(self._post_event, body)

    def _post_event(self, body):
        try:
            answer = self.agent.post_events([body])
        except vclient.AgentError as e:
            LOG.warning('The vireo agent refused event %(event)s: %(error)s',
                        {'event': body, 'error': e})
            return
        for event in answer.get('events', []):
            if event.get('code') != 200:
                # Not this agent's instance (404) is normal: Nova casts to instance.host
                # only, and the agent answers 207 with the event's own code.
                LOG.debug('The vireo agent did not take event %(event)s: code %(code)s',
                          {'event': body, 'code': event.get('code')})

    def _act(self, instance, action, **args):
        body = dict(args, action=action)
        try:
            return self.agent.action(instance.uuid, body)
        except vclient.AgentError as e:
            raise self._nova_error(instance, action, e)

    def _nova_error(self, instance, method, e):
        if e.agent_code == 'not-found':
            return exception.InstanceNotFound(instance_id=instance.uuid)
        if e.agent_code == 'illegal-state':
            return exception.InstanceInvalidState(
                instance_uuid=instance.uuid, attr='vireo state', state=e.reason,
                method=method)
        return e

    # -- host -----------------------------------------------------------------------------

    def init_host(self, host):
        try:
            health = self.agent.health()
        except vclient.AgentError as e:
            LOG.error('The vireo agent at %(url)s cannot be used: %(error)s',
                      {'url': CONF.vireo.agent_url, 'error': e})
            raise exception.HypervisorUnavailable(host=host)
        self._nodename = health.get('host') or host
        if self._nodename != host:
            LOG.warning('The vireo agent calls this host %(agent)s, nova-compute %(nova)s: '
                        'ports are bound to the name the agent uses',
                        {'agent': self._nodename, 'nova': host})
        if self._lifecycle is None:
            self._lifecycle = utils.spawn(self._follow_lifecycle)

    # -- lifecycle events -------------------------------------------------------------------

    def _follow_lifecycle(self):
        """Read the agent's lifecycle feed for as long as nova-compute runs and hand each
        power change to the manager (``emit_event``), which syncs that instance's power state
        at once instead of at its next periodic sync.  Starts from now: the manager syncs every
        instance when it starts."""
        after = None
        while True:
            after = self._read_lifecycle(after)

    def _read_lifecycle(self, after):
        """One read of the feed after number ``after``: its events are handed over; returns
        the number to read after next."""
        try:
            page = self.agent.lifecycle(after, wait=0 if after is None else LIFECYCLE_WAIT)
        except vclient.AgentError as e:
            LOG.warning('Cannot read the vireo agent\'s lifecycle events: %s', e)
            eventlet.sleep(LIFECYCLE_RETRY)
            return after
        except Exception:
            # The one reader of the feed: it must outlive any surprise.
            LOG.exception('Reading the vireo agent\'s lifecycle events failed')
            eventlet.sleep(LIFECYCLE_RETRY)
            return after
        if after is not None and page['last'] < after:
            # A new agent process numbers from 1 again: read all of its events.
            LOG.info('The vireo agent restarted: reading its lifecycle events from its start')
            return 0
        if page.get('lost'):
            LOG.warning('Lifecycle events were lost; the periodic power-state sync will find '
                        'what changed')
        for event in page.get('events', []):
            self._lifecycle_event(event['instance'], event['transition'])
        return page['last']

    def _lifecycle_event(self, uuid, transition):
        code = TRANSITIONS.get(transition)
        if code is None:
            return
        held = self._held_stops.pop(uuid, None)
        if held is not None:
            # Another event of the guest came within the delay (a reboot): the stop is moot.
            held.cancel()
        event = virtevent.LifecycleEvent(uuid, code)
        delay = CONF.vireo.stopped_event_delay
        if code == virtevent.EVENT_LIFECYCLE_STOPPED and delay > 0:
            self._held_stops[uuid] = eventlet.spawn_after(delay, self._emit_held, event)
        else:
            self.emit_event(event)

    def _emit_held(self, event):
        self._held_stops.pop(event.uuid, None)
        self.emit_event(event)

    def get_available_nodes(self, refresh=False):
        if self._nodename is None:
            self._nodename = self.agent.health().get('host') or CONF.host
        return [self._nodename]

    def get_host_ip_addr(self):
        return CONF.my_ip

    # -- resources ------------------------------------------------------------------------

    def get_available_resource(self, nodename):
        """The host as the agent reads it from libvirt and the instances filesystem."""
        host = self.agent.request('GET', '/v1/host')
        instances = self.agent.instances()
        arch = fields.Architecture.canonicalize(host['cpu']['model'])
        hv_type = host['hypervisor_type'].lower()
        supported = []
        if hv_type in fields.HVType.ALL:
            supported = [(arch, hv_type, fields.VMMode.HVM)]
        return {
            'vcpus': host['vcpus'],
            'memory_mb': host['memory_mb'],
            'local_gb': host['disk_gb'],
            'vcpus_used': sum(i.get('vcpus', 0) for i in instances),
            'memory_mb_used': sum(i.get('memory_mb', 0) for i in instances),
            'local_gb_used': host['disk_gb'] - host['disk_free_gb'],
            'hypervisor_type': host['hypervisor_type'],
            'hypervisor_version': host['hypervisor_version'],
            'hypervisor_hostname': self._nodename or host['host'],
            'cpu_info': jsonutils.dumps({
                'arch': arch, 'model': host['cpu']['model'], 'vendor': None,
                'topology': {k: host['cpu'][k] for k in ('sockets', 'cores', 'threads')},
                'features': []}),
            'disk_available_least': host['disk_free_gb'],
            'supported_instances': supported,
            'pci_passthrough_devices': '[]',  # JSON: the PCI tracker parses it
            'numa_topology': None,
        }

    def update_provider_tree(self, provider_tree, nodename, allocations=None):
        host = self.agent.request('GET', '/v1/host')
        ratios = self._get_allocation_ratios(provider_tree.data(nodename).inventory)

        def inventory(total, ratio, reserved):
            return {'total': total, 'min_unit': 1, 'max_unit': total, 'step_size': 1,
                    'allocation_ratio': ratio, 'reserved': reserved}

        provider_tree.update_inventory(nodename, {
            orc.VCPU: inventory(host['vcpus'], ratios[orc.VCPU], CONF.reserved_host_cpus),
            orc.MEMORY_MB: inventory(host['memory_mb'], ratios[orc.MEMORY_MB],
                                     CONF.reserved_host_memory_mb),
            orc.DISK_GB: inventory(host['disk_gb'], ratios[orc.DISK_GB],
                                   self._get_reserved_host_disk_gb_from_config()),
        })

    def get_info(self, instance, use_cache=True):
        try:
            found = self.agent.instance(instance.uuid)
        except vclient.AgentError as e:
            raise self._nova_error(instance, 'get_info', e)
        state = found.get('power_state')
        if state == 'no-domain':
            raise exception.InstanceNotFound(instance_id=instance.uuid)
        return hardware.InstanceInfo(state=POWER_STATES.get(state, power_state.NOSTATE),
                                     internal_id=found.get('name'))

    def instance_exists(self, instance):
        try:
            self.agent.instance(instance.uuid)
        except vclient.AgentError as e:
            if e.agent_code == 'not-found':
                return False
            raise
        return True

    def list_instances(self):
        return [i['name'] for i in self.agent.instances()]

    def list_instance_uuids(self):
        return [i['uuid'] for i in self.agent.instances()]

    # -- spawn ----------------------------------------------------------------------------

    def spawn(self, context, instance, image_meta, injected_files, admin_password,
              allocations, network_info=None, block_device_info=None, power_on=True,
              accel_info=None):
        body = {
            'uuid': instance.uuid,
            'name': instance.name,
            'flavor': self._flavor(instance.flavor),
            'image': self._image(context, instance, image_meta, block_device_info),
            'network_info': self._network_info(network_info),
            'power_on': bool(power_on),
        }
        if configdrive.required_by(instance):
            body['config_drive'] = self._config_drive(instance)
        if injected_files:
            LOG.warning('vireo writes no injected files; %d ignored (use user data)',
                        len(injected_files), instance=instance)
        # A failed build was cleaned up by the agent (domain, devices, disks) before it
        # answers; the error goes back to the manager, which reschedules.
        try:
            self.agent.create(body)
        except vclient.AgentLost as e:
            # The agent's recovery removes what the interrupted build made here; the build
            # fails once it is back, so that Nova's clean-up before its reschedule reaches
            # it.
            LOG.warning('The vireo agent went away during the build (%s); waiting for it '
                        'to recover', e, instance=instance)
            self._recovered(instance)
            raise

    @staticmethod
    def _flavor(flavor):
        return {
            'name': flavor.name,
            'vcpus': flavor.vcpus,
            'memory_mb': flavor.memory_mb,
            'root_gb': flavor.root_gb,
            'ephemeral_gb': flavor.ephemeral_gb,
            'swap_mb': flavor.swap or 0,
            'extra_specs': dict(flavor.extra_specs or {}),
        }

    @staticmethod
    def _image(context, instance, image_meta, block_device_info):
        """The root disk's image as the agent fetches it: Glance's download URL."""
        if driver.block_device_info_get_mapping(block_device_info):
            raise exception.InvalidBDM(
                message='vireo attaches no volumes: boot from a Glance image')
        if not image_meta.obj_attr_is_set('id'):
            raise exception.ImageUnacceptable(image_id='(none)',
                                              reason='vireo boots from an image only')
        disk_format = image_meta.disk_format if image_meta.obj_attr_is_set(
            'disk_format') else 'raw'
        if disk_format not in ('raw', 'qcow2'):
            raise exception.ImageUnacceptable(
                image_id=image_meta.id,
                reason='disk_format %s: vireo takes raw and qcow2' % disk_format)
        endpoint = next(glance.get_api_servers(context)).rstrip('/')
        image = {'id': image_meta.id, 'disk_format': disk_format,
                 'source': '%s/v2/images/%s/file' % (endpoint, image_meta.id)}
        if image_meta.obj_attr_is_set('checksum') and image_meta.checksum:
            image['checksum'] = 'md5:%s' % image_meta.checksum
        token = getattr(context, 'auth_token', None)
        if token:
            image['token'] = token
        return image

    @staticmethod
    def _config_drive(instance):
        drive = {'hostname': instance.hostname or instance.name,
                 'meta': dict(instance.metadata or {})}
        if instance.availability_zone:
            drive['availability_zone'] = instance.availability_zone
        if instance.key_data:
            drive['public_keys'] = {instance.key_name or 'key': instance.key_data}
        if instance.user_data:
            try:
                drive['user_data'] = base64.b64decode(instance.user_data).decode('utf-8')
            except (binascii.Error, UnicodeDecodeError):
                raise exception.InstanceUserDataMalformed()
        return drive

    # -- lifecycle ------------------------------------------------------------------------

    def destroy(self, context, instance, network_info, block_device_info=None,
                destroy_disks=True, destroy_secrets=True):
        self.cleanup(context, instance, network_info, block_device_info,
                     destroy_disks=destroy_disks, destroy_secrets=destroy_secrets)

    def cleanup(self, context, instance, network_info, block_device_info=None,
                destroy_disks=True, migrate_data=None, destroy_vifs=True,
                destroy_secrets=True):
        if self._reverting_here(context, instance):
            # Nova's revert_resize destroys "the new instance on the destination" before it
            # asks the source to finish the revert; on one host both are this agent's one
            # instance, whose `revert-resize` (finish_revert_migration) removes the resized
            # guest and brings the original back. Deleting it here would lose the original.
            LOG.debug('Same-host revert: the resized guest goes in finish_revert_migration',
                      instance=instance)
            return
        # Nova owns the ports: the agent unplugs this host's devices and leaves Neutron alone.
        try:
            self.agent.delete(instance.uuid, deallocate_network=False)
        except vclient.AgentError as e:
            if e.agent_code != 'not-found':
                raise
            LOG.debug('The vireo agent has no instance to clean up', instance=instance)

    def delete_instance_files(self, instance):
        """Nova's periodic clean-ups ask this for deleted instances whose files may linger
        here, e.g. the source's copy of a server deleted after its move to another host
        failed: the agent removes whatever it still holds of the instance (domain, devices,
        disks), never touching Neutron. True once nothing is left."""
        try:
            self.agent.delete(instance.uuid, deallocate_network=False)
        except vclient.AgentError as e:
            if e.agent_code == 'not-found':
                return True
            LOG.warning('The vireo agent could not remove what is left of the instance: '
                        '%s', e, instance=instance)
            return False
        LOG.info('Removed what was left of a deleted instance', instance=instance)
        return True

    def reboot(self, context, instance, network_info, reboot_type,
               block_device_info=None, bad_volumes_callback=None, accel_info=None):
        self._act(instance, 'reboot-hard' if reboot_type == 'HARD' else 'reboot-soft')

    def power_off(self, instance, timeout=0, retry_interval=0):
        # Nova's timeout 0 means "now"; the agent takes the same number of seconds.
        self._act(instance, 'power-off', timeout=max(int(timeout), 0))

    def power_on(self, context, instance, network_info, block_device_info=None,
                 accel_info=None):
        self._act(instance, 'power-on')

    def pause(self, instance):
        self._act(instance, 'pause')

    def unpause(self, instance):
        self._act(instance, 'unpause')

    def suspend(self, context, instance):
        self._act(instance, 'suspend')

    def resume(self, context, instance, network_info, block_device_info=None):
        self._act(instance, 'resume')

    def resume_state_on_host_boot(self, context, instance, network_info,
                                  block_device_info=None):
        # Nova asks for this ([DEFAULT] resume_guests_state_on_host_boot) for an instance it
        # believes running whose guest is not: the domain is made again and started, its
        # VIFs plugged and their events awaited, as in a hard reboot.
        self._act(instance, 'reboot-hard')

    def get_console_output(self, context, instance):
        try:
            return self.agent.console(instance.uuid)
        except vclient.AgentError as e:
            if e.agent_code == 'no-console-log':
                raise exception.ConsoleNotAvailable() from e
            raise self._nova_error(instance, 'get_console_output', e)

    # -- resize (on this host) --------------------------------------------------------------

    @staticmethod
    def _same_host(migration):
        return migration.source_compute == migration.dest_compute

    def _reverting_here(self, context, instance):
        """Is this Nova's revert_resize of a resize whose source and destination are here?"""
        if instance.task_state != task_states.RESIZE_REVERTING:
            return False
        moving = instance.migration_context
        if moving is None:
            return False
        migration = objects.Migration.get_by_id_and_instance(
            context, moving.migration_id, instance.uuid)
        return self._same_host(migration)

    def _migration_of(self, context, instance):
        """The migration Nova runs for the instance (its migration context names it)."""
        moving = instance.migration_context
        if moving is None:
            raise exception.MigrationNotFoundForInstance(instance_id=instance.uuid)
        return objects.Migration.get_by_id_and_instance(
            context, moving.migration_id, instance.uuid)

    def _caller_task(self, instance):
        """What Nova knows of its task for the agent's half (``caller``): the network
        events kept for the task before the driver was called (Nova moved the bindings
        first), and the time from which the agent counts the events it receives itself."""
        task = {'events_since_ms': int(time.time() * 1000)}
        if self.kept_events is not None:
            events = self.kept_events.task_events(instance)
            if events:
                task['events'] = events
        return task

    def _host_half(self, instance, request, **args):
        body = dict(args, action=request)
        try:
            return self.agent.host_half(instance.uuid, body)
        except vclient.AgentError as e:
            raise self._nova_error(instance, request, e)

    def _host_half_once_back(self, instance, request, **args):
        """A host half that must not be lost: the end of a live migration on its
        destination, which nothing can undo (the guest moved) or nobody else would do (the
        destination's clean-up). An agent that is away (restarting) is asked again until
        ``[vireo] agent_restart_timeout``; the agent takes a repeated request as done."""
        deadline = time.monotonic() + CONF.vireo.agent_restart_timeout
        waiting = False
        while True:
            try:
                return self._host_half(instance, request, **args)
            except vclient.AgentUnavailable as e:
                if time.monotonic() >= deadline:
                    raise
                if not waiting:
                    LOG.warning('The vireo agent is away for %(request)s (%(error)s): '
                                'waiting for it to come back',
                                {'request': request, 'error': e}, instance=instance)
                    waiting = True
            eventlet.sleep(1)

    def _migration_uri(self):
        return CONF.vireo.migration_uri or 'qemu+tcp://%s/system' % CONF.my_ip

    def migrate_disk_and_power_off(self, context, instance, dest, flavor, network_info,
                                   block_device_info=None, timeout=0, retry_interval=0):
        # `dest` is the destination's [DEFAULT] my_ip (Nova's migration.dest_host).
        if dest == CONF.my_ip:
            # On one host the agent's `resize` (finish_migration) powers the guest off,
            # copies and grows its disks and boots the new definition: nothing to move.
            return ''
        migration = self._migration_of(context, instance)
        # The source powers off and keeps the guest and its devices for a revert; Nova
        # carries the handover to the destination (finish_migration's disk_info), whose
        # agent copies the disks from this host's libvirtd.
        try:
            report = self.agent.action(instance.uuid, {
                'action': 'resize', 'flavor': self._flavor(flavor),
                'dest_host': migration.dest_compute, 'migration_id': migration.uuid,
                'caller_finishes': True})
        except vclient.AgentError as e:
            # The agent brought the instance back as it was before it answered.
            raise exception.InstanceFaultRollback(exception.ResizeError(
                reason='vireo agent: %s' % e)) from e
        return jsonutils.dumps({'handover': report['handover'],
                                'source_uri': self._migration_uri()})

    def finish_migration(self, context, migration, instance, disk_info, network_info,
                         image_meta, resize_instance, allocations, block_device_info=None,
                         power_on=True):
        if self._same_host(migration):
            # instance.flavor is the new flavor by now; the agent keeps the old definition
            # and disks until confirm or revert, and boots the guest again only if it ran.
            self._act(instance, 'resize', flavor=self._flavor(instance.flavor),
                      migration_id=migration.uuid)
            if power_on and self.get_info(instance).state != power_state.RUNNING:
                self._act(instance, 'power-on')
            return
        handover, caller = self._take_over(context, instance, disk_info, network_info,
                                           image_meta, block_device_info,
                                           exception.ResizeError)
        # Nova's view wins where it has one: the new flavor and whether the guest runs after
        # the move.
        handover['flavor'] = self._flavor(instance.flavor)
        handover['power_on'] = bool(power_on)
        moving = {'id': migration.uuid, 'source_host': migration.source_compute,
                  'dest_host': migration.dest_compute}

        def finish():
            self._host_half(instance, 'finish-resize', migration=moving, handover=handover,
                            caller=dict(caller, **self._caller_task(instance)))

        try:
            finish()
        except vclient.AgentUnavailable as e:
            # The recovery removes what the finish made here (the source keeps its copy).
            self._finish_again(instance, 'the resize', e, finish,
                               redo=lambda found: found is None)

    def _finish_again(self, instance, what, error, finish, redo):
        """The agent went away during the finish of `what` (``error``): once it is back
        and its recovery ended, ``finish`` runs again from the start (with the events Nova
        kept for the task: the lost agent had them) if ``redo`` says the recovery undid it
        (``redo(view)``, the view None when the agent no longer holds the instance); a
        finish that had ended (the instance running or stopped) is done; anything else
        raises ``error``."""
        LOG.warning('The vireo agent went away during the finish of %(what)s (%(error)s); '
                    'waiting for it to recover, then finishing again',
                    {'what': what, 'error': error}, instance=instance)
        found = self._recovered(instance)
        if redo(found):
            finish()
        elif found is not None and found.get('state') in ('running', 'stopped'):
            LOG.info('The finish of %s had ended before the agent went away', what,
                     instance=instance)
        else:
            raise error

    def _take_over(self, context, instance, disk_info, network_info, image_meta,
                   block_device_info, error):
        """The source's handover (its ``disk_info``) as this host takes the instance over,
        and the agent's ``caller`` for it: the ports as Nova bound them here, the base image
        from this host's Glance (the source's URL may not be reachable from here) with the
        request's token (never stored), and the source's libvirt URI to copy from. No
        ``image_meta``: the instance's own. A ``disk_info`` that is no handover is
        ``error``."""
        try:
            moved = jsonutils.loads(disk_info)
            handover = moved['handover']
            caller = {'source_uri': moved['source_uri']}
        except (TypeError, ValueError, KeyError) as e:
            raise error(reason='disk_info from the source is not a vireo handover: %s' % e)
        handover['network_info'] = self._network_info(network_info)
        image = (handover.get('storage') or {}).get('image')
        if image is not None:
            if image_meta is None:
                image_meta = objects.ImageMeta.from_instance(instance)
            here = self._image(context, instance, image_meta, block_device_info)
            image['source'] = here['source']
            if here.get('token'):
                caller['image_token'] = here['token']
        return handover, caller

    @staticmethod
    def _network_info(network_info):
        """Nova's network_info as the agent reads it (a list of VIF dicts)."""
        return jsonutils.loads(network_info.json()) if network_info else []

    @staticmethod
    def _bound_here(network_info, migrate_data):
        """The VIFs of a live migration's destination as bound to it (``network_info``
        when the migrate data has none). Nova hands the destination the instance's
        network_info as bound to the source; with a port binding per host (which the
        conductor makes before the migration) the migrate data carries the destination's
        binding, whose VIF type and details may differ (another firewall driver: hybrid plug
        on one host, native OVS on the other; another mechanism). The destination plugs and
        unplugs by it, and the source sends it the domain with the interfaces it calls for."""
        if migrate_data is None or 'vifs' not in migrate_data or not migrate_data.vifs:
            return network_info
        return network_model.NetworkInfo(
            [vif.get_dest_vif() for vif in migrate_data.vifs])

    def confirm_migration(self, context, migration, instance, network_info):
        if self._same_host(migration):
            self._act(instance, 'confirm-resize')
            return
        # Nova asks only the source: the destination's instance is an ordinary one already.
        # The agent answers once the old instance is off and recorded as gone, and removes
        # it (devices, definition, disks) right after: nothing of Nova's waits for that.
        try:
            self._host_half(instance, 'confirm-resize-source', remove_after=True)
        except exception.InstanceNotFound:
            LOG.debug('The source holds nothing of the instance any more', instance=instance)

    def finish_revert_migration(self, context, instance, network_info, migration,
                                block_device_info=None, power_on=True):
        if self._same_host(migration):
            # Removes the resized guest, restores the kept disks and definition and boots
            # it if it ran with the devices that stayed wired; the agent waits only for the
            # taps libvirt recreates (on one host Neutron sends no bind-time event).
            self._act(instance, 'revert-resize')
        else:
            # The destination destroyed its copy and Nova moved the bindings back before
            # this call: a port whose devices stayed wired here reported at that move, and
            # that event counts (the task's kept events and the time it began).
            def finish():
                self._host_half(instance, 'finish-revert-resize',
                                caller=self._caller_task(instance))

            try:
                finish()
            except vclient.AgentUnavailable as e:
                # The recovery stops the guest again: it waits as the resize's source.
                self._finish_again(
                    instance, 'the revert', e, finish,
                    redo=lambda found: (found or {}).get('state') == 'resize-source')
        running = self.get_info(instance).state == power_state.RUNNING
        if power_on and not running:
            self._act(instance, 'power-on')
        elif not power_on and running:
            self._act(instance, 'power-off')

    # -- live migration -------------------------------------------------------------------
    #
    # Nova runs each host's half: the destination's checks and pre_live_migration, the
    # source's live_migration, then post_live_migration_at_destination or
    # rollback_live_migration_at_destination. vireo copies the disks (a block migration)
    # into the destination's at the same paths (one instances path on every host, as Nova's
    # libvirt driver assumes), unless the hosts share the instances directory: Nova's own
    # probe (the destination's agent writes a file there, named in the migrate data's
    # `filename`; the source's looks for it; the destination's removes it) says so before
    # the migration, and the agents are told through `caller` (`shared_instance_path`).
    # The migrate data is Nova's LibvirtLiveMigrateData, so that Nova's clean-up flags
    # follow it; a shared directory is reported as shared block storage, not as a shared
    # instance path: with the latter Nova never calls rollback_live_migration_at_destination
    # (its `do_cleanup` is false) and the devices the destination plugged would stay, with
    # the former it calls it, and the source's clean-up, with destroy_disks false.
    # `block_migration` stays true either way: it is how Nova hands the source's handover
    # (get_instance_disk_info) to the destination. `target_connect_addr` carries the
    # destination's libvirt URI.

    def check_can_live_migrate_destination(self, context, instance, src_compute_info,
                                           dst_compute_info, block_migration=False,
                                           disk_over_commit=False):
        data = objects.LibvirtLiveMigrateData()
        # None: "auto", which the source decides (check_can_live_migrate_source).
        if block_migration is not None:
            data.block_migration = block_migration
        if disk_over_commit is not None:
            data.disk_over_commit = disk_over_commit
        data.is_shared_instance_path = False
        data.is_shared_block_storage = False
        probe = str(uuid.uuid4())
        try:
            self.agent.request('PUT', '/v1/storage/probes/%s' % probe)
        except vclient.AgentError as e:
            raise exception.MigrationPreCheckError(
                reason='the vireo agent could not write its shared-directory probe: %s' % e)
        data.filename = probe
        data.graphics_listen_addr_vnc = None
        data.graphics_listen_addr_spice = None
        data.serial_listen_addr = None
        data.target_connect_addr = self._migration_uri()
        data.supported_perf_events = []
        data.dst_wants_file_backed_memory = False
        data.file_backed_memory_discard = False
        return data

    def cleanup_live_migration_destination_check(self, context, dest_check_data):
        if 'filename' not in dest_check_data or not dest_check_data.filename:
            return
        try:
            self.agent.request('DELETE', '/v1/storage/probes/%s' % dest_check_data.filename)
        except vclient.AgentError as e:
            LOG.warning('The shared-directory probe %(probe)s may be left: %(error)s',
                        {'probe': dest_check_data.filename, 'error': e})

    def check_can_live_migrate_source(self, context, instance, dest_check_data,
                                      block_device_info=None):
        if driver.block_device_info_get_mapping(block_device_info):
            raise exception.MigrationPreCheckError(
                reason='vireo attaches no volumes')
        shared = self._sees_probe(dest_check_data)
        if (not shared and 'block_migration' in dest_check_data
                and dest_check_data.block_migration is False):
            raise exception.MigrationPreCheckError(
                reason='vireo live-migrates with the disks copied (block migration) unless '
                       'the hosts share the instances directory, and these do not')
        dest_check_data.is_shared_block_storage = shared
        dest_check_data.block_migration = True
        dest_check_data.instance_relative_path = instance.uuid
        return dest_check_data

    def _sees_probe(self, dest_check_data):
        """Does this host's agent find the destination's probe in its instances directory
        (the hosts share it)?"""
        if 'filename' not in dest_check_data or not dest_check_data.filename:
            return False
        try:
            found = self.agent.request('GET',
                                       '/v1/storage/probes/%s' % dest_check_data.filename)
        except vclient.AgentError as e:
            raise exception.MigrationPreCheckError(
                reason='the vireo agent could not look for the shared-directory probe: %s'
                % e)
        return bool(found and found.get('seen'))

    @staticmethod
    def _shared(migrate_data):
        """Whether the check found the instances directory shared (see above)."""
        return bool(migrate_data is not None
                    and 'is_shared_block_storage' in migrate_data
                    and migrate_data.is_shared_block_storage)

    def get_instance_disk_info(self, instance, block_device_info=None):
        """What the destination's pre_live_migration needs (Nova passes it along for a
        block migration): the agent's handover and this host's libvirt URI."""
        try:
            handover = self.agent.request('GET', '/v1/instances/%s/handover' % instance.uuid)
        except vclient.AgentError as e:
            raise self._nova_error(instance, 'get_instance_disk_info', e)
        return jsonutils.dumps({'handover': handover, 'source_uri': self._migration_uri()})

    def pre_live_migration(self, context, instance, block_device_info, network_info,
                           disk_info, migrate_data):
        handover, caller = self._take_over(context, instance, disk_info,
                                           self._bound_here(network_info, migrate_data),
                                           None, block_device_info, exception.MigrationError)
        migration = self._live_migration_of(instance, migrate_data)
        if self._shared(migrate_data):
            caller['shared_instance_path'] = True
        self._incoming[instance.uuid] = (migration, handover)
        self._host_half(instance, 'pre-live-migration', migration=migration,
                        handover=handover, caller=caller)
        return migrate_data

    @staticmethod
    def _migration_in(migrate_data):
        """Nova's migration record in the migrate data, when it travelled with it."""
        if migrate_data is not None and migrate_data.obj_attr_is_set('migration'):
            return migrate_data.migration
        return None

    def _live_migration_of(self, instance, migrate_data):
        # The agent names its probe file after the migration; without Nova's record (not
        # sent to the destination) any id will do: the destination's disks are its own.
        moving = self._migration_in(migrate_data)
        return {'id': moving.uuid if moving is not None else str(uuid.uuid4()),
                'source_host': instance.host, 'dest_host': self._nodename or CONF.host}

    def live_migration(self, context, instance, dest, post_method, recover_method,
                       block_migration=False, migrate_data=None):
        moving = self._migration_in(migrate_data)
        args = {'action': 'live-migrate', 'dest_host': dest,
                'caller': {'dest_uri': migrate_data.target_connect_addr}}
        if self._shared(migrate_data):
            args['caller']['shared_instance_path'] = True
        bound_there = self._bound_here(None, migrate_data)
        if bound_there is not None:
            # The destination plugged its ports by its own bindings: its domain follows.
            args['caller']['dest_network_info'] = self._network_info(bound_there)
        if moving is not None:
            args['migration_id'] = moving.uuid
        try:
            self.agent.action(instance.uuid, args)
        except vclient.AgentLost as e:
            # libvirt runs the migration job on without the agent: the guest may have left
            # or not. Rolling back the destination now could destroy a guest that arrived;
            # the agent's recovery, once it is back, lets the job end and says which.
            LOG.warning('The vireo agent went away during the live migration to %(dest)s '
                        '(%(error)s); waiting for it to recover the migration',
                        {'dest': dest, 'error': e}, instance=instance)
            if self._left_after_recovery(instance):
                LOG.info('The guest left for %s while the agent was away', dest,
                         instance=instance)
                post_method(context, instance, dest, block_migration, migrate_data)
            else:
                LOG.error('Live migration to %(dest)s did not happen: the guest stayed '
                          'here while the agent was away', {'dest': dest},
                          instance=instance)
                recover_method(context, instance, dest, migrate_data)
            return
        except vclient.AgentError as e:
            # The agent kept the guest running here; Nova rolls back the network and the
            # destination (it sets ERROR without rolling back if this raised).
            LOG.error('Live migration to %(dest)s failed: %(error)s',
                      {'dest': dest, 'error': e}, instance=instance)
            recover_method(context, instance, dest, migrate_data)
            return
        post_method(context, instance, dest, block_migration, migrate_data)

    def _left_after_recovery(self, instance):
        """Whether the guest left this host, once the agent's recovery of the interrupted
        live migration ended (see _recovered). Raises AgentUnavailable otherwise: Nova then
        sets ERROR, as neither finishing nor rolling back is safe without knowing."""
        found = self._recovered(instance)
        return found is None or found.get('power_state') == 'no-domain'

    def _recovered(self, instance):
        """The agent's view of the instance once the agent is back and no operation of the
        instance is under way there any more (its recovery of the one the agent died in
        ended); None if the agent does not hold it. Raises AgentUnavailable if that takes
        longer than ``[vireo] agent_restart_timeout``."""
        deadline = time.monotonic() + CONF.vireo.agent_restart_timeout
        while True:
            try:
                found = self.agent.instance(instance.uuid)
            except vclient.AgentUnavailable as e:
                last = e
            except vclient.AgentError as e:
                if e.agent_code == 'not-found':
                    return None
                raise
            else:
                if found.get('operation') is None:
                    return found
                last = None
            if time.monotonic() >= deadline:
                raise vclient.AgentUnavailable(
                    'unavailable', 'the agent did not recover %s within %d s: %s'
                    % (instance.uuid, CONF.vireo.agent_restart_timeout,
                       last or 'still under way'))
            eventlet.sleep(1)

    def post_live_migration_at_source(self, context, instance, network_info):
        # The agent's live-migrate unplugged and removed everything of the guest here once
        # it ran on the destination; Nova's clean-up (cleanup) finds nothing left.
        LOG.debug('The source was cleaned up by the migration', instance=instance)

    def post_live_migration_at_destination(self, context, instance, network_info,
                                           block_migration=False, block_device_info=None):
        migration, _ = self._incoming.pop(instance.uuid, (None, None))
        if migration is None:
            migration = self._live_migration_of(instance, None)
        self._host_half_once_back(instance, 'post-live-migration-at-destination',
                                  migration=migration, caller={})

    def rollback_live_migration_at_destination(self, context, instance, network_info,
                                               block_device_info, destroy_disks=True,
                                               migrate_data=None):
        migration, handover = self._incoming.pop(instance.uuid, (None, None))
        if handover is None:
            # nova-compute restarted since pre_live_migration: what Nova knows is enough to
            # unplug the VIFs and remove what this host prepared.
            handover = {'name': instance.name, 'flavor': self._flavor(instance.flavor),
                        'old_flavor': self._flavor(instance.flavor), 'boot': {'type': 'none'},
                        'power_on': True}
        handover['network_info'] = self._network_info(
            self._bound_here(network_info, migrate_data))
        if migration is None:
            migration = self._live_migration_of(instance, migrate_data)
        try:
            self._host_half_once_back(instance, 'rollback-live-migration-at-destination',
                                      handover=handover, do_cleanup=True,
                                      destroy_disks=bool(destroy_disks),
                                      migration_id=migration['id'], caller={})
        except exception.InstanceNotFound:
            LOG.debug('Nothing of the instance here to roll back', instance=instance)

    # -- interfaces -----------------------------------------------------------------------

    def plug_vifs(self, instance, network_info):
        """nova-compute's start asks this for every instance it finds here: the agent plugs
        what is missing of each VIF's host side (idempotent; the guest is not touched)."""
        try:
            self._act(instance, 'plug-vifs')
        except exception.InstanceNotFound:
            # The agent holds no such instance: the power-state sync will find the guest
            # gone; nothing here to plug.
            LOG.warning('The vireo agent holds no such instance: no VIF to plug',
                        instance=instance)
        except vclient.AgentError as e:
            raise exception.VirtualInterfacePlugException(str(e)) from e

    def unplug_vifs(self, instance, network_info):
        """Nova's clean-up of a build's networks asks this: the agent removes each VIF's
        host side (a failed build's were removed with it already: not found is done)."""
        try:
            self._act(instance, 'unplug-vifs')
        except exception.InstanceNotFound:
            LOG.debug('The vireo agent holds no such instance: no VIF to unplug',
                      instance=instance)

    def attach_interface(self, context, instance, image_meta, vif):
        try:
            self._act(instance, 'attach-interface', vif=jsonutils.loads(jsonutils.dumps(vif)))
        except vclient.AgentError as e:
            raise exception.InterfaceAttachFailed(instance_uuid=instance.uuid) from e

    def detach_interface(self, context, instance, vif):
        try:
            self._act(instance, 'detach-interface', port_id=vif['id'])
        except vclient.AgentError as e:
            if e.agent_code == 'invalid':
                raise exception.NotFound(str(e)) from e
            raise exception.InterfaceDetachFailed(instance_uuid=instance.uuid) from e
