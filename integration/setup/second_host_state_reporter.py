#!/usr/bin/python3
"""Reports an Open vSwitch agent state to neutron-server under a second host name.

This is NOT an agent: it wires nothing, runs no OVS or iptables code and never calls the
plugin's device RPCs. It only sends the heartbeat (`report_state` over RPC, the same call the
real neutron-openvswitch-agent makes every report_interval) so that ML2's openvswitch mechanism
driver finds a live agent on that host and can bind ports there (vif_type ovs). Ports bound to
that host stay DOWN, because no agent ever reports their devices up.

vireo's integration tests use it for cross-host bindings (resize revert, live migration) on a
single machine, where a second real OVS agent would fight the first over OVS and iptables.

Runs with Debian's python3 and the neutron / oslo.messaging libraries the neutron packages
install. Exits at once on SIGTERM/SIGINT.
"""

import argparse
import os
import signal
import sys
import time

from neutron_lib import constants as n_const
from neutron_lib import context as n_context
from neutron_lib.agent import topics
from oslo_config import cfg

from neutron.agent import rpc as agent_rpc
from neutron.api.rpc.callbacks import resources
from neutron.common import config as common_config
from neutron.conf.agent import common as agent_conf

# ovs_hybrid_plug as the real agent derives it from its firewall driver.
HYBRID_PLUG = {"iptables_hybrid": True, "openvswitch": False, "noop": False}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config-file", required=True, help="neutron.conf (transport_url)")
    p.add_argument("--host", default="h2", help="host name to report (default h2)")
    p.add_argument("--firewall-driver", default="iptables_hybrid", choices=sorted(HYBRID_PLUG))
    p.add_argument("--bridge-mappings", default="physnet1:br-phys",
                   help="comma-separated physnet:bridge pairs")
    p.add_argument("--tunnel-types", default="vxlan", help="comma-separated")
    p.add_argument("--tunneling-ip", default="127.0.0.2")
    p.add_argument("--datapath-type", default="netdev")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between reports")
    return p.parse_args(argv)


def agent_state(args):
    mappings = {}
    for pair in filter(None, args.bridge_mappings.split(",")):
        physnet, bridge = pair.split(":", 1)
        mappings[physnet.strip()] = bridge.strip()
    tunnel_types = [t.strip() for t in args.tunnel_types.split(",") if t.strip()]
    return {
        "binary": "neutron-openvswitch-agent",
        "host": args.host,
        "topic": n_const.L2_AGENT_TOPIC,
        "agent_type": n_const.AGENT_TYPE_OVS,
        "start_flag": True,
        "configurations": {
            "bridge_mappings": mappings,
            "tunnel_types": tunnel_types,
            "tunneling_ip": args.tunneling_ip,
            "l2_population": False,
            "arp_responder_enabled": False,
            "enable_distributed_routing": False,
            "integration_bridge": "br-int",
            "datapath_type": args.datapath_type,
            "ovs_hybrid_plug": HYBRID_PLUG[args.firewall_driver],
            "ovs_capabilities": {"datapath_types": [args.datapath_type], "iface_types": []},
            "resource_provider_bandwidths": {},
            "resource_provider_inventory_defaults": {},
            "devices": 0,
            "state_reporter_only": True,
        },
        "resource_versions": resources.LOCAL_RESOURCE_VERSIONS,
    }


def main(argv):
    args = parse_args(argv)
    common_config.register_common_config_options()
    agent_conf.register_agent_state_opts_helper(cfg.CONF)
    common_config.init(["--config-file", args.config_file])
    state_rpc = agent_rpc.PluginReportStateAPI(topics.REPORTS)
    context = n_context.get_admin_context_without_session()
    state = agent_state(args)

    # Nothing to clean up: leave at once, even from inside a blocked RPC call (oslo.messaging's
    # threads would otherwise keep the process alive for seconds).
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, lambda *_: os._exit(0))

    print(f"reporting an Open vSwitch agent state for host {args.host} every "
          f"{args.interval}s (ovs_hybrid_plug={state['configurations']['ovs_hybrid_plug']})",
          flush=True)
    while True:
        try:
            # use_call: the server's answer tells whether it took the report.
            result = state_rpc.report_state(context, state, use_call=True)
            if state.pop("start_flag", None):
                print(f"first report accepted: {result}", flush=True)
        except Exception as exc:  # keep reporting: the server may be restarting
            print(f"report_state failed: {exc!r}", file=sys.stderr, flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
