"""Each driver method Nova calls maps to the right agent call, answer and error."""

import json
import time
import uuid

import eventlet
import pytest

from nova.compute import power_state
from nova.compute import task_states
from nova import exception
from nova import objects
from nova.virt.vireo import client as vclient
from nova.virt import event as virtevent
from nova.virt.vireo import driver as vdriver

from conftest import Agent
from conftest import HOST
from conftest import make_instance


@pytest.fixture
def driver(manager):
    manager.driver.init_host(HOST)
    return manager.driver


def _power(driver, instance):
    return driver.get_info(instance).state


def test_init_host_reads_the_agents_host_name(driver):
    assert driver.get_available_nodes() == [HOST]
    assert driver.get_host_ip_addr() == '192.0.2.10'


def test_init_host_without_an_agent_is_a_hypervisor_unavailable(nova_conf, tmp_path):
    token = tmp_path / 'token'
    token.write_text('x' * 20)
    token.chmod(0o600)
    dead = vclient.AgentClient('http://127.0.0.1:9', 'x' * 20, request_timeout=2)
    d = vdriver.VireoDriver(virtapi=None, agent=dead)
    with pytest.raises(exception.HypervisorUnavailable):
        d.init_host(HOST)


def test_a_token_file_others_can_read_is_refused(tmp_path):
    token = tmp_path / 'token'
    token.write_text('x' * 20)
    token.chmod(0o644)
    with pytest.raises(vclient.AgentError, match='chmod 600'):
        vclient.read_token(str(token))


def test_instances_the_agent_holds_are_listed_and_described(driver, agent):
    held = agent.create()
    assert held in driver.list_instance_uuids()
    assert 'instance-%s' % held[:8] in driver.list_instances()
    info = driver.get_info(make_instance(uuid_=held))
    assert info.state == power_state.RUNNING
    assert info.internal_id == 'instance-%s' % held[:8]
    assert driver.instance_exists(make_instance(uuid_=held))


def test_an_instance_the_agent_does_not_hold_is_not_found(driver):
    stranger = make_instance()
    with pytest.raises(exception.InstanceNotFound):
        driver.get_info(stranger)
    assert not driver.instance_exists(stranger)
    with pytest.raises(exception.InstanceNotFound):
        driver.power_on(None, stranger, [])


def test_power_pause_suspend_and_reboot_follow_the_agent(driver, agent):
    instance = make_instance(uuid_=agent.create())
    driver.power_off(instance, timeout=0)
    assert _power(driver, instance) == power_state.SHUTDOWN
    driver.power_on(None, instance, [])
    assert _power(driver, instance) == power_state.RUNNING
    driver.pause(instance)
    assert _power(driver, instance) == power_state.PAUSED
    driver.unpause(instance)
    assert _power(driver, instance) == power_state.RUNNING
    driver.suspend(None, instance)
    assert _power(driver, instance) == power_state.SUSPENDED
    driver.resume(None, instance, [])
    assert _power(driver, instance) == power_state.RUNNING
    driver.reboot(None, instance, [], 'SOFT')
    driver.reboot(None, instance, [], 'HARD')
    assert _power(driver, instance) == power_state.RUNNING
    ops = agent.get('/v1/operations?instance=%s' % instance.uuid).json()['operations']
    kinds = [op['kind'] for op in reversed(ops)]
    assert kinds == ['create', 'power-off', 'power-on', 'pause', 'unpause', 'suspend',
                     'resume', 'reboot-soft', 'reboot-hard']


def test_an_action_the_instance_state_forbids_is_invalid_state(driver, agent):
    instance = make_instance(uuid_=agent.create())
    with pytest.raises(exception.InstanceInvalidState):
        driver.unpause(instance)
    assert _power(driver, instance) == power_state.RUNNING


def test_destroy_removes_the_instance_and_is_idempotent(driver, agent):
    instance = make_instance(uuid_=agent.create())
    driver.destroy(None, instance, [])
    assert instance.uuid not in driver.list_instance_uuids()
    assert agent.get('/v1/instances/%s' % instance.uuid).status_code == 404
    driver.destroy(None, instance, [])
    driver.cleanup(None, instance, [])


def test_detaching_a_port_the_instance_does_not_have_is_not_found(driver, agent):
    instance = make_instance(uuid_=agent.create())
    with pytest.raises(exception.NotFound):
        driver.detach_interface(None, instance, {'id': str(uuid.uuid4())})


def test_capabilities_claim_only_what_is_forwarded(driver):
    caps = driver.capabilities
    assert caps['supports_attach_interface']
    assert not caps['supports_migrate_to_same_host']
    assert not caps['has_imagecache']


# -- spawn from Glance ----------------------------------------------------------------------

IMAGE = b'\0' * (1 << 20)


def _build(image, root_gb=1, **extra):
    from nova import objects

    flavor = objects.Flavor(name='m1.test', vcpus=1, memory_mb=64, root_gb=root_gb,
                            ephemeral_gb=0, swap=0, extra_specs={})
    fields = dict(uuid=str(uuid.uuid4()), id=int(uuid.uuid4().int % 10**6), flavor=flavor,
                  image_ref=image['id'], config_drive='', launched_at=None,
                  user_data=None, key_name=None, key_data=None, hostname='vm-test',
                  metadata={}, availability_zone=None, system_metadata={},
                  task_state='spawning', vm_state='building', host=HOST)
    fields.update(extra)
    return objects.Instance(**fields)


def _image_meta(image, **override):
    from nova import objects

    meta = {k: image[k] for k in ('id', 'name', 'checksum', 'disk_format',
                                  'container_format', 'size')}
    meta.update(override)
    return objects.ImageMeta.from_dict(meta)


def _instance_dir(agent, instance):
    return agent.root / 'state' / 'instances' / instance.uuid


def test_spawn_boots_a_glance_image_on_its_own_overlay(driver, agent, glance_api, context):
    image = glance_api.upload(IMAGE)
    instance = _build(image)
    driver.spawn(context, instance, _image_meta(image), [], None, {})
    assert _power(driver, instance) == power_state.RUNNING
    assert instance.name in driver.list_instances()
    # The image was fetched once into the agent's cache; the instance has its own disk.
    base = agent.root / 'state' / '_base' / image['id']
    assert base.read_bytes() == IMAGE
    assert (_instance_dir(agent, instance) / 'disk').is_file()
    assert not (_instance_dir(agent, instance) / 'disk.config').exists()
    driver.destroy(context, instance, [])
    assert not _instance_dir(agent, instance).exists()


def test_spawn_with_a_config_drive_gives_it_user_data(driver, agent, glance_api, context):
    import base64

    image = glance_api.upload(IMAGE)
    instance = _build(image, config_drive='True',
                      user_data=base64.b64encode(b'#cloud-config\n').decode())
    driver.spawn(context, instance, _image_meta(image), [], None, {})
    drive = _instance_dir(agent, instance) / 'disk.config'
    assert b'#cloud-config' in drive.read_bytes()
    driver.destroy(context, instance, [])


def test_a_build_whose_agent_went_away_fails_once_the_agent_recovered_it(
        driver, glance_api, context, monkeypatch):
    """The agent died during the build: the build fails (Nova reschedules) only once the
    agent is back and its recovery ended, so that Nova's clean-up reaches it."""
    image = glance_api.upload(IMAGE)
    instance = _build(image)
    polls = []

    def lost(body):
        raise vclient.AgentLost('agent-lost', 'connection refused')

    def restarting(uuid_):
        polls.append(uuid_)
        if len(polls) == 1:
            raise vclient.AgentUnavailable('unavailable', 'connection refused')
        if len(polls) == 2:
            return {'uuid': uuid_, 'operation': {'phase': 'recover'}}
        raise vclient.AgentError('not-found', 'no such instance', status=404)

    monkeypatch.setattr(driver.agent, 'create', lost)
    monkeypatch.setattr(driver.agent, 'instance', restarting)
    with pytest.raises(vclient.AgentLost):
        driver.spawn(context, instance, _image_meta(image), [], None, {})
    assert polls == [instance.uuid] * 3


def test_a_wrong_checksum_fails_the_build_and_leaves_nothing(
        driver, agent, glance_api, context):
    image = glance_api.upload(IMAGE)
    instance = _build(image)
    with pytest.raises(vclient.AgentError) as e:
        driver.spawn(context, instance, _image_meta(image, checksum='0' * 32), [], None, {})
    assert e.value.agent_code == 'build-failed'
    assert 'want md5:%s' % ('0' * 32) in e.value.reason
    assert instance.uuid not in driver.list_instance_uuids()
    assert not _instance_dir(agent, instance).exists()


def test_images_vireo_cannot_boot_are_refused_before_the_agent_is_asked(
        driver, glance_api, context):
    image = glance_api.upload(IMAGE, disk_format='iso')
    instance = _build(image)
    with pytest.raises(exception.ImageUnacceptable):
        driver.spawn(context, instance, _image_meta(image), [], None, {})
    bdi = {'block_device_mapping': [{'connection_info': {}, 'mount_device': '/dev/vdb'}]}
    with pytest.raises(exception.InvalidBDM):
        driver.spawn(context, _build(image), _image_meta(image, disk_format='raw'), [], None,
                     {}, block_device_info=bdi)
    assert instance.uuid not in driver.list_instance_uuids()


# -- resources ------------------------------------------------------------------------------

def test_available_resources_are_the_agents_host_and_instances(driver, agent):
    agent.create()
    host = agent.get('/v1/host').json()
    held = agent.get('/v1/instances').json()['instances']
    res = driver.get_available_resource(HOST)
    assert res['vcpus'] == host['vcpus'] > 0
    assert res['memory_mb'] == host['memory_mb'] > 0
    assert res['local_gb'] == host['disk_gb']
    assert res['local_gb_used'] == host['disk_gb'] - host['disk_free_gb']
    assert res['vcpus_used'] == sum(i['vcpus'] for i in held) >= 1
    assert res['memory_mb_used'] == sum(i['memory_mb'] for i in held) >= 64
    assert res['hypervisor_type'] == host['hypervisor_type']
    assert res['hypervisor_hostname'] == HOST
    # libvirt's test driver says its CPU is an i686.
    assert res['supported_instances'] == [(host['cpu']['model'], 'test', 'hvm')] == [
        ('i686', 'test', 'hvm')]


def test_the_provider_tree_gets_the_hosts_inventory(driver, agent):
    from nova.compute import provider_tree

    host = agent.get('/v1/host').json()
    tree = provider_tree.ProviderTree()
    tree.new_root(HOST, str(uuid.uuid4()))
    driver.update_provider_tree(tree, HOST)
    inv = tree.data(HOST).inventory
    assert inv['VCPU']['total'] == host['vcpus']
    assert inv['VCPU']['allocation_ratio'] == 16.0  # Nova's initial_cpu_allocation_ratio
    assert inv['MEMORY_MB']['total'] == host['memory_mb']
    assert inv['MEMORY_MB']['reserved'] == 512  # Nova's reserved_host_memory_mb
    assert inv['DISK_GB']['total'] == host['disk_gb']
    assert inv['DISK_GB']['max_unit'] == host['disk_gb']


# -- resize on this host -------------------------------------------------------------------

def _flavor(vcpus, memory_mb, name):
    return objects.Flavor(name=name, vcpus=vcpus, memory_mb=memory_mb, root_gb=0,
                          ephemeral_gb=0, swap=0, extra_specs={})


def _here(instance, monkeypatch):
    """A same-host migration of `instance`, as Nova's database would give it back."""
    migration = objects.Migration(id=7, uuid=str(uuid.uuid4()), source_compute=HOST,
                                  dest_compute=HOST, instance_uuid=instance.uuid)
    instance.migration_context = objects.MigrationContext(
        instance_uuid=instance.uuid, migration_id=migration.id)
    monkeypatch.setattr(objects.Migration, 'get_by_id_and_instance',
                        lambda context, id_, uuid_: migration)
    return migration


def _held(agent, instance):
    held = agent.get('/v1/instances/%s' % instance.uuid).json()
    return held['vcpus'], held['memory_mb'], held['power_state']


def test_a_resize_here_is_the_agents_resize_then_its_confirm(driver, agent, monkeypatch):
    instance = make_instance(uuid_=agent.create())
    migration = _here(instance, monkeypatch)
    assert driver.migrate_disk_and_power_off(
        None, instance, '192.0.2.10', _flavor(2, 96, 'm1.more'), []) == ''
    assert _held(agent, instance) == (1, 64, 'running')
    instance.flavor = _flavor(2, 96, 'm1.more')
    driver.finish_migration(None, migration, instance, '', [], None, True, {}, power_on=True)
    assert _held(agent, instance) == (2, 96, 'running')
    driver.confirm_migration(None, migration, instance, [])
    ops = agent.get('/v1/operations?instance=%s' % instance.uuid).json()['operations']
    assert [op['kind'] for op in reversed(ops)] == ['create', 'resize', 'confirm-resize']
    assert all(op['state'] == 'succeeded' for op in ops), ops


def test_a_revert_here_keeps_the_original_through_novas_destroy(driver, agent, monkeypatch):
    instance = make_instance(uuid_=agent.create())
    migration = _here(instance, monkeypatch)
    instance.flavor = _flavor(2, 96, 'm1.more')
    driver.finish_migration(None, migration, instance, '', [], None, True, {}, power_on=True)
    # Nova's revert_resize destroys "the destination's" guest first: here, that is the one
    # instance, which the revert must bring back as it was.
    instance.task_state = task_states.RESIZE_REVERTING
    driver.destroy(None, instance, [])
    assert _held(agent, instance) == (2, 96, 'running')
    driver.finish_revert_migration(None, instance, [], migration, power_on=True)
    assert _held(agent, instance) == (1, 64, 'running')
    # Outside a revert, destroy removes it.
    instance.task_state = None
    driver.destroy(None, instance, [])
    assert agent.get('/v1/instances/%s' % instance.uuid).status_code == 404


def test_a_revert_of_a_stopped_instance_leaves_it_stopped(driver, agent, monkeypatch):
    instance = make_instance(uuid_=agent.create(power_on=False))
    migration = _here(instance, monkeypatch)
    instance.flavor = _flavor(2, 96, 'm1.more')
    driver.finish_migration(None, migration, instance, '', [], None, True, {}, power_on=False)
    assert _held(agent, instance) == (2, 96, 'shutoff')
    driver.finish_revert_migration(None, instance, [], migration, power_on=False)
    assert _held(agent, instance) == (1, 64, 'shutoff')


OTHER = 'compute-b'


@pytest.fixture(scope='module')
def agent_b(tmp_path_factory):
    """The destination host's agent (its own test-driver node)."""
    b = Agent(tmp_path_factory.mktemp('agent-b'), OTHER)
    yield b
    b.stop()


@pytest.fixture
def driver_b(nova_conf, agent_b):
    """The destination's driver (a second nova-compute's), on the other agent."""
    d = vdriver.VireoDriver(virtapi=None, agent=vclient.AgentClient(
        agent_b.url, vclient.read_token(str(agent_b.token_file))))
    d.init_host(OTHER)
    return d


def _to_other(instance, monkeypatch):
    """A migration of `instance` from this host to the other, as Nova's database gives it."""
    migration = objects.Migration(id=9, uuid=str(uuid.uuid4()), source_compute=HOST,
                                  dest_compute=OTHER, instance_uuid=instance.uuid)
    instance.migration_context = objects.MigrationContext(
        instance_uuid=instance.uuid, migration_id=migration.id)
    monkeypatch.setattr(objects.Migration, 'get_by_id_and_instance',
                        lambda context, id_, uuid_: migration)
    return migration


def _moved_to_other(driver, driver_b, agent, instance, monkeypatch):
    """Nova's resize_instance on the source, then finish_resize on the destination."""
    migration = _to_other(instance, monkeypatch)
    disk_info = driver.migrate_disk_and_power_off(None, instance, '192.0.2.99',
                                                  _flavor(2, 96, 'm1.more'), [])
    moved = json.loads(disk_info)
    assert moved['source_uri'] == 'qemu+tcp://192.0.2.10/system'
    assert moved['handover']['flavor']['vcpus'] == 2
    # The source waits stopped with its guest kept for a revert.
    assert _held(agent, instance) == (1, 64, 'shutoff')
    instance.flavor = _flavor(2, 96, 'm1.more')
    instance.task_state = task_states.RESIZE_FINISH
    driver_b.finish_migration(None, migration, instance, disk_info, [], None, True, {},
                              power_on=True)
    return migration


def test_a_resize_to_another_host_is_handed_over_through_nova_and_confirmed_on_the_source(
        driver, driver_b, agent, agent_b, monkeypatch):
    instance = make_instance(uuid_=agent.create())
    migration = _moved_to_other(driver, driver_b, agent, instance, monkeypatch)
    # The destination runs an ordinary instance: the next operation is taken.
    assert _held(agent_b, instance) == (2, 96, 'running')
    driver_b.reboot(None, instance, [], 'HARD')
    driver.confirm_migration(None, migration, instance, [])
    assert agent.get('/v1/instances/%s' % instance.uuid).status_code == 404
    # Confirming again finds nothing to remove: still confirmed.
    driver.confirm_migration(None, migration, instance, [])
    driver_b.destroy(None, instance, [])
    assert agent_b.get('/v1/instances/%s' % instance.uuid).status_code == 404


def test_a_revert_from_another_host_brings_the_original_back_on_the_source(
        driver, driver_b, agent, agent_b, monkeypatch):
    instance = make_instance(uuid_=agent.create())
    migration = _moved_to_other(driver, driver_b, agent, instance, monkeypatch)
    # Nova's revert_resize on the destination destroys its copy, then asks the source.
    instance.task_state = task_states.RESIZE_REVERTING
    driver_b.destroy(None, instance, [])
    assert agent_b.get('/v1/instances/%s' % instance.uuid).status_code == 404
    instance.flavor = _flavor(1, 64, 'm1.tiny')
    driver.finish_revert_migration(None, instance, [], migration, power_on=True)
    assert _held(agent, instance) == (1, 64, 'running')
    op = agent.get('/v1/instances/%s' % instance.uuid).json()['last_operation']
    assert op['request'] == 'finish-revert-resize'
    instance.task_state = None
    driver.destroy(None, instance, [])


def test_a_resize_to_another_host_the_agent_refuses_leaves_the_instance_as_it_was(
        driver, agent, monkeypatch):
    instance = make_instance(uuid_=agent.create())
    migration = _to_other(instance, monkeypatch)
    migration.dest_compute = HOST  # the agent's own name: no other host to hand it to
    with pytest.raises(exception.InstanceFaultRollback):
        driver.migrate_disk_and_power_off(None, instance, '192.0.2.99',
                                          _flavor(2, 96, 'm1.more'), [])
    assert _held(agent, instance) == (1, 64, 'running')


def test_a_finish_without_a_handover_is_a_resize_error(driver_b, agent):
    instance = make_instance()
    elsewhere = objects.Migration(id=8, uuid=str(uuid.uuid4()), source_compute=HOST,
                                  dest_compute=OTHER, instance_uuid=instance.uuid)
    with pytest.raises(exception.ResizeError):
        driver_b.finish_migration(None, elsewhere, instance, '', [], None, True, {})


def test_console_output_is_the_end_of_the_agents_serial_log(driver, agent):
    instance = make_instance(uuid_=agent.create())
    assert driver.get_console_output(None, instance) == ''
    log = agent.root / 'state' / 'instances' / instance.uuid / 'console.log'
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b'SeaBIOS\n' + b'.' * (150 * 1024) + b'\nlogin: ')
    out = driver.get_console_output(None, instance)
    assert len(out) == 100 * 1024 and out.endswith('\nlogin: ')
    with pytest.raises(exception.InstanceNotFound):
        driver.get_console_output(None, make_instance())


def test_resume_state_on_host_boot_starts_the_guest_again(driver, agent):
    instance = make_instance(uuid_=agent.create())
    driver.power_off(instance, timeout=0)
    driver.resume_state_on_host_boot(None, instance, [])
    assert _power(driver, instance) == power_state.RUNNING
    ops = agent.get('/v1/operations?instance=%s' % instance.uuid).json()['operations']
    assert ops[0]['kind'] == 'reboot-hard' and ops[0]['state'] == 'succeeded'


# -- lifecycle events ---------------------------------------------------------------------

def _until(check, within=15.0):
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, 'not within %s s' % within
        eventlet.sleep(0.05)


def test_power_changes_reach_nova_as_lifecycle_events(driver, agent):
    vconf_delay = 2.0
    vdriver.CONF.set_override('stopped_event_delay', vconf_delay, group='vireo')
    try:
        got = []
        driver.register_event_listener(got.append)
        instance = make_instance(uuid_=agent.create())

        def of(transition):
            return [e for e in got
                    if e.uuid == instance.uuid and e.transition == transition]
        _until(lambda: of(virtevent.EVENT_LIFECYCLE_STARTED))
        driver.pause(instance)
        _until(lambda: of(virtevent.EVENT_LIFECYCLE_PAUSED))
        driver.unpause(instance)
        _until(lambda: len(of(virtevent.EVENT_LIFECYCLE_RESUMED)) == 2)  # spawn's, unpause's
        # A hard reboot stops and starts the guest: the held "stopped" is dropped.
        started = len(of(virtevent.EVENT_LIFECYCLE_STARTED))
        driver.reboot(None, instance, [], 'HARD')
        _until(lambda: len(of(virtevent.EVENT_LIFECYCLE_STARTED)) > started)
        eventlet.sleep(vconf_delay + 0.5)
        assert of(virtevent.EVENT_LIFECYCLE_STOPPED) == []
        # A stop with nothing after it is told, once the delay has passed.
        driver.power_off(instance, timeout=0)
        _until(lambda: of(virtevent.EVENT_LIFECYCLE_STOPPED))
        assert len(of(virtevent.EVENT_LIFECYCLE_STOPPED)) == 1
    finally:
        vdriver.CONF.clear_override('stopped_event_delay', group='vireo')
        driver.register_event_listener(None)


def test_a_restarted_agents_feed_is_read_from_its_start(driver, agent):
    # A number the agent never gave (its previous process's) is answered at once, and the
    # driver reads the new process's events from its first.
    t = time.monotonic()
    assert driver._read_lifecycle(10 ** 9) == 0
    assert time.monotonic() - t < 5
    agent.create()
    _until(lambda: driver.agent.lifecycle()['last'] > 0)
    assert driver._read_lifecycle(0) > 0


def test_lingering_files_of_a_deleted_instance_are_removed_by_the_agent(driver, agent):
    instance = make_instance(uuid_=agent.create())
    assert driver.delete_instance_files(instance)
    assert agent.get('/v1/instances/%s' % instance.uuid).status_code == 404
    # Nothing left is success too (Nova's periodic task asks again after a failure).
    assert driver.delete_instance_files(instance)


def test_plug_and_unplug_vifs_are_the_agents_and_leave_the_guest_alone(driver, agent):
    instance = make_instance(uuid_=agent.create())
    driver.unplug_vifs(instance, [])
    driver.plug_vifs(instance, [])
    ops = agent.get('/v1/operations?instance=%s' % instance.uuid).json()['operations']
    assert [op['kind'] for op in ops[:2]] == ['plug-vifs', 'unplug-vifs'], ops
    assert all(op['state'] == 'succeeded' for op in ops[:2]), ops
    assert _held(agent, instance) == (1, 64, 'running')
    # An instance the agent does not hold: nothing to plug or unplug, no error for Nova.
    stranger = make_instance()
    driver.unplug_vifs(stranger, [])
    driver.plug_vifs(stranger, [])


def test_a_live_migration_that_fails_in_libvirt_is_recovered_by_the_driver(
        driver, driver_b, agent, agent_b):
    instance = make_instance(uuid_=agent.create())
    instance.flavor = _flavor(1, 64, 'm1.tiny')
    # Nova's checks: the destination's, then the source's.
    data = driver_b.check_can_live_migrate_destination(None, instance, {}, {}, None, None)
    probe = '/v1/storage/probes/%s' % data.filename
    assert agent_b.get(probe).json() == {'seen': True}
    data = driver.check_can_live_migrate_source(None, instance, data)
    # The hosts' instances directories are their own: the source does not see B's probe.
    assert data.block_migration is True and data.is_shared_instance_path is False
    assert data.is_shared_block_storage is False
    assert data.target_connect_addr == 'qemu+tcp://192.0.2.10/system'
    driver_b.cleanup_live_migration_destination_check(None, data)
    assert agent_b.get(probe).json() == {'seen': False}
    # The source's disk info carries its handover to the destination's pre_live_migration.
    disk_info = driver.get_instance_disk_info(instance)
    assert json.loads(disk_info)['handover']['name'] == 'instance-%s' % instance.uuid[:8]
    data.migration = objects.Migration(uuid=str(uuid.uuid4()))
    driver_b.pre_live_migration(None, instance, None, [], disk_info, data)
    assert agent_b.get('/v1/instances/%s' % instance.uuid).json()['state'] == 'incoming'
    # libvirt's test driver cannot migrate: the migration fails there, and the driver calls
    # Nova's recover method itself (a raise would leave the instance in ERROR).
    data.target_connect_addr = 'test:///default'
    calls = []
    driver.live_migration(None, instance, OTHER,
                          post_method=lambda *a, **k: calls.append('post'),
                          recover_method=lambda *a, **k: calls.append('recover'),
                          block_migration=True, migrate_data=data)
    assert calls == ['recover']
    assert _held(agent, instance) == (1, 64, 'running')
    driver_b.rollback_live_migration_at_destination(None, instance, [], None,
                                                    destroy_disks=True, migrate_data=data)
    assert agent_b.get('/v1/instances/%s' % instance.uuid).status_code == 404
    driver.destroy(None, instance, [])


@pytest.mark.parametrize('left', [False, True])
def test_a_live_migration_whose_agent_went_away_ends_as_the_agents_recovery_found_it(
        driver, agent, monkeypatch, left):
    """The agent died while libvirt ran the migration: the driver neither posts nor rolls
    back until the agent is back and its recovery ended; then the guest's whereabouts
    decide (left: Nova posts the migration; stayed: Nova rolls it back)."""
    instance = make_instance(uuid_=agent.create())
    data = objects.LibvirtLiveMigrateData(target_connect_addr='test:///default')
    data.migration = objects.Migration(uuid=str(uuid.uuid4()))

    def lost(uuid_, body):
        assert body['action'] == 'live-migrate'
        if left:
            # As the agent's recovery does once the guest left: nothing of it here.
            driver.agent.delete(uuid_)
        raise vclient.AgentLost('agent-lost', 'connection refused')

    real = driver.agent.instance
    answers = []

    def restarting(uuid_):
        # Down twice, then recovering once, then the real answer.
        answers.append(uuid_)
        if len(answers) <= 2:
            raise vclient.AgentUnavailable('unavailable', 'connection refused')
        view = real(uuid_)
        if len(answers) == 3:
            view['operation'] = {'phase': 'recover: the migration job'}
        return view

    monkeypatch.setattr(driver.agent, 'action', lost)
    monkeypatch.setattr(driver.agent, 'instance', restarting)
    calls = []
    driver.live_migration(None, instance, OTHER,
                          post_method=lambda *a, **k: calls.append('post'),
                          recover_method=lambda *a, **k: calls.append('recover'),
                          block_migration=True, migrate_data=data)
    assert calls == ['post' if left else 'recover']
    assert len(answers) == (3 if left else 4)
    monkeypatch.undo()
    if not left:
        assert _held(agent, instance)[2] == 'running'
        driver.destroy(None, instance, [])


def test_a_live_migration_whose_agent_stays_away_is_neither_posted_nor_rolled_back(
        driver, monkeypatch):
    instance = make_instance()
    data = objects.LibvirtLiveMigrateData(target_connect_addr='test:///default')

    def away(*args):
        raise vclient.AgentLost('agent-lost', 'connection refused')

    monkeypatch.setattr(driver.agent, 'action', away)
    monkeypatch.setattr(driver.agent, 'instance', lambda u: (_ for _ in ()).throw(
        vclient.AgentUnavailable('unavailable', 'connection refused')))
    vdriver.CONF.set_override('agent_restart_timeout', 2, group='vireo')
    calls = []
    with pytest.raises(vclient.AgentUnavailable, match='did not recover .* within 2 s'):
        driver.live_migration(None, instance, OTHER,
                              post_method=lambda *a, **k: calls.append('post'),
                              recover_method=lambda *a, **k: calls.append('recover'),
                              block_migration=True, migrate_data=data)
    vdriver.CONF.clear_override('agent_restart_timeout', group='vireo')
    assert calls == []


def test_a_live_migration_that_copies_no_disk_is_refused_before_anything_moves(driver):
    instance = make_instance()
    data = objects.LibvirtLiveMigrateData(block_migration=False)
    with pytest.raises(exception.MigrationPreCheckError):
        driver.check_can_live_migrate_source(None, instance, data)


def test_a_shared_instances_directory_is_found_by_the_destinations_probe(driver, agent):
    # Source and destination on one instances directory (here: one agent's): the source
    # finds the probe the destination's check wrote, and the migrate data says shared
    # block storage (Nova then rolls the destination back, and keeps the disks), not a
    # shared instance path (Nova would skip the destination's rollback). A migration that
    # copies no disk is fine there.
    instance = make_instance()
    data = driver.check_can_live_migrate_destination(None, instance, {}, {}, False, None)
    data = driver.check_can_live_migrate_source(None, instance, data)
    assert data.is_shared_block_storage is True and data.is_shared_instance_path is False
    assert data.block_migration is True
    assert driver._shared(data)
    driver.cleanup_live_migration_destination_check(None, data)
    assert agent.get('/v1/storage/probes/%s' % data.filename).json() == {'seen': False}
    assert not driver._shared(objects.LibvirtLiveMigrateData(is_shared_block_storage=False))
    assert not driver._shared(None)


def test_a_live_migrations_destination_plugs_by_its_own_binding(driver_b, monkeypatch):
    # Nova hands the destination the network_info bound to the source (hybrid plug there);
    # the port's binding to the destination, in the migrate data, says native OVS: the
    # destination's agent prepares, and rolls back, what its own binding says.
    from nova.network import model as network_model
    instance = make_instance()
    port = str(uuid.uuid4())
    source_vif = network_model.VIF(
        id=port, address='fa:16:3e:00:00:01', type='ovs', vnic_type='normal',
        details={'ovs_hybrid_plug': True, 'port_filter': True},
        network=network_model.Network(id=str(uuid.uuid4()), bridge='br-int'))
    network_info = network_model.NetworkInfo([source_vif])
    data = objects.LibvirtLiveMigrateData(block_migration=True)
    dest = objects.VIFMigrateData(port_id=port, source_vif=source_vif, vif_type='ovs',
                                  vnic_type='normal', host=OTHER)
    dest.vif_details = {'ovs_hybrid_plug': False, 'port_filter': True}
    dest.profile = {}
    data.vifs = [dest]
    sent = []
    monkeypatch.setattr(driver_b.agent, 'host_half',
                        lambda uuid_, body: sent.append(body) or {})
    disk_info = json.dumps({'handover': {'name': instance.name, 'boot': {'type': 'none'}},
                            'source_uri': 'test:///default'})
    driver_b.pre_live_migration(None, instance, None, network_info, disk_info, data)
    driver_b.rollback_live_migration_at_destination(None, instance, network_info, None,
                                                    migrate_data=data)
    assert [b['action'] for b in sent] == ['pre-live-migration',
                                           'rollback-live-migration-at-destination']
    for body in sent:
        [vif] = body['handover']['network_info']
        assert (vif['id'], vif['details']['ovs_hybrid_plug']) == (port, False), body
    # The source's live_migration sends them to its agent for the destination's domain.
    actions = []
    monkeypatch.setattr(driver_b.agent, 'action',
                        lambda uuid_, body: actions.append(body) or {})
    data.target_connect_addr = 'qemu+tcp://192.0.2.11/system'
    driver_b.live_migration(None, instance, OTHER, post_method=lambda *a, **k: None,
                            recover_method=lambda *a, **k: None, migrate_data=data)
    [vif] = actions[0]['caller']['dest_network_info']
    assert (vif['id'], vif['details']['ovs_hybrid_plug']) == (port, False), actions
    # Without a binding per host in the migrate data, Nova's network_info is all there is.
    del sent[:]
    data = objects.LibvirtLiveMigrateData(block_migration=True)
    driver_b.pre_live_migration(None, instance, None, network_info, disk_info, data)
    [vif] = sent[0]['handover']['network_info']
    assert vif['details']['ovs_hybrid_plug'] is True
