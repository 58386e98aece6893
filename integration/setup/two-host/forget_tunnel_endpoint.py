#!/usr/bin/python3
"""Removes host B's vxlan tunnel endpoint from Neutron after host B is gone.

A real neutron-openvswitch-agent announces its tunnel address (`tunnel_sync`); neutron-server
stores it in `ml2_vxlan_endpoints` and fans out `tunnel_update`, so every other agent (host A's)
adds a vxlan port towards it to its br-tun. Neutron has no API to forget an endpoint (deleting the
agent leaves it). This does what neutron-server itself does when a host's tunnel address changes:
delete the endpoint row (only for that address *and* host), then fan out `tunnel_delete`, upon
which the other agents remove their tunnel port to it.

Used by integration/two-host.sh down. Runs with Debian's python3 and the neutron libraries of the
neutron packages; needs host A's neutron.conf (transport_url, [database] connection).
"""

import argparse
import sys

from neutron_lib import context as n_context
from neutron_lib.agent import topics
from oslo_config import cfg

from neutron.common import config as common_config
from neutron.plugins.ml2 import rpc as ml2_rpc
from neutron.plugins.ml2.drivers import type_vxlan


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config-file", required=True, help="host A's neutron.conf")
    p.add_argument("--host", required=True, help="host B's agent host name")
    p.add_argument("--ip", required=True, help="host B's tunnel address (local_ip)")
    args = p.parse_args(argv)

    common_config.register_common_config_options()
    common_config.init(["--config-file", args.config_file])
    driver = type_vxlan.VxlanTypeDriver()
    endpoint = driver.get_endpoint_by_ip(args.ip)
    if endpoint is None:
        print(f"no vxlan endpoint {args.ip}: nothing to do", flush=True)
        return 0
    if endpoint.host != args.host:
        print(f"vxlan endpoint {args.ip} belongs to host {endpoint.host!r}, not "
              f"{args.host!r}: left alone", flush=True)
        return 0
    driver.delete_endpoint(args.ip)
    notifier = ml2_rpc.AgentNotifierApi(topics.AGENT)
    notifier.tunnel_delete(n_context.get_admin_context(), args.ip, "vxlan")
    print(f"deleted vxlan endpoint {args.ip} (host {args.host}) and sent tunnel_delete",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
