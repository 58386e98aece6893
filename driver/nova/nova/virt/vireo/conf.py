"""The ``[vireo]`` section of nova.conf: how the driver reaches this host's vireo agent."""

from oslo_config import cfg

vireo_group = cfg.OptGroup('vireo', title='vireo agent',
                           help='The vireo agent this nova-compute drives (one per host).')

vireo_opts = [
    cfg.URIOpt('agent_url', default='http://127.0.0.1:8774', schemes=['http', 'https'],
               help="The agent's HTTP API (its `listen`). nova-api also defaults to port 8774: "
                    'on a host that runs both, move the agent.'),
    cfg.StrOpt('token_file', default='/etc/vireo/api-token',
               help="A file holding the agent's API token (mode 0600, as the agent wants)."),
    cfg.FloatOpt('request_timeout', default=30.0, min=1.0,
                 help='Seconds one HTTP request to the agent may take.'),
    cfg.IntOpt('operation_timeout', default=3600, min=1,
               help='Seconds the driver waits for one agent operation (a spawn, a resize '
                    'step, a migration) to finish before it gives up on it.'),
    cfg.IntOpt('agent_restart_timeout', default=300, min=1,
               help='Seconds a live migration whose agent went away while it ran waits for '
                    'the agent to come back and recover it: the outcome (the guest left, or '
                    'stayed) decides whether Nova finishes or rolls back the migration.'),
    cfg.StrOpt('migration_uri',
               help="The libvirt URI other hosts reach this host's libvirtd at: a resize's "
                    'destination copies the disks from it. Default: qemu+tcp://<my_ip>/system '
                    "(Nova's libvirt driver's live_migration_scheme tcp and "
                    'live_migration_inbound_addr).'),
    cfg.IntOpt('kept_events_per_instance', default=32, min=1,
               help='Network events kept per instance that arrived before Nova waited for '
                    'them (oldest dropped first).'),
    cfg.FloatOpt('stopped_event_delay', default=15.0, min=0.0,
                 help='Seconds a guest\'s "stopped" lifecycle event is held before Nova is '
                      'told, and dropped if another event of the guest comes first (a '
                      'reboot stops and starts it): the delay Nova\'s libvirt driver uses.'),
]


def register_opts(conf):
    conf.register_group(vireo_group)
    conf.register_opts(vireo_opts, group=vireo_group)


def list_opts():
    return {vireo_group: vireo_opts}
