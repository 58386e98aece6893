#!/usr/bin/env bash
# integration/two-host.sh — a second hypervisor host ("host B") on this machine.
#
#   two-host.sh up       [--no-neutron]   start host B (idempotent)
#   two-host.sh down                      remove everything `up` created
#   two-host.sh status                    one line per part; exit 1 when a part is down
#   two-host.sh exec CMD [ARG...]         run CMD inside host B's namespaces
#   two-host.sh env                       print `export VIREO_HOSTB_...=` lines
#   two-host.sh nova-up                   host B as a second nova-compute (vireo.VireoDriver and
#                                         its vireo agent) of host-setup.sh nova-up's OpenStack
#   two-host.sh nova-down                 stop them
#   two-host.sh nova-compute-driver vireo|libvirt
#                                         after nova-up: host B's nova-compute on vireo.VireoDriver
#                                         or on Nova's libvirt.LibvirtDriver (the side-by-side's
#                                         moves between hosts, integration/nova/side_by_side.py)
#   two-host.sh nova-instances own|shared after nova-up: host B's agent on its own instances
#                                         directory (the default) or on host A's (a shared one)
#   two-host.sh selftest [--events] [--no-boot] [--no-neutron] [--only PART,...]
#                                         live migrations A -> B -> A (diskless, OVS, booted
#                                         guest, Neutron port bindings), an offline move and
#                                         back, a failing migration
#
# Host A is the machine's own libvirtd (qemu:///system), Open vSwitch and Neutron, which this
# script never stops, restarts or reconfigures. Host B is a libvirtd + virtlogd, an Open vSwitch
# (userspace datapath), a neutron-openvswitch-agent, a neutron-linuxbridge-agent (host
# <name>-lb) and, when host A runs ML2/OVN, an ovn-controller (chassis <name>-ovn) that run
# inside their own network, mount and UTS namespaces; B's network namespace is linked to the
# root namespace by a veth pair on TEST-NET-2 (198.51.100.0/30: A = .1, B = .2). See
# integration/README.md, "Two hosts on one machine". Runs as root on Debian 12 without
# systemd; needs integration/host-setup.sh up first.
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
SCRIPT_DIR=$(dirname "$SELF")
TPL_DIR=$SCRIPT_DIR/setup/two-host

STATE_DIR=${VIREO_STATE_DIR:-/var/lib/vireo-integration}
HB_DIR=${VIREO_HB_DIR:-$STATE_DIR/hostb}
HB_NAME=${VIREO_HOSTB_NAME:-vireo-hb}
HB_LB_HOST=${VIREO_HOSTB_LB_HOST:-$HB_NAME-lb} # host B's Linux bridge agent
LB_UPLINK_B=vhb-lbup                           # its physnet1 (a veth pair inside B)
LB_UPLINK_B_PEER=vhb-lbpeer
NETNS=vireo-hb
NS_DIR=/run/vireo-hb # mount point of B's mount and UTS namespace files (a private bind mount)
ADDR_A=${VIREO_HB_ADDR_A:-198.51.100.1}
ADDR_B=${VIREO_HB_ADDR_B:-198.51.100.2}
PREFIX=30
VETH_A=vhb-a   # root namespace end of the management/migration link (ADDR_A)
VETH_B=vhb-b   # host B end (ADDR_B)
LINK_A=vhb-la  # guest data link: in A's vhb-br0 ...
LINK_B=vhb-lb  # ... and in B's vhb-br0
BRIDGE=vhb-br0 # the Linux bridge that exists on both hosts
HB_UUID=${VIREO_HOSTB_UUID:-7669726f-6862-4000-8000-000000000002}
LIBVIRT_PORT=16509
RABBIT_PORT=5672
MARKER=.vireo-hb-host-b
PY=/usr/bin/python3

A_NEUTRON_ENV=$STATE_DIR/neutron.env
A_NEUTRON_CONF=$STATE_DIR/etc/neutron.conf

# Host B's directories (bind-mounted over the standard paths inside B's mount namespace).
LV=$HB_DIR/libvirt
OVS=$HB_DIR/ovs
RUN=$HB_DIR/run
LOG=$HB_DIR/log
NEU=$HB_DIR/neutron

HB_URI=qemu+tcp://$ADDR_B/system
HB_UNIX_URI="qemu+unix:///system?socket=$LV/run/libvirt-sock"
HA_URI_FROM_B=qemu+tcp://$ADDR_A/system
HA_UNIX_URI_FROM_B="qemu+unix:///system?socket=$HB_DIR/hosta-libvirt/libvirt-sock"
B_OVSDB=unix:$OVS/run/db.sock

# ---------------------------------------------------------------------------------------------
# helpers

log() { printf '[two-host %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}
now() { date +%s.%N; }
elapsed() { awk -v s="$1" -v e="$(now)" 'BEGIN { printf "%.2f", e - s }'; }
TIMINGS=()
record() { # record LABEL START
  local d
  d=$(elapsed "$2")
  TIMINGS+=("$1=${d}s")
  log "$1 took ${d}s"
}
print_timings() {
  local t
  for t in "${TIMINGS[@]}"; do echo "TIMING $t"; done
}

# wait_for SECONDS DESCRIPTION CMD...: polls CMD every 0.2 s until it succeeds.
wait_for() {
  local timeout=$1 what=$2 start
  shift 2
  start=$(now)
  while ! "$@" >/dev/null 2>&1; do
    if awk -v s="$start" -v e="$(now)" -v t="$timeout" 'BEGIN { exit !(e - s > t) }'; then
      log "timed out after ${timeout}s waiting for $what"
      return 1
    fi
    sleep 0.2
  done
}

# The network namespace inode of host B ("" when there is none).
netns_id() { stat -L -c %i "/run/netns/$NETNS" 2>/dev/null || true; }
ns_ready() {
  [[ -e /run/netns/$NETNS ]] && mountpoint -q "$NS_DIR/mnt" 2>/dev/null &&
    mountpoint -q "$NS_DIR/uts" 2>/dev/null
}

# in_b CMD...: runs CMD inside host B's mount, UTS and network namespaces. The inner half
# (`__in-b`) refuses to run unless B's private /run/libvirt is mounted, so a command meant for
# host B can never reach host A's daemons by accident.
in_b() {
  ns_ready || die "host B is not up (run: $0 up)"
  nsenter --mount="$NS_DIR/mnt" --uts="$NS_DIR/uts" --net="/run/netns/$NETNS" -- \
    "$SELF" __in-b "$@"
}

# pid_of NAME: the pid recorded in $RUN/NAME.pid, if that process runs.
pid_of() {
  local name=$1 pid
  [[ -s $RUN/$name.pid ]] || return 1
  pid=$(tr -dc 0-9 <"$RUN/$name.pid")
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}
alive_b() { # alive_b NAME: runs, and inside host B's network namespace
  local pid want
  pid=$(pid_of "$1") || return 1
  want=$(netns_id)
  [[ -n $want && $(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null) == "$want" ]]
}
alive_root() { # alive_root NAME: runs, is a socat, in the root network namespace
  local pid
  pid=$(pid_of "$1") || return 1
  [[ $(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null) == $(stat -L -c %i "/proc/$$/ns/net") ]] &&
    [[ $(tr '\0' ' ' <"/proc/$pid/cmdline") == socat* ]]
}

# stop_pid NAME TIMEOUT CHECK: TERM (then KILL) to the process recorded as NAME — and to its
# process group when it leads one — but only while `CHECK NAME` (alive_b or alive_root) confirms
# it is ours: a stale pid file never gets another process killed.
stop_pid() {
  local name=$1 timeout=$2 check=$3 pid i
  if "$check" "$name"; then
    pid=$(pid_of "$name")
    log "stopping $name (pid $pid)"
    if [[ $(ps -o pgid= -p "$pid" | tr -d ' ') == "$pid" ]]; then
      kill -TERM -- "-$pid" 2>/dev/null || true
    else
      kill -TERM "$pid" 2>/dev/null || true
    fi
    for ((i = 0; i < timeout * 5; i++)); do
      "$check" "$name" || break
      sleep 0.2
    done
    if "$check" "$name"; then
      log "$name did not stop: KILL"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$RUN/$name.pid"
}

# Processes in host B's network or mount namespace (all of them started by this script or by
# `exec`).
pids_in_b() {
  local net mnt p
  net=$(netns_id)
  mnt=$(stat -L -c %i "$NS_DIR/mnt" 2>/dev/null || true)
  for p in /proc/[0-9]*; do
    [[ -n $net && $(stat -L -c %i "$p/ns/net" 2>/dev/null) == "$net" ]] ||
      [[ -n $mnt && $(stat -L -c %i "$p/ns/mnt" 2>/dev/null) == "$mnt" ]] || continue
    echo "${p#/proc/}"
  done
}

render() { # render TEMPLATE OUT: fills @VAR@ placeholders; records a changed file in CHANGED
  sed -e "s|@HB_DIR@|$HB_DIR|g" -e "s|@HB_NAME@|$HB_NAME|g" -e "s|@HB_UUID@|$HB_UUID|g" \
    -e "s|@HB_LB_HOST@|$HB_LB_HOST|g" -e "s|@LB_UPLINK_B@|$LB_UPLINK_B|g" \
    -e "s|@ADDR_A@|$ADDR_A|g" -e "s|@ADDR_B@|$ADDR_B|g" -e "s|@LIBVIRT_PORT@|$LIBVIRT_PORT|g" \
    -e "s|@RABBIT_PORT@|$RABBIT_PORT|g" -e "s|@FIREWALL_DRIVER@|${FIREWALL:-iptables_hybrid}|g" \
    "$TPL_DIR/$1" >"$2.tmp"
  if cmp -s "$2.tmp" "$2"; then
    rm -f "$2.tmp"
  else
    [[ -e $2 ]] && CHANGED+=("$(basename "$2")")
    mv "$2.tmp" "$2"
  fi
}
CHANGED=()
changed() {
  local f c
  for f in "$@"; do
    for c in "${CHANGED[@]}"; do [[ $c == "$f" ]] && return 0; done
  done
  return 1
}

neutron_url() { sed -n 's/^VIREO_NEUTRON_URL=//p' "$A_NEUTRON_ENV" 2>/dev/null; }
api() { # api METHOD PATH [JSON]
  local args=(-sS -f --max-time 30 -X "$1" -H 'Content-Type: application/json'
    -H 'X-Project-Id: vireo' -H 'X-Roles: admin')
  [[ $# -ge 3 ]] && args+=(-d "$3")
  curl "${args[@]}" "$(neutron_url)$2"
}
have_neutron() { [[ -s $A_NEUTRON_ENV && -s $A_NEUTRON_CONF ]] && api GET '/v2.0/networks?limit=1' >/dev/null 2>&1; }

# agent_alive_b [SINCE]: the Open vSwitch agent of host B reports alive (started at or after
# unix time SINCE).
agent_alive_b() { # agent_alive_b [SINCE [HOST [TYPE]]]: that agent reports alive, started since SINCE
  local out
  out=$(api GET "/v2.0/agents?host=${2:-$HB_NAME}&agent_type=${3:-Open+vSwitch+agent}") || return 1
  jq -e --argjson since "${1:-0}" '.agents | length > 0 and all(.alive
      and ((.started_at | sub("\\.[0-9]+$"; "") | strptime("%Y-%m-%d %H:%M:%S") | mktime) >= $since))' \
    <<<"$out" >/dev/null
}

# ---------------------------------------------------------------------------------------------
# namespaces and links

# Called (as `__ns-init`) inside the freshly unshared mount and UTS namespaces, already in B's
# network namespace: the mounts that make host B's paths private.
ns_init() {
  hostname "$HB_NAME"
  # sysfs of B's network namespace (libvirt and OVS read /sys/class/net).
  mount -t sysfs -o nosuid,nodev,noexec sysfs /sys
  # Host A's /run/libvirt, kept reachable under another path before B's copy hides it.
  mount --bind /run/libvirt "$HB_DIR/hosta-libvirt"
  local pair
  for pair in "$LV/run:/run/libvirt" "$LV/lib:/var/lib/libvirt" "$LV/cache:/var/cache/libvirt" \
    "$LV/log:/var/log/libvirt" "$LV/etc:/etc/libvirt" "$OVS/run:/run/openvswitch" \
    "$OVS/etc:/etc/openvswitch" "$OVS/log:/var/log/openvswitch" "$OVS/lib:/var/lib/openvswitch" \
    "$HB_DIR/hosts:/etc/hosts"; do
    [[ -e ${pair#*:} ]] || continue # never create paths in the shared file system
    mount --bind "${pair%%:*}" "${pair#*:}"
  done
  # The new mount namespace copied every mount of the root namespace, including the nsfs
  # mounts under /run/netns of other network namespaces: drop the copies, or those namespaces
  # would outlive their `ip netns delete` for as long as host B exists.
  local mp
  while read -r mp; do
    umount -l "$mp" 2>/dev/null || true
  done < <(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") { if ($(i + 1) == "nsfs") print $5; break } }' \
    /proc/self/mountinfo)
}

create_dirs() {
  mkdir -p "$RUN" "$LOG" "$HB_DIR/hosta-libvirt" "$HB_DIR/guest" \
    "$LV"/{run,lib,cache,log,etc} "$LV/etc/qemu/networks" "$LV/etc/qemu/autostart" \
    "$LV/lib/qemu" "$LV/cache/qemu" "$LV/log/qemu" \
    "$OVS"/{run,etc,log,lib} "$NEU"/{state,lock}
  chmod 755 "$HB_DIR" "$LV/run" "$LV/lib" "$LV/log" "$LV/log/qemu" "$HB_DIR/guest"
  chmod 711 "$LV/cache"
  chown libvirt-qemu:libvirt-qemu "$LV/lib/qemu"
  chmod 750 "$LV/lib/qemu"
  touch "$LV/run/$MARKER"
  # Seed B's QEMU capabilities cache with host A's (same binaries, same kernel and CPU; libvirt
  # re-probes by itself when an entry does not match): saves B's libvirtd start ~5-8 s of probing.
  mkdir -p "$LV/cache/qemu/capabilities"
  if [[ -z $(ls -A "$LV/cache/qemu/capabilities") ]]; then
    cp -p /var/cache/libvirt/qemu/capabilities/*.xml "$LV/cache/qemu/capabilities/" 2>/dev/null || true
  fi
  # B's /etc/hosts: the machine's, with host A's name on A's address on the link (the
  # machine maps it to the loopback, which inside B is B's own: a migration to A would connect
  # to B itself), plus B's name on B's address.
  local a_name
  a_name=$(hostname)
  {
    awk -v a="$a_name" -v b="$HB_NAME" '/^[[:space:]]*#/ || NF < 2 { print; next }
      { out = $1; for (i = 2; i <= NF; i++) if ($i != a && $i != b) out = out "\t" $i
        if (out != $1) print out }' /etc/hosts
    printf '%s\t%s\n' "$ADDR_A" "$a_name" "$ADDR_B" "$HB_NAME"
  } >"$HB_DIR/hosts.tmp"
  # In place: B's /etc/hosts is a bind mount of this very inode.
  cmp -s "$HB_DIR/hosts.tmp" "$HB_DIR/hosts" || cat "$HB_DIR/hosts.tmp" >"$HB_DIR/hosts"
  rm -f "$HB_DIR/hosts.tmp"
  chmod 644 "$HB_DIR/hosts"
}

create_namespaces() {
  if ns_ready; then
    in_b true || die "host B's namespaces exist but its mounts are missing: run '$0 down' first"
    return
  fi
  # A half-made set (an earlier `up` was interrupted): start over.
  umount "$NS_DIR/mnt" 2>/dev/null || true
  umount "$NS_DIR/uts" 2>/dev/null || true
  mkdir -p "$NS_DIR"
  # Namespace files can only be bind-mounted below a mount with private propagation.
  mountpoint -q "$NS_DIR" || mount --bind "$NS_DIR" "$NS_DIR"
  mount --make-private "$NS_DIR"
  touch "$NS_DIR/mnt" "$NS_DIR/uts"
  [[ -e /run/netns/$NETNS ]] || ip netns add "$NETNS"
  nsenter --net="/run/netns/$NETNS" -- unshare --mount="$NS_DIR/mnt" --uts="$NS_DIR/uts" \
    --propagation private -- "$SELF" __ns-init
  in_b true || die "host B's mounts did not come up"
}

create_links() {
  if ! ip link show "$VETH_A" >/dev/null 2>&1; then
    ip link add "$VETH_A" type veth peer name "$VETH_B" netns "$NETNS"
  fi
  ip addr replace "$ADDR_A/$PREFIX" dev "$VETH_A"
  ip link set "$VETH_A" up
  ip -n "$NETNS" link set lo up
  ip -n "$NETNS" addr replace "$ADDR_B/$PREFIX" dev "$VETH_B"
  ip -n "$NETNS" link set "$VETH_B" up
  # The guest network: vhb-br0 on both hosts, joined by a second veth pair (a "switch").
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip -n "$NETNS" link show "$BRIDGE" >/dev/null 2>&1 || ip -n "$NETNS" link add "$BRIDGE" type bridge
  if ! ip link show "$LINK_A" >/dev/null 2>&1; then
    ip link add "$LINK_A" type veth peer name "$LINK_B" netns "$NETNS"
  fi
  ip link set "$LINK_A" master "$BRIDGE" up
  ip -n "$NETNS" link set "$LINK_B" master "$BRIDGE" up
  ip link set "$BRIDGE" up
  ip -n "$NETNS" link set "$BRIDGE" up
}

# tcp_open ADDR PORT: something accepts TCP connections there.
# shellcheck disable=SC2016 # $1/$2 expand in the inner bash
tcp_open() { timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' tcp_open "$1" "$2" 2>/dev/null; }

# ---------------------------------------------------------------------------------------------
# host B's daemons

write_configs() {
  render libvirtd.conf.in "$LV/etc/libvirtd.conf"
  render qemu.conf.in "$LV/etc/qemu.conf"
  render virtlogd.conf.in "$LV/etc/virtlogd.conf"
  : >"$LV/etc/libvirt.conf"
  chmod 600 "$LV/etc/qemu.conf"
}

libvirt_b_answers() { virsh -c "$HB_URI" version; }

# Does host B's libvirtd run under tini? It is started as a child of `tini -s`, a subreaper,
# so that B's QEMU processes are reaped when they exit (see host-setup.sh, start_libvirtd).
libvirtd_b_reaped() {
  local pid
  pid=$(pid_of libvirtd) || return 1
  [[ $(ps -o comm= -p "$(ps -o ppid= -p "$pid" | tr -d ' ')") == tini ]]
}

start_libvirt_b() {
  local s
  if alive_b libvirtd && changed libvirtd.conf qemu.conf; then
    log "configuration changed: restarting host B's libvirtd"
    stop_pid libvirtd 30 alive_b
  fi
  if alive_b libvirtd && ! libvirtd_b_reaped; then
    log "host B's libvirtd runs without tini: restarting it under tini"
    stop_pid libvirtd 30 alive_b
  fi
  if ! alive_b virtlogd; then
    s=$(now)
    in_b virtlogd -d -p "$RUN/virtlogd.pid" -f /etc/libvirt/virtlogd.conf >>"$LOG/virtlogd.log" 2>&1
    wait_for 10 "host B's virtlogd" alive_b virtlogd || die "host B's virtlogd did not start"
    record hostb-virtlogd "$s"
  fi
  if ! alive_b libvirtd; then
    s=$(now)
    in_b setsid tini -s -- libvirtd -l -p "$RUN/libvirtd.pid" -f /etc/libvirt/libvirtd.conf \
      >>"$LOG/libvirtd.log" 2>&1 </dev/null &
    wait_for 60 "host B's libvirtd" libvirt_b_answers || {
      tail -20 "$LV/log/libvirtd.log" >&2 || true
      die "host B's libvirtd does not answer on $HB_URI"
    }
    record hostb-libvirtd "$s"
  fi
  # Host A as seen from B, for peer-to-peer migrations B -> A: a forwarder on A's side of the
  # veth pair to A's unix socket, accepting connections from B's address only (a process in the
  # root namespace cannot send from an address it does not have).
  if ! alive_root fwd-libvirt; then
    setsid socat "TCP-LISTEN:$LIBVIRT_PORT,bind=$ADDR_A,reuseaddr,fork,range=$ADDR_B/32" \
      UNIX-CONNECT:/run/libvirt/libvirt-sock >>"$LOG/fwd-libvirt.log" 2>&1 </dev/null &
    echo $! >"$RUN/fwd-libvirt.pid"
  fi
  wait_for 20 "host A from host B" in_b virsh -c "$HA_URI_FROM_B" version ||
    die "host B cannot reach host A's libvirtd at $HA_URI_FROM_B"
}

ovs_b() { ovs-vsctl --db="$B_OVSDB" --timeout=10 "$@"; }

start_ovs_b() {
  local s
  s=$(now)
  if [[ ! -s $OVS/etc/conf.db ]]; then
    ovsdb-tool create "$OVS/etc/conf.db" /usr/share/openvswitch/vswitch.ovsschema
  fi
  # Explicit paths everywhere (and OVS_RUNDIR for the bridges' management sockets), so nothing
  # depends on the bind mounts; inside B the same files also appear under the standard paths,
  # where libvirt's ovs-vsctl and the Neutron agent look.
  local env=(env "OVS_RUNDIR=$OVS/run" "OVS_LOGDIR=$OVS/log" "OVS_DBDIR=$OVS/etc"
    "OVS_SYSCONFDIR=$OVS/etc")
  if ! alive_b ovsdb-server; then
    in_b "${env[@]}" ovsdb-server "$OVS/etc/conf.db" --remote="punix:$OVS/run/db.sock" \
      --remote=db:Open_vSwitch,Open_vSwitch,manager_options \
      --pidfile="$RUN/ovsdb-server.pid" --unixctl="$OVS/run/ovsdb-server.ctl" \
      --log-file="$OVS/log/ovsdb-server.log" -vconsole:off --no-chdir --detach \
      >>"$LOG/ovsdb-server.out" 2>&1
    wait_for 10 "host B's ovsdb-server" ovsdb-client list-dbs "$B_OVSDB" || die "host B's ovsdb-server does not answer"
    ovs_b --no-wait init
    ovs_b --no-wait set Open_vSwitch . external_ids:hostname="$HB_NAME" \
      external_ids:system-id="$HB_NAME" external_ids:rundir="/var/run/openvswitch"
  fi
  if ! alive_b ovs-vswitchd; then
    in_b "${env[@]}" ovs-vswitchd "unix:$OVS/run/db.sock" --pidfile="$RUN/ovs-vswitchd.pid" \
      --unixctl="$OVS/run/ovs-vswitchd.ctl" --log-file="$OVS/log/ovs-vswitchd.log" \
      -vconsole:off --no-chdir --detach >>"$LOG/ovs-vswitchd.out" 2>&1
    wait_for 20 "host B's ovs-vswitchd" ovs-appctl -t "$OVS/run/ovs-vswitchd.ctl" version ||
      die "host B's ovs-vswitchd did not start"
  fi
  local br
  for br in br-int br-phys; do
    ovs_b -- --may-exist add-br "$br" -- set Bridge "$br" datapath_type=netdev
  done
  record hostb-ovs "$s"
}

start_forwarder_rabbit() {
  alive_root fwd-rabbit && return
  setsid socat "TCP-LISTEN:$RABBIT_PORT,bind=$ADDR_A,reuseaddr,fork,range=$ADDR_B/32" \
    "TCP:127.0.0.1:$RABBIT_PORT" >>"$LOG/fwd-rabbit.log" 2>&1 </dev/null &
  echo $! >"$RUN/fwd-rabbit.pid"
}

# start_neutron_agent_b NAME PROGRAM INI WHAT HOST TYPE: Neutron's agent PROGRAM inside host
# B (B's neutron.conf, then INI), its pid as NAME, until Neutron shows HOST's TYPE agent alive.
start_neutron_agent_b() {
  local name=$1 program=$2 ini=$3 what=$4 host=$5 type=$6 s
  alive_b "$name" && return
  s=$(now)
  setsid nsenter --mount="$NS_DIR/mnt" --uts="$NS_DIR/uts" --net="/run/netns/$NETNS" -- \
    "$SELF" __in-b "$program" --config-file "$NEU/neutron.conf" --config-file "$NEU/$ini" \
    --log-file "$LOG/$program.log" >>"$LOG/$name.out" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
  wait_for 120 "host B's $what to report alive" agent_alive_b "${s%.*}" "$host" "$type" || {
    tail -30 "$LOG/$program.log" >&2 || true
    die "host B's $what did not report alive"
  }
  record "hostb-$name" "$s"
}

start_agent_b() {
  FIREWALL=$(cat "$STATE_DIR/firewall" 2>/dev/null || echo iptables_hybrid)
  render neutron.conf.in "$NEU/neutron.conf"
  render openvswitch_agent.ini.in "$NEU/openvswitch_agent.ini"
  start_forwarder_rabbit
  if alive_b neutron-ovs-agent && changed neutron.conf openvswitch_agent.ini; then
    log "configuration changed: restarting host B's Open vSwitch agent"
    stop_pid neutron-ovs-agent 10 alive_b
  fi
  start_neutron_agent_b neutron-ovs-agent neutron-openvswitch-agent openvswitch_agent.ini \
    "Open vSwitch agent" "$HB_NAME" "Open+vSwitch+agent"
  echo "$FIREWALL" >"$HB_DIR/firewall"
}

# Host B as a second chassis of host A's ML2/OVN (integration/host-setup.sh's OVN databases, its
# ML2/OVN neutron-server): an ovn-controller inside B on B's Open vSwitch, chassis HB_OVN_HOST
# with its own integration bridge, as host A's chassis is on A's. ML2/OVN then binds ports to
# host B too, and its cross-host events are real (the two-host OVN scenarios of the stack tier).
OVN_DIR=$STATE_DIR/ovn
HB_OVN_HOST=${VIREO_HOSTB_OVN_HOST:-$HB_NAME-ovn}
OVN_BRIDGE=br-ovn

ovn_sb() { ovn-sbctl --db="unix:$OVN_DIR/run/sb.sock" --timeout=10 "$@"; }
have_ovn() { [[ -S $OVN_DIR/run/sb.sock ]] && ovn_sb --timeout=3 show >/dev/null 2>&1; }
# The Nova tier's Neutron and port form (host-setup.sh nova-network): "ovs pre-created" by
# default; on ovn, host B's chassis reports nova-compute's host name, HB_NAME.
nova_network() {
  local words=()
  [[ -s $STATE_DIR/nova-network ]] && read -r -a words <"$STATE_DIR/nova-network"
  echo "${words[0]:-ovs} ${words[1]:-pre-created}"
}
# Host B's nova-compute (and agent) host: HB_NAME, or on lb its Linux bridge agent's host.
compute_host_b() { if [[ $(nova_network) == lb\ * ]]; then echo "$HB_LB_HOST"; else echo "$HB_NAME"; fi; }
ovn_hostname_b() { if [[ $(nova_network) == ovn\ * ]]; then echo "$HB_NAME"; else echo "$HB_OVN_HOST"; fi; }
ovn_chassis_b_up() {
  [[ $(ovn_sb --bare --columns=hostname find Chassis "name=$HB_OVN_HOST") == "$(ovn_hostname_b)" ]]
}
set_ovn_hostname_b() {
  have_ovn && alive_b ovn-controller || return 0
  ovs_b set Open_vSwitch . "external_ids:hostname-$HB_OVN_HOST=$(ovn_hostname_b)"
  wait_for 30 "chassis $HB_OVN_HOST as $(ovn_hostname_b)" ovn_chassis_b_up ||
    die "chassis $HB_OVN_HOST does not report $(ovn_hostname_b)"
}

start_ovn_b() {
  local c=$HB_OVN_HOST s
  s=$(now)
  # The chassis-named options (ovn-controller(8), `-n`): B's Open vSwitch serves only B's
  # OVS agent besides, whose bridges these do not touch.
  ovs_b set Open_vSwitch . "external_ids:ovn-remote-$c=unix:$OVN_DIR/run/sb.sock" \
    "external_ids:ovn-encap-type-$c=geneve" "external_ids:ovn-encap-ip-$c=$ADDR_B" \
    "external_ids:ovn-bridge-$c=$OVN_BRIDGE" "external_ids:ovn-bridge-datapath-type-$c=netdev" \
    "external_ids:hostname-$c=$(ovn_hostname_b)"
  if ! alive_b ovn-controller; then
    mkdir -p "$HB_DIR/ovn"
    in_b env "OVN_RUNDIR=$HB_DIR/ovn" ovn-controller -n "$c" "$B_OVSDB" \
      --pidfile="$RUN/ovn-controller.pid" --log-file="$LOG/ovn-controller.log" \
      -vconsole:off --no-chdir --detach >>"$LOG/ovn-controller.out" 2>&1
  fi
  wait_for 30 "host B's ovn-controller ($c) to register its chassis" ovn_chassis_b_up || {
    tail -20 "$LOG/ovn-controller.log" >&2 || true
    die "host B's ovn-controller did not register its chassis"
  }
  record hostb-ovn-controller "$s"
}

# The chassis outlives its ovn-controller in the southbound database: remove it, so ML2/OVN
# stops offering host B.
ovn_forget_b() {
  have_ovn || return 0
  ovn_sb --if-exists chassis-del "$HB_OVN_HOST" >/dev/null 2>&1 ||
    log "could not remove OVN chassis $HB_OVN_HOST"
}

# Host B's Linux bridge agent: a host of its own, HB_LB_HOST, inside B beside B's OVS agent
# (host A runs one as <hostname>-lb), so Linux bridge ports move between hosts with real
# events. Its physnet1 uplink is a veth pair inside B.
start_lb_agent_b() {
  render linuxbridge_agent.ini.in "$NEU/linuxbridge_agent.ini"
  if alive_b neutron-lb-agent && changed neutron.conf linuxbridge_agent.ini; then
    log "configuration changed: restarting host B's Linux bridge agent"
    stop_pid neutron-lb-agent 10 alive_b
  fi
  if ! ip -n "$NETNS" link show "$LB_UPLINK_B" >/dev/null 2>&1; then
    ip -n "$NETNS" link add "$LB_UPLINK_B" type veth peer name "$LB_UPLINK_B_PEER"
  fi
  ip -n "$NETNS" link set "$LB_UPLINK_B" up
  ip -n "$NETNS" link set "$LB_UPLINK_B_PEER" up
  start_neutron_agent_b neutron-lb-agent neutron-linuxbridge-agent linuxbridge_agent.ini \
    "Linux bridge agent" "$HB_LB_HOST" "Linux+bridge+agent"
}

# ---------------------------------------------------------------------------------------------
# nova-up / nova-down: host B as a second nova-compute of host A's small OpenStack

NOVA_B=$HB_DIR/nova
NOVA_B_CONF=$NOVA_B/nova.conf
AGENT_B_DIR=$HB_DIR/vireo-agent
AGENT_B_PORT=${VIREO_HB_NOVA_AGENT_PORT:-8775}
# One instances path on every host (Nova's assumption for a block live migration: the disks
# go to the same paths): inside host B's mount namespace, host B's own directory is mounted at
# host A's instances path.
INSTANCES_PATH=$STATE_DIR/vireo-agent/instances
INSTANCES_B=$AGENT_B_DIR/instances
# The same for Nova's own instances path while host B's nova-compute runs Nova's libvirt driver
# (nova-compute-driver libvirt): host A's, with host B's own directory mounted there inside B.
NOVA_INSTANCES_PATH=$STATE_DIR/nova/instances
NOVA_B_DRIVER_CONF=$NOVA_B/nova-compute-driver.conf
A_ETC=$STATE_DIR/etc
NOVA_API_URL=http://127.0.0.1:${VIREO_NOVA_API_PORT:-18774}
# Host A's services that host B's nova-compute and agent call, through forwarders on A's side
# of the link that accept host B's address only (the services listen on A's loopback).
NOVA_B_FORWARDS=(neutron:9696 neutron-ovn:9796 placement:8778 glance:9292)

start_forwarder() { # start_forwarder NAME PORT: ADDR_A:PORT -> 127.0.0.1:PORT, from B only
  alive_root "fwd-$1" && return
  setsid socat "TCP-LISTEN:$2,bind=$ADDR_A,reuseaddr,fork,range=$ADDR_B/32" "TCP:127.0.0.1:$2" \
    >>"$LOG/fwd-$1.log" 2>&1 </dev/null &
  echo $! >"$RUN/fwd-$1.pid"
}

agent_b_answers() { curl -sSf --max-time 5 "http://$ADDR_B:$AGENT_B_PORT/healthz"; }
compute_b_registered() {
  curl -sSf --max-time 10 -H 'X-Auth-Token: admin:admin' \
    "$NOVA_API_URL/v2.1/os-hypervisors" | jq -e --arg h "$(compute_host_b)" \
    '[.hypervisors[] | select(.hypervisor_hostname == $h and .state == "up")] | length == 1'
}

# forced_down_b HOST true|false: Nova counts HOST's nova-compute down (or by its heartbeat),
# if it knows it (as host-setup.sh's forced_down).
forced_down_b() {
  local api=$NOVA_API_URL/v2.1/os-services id
  local h=(-sS -f --max-time 10 -H 'X-Auth-Token: admin:admin' -H 'OpenStack-API-Version: compute 2.53')
  id=$(curl "${h[@]}" "$api?binary=nova-compute&host=$1" | jq -r '.services[0].id // empty') || return 1
  [[ -z $id ]] || curl "${h[@]}" -X PUT -H 'Content-Type: application/json' \
    -d "{\"forced_down\": $2}" "$api/$id" >/dev/null
}

# The driver package both nova-computes load is host A's (one filesystem): this checkout's,
# installed before a start names it in nova-compute.sum (a process started on an older copy
# under a new sum would keep it through the next nova-up).
install_nova_driver() {
  bash "$SCRIPT_DIR"/../driver/nova/install.sh >"$LOG/nova-driver-install.log" 2>&1 || {
    cat "$LOG/nova-driver-install.log" >&2
    die "installing the vireo Nova driver failed"
  }
}

write_nova_b_configs() {
  local domain_type=qemu network form neutron_port=9696 bridge=br-int
  [[ -e /dev/kvm ]] && domain_type=kvm
  # Host A's choice of Neutron (host-setup.sh nova-network): ML2/OVN's server and bridge.
  read -r network form <<<"$(nova_network)"
  if [[ $network == ovn ]]; then
    neutron_port=9796
    bridge=$OVN_BRIDGE
  fi
  mkdir -p "$NOVA_B/lock" "$NOVA_B/instances" "$AGENT_B_DIR/images"
  # QEMU (libvirt-qemu) reaches the instance disks by path.
  chmod 0711 "$AGENT_B_DIR"
  cat >"$AGENT_B_DIR/agent.toml" <<EOF
# Host B's vireo agent, driven by host B's nova-compute (two-host.sh nova-up).
host = "$(compute_host_b)"
listen = "$ADDR_B:$AGENT_B_PORT"
api_token_file = "$A_ETC/vireo-agent-token"
accept_noauth_events = false
[libvirt]
uri = "$HB_UNIX_URI"
# As host A's (setup/vireo-agent.toml.in): 20 s for the tier's small guests.
live_migration_completion_timeout = 10
[instances]
state_dir = "$AGENT_B_DIR"
instances_path = "$INSTANCES_PATH"
image_dirs = ["$AGENT_B_DIR/images"]
domain_type = "$domain_type"
ovs_native_form = "$form"
power_off_timeout = 5
soft_reboot_timeout = 5
device_detach_timeout = 2
device_detach_attempts = 2
[plugging]
ovsdb_connection = "$B_OVSDB"
datapath_type = "netdev"
[network]
kind = "neutron"
[network.neutron]
url = "http://$ADDR_A:$neutron_port"
auth = { type = "noauth" }
ovs_bridge = "$bridge"
ports_owner = "nova"
EOF
  cat >"$NOVA_B_CONF" <<EOF
# Host B's nova-compute (two-host.sh nova-up): host A's conductor, placement, glance and
# Neutron through forwarders on host A's address; no database (computes use the conductor).
[DEFAULT]
host = $(compute_host_b)
my_ip = $ADDR_B
state_path = $NOVA_B
instances_path = $NOVA_B/instances
transport_url = rabbit://guest:guest@$ADDR_A:$RABBIT_PORT/
compute_driver = vireo.VireoDriver
vif_plugging_timeout = 300
vif_plugging_is_fatal = true
shutdown_timeout = 5
heal_instance_info_cache_interval = -1
allow_resize_to_same_host = true
# Less free memory than host A: the scheduler's RAM weigher puts host A first and host B
# second, so a build that fails on A is rescheduled here.
reserved_host_memory_mb = 4096

[placement]
auth_type = admin_token
token = admin:admin
endpoint = http://$ADDR_A:8778

[neutron]
auth_type = admin_token
token = admin:admin
endpoint = http://$ADDR_A:$neutron_port
endpoint_override = http://$ADDR_A:$neutron_port
ovs_bridge = $bridge

[glance]
api_servers = http://$ADDR_A:9292

[oslo_concurrency]
lock_path = $NOVA_B/lock

[vireo]
agent_url = http://$ADDR_B:$AGENT_B_PORT
token_file = $A_ETC/vireo-agent-token
migration_uri = $HB_URI
EOF
}

cmd_nova_up() {
  local s start
  start=$(now)
  ns_ready || die "host B is not up (run: $0 up)"
  [[ -s $A_ETC/nova.conf && -s $A_ETC/vireo-agent-token ]] ||
    die "no Nova tier on host A (run: integration/host-setup.sh nova-up)"
  alive_b neutron-ovs-agent || die "host B runs no Open vSwitch agent (run: $0 up with Neutron)"
  local bin=${VIREO_BIN:-$SCRIPT_DIR/../target/debug/vireo}
  [[ -x $bin ]] || die "no vireo binary at $bin (cargo build -p vireo, or set VIREO_BIN)"
  start_forwarder_rabbit
  local f
  for f in "${NOVA_B_FORWARDS[@]}"; do start_forwarder "${f%%:*}" "${f#*:}"; done
  write_nova_b_configs
  set_ovn_hostname_b
  mkdir -p "$INSTANCES_PATH" "$INSTANCES_B"
  chmod 0711 "$INSTANCES_B"
  if [[ $(instances_mode) == own ]]; then
    in_b mountpoint -q "$INSTANCES_PATH" || in_b mount --bind "$INSTANCES_B" "$INSTANCES_PATH"
  fi
  s=$(now)
  # A new binary or configuration restarts the agent (its own pid file and sum).
  local sum
  sum=$(cat "$bin" "$AGENT_B_DIR/agent.toml" | md5sum)
  if alive_b vireo-agent && [[ $(cat "$RUN/vireo-agent.sum" 2>/dev/null) != "$sum" ]]; then
    stop_pid vireo-agent 30 alive_b
  fi
  if ! alive_b vireo-agent; then
    setsid nsenter --mount="$NS_DIR/mnt" --uts="$NS_DIR/uts" --net="/run/netns/$NETNS" -- \
      "$SELF" __in-b "$bin" agent --config "$AGENT_B_DIR/agent.toml" \
      >>"$LOG/vireo-agent.log" 2>&1 </dev/null &
    echo $! >"$RUN/vireo-agent.pid"
    echo "$sum" >"$RUN/vireo-agent.sum"
  fi
  wait_for 60 "host B's vireo agent" agent_b_answers || {
    tail -20 "$LOG/vireo-agent.log" >&2 || true
    die "host B's vireo agent did not answer"
  }
  record hostb-vireo-agent "$s"
  s=$(now)
  # The driver package is host A's (one filesystem): a new driver or configuration restarts
  # nova-compute, on this checkout's driver installed first.
  install_nova_driver
  sum=$(cat "$NOVA_B_CONF" "$SCRIPT_DIR"/../driver/nova/nova/virt/vireo/*.py | md5sum)
  if alive_b nova-compute && [[ $(cat "$RUN/nova-compute.sum" 2>/dev/null) != "$sum" ]]; then
    stop_pid nova-compute 30 alive_b
  fi
  if ! alive_b nova-compute; then
    setsid nsenter --mount="$NS_DIR/mnt" --uts="$NS_DIR/uts" --net="/run/netns/$NETNS" -- \
      "$SELF" __in-b "$PY" -c \
      "import sys; from nova.cmd.compute import main; sys.exit(main())" \
      --config-file "$NOVA_B_CONF" >>"$LOG/nova-compute.log" 2>&1 </dev/null &
    echo $! >"$RUN/nova-compute.pid"
    echo "$sum" >"$RUN/nova-compute.sum"
  fi
  forced_down_b "$(compute_host_b)" false
  wait_for 120 "host B's nova-compute in nova-api" compute_b_registered || {
    tail -30 "$LOG/nova-compute.log" >&2 || true
    die "host B's nova-compute did not register"
  }
  record hostb-nova-compute "$s"
  # Host B's nova-compute of another network (HB_NAME or HB_LB_HOST) is down: the scheduler
  # must not pick it in the minute Nova would still count it up.
  local other
  for other in "$HB_NAME" "$HB_LB_HOST"; do
    [[ $other == "$(compute_host_b)" ]] || forced_down_b "$other" true
  done
  record nova-up "$start"
  print_timings
  echo "host B's nova-compute: $(compute_host_b) (agent http://$ADDR_B:$AGENT_B_PORT, log $LOG/nova-compute.log)"
}

# Up with nova-compute's current process: its service reported after UTC-TIME.
compute_b_reported_since() {
  curl -sSf --max-time 10 -H 'X-Auth-Token: admin:admin' \
    "$NOVA_API_URL/v2.1/os-services?binary=nova-compute&host=$(compute_host_b)" |
    jq -e --arg t "$1" '.services[] | select(.state == "up" and .updated_at > $t)'
}

# The driver host B's nova-compute loads: vireo (nova.conf's own) or Nova's libvirt driver, as
# host A's (host-setup.sh nova-compute-driver, setup/nova-compute-libvirt.conf.in) on host B's
# libvirtd and Open vSwitch.
write_nova_b_driver_config() { # write_nova_b_driver_config vireo|libvirt
  local domain_type=qemu helper
  [[ -e /dev/kvm ]] && domain_type=kvm
  helper="privsep-helper --config-file $NOVA_B_CONF --config-file $NOVA_B_DRIVER_CONF"
  case $1 in
  vireo) echo '# nova-compute on vireo.VireoDriver (nova.conf); nothing to add' >"$NOVA_B_DRIVER_CONF" ;;
  libvirt)
    cat >"$NOVA_B_DRIVER_CONF" <<EOF
# Host B's nova-compute on Nova's own libvirt driver (two-host.sh nova-compute-driver libvirt).
[DEFAULT]
compute_driver = libvirt.LibvirtDriver
# One instances path on every host, as Nova's libvirt driver assumes: host A's, host B's own
# directory mounted there inside B.
instances_path = $NOVA_INSTANCES_PATH
[libvirt]
virt_type = $domain_type
connection_uri = $HB_UNIX_URI
cpu_mode = none
wait_soft_reboot_seconds = 5
device_detach_attempts = 2
device_detach_timeout = 2
# Host A's libvirtd reaches this one (and QEMU its QEMU) at host B's address.
live_migration_scheme = tcp
live_migration_inbound_addr = $ADDR_B
[vnc]
enabled = false
[os_vif_ovs]
ovsdb_connection = $B_OVSDB
[nova_sys_admin]
helper_command = $helper
[vif_plug_ovs_privileged]
helper_command = $helper
[vif_plug_linux_bridge_privileged]
helper_command = $helper
[privsep_osbrick]
helper_command = $helper
EOF
    ;;
  *) die "no compute driver $1 here (vireo or libvirt)" ;;
  esac
}

# Nova's libvirt driver copies the disks of a cold migration or resize over SSH (and probes the
# destination's instances path with it). For the side-by-side only: while host B's nova-compute
# runs that driver, host B runs an sshd on its own address, inside its namespaces (so it sees
# host B's instances path), that takes host A's root with a key of the tier's and nothing else
# (no password, no other user); root's ssh client uses that key, and knows host B's key, for
# host B's address only. vireo needs none of it: its destination copies the disks over the
# libvirt connection the hosts already trust.
SSH_DIR=$HB_DIR/ssh
SSH_CLIENT_CONF=/etc/ssh/ssh_config.d/vireo-integration-hostb.conf

ssh_b_answers() { ssh -o ConnectTimeout=2 "$ADDR_B" true 2>/dev/null; }

ssh_up() {
  if [[ ! -x /usr/sbin/sshd ]]; then
    log "installing openssh-server (for Nova's libvirt driver only; its own service is not started)"
    local added_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
      printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
      chmod 755 /usr/sbin/policy-rc.d
      added_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-server >&2
    if ((added_policy)); then rm -f /usr/sbin/policy-rc.d; fi
  fi
  mkdir -p "$SSH_DIR"
  chmod 700 "$SSH_DIR"
  [[ -s $SSH_DIR/id_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C vireo-integration -f "$SSH_DIR/id_ed25519"
  [[ -s $SSH_DIR/host_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C host-b -f "$SSH_DIR/host_ed25519"
  install -m 600 "$SSH_DIR/id_ed25519.pub" "$SSH_DIR/authorized_keys"
  printf '%s %s\n' "$ADDR_B" "$(cut -d' ' -f1,2 "$SSH_DIR/host_ed25519.pub")" >"$SSH_DIR/known_hosts"
  cat >"$SSH_DIR/sshd_config" <<EOF
# Host B's sshd for Nova's libvirt driver (two-host.sh nova-compute-driver libvirt).
ListenAddress $ADDR_B
HostKey $SSH_DIR/host_ed25519
AuthorizedKeysFile $SSH_DIR/authorized_keys
AllowUsers root
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PidFile none
# scp speaks SFTP since OpenSSH 9.0.
Subsystem sftp internal-sftp
EOF
  cat >"$SSH_CLIENT_CONF" <<EOF
# two-host.sh: host A's root reaches host B's sshd (Nova's libvirt driver only).
Host $ADDR_B
  IdentityFile $SSH_DIR/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $SSH_DIR/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
EOF
  # Started again on the configuration just written.
  stop_pid sshd 10 alive_b
  in_b mkdir -p /run/sshd
  setsid nsenter --mount="$NS_DIR/mnt" --uts="$NS_DIR/uts" --net="/run/netns/$NETNS" -- \
    "$SELF" __in-b /usr/sbin/sshd -D -e -f "$SSH_DIR/sshd_config" >>"$LOG/sshd.log" 2>&1 </dev/null &
  echo $! >"$RUN/sshd.pid"
  wait_for 20 "host B's sshd" ssh_b_answers || {
    tail -20 "$LOG/sshd.log" >&2 || true
    die "host B's sshd does not take host A's key"
  }
}

ssh_down() {
  stop_pid sshd 10 alive_b
  rm -f "$SSH_CLIENT_CONF"
}

# Whose instances directory host B's agent uses: `own` (its own, mounted at host A's path
# inside B) or `shared` (host A's itself: nothing mounted over it), as nova-instances set.
INSTANCES_MODE_FILE=$HB_DIR/instances-mode
instances_mode() {
  cat "$INSTANCES_MODE_FILE" 2>/dev/null || echo own
}

# Switch host B's agent between its own instances directory and host A's. Neither may hold
# an instance: the disks would stay behind on the other side of the switch.
cmd_nova_instances() {
  local mode=$1 left
  [[ $mode == own || $mode == shared ]] || die "usage: two-host.sh nova-instances own|shared"
  ns_ready || die "host B is not up (run: $0 up)"
  left=$(find "$INSTANCES_B" "$INSTANCES_PATH" -mindepth 1 -maxdepth 1 -type d 2>/dev/null |
    grep -v '/_' || true)
  [[ -z $left ]] || die "instance directories are left; remove the servers first: $left"
  if [[ $mode == shared ]]; then
    if in_b mountpoint -q "$INSTANCES_PATH"; then in_b umount "$INSTANCES_PATH"; fi
    in_b mountpoint -q "$INSTANCES_PATH" && die "host B's own instances directory is still mounted"
  else
    mkdir -p "$INSTANCES_PATH" "$INSTANCES_B"
    in_b mountpoint -q "$INSTANCES_PATH" || in_b mount --bind "$INSTANCES_B" "$INSTANCES_PATH"
  fi
  echo "$mode" >"$INSTANCES_MODE_FILE"
  echo "host B's instances directory: $mode ($INSTANCES_PATH inside B)"
}

# Host B's nova-compute restarted on another driver (nova-up starts it on vireo's again).
cmd_nova_compute_driver() {
  local driver=$1 since
  alive_b nova-compute || die "no nova-compute on host B: two-host.sh nova-up first"
  if [[ $driver == libvirt ]]; then
    "$PY" -c 'import libvirt' 2>/dev/null || die "Nova's libvirt driver needs python3-libvirt"
    mkdir -p "$NOVA_INSTANCES_PATH" "$NOVA_B/instances"
    in_b mountpoint -q "$NOVA_INSTANCES_PATH" || in_b mount --bind "$NOVA_B/instances" "$NOVA_INSTANCES_PATH"
    ssh_up
  fi
  write_nova_b_driver_config "$driver"
  # This checkout's driver, installed (host A's filesystem) before the sum below names it.
  install_nova_driver
  # Stopped first: the old process reports until it exits (host-setup.sh's reason).
  stop_pid nova-compute 30 alive_b
  if [[ $driver == vireo ]]; then
    ssh_down
    if in_b mountpoint -q "$NOVA_INSTANCES_PATH"; then in_b umount "$NOVA_INSTANCES_PATH"; fi
  fi
  since=$(date -u +%FT%T)
  setsid nsenter --mount="$NS_DIR/mnt" --uts="$NS_DIR/uts" --net="/run/netns/$NETNS" -- \
    "$SELF" __in-b "$PY" -c \
    "import sys; from nova.cmd.compute import main; sys.exit(main())" \
    --config-file "$NOVA_B_CONF" --config-file "$NOVA_B_DRIVER_CONF" \
    >>"$LOG/nova-compute.log" 2>&1 </dev/null &
  echo $! >"$RUN/nova-compute.pid"
  # nova-up's sum for vireo's (it keeps that process), none for the libvirt driver's (nova-up
  # starts vireo's again).
  if [[ $driver == vireo ]]; then
    cat "$NOVA_B_CONF" "$SCRIPT_DIR"/../driver/nova/nova/virt/vireo/*.py | md5sum >"$RUN/nova-compute.sum"
  else
    echo "$driver" >"$RUN/nova-compute.sum"
  fi
  wait_for 120 "host B's nova-compute on the $driver driver" compute_b_reported_since "$since" || {
    tail -30 "$LOG/nova-compute.log" >&2 || true
    die "host B's nova-compute did not come back on the $driver driver"
  }
}

cmd_nova_down() {
  stop_pid nova-compute 30 alive_b
  stop_pid vireo-agent 30 alive_b
  ssh_down
  if ns_ready && in_b mountpoint -q "$INSTANCES_PATH"; then in_b umount "$INSTANCES_PATH"; fi
  if ns_ready && in_b mountpoint -q "$NOVA_INSTANCES_PATH"; then in_b umount "$NOVA_INSTANCES_PATH"; fi
  local f
  for f in "${NOVA_B_FORWARDS[@]}"; do stop_pid "fwd-${f%%:*}" 5 alive_root; done
  # Host B's chassis is HB_OVN_HOST again (the stack tier's), whatever Neutron Nova was on.
  if ns_ready && have_ovn && alive_b ovn-controller; then
    ovs_b set Open_vSwitch . "external_ids:hostname-$HB_OVN_HOST=$HB_OVN_HOST"
  fi
  # Guests a failed test left behind go with the agent's state (host A's nova-down drops the
  # databases, so the next tier numbers instances from 1 again).
  if ns_ready && alive_b libvirtd && [[ -d $AGENT_B_DIR ]]; then
    local dir uuid
    for dir in "$AGENT_B_DIR"/instances/*/; do
      [[ -d $dir ]] || continue
      uuid=$(basename "$dir")
      virsh -c "$HB_URI" destroy "$uuid" >/dev/null 2>&1 || true
      virsh -c "$HB_URI" undefine "$uuid" >/dev/null 2>&1 || true
    done
  fi
  rm -rf "$NOVA_B" "$AGENT_B_DIR"
}

# ---------------------------------------------------------------------------------------------
# down

# Neutron keeps an agent row and a vxlan tunnel endpoint for host B; host A's agent keeps a
# tunnel port to B's address in its br-tun. Remove all three (the endpoint and the tunnel port
# the way neutron-server does when a host's tunnel address changes: delete the endpoint row,
# then fan out tunnel_delete).
neutron_forget_b() {
  have_neutron || return 0
  local id h
  for h in "$HB_NAME" "$HB_LB_HOST"; do
    for id in $(api GET "/v2.0/agents?host=$h" | jq -r '.agents[].id'); do
      log "deleting Neutron agent $id (host $h)"
      api DELETE "/v2.0/agents/$id" >/dev/null || true
    done
  done
  "$PY" "$TPL_DIR/forget_tunnel_endpoint.py" --config-file "$A_NEUTRON_CONF" \
    --host "$HB_NAME" --ip "$ADDR_B" >>"$LOG/forget-tunnel-endpoint.log" 2>&1 ||
    log "could not remove the tunnel endpoint $ADDR_B (see $LOG/forget-tunnel-endpoint.log)"
}

cmd_down() {
  local s pid
  s=$(now)
  # Domains on host B first (their QEMU processes would otherwise be killed below anyway).
  if ns_ready && alive_b libvirtd; then
    local dom
    for dom in $(virsh -c "$HB_URI" list --all --name 2>/dev/null); do
      log "removing host B's domain $dom"
      virsh -c "$HB_URI" destroy "$dom" >/dev/null 2>&1 || true
      virsh -c "$HB_URI" undefine --nvram "$dom" >/dev/null 2>&1 ||
        virsh -c "$HB_URI" undefine "$dom" >/dev/null 2>&1 || true
    done
  fi
  local had_agent=0
  [[ -e $RUN/neutron-ovs-agent.pid ]] && had_agent=1
  stop_pid neutron-ovs-agent 5 alive_b &
  stop_pid neutron-lb-agent 5 alive_b &
  stop_pid ovn-controller 5 alive_b &
  stop_pid libvirtd 30 alive_b &
  stop_pid ovs-vswitchd 10 alive_b &
  stop_pid fwd-libvirt 5 alive_root &
  stop_pid fwd-rabbit 5 alive_root &
  local f
  for f in "${NOVA_B_FORWARDS[@]}"; do stop_pid "fwd-${f%%:*}" 5 alive_root & done
  wait
  stop_pid virtlogd 10 alive_b &
  stop_pid ovsdb-server 10 alive_b &
  wait
  # Whatever else still runs in B's namespaces (QEMU, privsep helpers, `exec` leftovers).
  local left
  mapfile -t left < <(pids_in_b)
  if ((${#left[@]})); then
    log "killing ${#left[@]} process(es) left in host B: ${left[*]}"
    kill -KILL "${left[@]}" 2>/dev/null || true
    for pid in "${left[@]}"; do
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    done
  fi
  if ((had_agent)) || [[ -e $NEU/neutron.conf ]]; then neutron_forget_b; fi
  ovn_forget_b
  umount "$NS_DIR/mnt" 2>/dev/null || true
  umount "$NS_DIR/uts" 2>/dev/null || true
  if mountpoint -q "$NS_DIR" 2>/dev/null; then umount "$NS_DIR"; fi
  rm -rf "$NS_DIR"
  [[ -e /run/netns/$NETNS ]] && ip netns delete "$NETNS"
  # Deleting the namespace takes B's ends of both veth pairs (and so A's ends) with it.
  ip link del "$VETH_A" 2>/dev/null || true
  ip link del "$LINK_A" 2>/dev/null || true
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -rf "$HB_DIR"
  record down "$s"
  print_timings
}

# ---------------------------------------------------------------------------------------------
# up, status, env

check_host_a() {
  local c
  # The only package host B needs beyond integration/host-setup.sh's set: the forwarders.
  if ! command -v socat >/dev/null; then
    log "installing socat"
    DEBIAN_FRONTEND=noninteractive apt-get -y -q install --no-install-recommends socat >/dev/null 2>&1 || {
      apt-get -q update >/dev/null 2>&1
      DEBIAN_FRONTEND=noninteractive apt-get -y -q install --no-install-recommends socat >/dev/null
    } || die "could not install socat"
  fi
  for c in ip nsenter unshare mountpoint socat virsh libvirtd virtlogd tini ovsdb-server \
    ovs-vswitchd ovs-vsctl ovsdb-tool jq curl; do
    command -v "$c" >/dev/null || die "missing $c (run integration/host-setup.sh up; apt-get install socat)"
  done
  virsh -c qemu:///system version >/dev/null 2>&1 ||
    die "host A's libvirtd (qemu:///system) does not answer: run integration/host-setup.sh up"
}

cmd_up() {
  local s
  s=$(now)
  check_host_a
  create_dirs
  local t
  t=$(now)
  create_namespaces
  create_links
  record hostb-namespaces-links "$t"
  write_configs
  start_libvirt_b
  start_ovs_b
  if [[ $NO_NEUTRON == 0 ]]; then
    if have_neutron; then
      start_agent_b
      start_lb_agent_b
    else
      log "no Neutron set-up on host A (integration/host-setup.sh up --with-neutron): host B runs no agent"
    fi
    if have_ovn; then
      start_ovn_b
    else
      log "no ML2/OVN on host A: host B is no OVN chassis"
    fi
  fi
  record up "$s"
  print_timings
  cmd_env
}

cmd_env() {
  local agent=0 ovn=
  ns_ready && alive_b neutron-ovs-agent && agent=1
  ns_ready && alive_b ovn-controller && ovn=$HB_OVN_HOST
  local lb=
  ns_ready && alive_b neutron-lb-agent && lb=$HB_LB_HOST
  cat <<EOF
export VIREO_HOSTB_NAME=$HB_NAME
export VIREO_HOSTB_URI=$HB_URI
export VIREO_HOSTB_UNIX_URI='$HB_UNIX_URI'
export VIREO_HOSTB_ADDR=$ADDR_B
export VIREO_HOSTB_MIGRATE_URI=tcp://$ADDR_B
export VIREO_HOSTA_ADDR=$ADDR_A
export VIREO_HOSTA_MIGRATE_URI=tcp://$ADDR_A
export VIREO_HOSTA_URI_FROM_B=$HA_URI_FROM_B
export VIREO_HOSTA_UNIX_URI_FROM_B='$HA_UNIX_URI_FROM_B'
export VIREO_HOSTB_BRIDGE=$BRIDGE
export VIREO_HOSTB_OVSDB=$B_OVSDB
export VIREO_HOSTB_NETNS=$NETNS
export VIREO_HOSTB_UUID=$HB_UUID
export VIREO_HOSTB_NEUTRON_AGENT=$agent
export VIREO_HOSTB_OVN_HOST=$ovn
export VIREO_HOSTB_LB_HOST=$lb
EOF
}

cmd_status() {
  local bad=0
  report() { printf '%-26s %-5s %s\n' "$1" "$2" "${3:-}"; }
  if ns_ready && in_b true 2>/dev/null; then
    report namespaces up "netns $NETNS, mount+uts $NS_DIR/{mnt,uts}, hostname $(in_b hostname)"
  else
    report namespaces DOWN
    return 1
  fi
  if tcp_open "$ADDR_B" "$LIBVIRT_PORT"; then report link up "$VETH_A $ADDR_A <-> $VETH_B $ADDR_B (B's libvirtd reachable)"; else
    report link DOWN
    bad=1
  fi
  if ip link show "$BRIDGE" >/dev/null 2>&1 && ip -n "$NETNS" link show "$BRIDGE" >/dev/null 2>&1; then
    report bridge up "$BRIDGE on A and B, joined by $LINK_A/$LINK_B"
  else
    report bridge DOWN
    bad=1
  fi
  local n
  for n in virtlogd libvirtd ovsdb-server ovs-vswitchd; do
    if alive_b "$n"; then report "hostb $n" up "pid $(pid_of "$n")"; else
      report "hostb $n" DOWN
      bad=1
    fi
  done
  if libvirt_b_answers >/dev/null 2>&1; then
    report "hostb libvirt" up "$HB_URI, host uuid $(virsh -c "$HB_URI" capabilities | sed -n 's:.*<uuid>\(.*\)</uuid>.*:\1:p' | head -1), $(virsh -c "$HB_URI" list --name | grep -c . || true) running domain(s)"
  else
    report "hostb libvirt" DOWN "$HB_URI"
    bad=1
  fi
  if alive_root fwd-libvirt; then report "hosta-from-b forwarder" up "$HA_URI_FROM_B"; else
    report "hosta-from-b forwarder" DOWN
    bad=1
  fi
  if ovs_b --timeout=2 br-exists br-int 2>/dev/null; then
    report "hostb br-int" up "$B_OVSDB, datapath $(ovs_b get Bridge br-int datapath_type)"
  else
    report "hostb br-int" DOWN
    bad=1
  fi
  if [[ -e $NEU/neutron.conf ]]; then
    if alive_b neutron-ovs-agent && agent_alive_b 0 2>/dev/null; then
      report "hostb neutron agent" up "host $HB_NAME, firewall $(cat "$HB_DIR/firewall" 2>/dev/null)"
    else
      report "hostb neutron agent" DOWN
      bad=1
    fi
  else
    report "hostb neutron agent" none "(no Neutron on host A, or up --no-neutron)"
  fi
  if [[ -e $NEU/linuxbridge_agent.ini ]]; then
    if alive_b neutron-lb-agent && agent_alive_b 0 "$HB_LB_HOST" "Linux+bridge+agent" 2>/dev/null; then
      report "hostb linux bridge agent" up "host $HB_LB_HOST, physnet1 on $LB_UPLINK_B"
    else
      report "hostb linux bridge agent" DOWN
      bad=1
    fi
  fi
  if alive_b ovn-controller; then
    if ovn_chassis_b_up 2>/dev/null; then report "hostb ovn-controller" up "chassis $HB_OVN_HOST"; else
      report "hostb ovn-controller" DOWN "chassis $HB_OVN_HOST not registered"
      bad=1
    fi
  else
    report "hostb ovn-controller" none "(no ML2/OVN on host A, or up --no-neutron)"
  fi
  return $bad
}

usage() {
  sed -n '2,21p' "$SELF" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

# ---------------------------------------------------------------------------------------------
# main

[[ $# -ge 1 ]] || usage
CMD=$1
shift
ARGS=("$@")
case $CMD in
__ns-init)
  ns_init
  exit 0
  ;;
__in-b)
  [[ -e /run/libvirt/$MARKER && $(hostname) == "$HB_NAME" ]] ||
    die "not inside host B's namespaces (no /run/libvirt/$MARKER)"
  exec "$@"
  ;;
esac
[[ $(id -u) == 0 ]] || die "run as root"

NO_NEUTRON=0
export SELFTEST_EVENTS=0 SELFTEST_BOOT=1 SELFTEST_ONLY=bridge,ovs,boot,neutron,cold,fail # selftest.sh
case $CMD in
up | selftest)
  while [[ $# -gt 0 ]]; do
    case $1 in
    --no-neutron) NO_NEUTRON=1 ;;
    --events) SELFTEST_EVENTS=1 ;;
    --no-boot) SELFTEST_BOOT=0 ;;
    --only)
      SELFTEST_ONLY=${2:?--only needs a list of parts}
      shift
      ;;
    -h | --help) usage 0 ;;
    *) die "unknown option $1" ;;
    esac
    shift
  done
  ;;
esac

# One `up`/`down` at a time; selftests may run alongside each other but not alongside those.
# This process holds the lock and runs the command as a child without the lock's descriptor (the
# daemons `up` starts would otherwise inherit it and keep the lock forever).
if [[ -z ${VIREO_HB_LOCKED:-} ]]; then
  case $CMD in
  up | down | selftest | nova-up | nova-down)
    mkdir -p "$STATE_DIR"
    exec 9>"$STATE_DIR/.two-host.lock"
    mode=-x
    [[ $CMD == selftest ]] && mode=-s
    flock "$mode" -w 600 9 || die "timed out waiting for $STATE_DIR/.two-host.lock (another up/down/selftest)"
    rc=0
    VIREO_HB_LOCKED=1 "$SELF" "$CMD" "${ARGS[@]}" 9>&- || rc=$?
    exit $rc
    ;;
  esac
fi

case $CMD in
up) cmd_up ;;
down) cmd_down ;;
nova-up) cmd_nova_up ;;
nova-down) cmd_nova_down ;;
nova-instances)
  [[ $# -eq 1 ]] || die "usage: two-host.sh nova-instances own|shared"
  cmd_nova_instances "$1"
  ;;
nova-compute-driver)
  [[ $# -eq 1 ]] || die "usage: two-host.sh nova-compute-driver vireo|libvirt"
  cmd_nova_compute_driver "$1"
  ;;
status) cmd_status ;;
env) cmd_env ;;
exec)
  [[ $# -ge 1 ]] || die "usage: two-host.sh exec CMD [ARG...]"
  in_b "$@"
  ;;
selftest)
  # shellcheck source-path=SCRIPTDIR source=setup/two-host/selftest.sh
  . "$TPL_DIR/selftest.sh"
  cmd_selftest
  ;;
-h | --help | help) usage 0 ;;
*) usage ;;
esac
