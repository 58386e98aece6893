#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ (committed; rerun after changing this).

Seeds are realistic inputs: a full Nova network_info with every vif_type vireo knows (as
Nova's network_info cache holds them), the live and inactive libvirt XML captured in
xml/tests/fixtures/, the device elements and vireo metadata inside them, Nova's
os-server-external-events body, and `vireo events explain` documents; plus a few hostile
variants (metacharacters, over-long names, duplicates, unknown types) so the fuzzer starts
next to every error path. Usage: python3 fuzz/make_seeds.py
"""

import copy
import json
import os
import re
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXTURES = os.path.join(ROOT, "xml", "tests", "fixtures")
CORPUS = os.path.join(HERE, "corpus")

NET = "5f0b0f3e-6f7a-4c4e-9a55-2a6a3a0c1b2d"
SERVER = "9a1c2e44-5d2b-4e55-9c51-3f0f3a6c4d10"
HOSTILE = "<a href=\"x\">&amp;'b'</a> ;|$(id)`id`"


def port(n):
    return "3b2c4d5e-0000-4000-8000-%012x" % n


def network(bridge="br-int", mtu=1442, physnet=None, tunneled=True):
    return {
        "id": NET,
        "bridge": bridge,
        "label": "private",
        "subnets": [
            {
                "cidr": "10.0.0.0/26",
                "dns": [],
                "gateway": {"address": "10.0.0.1", "type": "gateway", "version": 4, "meta": {}},
                "ips": [
                    {
                        "address": "10.0.0.5",
                        "type": "fixed",
                        "version": 4,
                        "meta": {},
                        "floating_ips": [],
                    }
                ],
                "routes": [],
                "version": 4,
                "meta": {"enable_dhcp": True, "dhcp_server": "10.0.0.2"},
            },
            {
                "cidr": "fd00:1::/64",
                "dns": [],
                "gateway": {"address": "fd00:1::1", "type": "gateway", "version": 6, "meta": {}},
                "ips": [
                    {
                        "address": "fd00:1::f816:3eff:fe00:1",
                        "type": "fixed",
                        "version": 6,
                        "meta": {},
                        "floating_ips": [],
                    }
                ],
                "routes": [],
                "version": 6,
                "meta": {"ipv6_address_mode": "slaac", "ipv6_ra_mode": "slaac"},
            },
        ],
        "meta": {
            "injected": False,
            "tenant_id": "3c8b5a2e9d1f4e6a8b7c6d5e4f3a2b1c",
            "mtu": mtu,
            "physical_network": physnet,
            "tunneled": tunneled,
        },
    }


def vif(n, vif_type, vnic_type="normal", details=None, profile=None, net=None, devname=True,
        active=True):
    pid = port(n)
    v = {
        "id": pid,
        "address": "fa:16:3e:00:00:%02x" % n,
        "network": net or network(),
        "type": vif_type,
        "details": details if details is not None else {},
        "devname": ("tap" + pid[:11]) if devname else None,
        "ovs_interfaceid": pid if vif_type == "ovs" else None,
        "qbh_params": None,
        "qbg_params": None,
        "active": active,
        "vnic_type": vnic_type,
        "profile": profile if profile is not None else {},
        "preserve_on_delete": False,
        "delegate_create": True,
        "meta": {},
    }
    return v


def every_vif_type():
    sriov = {"pci_vendor_info": "8086:154c", "pci_slot": "0000:81:10.2",
             "physical_network": "physnet2"}
    return [
        vif(1, "ovs", details={"connectivity": "l2", "port_filter": True,
                               "ovs_hybrid_plug": True, "datapath_type": "system",
                               "bridge_name": "br-int"}),
        vif(2, "ovs", details={"connectivity": "l2", "port_filter": True,
                               "ovs_hybrid_plug": False, "datapath_type": "system",
                               "bridge_name": "br-int"}, active=False),
        vif(3, "bridge", details={"connectivity": "l2", "port_filter": True},
            net=network(bridge="brq" + NET[:11], mtu=1450)),
        vif(4, "hw_veb", "direct", details={"connectivity": "l2", "port_filter": False,
                                            "vlan": "100"},
            profile=sriov, net=network(bridge=None, mtu=1500, physnet="physnet2",
                                       tunneled=False), devname=False),
        vif(5, "hw_veb", "macvtap", details={"connectivity": "l2", "port_filter": False,
                                             "vlan": "101"},
            profile=dict(sriov, pci_slot="0000:81:10.3"),
            net=network(bridge=None, mtu=1500, physnet="physnet2", tunneled=False)),
        vif(6, "hostdev_physical", "direct-physical", details={"connectivity": "l2",
                                                               "vlan": "0"},
            profile={"pci_vendor_info": "8086:1572", "pci_slot": "0000:82:00.0",
                     "physical_network": "physnet3"},
            net=network(bridge=None, mtu=9000, physnet="physnet3", tunneled=False),
            devname=False),
        vif(7, "vhostuser", details={"connectivity": "l2", "port_filter": False,
                                     "datapath_type": "netdev", "vhostuser_mode": "server",
                                     "vhostuser_ovs_plug": True,
                                     "vhostuser_socket": "/var/run/openvswitch/vhu"
                                     + port(7)[:11],
                                     "bridge_name": "br-int"}),
        vif(8, "tap", details={"port_filter": True}, net=network(bridge=None)),
        vif(9, "macvtap", details={"physical_interface": "eth1", "macvtap_mode": "bridge",
                                   "macvtap_source": "eth1.100", "vlan": 100},
            net=network(bridge=None, physnet="physnet1", tunneled=False)),
        vif(10, "vdpa", "vdpa", profile={"pci_vendor_info": "15b3:101e",
                                         "pci_slot": "0000:83:00.2",
                                         "physical_network": None}),
        vif(11, "ovs", "remote-managed",
            details={"connectivity": "l2", "port_filter": True},
            profile={"pci_vendor_info": "15b3:101e", "pci_slot": "0000:84:00.4",
                     "card_serial_number": "MT2113X00000", "pf_mac_address": "00:53:00:00:00:42",
                     "vf_num": 3}),
        vif(12, "ovs", "virtio-forwarder",
            details={"vhostuser_socket": "/run/vrtio/vf12", "vhostuser_mode": "client",
                     "port_filter": False}),
    ]


def hostile_variants():
    """One document per error path the issue names."""
    base = every_vif_type()[0]
    out = []

    def doc(name, mutate, n_vifs=2):
        vifs = [copy.deepcopy(base), vif(2, "ovs")]
        mutate(vifs)
        out.append((name, vifs[:n_vifs]))

    doc("metachar-devname", lambda v: v[1].update(devname="tap;$(reboot)"))
    doc("xml-in-label", lambda v: v[0]["network"].update(label=HOSTILE))
    doc("long-devname", lambda v: v[1].update(devname="tap0123456789abcdef"))
    doc("long-bridge", lambda v: v[1]["network"].update(bridge="br-int-much-too-long"))
    doc("dup-mac", lambda v: v[1].update(address=v[0]["address"]))
    doc("dup-port", lambda v: v[1].update(id=v[0]["id"]))
    doc("unknown-vif-type", lambda v: v[1].update(type="802.qbh"))
    doc("unbound", lambda v: v[1].update(type="binding_failed"))
    doc("unknown-vnic-type", lambda v: v[1].update(vnic_type="fancy"))
    doc("wrong-types", lambda v: v[1].update(active=1, details={"ovs_hybrid_plug": "yes",
                                                                "vlan": [1]}))
    doc("vlan-range", lambda v: v[1]["details"].update(vlan=4096))
    doc("mtu-range", lambda v: v[1]["network"]["meta"].update(mtu="70000"))
    doc("bad-pci", lambda v: v[1]["profile"].update(pci_slot="0000:81:20.9"))
    doc("multicast-mac", lambda v: v[1].update(address="01:00:5e:00:00:01"))
    doc("socket-metachar", lambda v: v[1]["details"].update(
        vhostuser_socket="/run/<x>&'\";|`id`") or v[1].update(type="vhostuser"))
    return out


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(os.path.join(d, name), mode) as f:
        f.write(data)


def js(v, pretty=False):
    return json.dumps(v, indent=1 if pretty else None, separators=None if pretty else (",", ":"))


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


def elements(xml, tag):
    return re.findall(r"<%s[ >].*?</%s>" % (tag, tag), xml, re.S)


HOSTDEV = """<hostdev mode='subsystem' type='pci' managed='yes'>
  <driver name='vfio'/>
  <source>
    <address domain='0x0000' bus='0x82' slot='0x00' function='0x0'/>
  </source>
  <alias name='hostdev0'/>
  <address type='pci' domain='0x0000' bus='0x05' slot='0x00' function='0x0'/>
</hostdev>"""

SRIOV_IFACE = """<interface type='hostdev' managed='yes'>
  <mac address='fa:16:3e:00:00:04'/>
  <driver name='vfio'/>
  <source>
    <address type='pci' domain='0x0000' bus='0x81' slot='0x10' function='0x2'/>
  </source>
  <vlan>
    <tag id='100'/>
  </vlan>
  <alias name='hostdev1'/>
  <address type='pci' domain='0x0000' bus='0x06' slot='0x00' function='0x0'/>
</interface>"""

VHOSTUSER_IFACE = """<interface type='vhostuser'>
  <mac address='fa:16:3e:00:00:07'/>
  <source type='unix' path='/var/run/openvswitch/vhu3b2c4d5e-00' mode='server'/>
  <target dev='vhu3b2c4d5e-00'/>
  <model type='virtio'/>
  <driver queues='4' rx_queue_size='1024' tx_queue_size='1024'/>
  <mtu size='9000'/>
</interface>"""

DIRECT_IFACE = """<interface type='direct'>
  <mac address='fa:16:3e:00:00:09'/>
  <source dev='eth1.100' mode='bridge'/>
  <target dev='macvtap0'/>
  <model type='virtio'/>
  <bandwidth>
    <inbound average='1000' peak='2000' burst='1024'/>
    <outbound average='500'/>
  </bandwidth>
</interface>"""

HOSTILE_IFACE = """<interface type='vhostuser'>
  <mac address='fa:16:3e:00:00:7f'/>
  <source type='unix' path='/run/&lt;x&gt;&amp;&apos;&quot;;|$(id)`id`' mode='client'/>
  <alias name='ua-&lt;&amp;&gt;'/>
</interface>"""

DISKS = [
    """<disk type='file' device='disk'>
  <driver name='qemu' type='qcow2' cache='none'/>
  <source file='/var/lib/vireo/instances/9a1c2e44/disk'/>
  <target dev='vda' bus='virtio'/>
  <alias name='virtio-disk0'/>
  <address type='pci' domain='0x0000' bus='0x04' slot='0x00' function='0x0'/>
</disk>""",
    """<disk type='network' device='disk'>
  <driver name='qemu' type='raw' cache='writeback' discard='unmap'/>
  <auth username='cinder'>
    <secret type='ceph' uuid='b3b4c5d6-0000-4000-8000-000000000001'/>
  </auth>
  <source protocol='rbd' name='volumes/volume-1'>
    <host name='192.0.2.10' port='6789'/>
    <host name='192.0.2.11' port='6789'/>
  </source>
  <target dev='vdb' bus='virtio'/>
  <serial>volume-1</serial>
</disk>""",
    """<disk type='block' device='cdrom'>
  <driver name='qemu' type='raw'/>
  <source dev='/dev/sr0'/>
  <target dev='sda' bus='sata'/>
  <readonly/>
  <address type='drive' controller='0' bus='0' target='0' unit='0'/>
</disk>""",
]


def main():
    if os.path.isdir(CORPUS):
        shutil.rmtree(CORPUS)

    full = every_vif_type()
    nis = [("nova-every-vif-type.json", js(full, pretty=True)),
           ("nova-every-vif-type-compact.json", js(full)),
           ("minimal-ovs.json", js([{"id": port(1), "address": "fa:16:3e:00:00:01",
                                     "type": "ovs"}])),
           ("empty.json", "[]")]
    for i, v in enumerate(full):
        nis.append(("one-%02d-%s-%s.json" % (i + 1, v["type"], v["vnic_type"]), js([v])))
    for name, doc in hostile_variants():
        nis.append(("bad-%s.json" % name, js(doc)))
    for name, text in nis:
        write("network_info", name, text)

    # vireo events explain documents.
    ops = [("spawn", None), ("hard-reboot", None), ("power-on", None),
           ("attach-interface", None), ("update-binding-profile", None),
           ("finish-resize", ("h1", "h2")), ("finish-resize", ("h1", "h1")),
           ("revert-resize", ("h1", "h2")), ("live-migration", ("h1", "h2")),
           ("post-live-migration", ("h1", "h2")), ("live-migration", ("h1", "h1")),
           ("revert-resize", None)]
    for i, (op, mig) in enumerate(ops):
        doc = {"operation": op, "network_info": full if i % 2 == 0 else full[:3]}
        if mig:
            doc["migration"] = {"source_compute": mig[0], "dest_compute": mig[1],
                                "migration_type": "resize", "status": "post-migrating"}
        if i % 3 == 1:
            doc["wiring"] = {"ovs_native": "pre-created", "linux_bridge": "libvirt-managed"}
        write("explain_input", "%02d-%s.json" % (i, op), js(doc, pretty=i % 2 == 1))
    write("explain_input", "bad-wiring.json",
          js({"operation": "spawn", "network_info": [], "wiring": {"ovs_native": "x"}}))
    write("explain_input", "bad-unknown-key.json",
          js({"operation": "spawn", "network_info": [], "extra": 1}))

    # Nova's POST /os-server-external-events body, and single events.
    events = [{"name": n, "server_uuid": SERVER, "tag": port(1), "status": s}
              for n, s in [("network-vif-plugged", "completed"),
                           ("network-vif-plugged", "failed"),
                           ("network-vif-unplugged", "completed"),
                           ("network-vif-deleted", "completed"),
                           ("network-changed", "completed"),
                           ("volume-extended", "completed"),
                           ("power-update", "in-progress"),
                           ("accelerator-request-bound", "completed"),
                           ("volume-reimaged", "completed")]]
    write("external_event", "body.json", js({"events": events}, pretty=True))
    for i, e in enumerate(events):
        write("external_event", "event-%d.json" % i, js(e))
    write("external_event", "no-status.json",
          js({"name": "network-vif-plugged", "server_uuid": SERVER, "tag": port(2)}))
    write("external_event", "no-tag.json",
          js({"name": "network-changed", "server_uuid": SERVER}))

    # Domain XML: libvirt's live and inactive documents, and one with devices vireo adds.
    docs = {}
    for f in sorted(os.listdir(FIXTURES)):
        if f.endswith(".xml"):
            docs[f] = fixture(f)
            write("domain_xml", f, docs[f])
    live = [docs["live-kvm-q35.xml"], docs["live-qemu-q35.xml"], docs["inactive-kvm-q35.xml"]]
    with_pci = live[0].replace("</devices>", HOSTDEV + "\n" + SRIOV_IFACE + "\n"
                               + DIRECT_IFACE + "\n" + DISKS[0] + "\n</devices>")
    write("domain_xml", "live-with-passthrough.xml", with_pci)

    # Device elements: from the fixtures, plus every other form vireo writes.
    devs = [HOSTDEV, SRIOV_IFACE, VHOSTUSER_IFACE, DIRECT_IFACE, HOSTILE_IFACE] + DISKS
    for text in live[:2]:
        devs += elements(text, "interface")
    for i, text in enumerate(devs):
        write("device_xml", "%02d.xml" % i, text)

    # vireo metadata: prefixed (in a domain), and as virDomainGetMetadata returns it.
    meta = elements(live[0], "vireo:instance")[0]
    write("metadata_xml", "prefixed.xml", meta)
    plain = re.sub(r"<(/?)vireo:", r"<\1", meta).replace(
        ' xmlns:vireo="', ' xmlns="')
    write("metadata_xml", "plain.xml", plain)
    op = ('<vireo:operation id="req-1" kind="resize" phase="finish" started_at="1764000000000">'
          '{"old_flavor":"m1.small","dest":"h2"}</vireo:operation>\n    </vireo:instance>')
    write("metadata_xml", "with-operation.xml", meta.replace("</vireo:instance>", op))

    # Live rewrite: selector byte (edit % 8, device pick), then the document.
    for sel in "01234567":
        write("live_rewrite", "%s-live.xml" % sel, sel + live[0])
        write("live_rewrite", "%s-passthrough.xml" % sel, sel + with_pci)
    write("live_rewrite", "8-inactive.xml", "8" + live[-1])


if __name__ == "__main__":
    main()
