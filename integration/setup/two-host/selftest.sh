# shellcheck shell=bash disable=SC2016
# integration/setup/two-host/selftest.sh — `two-host.sh selftest`, sourced by two-host.sh (uses
# its variables and helpers). Real migrations between host A (qemu:///system) and host B:
#
#   bridge   diskless domain, NIC on vhb-br0: live, peer-to-peer, --persistent --undefinesource,
#            A -> B -> A; the guest's MAC must show up behind the data link in the other host's
#            bridge (QEMU's self-announce after the switch-over)
#   ovs      diskless domain, NIC on an OVS bridge (virtualport openvswitch) that exists in A's
#            and B's Open vSwitch: live, managed (not peer-to-peer), A -> B -> A; the port with its
#            iface-id must move from A's OVS to B's and back
#   boot     a booted TCG guest (integration/guest/build-guest.sh): live A -> B -> A with a new
#            serial log per host (--xml); a magic SysRq sent to the guest on each host must be
#            answered there, with the guest clock still running (not rebooted)
#   neutron  (host B runs an agent) a Neutron port: bound to A, plugged by libvirt into A's br-int
#            (ACTIVE); inactive binding for B, live migration, activation on B: B's agent wires it
#            (ACTIVE on B), then back; --events also checks network-vif-unplugged/-plugged
#   cold     (host B runs an agent) resize-like cross-host move and revert: stop on A, define and
#            start on B with the port rebound to B (ACTIVE there), then back to A
#   fail     migrations that must fail cleanly: unreachable destination libvirtd; a migration
#            stream that cannot connect (the domain keeps running on A, nothing stays on B)
#
# Prints PASS/FAIL lines and TIMING lines; exits 1 when a check failed.

SELFTEST_EVENTS=${SELFTEST_EVENTS:-0}
SELFTEST_BOOT=${SELFTEST_BOOT:-1}
SELFTEST_ONLY=${SELFTEST_ONLY:-bridge,ovs,boot,neutron,cold,fail}
part() { [[ ,$SELFTEST_ONLY, == *,$1,* ]]; }

ST_ID=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
ST=vhb-st-$ST_ID # every domain and port name starts with it
ST_OVSBR=vhbo$ST_ID
ST_WORK=
ST_PASS=0
ST_FAIL=0
ST_EVENTS_PID=
ST_A_OVSBR=0

vA() { virsh -q -c qemu:///system "$@"; }
vB() { virsh -q -c "$HB_URI" "$@"; }
pass() {
  ST_PASS=$((ST_PASS + 1))
  echo "PASS $*"
}
fail() {
  ST_FAIL=$((ST_FAIL + 1))
  echo "FAIL $*"
}
check() { # check DESCRIPTION CMD...
  local d=$1
  shift
  if "$@" >/dev/null 2>&1; then pass "$d"; else fail "$d"; fi
}
uuid() { cat /proc/sys/kernel/random/uuid; }
not() { ! "$@"; }
mac() { printf '52:54:00:%02x:%02x:%02x\n' $((RANDOM % 256)) $((RANDOM % 256)) "$1"; }

running_on() { # running_on A|B NAME
  local st
  if [[ $1 == A ]]; then st=$(vA domstate "$2" 2>/dev/null); else st=$(vB domstate "$2" 2>/dev/null); fi
  [[ $st == running ]]
}
absent_on() { # absent_on A|B NAME: no domain of that name (neither running nor defined)
  if [[ $1 == A ]]; then ! vA dominfo "$2" >/dev/null 2>&1; else ! vB dominfo "$2" >/dev/null 2>&1; fi
}
persistent_on() { # persistent_on A|B NAME
  local out
  if [[ $1 == A ]]; then out=$(vA dominfo "$2"); else out=$(vB dominfo "$2"); fi
  grep -qE '^Persistent: +yes' <<<"$out"
}
fdb_behind() { # fdb_behind A|B MAC PORT: that host's vhb-br0 learned MAC on PORT
  local out
  if [[ $1 == A ]]; then out=$(bridge fdb show br "$BRIDGE"); else out=$(in_b bridge fdb show br "$BRIDGE"); fi
  grep -qi "^$2 dev $3 " <<<"$out"
}
tap_in_bridge() { # tap_in_bridge A|B TAP
  if [[ $1 == A ]]; then ip -o link show master "$BRIDGE" | grep -q ": $2[@:]"; else
    ip -n "$NETNS" -o link show master "$BRIDGE" | grep -q ": $2[@:]"
  fi
}
ovs_a() { ovs-vsctl --timeout=10 "$@"; } # host A's Open vSwitch: only ports/bridges we made
ovs_on() { if [[ $1 == A ]]; then shift && ovs_a "$@"; else shift && ovs_b "$@"; fi; }
ovs_port_iface_id() { # ovs_port_iface_id A|B BRIDGE TAP IFACE_ID
  ovs_on "$1" list-ports "$2" | grep -qx "$3" &&
    [[ $(ovs_on "$1" get Interface "$3" external_ids:iface-id | tr -d '"') == "$4" ]]
}
ovs_port_absent() { ! ovs_on "$1" list-ports "$2" | grep -qx "$3"; }
ovs_port_wired() { # ovs_port_wired A|B TAP: in br-int with a real local VLAN (not the agent's dead 4095)
  local tag
  tag=$(ovs_on "$1" get Port "$2" tag 2>/dev/null) || return 1
  [[ $tag =~ ^[0-9]+$ && $tag != 4095 ]]
}

# migrate LABEL VIRSH_SIDE ARGS...: a timed migration; records TIMING LABEL.
migrate() {
  local label=$1 side=$2 s rc=0
  shift 2
  s=$(now)
  if [[ $side == A ]]; then vA migrate "$@" || rc=$?; else vB migrate "$@" || rc=$?; fi
  record "$label" "$s"
  if ((rc == 0)); then pass "$label: virsh migrate succeeded"; else fail "$label: virsh migrate exited $rc"; fi
  return $rc
}

# dom_xml NAME UUID TYPE NIC_XML [KERNEL_DIR SERIAL_LOG]
dom_xml() {
  local name=$1 id=$2 type=$3 nic=$4 kdir=${5:-} serial=${6:-} os mem=128
  os="<type arch='x86_64' machine='q35'>hvm</type>"
  if [[ -n $kdir ]]; then
    mem=256
    os+="<kernel>$kdir/vmlinuz</kernel><initrd>$kdir/initrd.img</initrd>"
    os+="<cmdline>$(cat "$kdir/cmdline") vireo.nics=1</cmdline>"
  fi
  cat <<EOF
<domain type='$type'>
  <name>$name</name>
  <uuid>$id</uuid>
  <memory unit='MiB'>$mem</memory>
  <vcpu>1</vcpu>
  <os>$os</os>
  <on_crash>destroy</on_crash>
  <devices>
    $nic
    ${serial:+<serial type='file'><source path='$serial'/><target port='0'/></serial>}
    <input type='keyboard' bus='ps2'/>
  </devices>
</domain>
EOF
}
bridge_nic() { echo "<interface type='bridge'><source bridge='$1'/><mac address='$2'/><target dev='$3'/><model type='virtio'/></interface>"; }
ovs_nic() { # ovs_nic BRIDGE MAC TAP IFACE_ID
  echo "<interface type='bridge'><source bridge='$1'/><mac address='$2'/><virtualport type='openvswitch'><parameters interfaceid='$4'/></virtualport><target dev='$3'/><model type='virtio'/></interface>"
}

accel() { if [[ -c /dev/kvm ]]; then echo kvm; else echo qemu; fi; }

st_cleanup() {
  local d
  for d in $(vA list --all --name 2>/dev/null | grep "^$ST-" || true); do
    vA destroy "$d" >/dev/null 2>&1 || true
    vA undefine "$d" >/dev/null 2>&1 || true
  done
  for d in $(vB list --all --name 2>/dev/null | grep "^$ST-" || true); do
    vB destroy "$d" >/dev/null 2>&1 || true
    vB undefine "$d" >/dev/null 2>&1 || true
  done
  if have_neutron && st_neutron_env; then
    for d in $(api GET "/v2.0/ports?name=$ST-lm" | jq -r '.ports[].id') \
      $(api GET "/v2.0/ports?name=$ST-cold" | jq -r '.ports[].id'); do
      port_delete "$d" || true
    done
  fi
  ((ST_A_OVSBR)) && ovs_a --if-exists del-br "$ST_OVSBR"
  ovs_b --if-exists del-br "$ST_OVSBR" >/dev/null 2>&1 || true
  [[ -n $ST_EVENTS_PID ]] && kill "$ST_EVENTS_PID" 2>/dev/null
  [[ -n $ST_WORK ]] && rm -rf "$ST_WORK"
}

# ---------------------------------------------------------------------------------------------

st_bridge() {
  local name=$ST-br id mac tap=vhb${ST_ID}b0
  id=$(uuid)
  mac=$(mac 1)
  echo "== bridge: $name ($(accel)), NIC on $BRIDGE, live peer-to-peer --persistent --undefinesource"
  dom_xml "$name" "$id" "$(accel)" "$(bridge_nic "$BRIDGE" "$mac" "$tap")" >"$ST_WORK/$name.xml"
  if ! vA define "$ST_WORK/$name.xml" >/dev/null || ! vA start "$name" >/dev/null; then
    fail "bridge: start on A"
    return 1
  fi
  check "bridge: running on A" running_on A "$name"
  migrate bridge-live-p2p-a-to-b A --live --p2p --persistent --undefinesource "$name" "$HB_URI" || return
  check "bridge: running on B" running_on B "$name"
  check "bridge: persistent on B" persistent_on B "$name"
  check "bridge: gone from A (no definition left)" absent_on A "$name"
  check "bridge: B's tap $tap in B's $BRIDGE" tap_in_bridge B "$tap"
  check "bridge: A's $BRIDGE learned the guest MAC behind $LINK_A" wait_for 10 "fdb" fdb_behind A "$mac" "$LINK_A"
  migrate bridge-live-p2p-b-to-a B --live --p2p --persistent --undefinesource "$name" \
    "$HA_URI_FROM_B" --migrateuri "tcp://$ADDR_A" || return
  check "bridge: running on A again" running_on A "$name"
  check "bridge: persistent on A" persistent_on A "$name"
  check "bridge: gone from B" absent_on B "$name"
  check "bridge: B's $BRIDGE learned the guest MAC behind $LINK_B" wait_for 10 "fdb" fdb_behind B "$mac" "$LINK_B"
  vA destroy "$name" >/dev/null && vA undefine "$name" >/dev/null
}

st_ovs() {
  local name=$ST-ovs id mac tap=vhb${ST_ID}o0 ifid
  id=$(uuid)
  ifid=$(uuid)
  mac=$(mac 2)
  echo "== ovs: $name ($(accel)), NIC on OVS bridge $ST_OVSBR (A's and B's OVS), live managed (non-p2p)"
  ST_A_OVSBR=1
  ovs_a -- --may-exist add-br "$ST_OVSBR" -- set Bridge "$ST_OVSBR" datapath_type=netdev
  ovs_b -- --may-exist add-br "$ST_OVSBR" -- set Bridge "$ST_OVSBR" datapath_type=netdev
  dom_xml "$name" "$id" "$(accel)" "$(ovs_nic "$ST_OVSBR" "$mac" "$tap" "$ifid")" >"$ST_WORK/$name.xml"
  vA create "$ST_WORK/$name.xml" >/dev/null || {
    fail "ovs: create on A"
    return
  }
  check "ovs: A's OVS has $tap with iface-id" ovs_port_iface_id A "$ST_OVSBR" "$tap" "$ifid"
  migrate ovs-live-managed-a-to-b A --live "$name" "$HB_URI" || return
  check "ovs: running on B" running_on B "$name"
  check "ovs: gone from A" absent_on A "$name"
  check "ovs: B's OVS has $tap with iface-id" ovs_port_iface_id B "$ST_OVSBR" "$tap" "$ifid"
  check "ovs: B's OVS port carries vm-id $id" \
    test "$(ovs_b get Interface "$tap" external_ids:vm-id | tr -d '"')" = "$id"
  check "ovs: A's OVS port removed" ovs_port_absent A "$ST_OVSBR" "$tap"
  migrate ovs-live-managed-b-to-a B --live "$name" qemu:///system --migrateuri "tcp://$ADDR_A" || return
  check "ovs: running on A again" running_on A "$name"
  check "ovs: gone from B" absent_on B "$name"
  check "ovs: A's OVS has $tap again" ovs_port_iface_id A "$ST_OVSBR" "$tap" "$ifid"
  check "ovs: B's OVS port removed" ovs_port_absent B "$ST_OVSBR" "$tap"
  vA destroy "$name" >/dev/null
  ovs_a --if-exists del-br "$ST_OVSBR"
  ovs_b --if-exists del-br "$ST_OVSBR"
  ST_A_OVSBR=0
}

# sysrq_answered A|B NAME LOG LEVEL: send Alt+SysRq+LEVEL; the guest prints "Loglevel set to LEVEL"
# on its serial console; prints the guest's timestamp of that line.
sysrq_answered() {
  local side=$1 name=$2 logf=$3 lvl=$4 i line
  if [[ $side == A ]]; then vA send-key "$name" KEY_LEFTALT KEY_SYSRQ "KEY_$lvl" >/dev/null; else
    vB send-key "$name" KEY_LEFTALT KEY_SYSRQ "KEY_$lvl" >/dev/null
  fi
  for ((i = 0; i < 100; i++)); do
    line=$(grep -a "Loglevel set to $lvl" "$logf" 2>/dev/null | tail -1)
    if [[ -n $line ]]; then
      sed -E 's/^\[ *([0-9.]+)\].*/\1/' <<<"$line"
      return 0
    fi
    sleep 0.2
  done
  return 1
}
serial_log() { # serial_log FILE: an empty file the QEMU of either host can be handed
  install -m 600 /dev/null "$1"
}

st_boot() {
  local name=$ST-boot id mac tap=vhb${ST_ID}g0 g=$ST_WORK/guest s t1 t2 up0
  id=$(uuid)
  mac=$(mac 3)
  echo "== boot: $name (TCG guest booted from $g), NIC on $BRIDGE, live p2p A -> B -> A"
  "$SCRIPT_DIR/guest/build-guest.sh" "$g" >/dev/null 2>"$ST_WORK/build-guest.log" || {
    fail "boot: build-guest.sh"
    return
  }
  serial_log "$ST_WORK/serial-a.log"
  serial_log "$ST_WORK/serial-b.log"
  serial_log "$ST_WORK/serial-a2.log"
  dom_xml "$name" "$id" qemu "$(bridge_nic "$BRIDGE" "$mac" "$tap")" "$g" "$ST_WORK/serial-a.log" \
    >"$ST_WORK/$name.xml"
  s=$(now)
  vA create "$ST_WORK/$name.xml" >/dev/null || {
    fail "boot: create on A"
    return
  }
  if wait_for 120 "the guest on A" grep -q VIREO-GUEST-READY "$ST_WORK/serial-a.log"; then
    record boot-ready-on-a "$s"
    pass "boot: guest READY on A"
  else
    fail "boot: guest READY on A"
    return
  fi
  up0=$(sed -n 's/.*VIREO-GUEST-READY.*uptime=\([0-9.]*\).*/\1/p' "$ST_WORK/serial-a.log")
  # Each host writes its own serial log: the destination definition names another file.
  vA dumpxml --migratable "$name" | sed "s|$ST_WORK/serial-a.log|$ST_WORK/serial-b.log|" >"$ST_WORK/$name-b.xml"
  migrate boot-live-p2p-a-to-b A --live --p2p "$name" "$HB_URI" --xml "$ST_WORK/$name-b.xml" || return
  check "boot: running on B" running_on B "$name"
  check "boot: gone from A" absent_on A "$name"
  if t1=$(sysrq_answered B "$name" "$ST_WORK/serial-b.log" 8); then
    pass "boot: guest answers SysRq on B (guest clock ${t1}s, READY was at ${up0}s: same boot)"
    awk -v a="$t1" -v b="$up0" 'BEGIN { exit !(a > b) }' || fail "boot: guest clock went back on B"
  else
    fail "boot: guest answers SysRq on B"
  fi
  check "boot: nothing new in A's serial log after the switch-over" \
    not grep -q "Loglevel set to 8" "$ST_WORK/serial-a.log"
  vB dumpxml --migratable "$name" | sed "s|$ST_WORK/serial-b.log|$ST_WORK/serial-a2.log|" >"$ST_WORK/$name-a2.xml"
  migrate boot-live-p2p-b-to-a B --live --p2p "$name" "$HA_URI_FROM_B" \
    --migrateuri "tcp://$ADDR_A" --xml "$ST_WORK/$name-a2.xml" || return
  check "boot: running on A again" running_on A "$name"
  if t2=$(sysrq_answered A "$name" "$ST_WORK/serial-a2.log" 7); then
    pass "boot: guest answers SysRq on A again (guest clock ${t2}s)"
    awk -v a="$t2" -v b="$t1" 'BEGIN { exit !(a > b) }' || fail "boot: guest clock went back on A"
  else
    fail "boot: guest answers SysRq on A again"
  fi
  vA destroy "$name" >/dev/null
}

# ---------------------------------------------------------------------------------------------
# Neutron

A_HOST=
NET_ID=
st_neutron_env() {
  A_HOST=$(sed -n 's/^VIREO_NEUTRON_HOST=//p' "$A_NEUTRON_ENV")
  NET_ID=$(sed -n 's/^VIREO_NEUTRON_NETWORK_ID=//p' "$A_NEUTRON_ENV")
  [[ -n $A_HOST && -n $NET_ID ]]
}
port_create() { # port_create NAME DEVICE_ID HOST -> port JSON
  api POST /v2.0/ports "{\"port\": {\"network_id\": \"$NET_ID\", \"project_id\": \"vireo\",
    \"name\": \"$1\", \"device_owner\": \"compute:nova\", \"device_id\": \"$2\",
    \"binding:host_id\": \"$3\"}}"
}
# binding_create PORT HOST: an inactive binding (noauth Neutron wants the project in the body).
binding_create() {
  api POST "/v2.0/ports/$1/bindings" "{\"binding\": {\"host\": \"$2\", \"project_id\": \"vireo\"}}"
}
# port_delete ID: also a port left with no binding at all (after a failed run), which Neutron
# refuses to delete (PortBindingNotFound) until it has one again.
port_delete() {
  api DELETE "/v2.0/ports/$1" >/dev/null 2>&1 && return
  binding_create "$1" "$A_HOST" >/dev/null 2>&1 || true
  api DELETE "/v2.0/ports/$1" >/dev/null
}
port_is() { # port_is ID STATUS HOST
  local p
  p=$(api GET "/v2.0/ports/$1") || return 1
  jq -e --arg s "$2" --arg h "$3" '.port.status == $s and .port."binding:host_id" == $h' <<<"$p" >/dev/null
}
# wait_wired LABEL SIDE HOST PORT TAP [SINCE]: port ACTIVE on HOST and its OVS port on that host
# has a local VLAN; records TIMING LABEL from SINCE (default: now).
wait_wired() {
  local label=$1 side=$2 host=$3 port=$4 tap=$5 s=${6:-}
  [[ -n $s ]] || s=$(now)
  if wait_for 60 "port $port ACTIVE on $host" port_is "$port" ACTIVE "$host" &&
    wait_for 30 "$tap wired on $side" ovs_port_wired "$side" "$tap"; then
    record "$label" "$s"
    pass "$label: port ACTIVE on $host, $tap wired by host $side's agent"
  else
    fail "$label: port ACTIVE on $host with $tap wired on $side (port: $(api GET "/v2.0/ports/$port" |
      jq -c '.port | {status, host: ."binding:host_id", vif_type: ."binding:vif_type"}'))"
    return 1
  fi
}

events_start() {
  local port
  port=$(sed -n 's/^VIREO_NOVA_PORT=//p' "$A_NEUTRON_ENV")
  if tcp_open 127.0.0.1 "$port"; then
    fail "events: 127.0.0.1:$port is taken (another test's Nova endpoint?); run without --events"
    SELFTEST_EVENTS=0
    return
  fi
  "$PY" "$SCRIPT_DIR/setup/nova_events_listener.py" --port "$port" --max-seconds 900 \
    >"$ST_WORK/events" 2>"$ST_WORK/events.log" &
  ST_EVENTS_PID=$!
  wait_for 10 "the events listener" grep -q listening "$ST_WORK/events.log" ||
    fail "events: listener did not start"
}
# event_seen NAME TAG SINCE: Neutron POSTed event NAME for port TAG at or after unix time SINCE.
event_seen() {
  jq -n -e --arg n "$1" --arg t "$2" --argjson s "$3" \
    'any(inputs; .name == $n and .tag == $t and .t >= $s)' "$ST_WORK/events" >/dev/null 2>&1
}
event_delay() { # event_delay NAME TAG SINCE: seconds from SINCE to the first such event
  jq -n -r --arg n "$1" --arg t "$2" --argjson s "$3" \
    '[inputs | select(.name == $n and .tag == $t and .t >= $s) | .t - $s] | first // empty
     | . * 100 | round / 100' "$ST_WORK/events"
}
check_event() { # check_event LABEL NAME TAG SINCE
  ((SELFTEST_EVENTS)) || return 0
  if wait_for 20 "$2 for $3" event_seen "$2" "$3" "$4"; then
    pass "$1: Neutron sent $2 $(event_delay "$2" "$3" "$4")s after it"
  else
    fail "$1: Neutron sent $2"
  fi
}
events_of() { # events_of PORT SINCE: the events Neutron sent for PORT, one line each
  ((SELFTEST_EVENTS)) || return 0
  sleep 3 # the notifier batches events per send_events_interval: let the last batch arrive
  jq -n -r --arg t "$1" --argjson s "$2" \
    'inputs | select(.tag == $t) | "EVENT +\(.t - $s | . * 10 | round / 10)s \(.name) \(.status // "-")"' \
    "$ST_WORK/events"
}

st_neutron_live() {
  local name=$ST-lm id mac tap=vhb${ST_ID}n0 p port s t_start
  id=$(uuid)
  t_start=$(now)
  echo "== neutron: $name, port bound to $A_HOST, live migration with multiple port bindings"
  p=$(port_create "$ST-lm" "$id" "$A_HOST") || {
    fail "neutron: create port"
    return
  }
  port=$(jq -r .port.id <<<"$p")
  mac=$(jq -r .port.mac_address <<<"$p")
  dom_xml "$name" "$id" "$(accel)" "$(ovs_nic br-int "$mac" "$tap" "$port")" >"$ST_WORK/$name.xml"
  s=$(now)
  vA create "$ST_WORK/$name.xml" >/dev/null || {
    fail "neutron: create on A"
    return
  }
  wait_wired neutron-plug-on-a A "$A_HOST" "$port" "$tap" "$s" || return
  check_event "neutron: plug on A" network-vif-plugged "$port" "$s"
  # Destination binding (inactive), as Nova's pre_live_migration does.
  check "neutron: inactive binding for $HB_NAME" \
    binding_create "$port" "$HB_NAME"
  migrate neutron-live-p2p-a-to-b A --live --p2p "$name" "$HB_URI" || return
  check "neutron: running on B" running_on B "$name"
  check "neutron: B's br-int has $tap with iface-id $port" ovs_port_iface_id B br-int "$tap" "$port"
  check "neutron: A's br-int port $tap removed" ovs_port_absent A br-int "$tap"
  s=$(now)
  check "neutron: activate the binding on $HB_NAME" api PUT "/v2.0/ports/$port/bindings/$HB_NAME/activate"
  wait_wired neutron-activate-on-b B "$HB_NAME" "$port" "$tap" "$s"
  check_event "neutron: activation on B" network-vif-unplugged "$port" "$s"
  check_event "neutron: activation on B" network-vif-plugged "$port" "$s"
  check "neutron: delete the old binding on $A_HOST" api DELETE "/v2.0/ports/$port/bindings/$A_HOST"
  check "neutron: inactive binding for $A_HOST" \
    binding_create "$port" "$A_HOST"
  migrate neutron-live-p2p-b-to-a B --live --p2p "$name" "$HA_URI_FROM_B" \
    --migrateuri "tcp://$ADDR_A" || return
  check "neutron: running on A again" running_on A "$name"
  check "neutron: B's br-int port $tap removed" ovs_port_absent B br-int "$tap"
  s=$(now)
  check "neutron: activate the binding on $A_HOST" api PUT "/v2.0/ports/$port/bindings/$A_HOST/activate"
  wait_wired neutron-activate-on-a A "$A_HOST" "$port" "$tap" "$s"
  check_event "neutron: activation on A" network-vif-unplugged "$port" "$s"
  check_event "neutron: activation on A" network-vif-plugged "$port" "$s"
  check "neutron: delete the old binding on $HB_NAME" api DELETE "/v2.0/ports/$port/bindings/$HB_NAME"
  vA destroy "$name" >/dev/null
  check "neutron: delete port" port_delete "$port"
  events_of "$port" "$t_start"
}

st_neutron_cold() {
  local name=$ST-cold id mac tap=vhb${ST_ID}c0 p port s t_start
  id=$(uuid)
  t_start=$(now)
  echo "== cold: $name, resize-like move A -> B (stop, define on B, rebind, start) and revert"
  p=$(port_create "$ST-cold" "$id" "$A_HOST") || {
    fail "cold: create port"
    return
  }
  port=$(jq -r .port.id <<<"$p")
  mac=$(jq -r .port.mac_address <<<"$p")
  dom_xml "$name" "$id" "$(accel)" "$(ovs_nic br-int "$mac" "$tap" "$port")" >"$ST_WORK/$name.xml"
  s=$(now)
  if ! vA define "$ST_WORK/$name.xml" >/dev/null || ! vA start "$name" >/dev/null; then
    fail "cold: start on A"
    return 1
  fi
  wait_wired cold-plug-on-a A "$A_HOST" "$port" "$tap" "$s" || return
  s=$(now)
  vA destroy "$name" >/dev/null
  vA dumpxml --inactive --migratable "$name" >"$ST_WORK/$name-b.xml"
  vB define "$ST_WORK/$name-b.xml" >/dev/null
  api PUT "/v2.0/ports/$port" "{\"port\": {\"binding:host_id\": \"$HB_NAME\"}}" >/dev/null
  vB start "$name" >/dev/null || fail "cold: start on B"
  check "cold: running on B" running_on B "$name"
  check "cold: A keeps its (stopped) definition until the resize is confirmed" persistent_on A "$name"
  wait_wired cold-move-a-to-b B "$HB_NAME" "$port" "$tap" "$s"
  check_event "cold: start on B" network-vif-plugged "$port" "$s"
  # Revert: back to A.
  s=$(now)
  vB destroy "$name" >/dev/null
  vB undefine "$name" >/dev/null
  api PUT "/v2.0/ports/$port" "{\"port\": {\"binding:host_id\": \"$A_HOST\"}}" >/dev/null
  vA start "$name" >/dev/null || fail "cold: start on A after revert"
  check "cold: gone from B" absent_on B "$name"
  wait_wired cold-revert-b-to-a A "$A_HOST" "$port" "$tap" "$s"
  check_event "cold: revert to A" network-vif-plugged "$port" "$s"
  vA destroy "$name" >/dev/null
  vA undefine "$name" >/dev/null
  check "cold: delete port" port_delete "$port"
  events_of "$port" "$t_start"
}

# ---------------------------------------------------------------------------------------------

st_fail() {
  local name=$ST-fail id s rc
  id=$(uuid)
  echo "== fail: migrations that must fail, leaving the domain running on A"
  dom_xml "$name" "$id" "$(accel)" "$(bridge_nic "$BRIDGE" "$(mac 4)" "vhb${ST_ID}f0")" >"$ST_WORK/$name.xml"
  vA create "$ST_WORK/$name.xml" >/dev/null || {
    fail "fail: create on A"
    return
  }
  # 1. Nothing listens at the destination URI (connection refused).
  s=$(now)
  rc=0
  vA migrate --live --p2p "$name" "qemu+tcp://$ADDR_B:1/system" >"$ST_WORK/fail1.log" 2>&1 || rc=$?
  record fail-unreachable-libvirtd "$s"
  if ((rc != 0)); then pass "fail: unreachable destination libvirtd refused: $(grep -m1 error "$ST_WORK/fail1.log")"; else
    fail "fail: migration to an unreachable libvirtd succeeded"
  fi
  check "fail: still running on A" running_on A "$name"
  # 2. The destination prepares (B starts an incoming QEMU), but the migration stream goes to an
  #    address where nothing listens: the source must give up, B must remove its half.
  s=$(now)
  rc=0
  vA migrate --live --p2p "$name" "$HB_URI" --migrateuri "tcp://$ADDR_A:49151" >"$ST_WORK/fail2.log" 2>&1 || rc=$?
  record fail-migration-stream "$s"
  if ((rc != 0)); then pass "fail: unreachable migration stream failed: $(grep -m1 error "$ST_WORK/fail2.log")"; else
    fail "fail: migration with an unreachable stream succeeded"
  fi
  check "fail: still running on A" running_on A "$name"
  check "fail: nothing left on B" wait_for 10 "B to drop the incoming domain" absent_on B "$name"
  vA destroy "$name" >/dev/null
}

cmd_selftest() {
  local s
  s=$(now)
  cmd_status >/dev/null || die "host B is not (fully) up: run '$0 up' first ('$0 status' says what is missing)"
  ST_WORK=$(mktemp -d "$HB_DIR/selftest.XXXXXX")
  chmod 755 "$ST_WORK"
  trap st_cleanup EXIT
  log "selftest $ST (work dir $ST_WORK)"
  # A part returns early (non-zero) only after it counted a failure: go on with the next part.
  part bridge && { st_bridge || true; }
  part ovs && { st_ovs || true; }
  part boot && ((SELFTEST_BOOT)) && { st_boot || true; }
  if part neutron || part cold; then
    if [[ $NO_NEUTRON == 0 ]] && alive_b neutron-ovs-agent && have_neutron && st_neutron_env; then
      ((SELFTEST_EVENTS)) && events_start
      part neutron && { st_neutron_live || true; }
      part cold && { st_neutron_cold || true; }
    else
      echo "== neutron, cold: skipped (host B runs no Neutron agent, or --no-neutron)"
    fi
  fi
  part fail && { st_fail || true; }
  record selftest "$s"
  print_timings
  echo "selftest: $ST_PASS passed, $ST_FAIL failed"
  ((ST_FAIL == 0))
}
