#!/usr/bin/env bash
# integration/host-setup.sh — install and run what vireo's integration tier needs on one host.
#
#   host-setup.sh up     [--with-neutron] [--firewall iptables_hybrid|openvswitch]
#                        [--nova-port PORT] [--second-host NAME]
#   host-setup.sh down   [--neutron-only]
#   host-setup.sh status [--with-neutron]
#   host-setup.sh neutron-firewall iptables_hybrid|openvswitch
#   host-setup.sh env    (prints the VIREO_* variables of a running Neutron set-up)
#   host-setup.sh build-deps (only what building vireo and its test:/// main job need)
#   host-setup.sh nova-up   (after `up --with-neutron`: placement, glance, nova-api, -conductor,
#                            -scheduler, a vireo agent and nova-compute with vireo.VireoDriver;
#                            Neutron then posts its events to nova-api)
#   host-setup.sh nova-down (stops them; Neutron posts to vireo's agents again)
#   host-setup.sh nova-compute-driver vireo|libvirt (after nova-up: host A's nova-compute on
#                            vireo.VireoDriver or on Nova's own libvirt.LibvirtDriver, for the
#                            side-by-side in integration/nova/side_by_side.py)
#   host-setup.sh vireo-agent-up (after nova-up: host A's vireo agent started again if it does
#                            not answer; the Nova tier's agent-kill scenarios)
#   host-setup.sh nova-network ovs|ovn|lb [pre-created|libvirt-managed] (after nova-up: the
#                            network every Nova service and vireo agent uses: ML2/openvswitch,
#                            ML2/OVN, or the Linux bridge agents (nova-compute then runs as
#                            their host, <hostname>-lb), and the form of vireo's native OVS
#                            ports; two-host.sh nova-up then does the same on host B; nova-down
#                            goes back to ovs)
#
# Runs as root on Debian 12 (bookworm) without systemd as PID 1. Idempotent: `up` on a host where
# everything already runs only checks it. See integration/README.md.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SETUP_DIR=$SCRIPT_DIR/setup

STATE_DIR=${VIREO_STATE_DIR:-/var/lib/vireo-integration}
RUN_DIR=$STATE_DIR/run
LOG_DIR=$STATE_DIR/log
ETC_DIR=$STATE_DIR/etc
EVENTS_TOKEN_FILE=$ETC_DIR/vireo-events-token
MARK_DIR=$STATE_DIR/started
ENV_FILE=$STATE_DIR/neutron.env

HOST=${VIREO_NEUTRON_HOST:-$(hostname)}
SECOND_HOST=${VIREO_SECOND_HOST:-h2}
NOVA_PORT=${VIREO_NOVA_PORT:-8774}
# What Neutron's notifier sends to NOVA_PORT (keystoneauth's admin_token plugin): vireo's events
# token (EVENTS_TOKEN_FILE, docs/AGENT.md's set-up, no proxy) or, to nova-api (noauth2), admin:admin.
NOVA_TOKEN=
NOVA_API_PORT=${VIREO_NOVA_API_PORT:-18774}
PLACEMENT_PORT=8778
GLANCE_PORT=9292
AGENT_PORT=${VIREO_NOVA_AGENT_PORT:-8775}
# This host's address on the link to two-host.sh's host B (its libvirtd is forwarded there).
HOSTA_LINK_ADDR=${VIREO_HB_ADDR_A:-198.51.100.1}
OS_TOKEN=admin:admin # noauth2: the user before the colon is the admin
NEUTRON_PORT=${VIREO_NEUTRON_PORT:-9696}
FIREWALL=${VIREO_FIREWALL:-iptables_hybrid}
SEND_EVENTS_INTERVAL=${VIREO_SEND_EVENTS_INTERVAL:-2}
RABBIT_PORT=5672
DB_PORT=3306
DB_PASSWORD=vireo-neutron
NET_NAME=vireo-net
SUBNET_NAME=vireo-subnet
SUBNET_CIDR=${VIREO_SUBNET_CIDR:-192.0.2.0/24}
# The Linux bridge agent's host (in this namespace), its flat network on physnet1 and the veth
# end it uses as that network's uplink.
LB_HOST=${VIREO_LB_HOST:-$HOST-lb}
LB_UPLINK=vlb-up
LB_UPLINK_PEER=vlb-peer
LB_NET_NAME=vireo-lb-net
LB_SUBNET_NAME=vireo-lb-subnet
LB_SUBNET_CIDR=203.0.113.0/24
NEUTRON_URL=http://127.0.0.1:$NEUTRON_PORT
# ML2/OVN: a second neutron-server (its own port, database and RabbitMQ vhost) whose one chassis
# is an ovn-controller on this machine's Open vSwitch as host OVN_HOST, with an integration
# bridge of its own (the OVS agent keeps br-int), and a geneve network.
OVN_DIR=$STATE_DIR/ovn
OVN_HOST=${VIREO_OVN_HOST:-$HOST-ovn}
OVN_BRIDGE=br-ovn
NEUTRON_OVN_PORT=${VIREO_NEUTRON_OVN_PORT:-9796}
NEUTRON_OVN_URL=http://127.0.0.1:$NEUTRON_OVN_PORT
OVN_NET_NAME=vireo-ovn-net
OVN_SUBNET_NAME=vireo-ovn-subnet
OVN_SUBNET_CIDR=198.18.0.0/24
# The Nova tier's network (`nova-network`): "ovs" (the ML2/openvswitch server and its OVS
# agents, the default), "ovn" (the ML2/OVN server) or "lb" (the ML2/openvswitch server's Linux
# bridge agents), then the form of vireo's native OVS ports. Neutron binds a port to the agent
# (or chassis) of the host Nova names, nova-compute's: on ovn host A's chassis takes
# nova-compute's host name (OVN_HOST again after nova-down); on lb nova-compute and its agent
# run as the Linux bridge agent's host, LB_HOST (the OVS agent is this machine's HOST).
# two-host.sh reads the same file.
NOVA_NETWORK_FILE=$STATE_DIR/nova-network
NOVA_NEUTRON_PORT=$NEUTRON_PORT
NOVA_OVS_BRIDGE=br-int
NOVA_OVS_FORM=pre-created
COMPUTE_HOST=$HOST
PY=/usr/bin/python3 # Debian's python: the one the neutron packages install into

BPO_PKGS=(qemu-system-x86 qemu-utils libvirt-daemon-system libvirt-dev libvirt-clients)
BASE_PKGS=(pkg-config libxml2-utils openvswitch-switch iproute2 cpio busybox-static
  linux-image-amd64 kmod xz-utils zstd jq curl procps iptables genisoimage e2fsprogs util-linux
  tini)
# The OpenStack tier: Neutron and its services, and Nova's libraries for the Nova driver's tests
# (driver/nova/tests load Nova's own ComputeManager in-process and start their own glance-api),
# and python3-libvirt for Nova's own libvirt driver (the side-by-side, nova-compute-driver).
NEUTRON_PKGS=(neutron-server neutron-openvswitch-agent neutron-linuxbridge-agent rabbitmq-server
  mariadb-server ovn-central ovn-host
  python3-pymysql sudo ipset conntrack python3-nova python3-pytest python3-flake8 glance-api
  python3-placement placement-api python3-openstackclient python3-libvirt)

export DEBIAN_FRONTEND=noninteractive

# ---------------------------------------------------------------------------------------------
# helpers

log() { printf '[host-setup %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}
now() { date +%s.%N; }
elapsed() { awk -v s="$1" -v e="$(now)" 'BEGIN { printf "%.1f", e - s }'; }

TIMINGS=()
# timed LABEL CMD...: runs CMD and records how long it took.
timed() {
  local label=$1 start
  shift
  start=$(now)
  "$@"
  local d
  d=$(elapsed "$start")
  TIMINGS+=("$label=${d}s")
  log "$label took ${d}s"
}
# record LABEL START: records the time since START.
record() {
  local d
  d=$(elapsed "$2")
  TIMINGS+=("$1=${d}s")
  log "$1 took ${d}s"
}
print_timings() {
  local t
  for t in "${TIMINGS[@]}"; do echo "TIMING $t"; done
}

# wait_for SECONDS DESCRIPTION CMD...: polls CMD every 0.5 s until it succeeds.
wait_for() {
  local timeout=$1 what=$2 start
  shift 2
  start=$(now)
  while ! "$@" >/dev/null 2>&1; do
    if awk -v s="$start" -v e="$(now)" -v t="$timeout" 'BEGIN { exit !(e - s > t) }'; then
      log "timed out after ${timeout}s waiting for $what"
      return 1
    fi
    sleep 0.5
  done
}

# wait_alive NAME SECONDS DESCRIPTION CMD...: like wait_for, but gives up at once when the
# process started as NAME has exited.
wait_alive() {
  local name=$1 timeout=$2 what=$3 start
  shift 3
  start=$(now)
  while ! "$@" >/dev/null 2>&1; do
    if ! alive "$name"; then
      log "$name exited while waiting for $what"
      return 1
    fi
    if awk -v s="$start" -v e="$(now)" -v t="$timeout" 'BEGIN { exit !(e - s > t) }'; then
      log "timed out after ${timeout}s waiting for $what"
      return 1
    fi
    sleep 0.5
  done
}

pkg_installed() { [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]; }
missing_pkgs() {
  local p
  for p in "$@"; do pkg_installed "$p" || echo "$p"; done
}

pid_of() { [[ -s $RUN_DIR/$1.pid ]] && cat "$RUN_DIR/$1.pid"; }
alive() {
  local pid
  pid=$(pid_of "$1") || return 1
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}

# start_bg NAME CMD...: starts CMD in its own session (process group = its pid), logs to
# $LOG_DIR/NAME.log, records its pid in $RUN_DIR/NAME.pid.
start_bg() {
  local name=$1
  shift
  setsid "$@" >>"$LOG_DIR/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN_DIR/$name.pid"
}

# stop_bg NAME [TIMEOUT]: TERM to the process group started by start_bg, KILL after TIMEOUT.
stop_bg() {
  local name=$1 timeout=${2:-20} pid i
  pid=$(pid_of "$name") || return 0
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    log "stopping $name (pid $pid)"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < timeout * 2; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  # Children that outlived their leader keep the process group id.
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$RUN_DIR/$name.pid"
}

render() { # render TEMPLATE OUT
  sed -e "s|@HOST@|$HOST|g" \
    -e "s|@NEUTRON_PORT@|$NEUTRON_PORT|g" \
    -e "s|@NOVA_PORT@|$NOVA_PORT|g" \
    -e "s|@RABBIT_PORT@|$RABBIT_PORT|g" \
    -e "s|@DB_PORT@|$DB_PORT|g" \
    -e "s|@DB_PASSWORD@|$DB_PASSWORD|g" \
    -e "s|@STATE_DIR@|$STATE_DIR|g" \
    -e "s|@RUN_DIR@|$RUN_DIR|g" \
    -e "s|@LOG_DIR@|$LOG_DIR|g" \
    -e "s|@FIREWALL_DRIVER@|$FIREWALL|g" \
    -e "s|@SEND_EVENTS_INTERVAL@|$SEND_EVENTS_INTERVAL|g" \
    -e "s|@NOVA_TOKEN@|$NOVA_TOKEN|g" \
    -e "s|@NOVA_API_PORT@|$NOVA_API_PORT|g" \
    -e "s|@PLACEMENT_PORT@|$PLACEMENT_PORT|g" \
    -e "s|@GLANCE_PORT@|$GLANCE_PORT|g" \
    -e "s|@AGENT_PORT@|$AGENT_PORT|g" \
    -e "s|@ETC_DIR@|$ETC_DIR|g" \
    -e "s|@DOMAIN_TYPE@|${DOMAIN_TYPE:-kvm}|g" \
    -e "s|@HOSTA_LINK_ADDR@|$HOSTA_LINK_ADDR|g" \
    -e "s|@LB_HOST@|$LB_HOST|g" \
    -e "s|@LB_UPLINK@|$LB_UPLINK|g" \
    -e "s|@NEUTRON_OVN_PORT@|$NEUTRON_OVN_PORT|g" \
    -e "s|@OVN_DIR@|$OVN_DIR|g" \
    -e "s|@OVN_HOST@|$OVN_HOST|g" \
    -e "s|@OVN_BRIDGE@|$OVN_BRIDGE|g" \
    -e "s|@NOVA_NEUTRON_PORT@|$NOVA_NEUTRON_PORT|g" \
    -e "s|@NOVA_OVS_BRIDGE@|$NOVA_OVS_BRIDGE|g" \
    -e "s|@NOVA_OVS_FORM@|$NOVA_OVS_FORM|g" \
    -e "s|@COMPUTE_HOST@|$COMPUTE_HOST|g" \
    "$SETUP_DIR/$1" >"$2.tmp"
  if cmp -s "$2.tmp" "$2"; then
    rm -f "$2.tmp"
  else
    [[ -e $2 ]] && CHANGED+=("$(basename "$2")")
    mv "$2.tmp" "$2"
  fi
}
# stamp NAME FILE...: remembers the configuration the process NAME starts with; stale NAME
# FILE... is true when a running NAME started with other content than the files hold now (a
# run that rewrote a file and failed before restarting NAME is caught by the next run).
conf_sum() { (cd "$ETC_DIR" && cat "$@" 2>/dev/null | sha256sum | cut -d' ' -f1); }
stamp() {
  local name=$1
  shift
  conf_sum "$@" >"$RUN_DIR/$name.conf-sum"
}
stale() {
  local name=$1
  shift
  [[ $(cat "$RUN_DIR/$name.conf-sum" 2>/dev/null) != "$(conf_sum "$@")" ]]
}
CHANGED=()
changed() { # changed FILE...: was one of these configs rewritten with new content?
  local f c
  for f in "$@"; do
    for c in "${CHANGED[@]}"; do [[ $c == "$f" ]] && return 0; done
  done
  return 1
}

api() { # api METHOD PATH [JSON]
  local args=(-sS -f --max-time 30 -X "$1" -H 'Content-Type: application/json'
    -H 'X-Project-Id: vireo' -H 'X-Roles: admin')
  [[ $# -ge 3 ]] && args+=(-d "$3")
  curl "${args[@]}" "$NEUTRON_URL$2"
}

mark() { touch "$MARK_DIR/$1"; }
marked() { [[ -e $MARK_DIR/$1 ]]; }

# ---------------------------------------------------------------------------------------------
# packages

os_codename() { . /etc/os-release && echo "${VERSION_CODENAME:-bookworm}"; }

# The mirror the machine already uses for the main suite (deb822 or one-line format).
debian_mirror() {
  local f m
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -e $f ]] || continue
    m=$(awk -v suite="$(os_codename)" 'BEGIN { RS = ""; FS = "\n" }
      {
        uris = ""; ok = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^[ \t]*#/) continue
          if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); uris = a[2] }
          if ($i ~ /^Suites:/) { n = split($i, s, /[ \t]+/); for (j = 2; j <= n; j++) if (s[j] == suite) ok = 1 }
        }
        if (ok && uris != "") { print uris; exit }
      }' "$f")
    [[ -n $m ]] && {
      echo "$m"
      return
    }
  done
  if [[ -f /etc/apt/sources.list ]]; then
    m=$(awk -v suite="$(os_codename)" '$1 == "deb" && $3 == suite { print $2; exit }' /etc/apt/sources.list)
    [[ -n $m ]] && {
      echo "$m"
      return
    }
  fi
  echo http://deb.debian.org/debian
}

# Adds <codename>-backports (main) unless some apt source already provides it; returns 0 when
# it added the source.
ensure_backports_source() {
  local suite f
  suite="$(os_codename)-backports"
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    if grep -qE "^[[:space:]]*(Suites:.*[[:space:]]$suite([[:space:]]|\$)|deb[[:space:]].*[[:space:]]${suite}[[:space:]])" "$f"; then
      return 1
    fi
  done
  local mirror
  mirror=$(debian_mirror)
  log "adding apt source $suite on $mirror"
  cat >/etc/apt/sources.list.d/vireo-backports.sources <<EOF
# Added by vireo integration/host-setup.sh: qemu-system-x86 and libvirt from $suite.
Types: deb
URIs: $mirror
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  return 0
}

apt_install() { # apt_install [apt options] -- PKGS...
  local opts=()
  while [[ $1 != -- ]]; do
    opts+=("$1")
    shift
  done
  shift
  apt-get -y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    install "${opts[@]}" "$@"
}

install_packages() {
  local with_neutron=$1 added_policy=0
  ensure_backports_source || true
  local bpo base neu
  mapfile -t bpo < <(missing_pkgs "${BPO_PKGS[@]}")
  mapfile -t base < <(missing_pkgs "${BASE_PKGS[@]}")
  neu=()
  [[ $with_neutron == 1 ]] && mapfile -t neu < <(missing_pkgs "${NEUTRON_PKGS[@]}")
  if ((${#bpo[@]} + ${#base[@]} + ${#neu[@]} == 0)); then
    log "all packages present"
    return
  fi
  log "installing: ${bpo[*]} ${base[*]} ${neu[*]}"
  # Package scripts must not try to start services (there is no init system to ask).
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    added_policy=1
  fi
  apt-get -q update >"$LOG_DIR/apt-update.log" 2>&1 || {
    cat "$LOG_DIR/apt-update.log" >&2
    die "apt-get update failed"
  }
  local suite
  suite="$(os_codename)-backports"
  ((${#bpo[@]})) && apt_install -t "$suite" -- "${BPO_PKGS[@]}"
  ((${#base[@]})) && apt_install --no-install-recommends -- "${base[@]}"
  ((${#neu[@]})) && apt_install --no-install-recommends -- "${neu[@]}"
  if ((added_policy)); then rm -f /usr/sbin/policy-rc.d; fi
}

# build-deps: what `cargo build` needs (the virt crate links libvirt via pkg-config) and what
# the main job needs at run time on libvirt's in-process test driver. No daemon.
BUILD_PKGS=(libvirt-dev pkg-config)
install_build_deps() {
  local missing
  mapfile -t missing < <(missing_pkgs "${BUILD_PKGS[@]}")
  if ((${#missing[@]} == 0)); then
    log "build dependencies present"
    return
  fi
  ensure_backports_source || true
  log "installing: ${missing[*]}"
  apt-get -q update >"$LOG_DIR/apt-update.log" 2>&1 || {
    cat "$LOG_DIR/apt-update.log" >&2
    die "apt-get update failed"
  }
  # libvirt-dev from backports, like the daemons, so one libvirt version is on the machine.
  apt_install -t "$(os_codename)-backports" --no-install-recommends -- libvirt-dev
  apt_install --no-install-recommends -- pkg-config
}

# ---------------------------------------------------------------------------------------------
# libvirt and Open vSwitch

libvirt_answers() { virsh -c qemu:///system version; }

# The pid of this host's libvirtd (its pid file in /run; `pgrep` would also find the libvirtd
# of integration/two-host.sh's host B).
libvirtd_pid() {
  local pid
  [[ -s /run/libvirtd.pid ]] || return 1
  pid=$(cat /run/libvirtd.pid)
  [[ $(ps -o comm= -p "$pid") == libvirtd ]] && echo "$pid"
}

# Does libvirtd run under tini, the subreaper it is started with here?
libvirtd_reaped() {
  local pid ppid
  pid=$(libvirtd_pid) || return 1
  ppid=$(ps -o ppid= -p "$pid" | tr -d ' ')
  [[ $(ps -o comm= -p "$ppid") == tini ]]
}

# libvirtd in the foreground under `tini -s`, a child subreaper. QEMU daemonizes, so its parent
# is the nearest subreaper, else PID 1; when a QEMU process exits, libvirtd waits until that
# parent has reaped it. On a host whose PID 1 is systemd that is at once; on machines whose
# PID 1 is a sandbox's init (this CI's) it took 1.2-1.4 s, added to every destroy, shut-down
# and live migration (measured with `virsh destroy` of a bare TCG domain: 1.25 s, against 0.01 s
# for the same QEMU killed by hand). Under tini every QEMU is reaped when it exits, as under
# systemd.
start_libvirtd() {
  setsid tini -s -- libvirtd >>"$LOG_DIR/libvirtd-stdio.log" 2>&1 </dev/null &
}

# stop_marked NAME: stop a daemon `up` started (its pid file in /run), and forget it.
stop_marked() {
  local d=$1 pid i
  if [[ -s /run/$d.pid ]]; then
    pid=$(cat "/run/$d.pid")
    log "stopping $d (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
  fi
  rm -f "$MARK_DIR/$d"
}

start_libvirt() {
  if ! pgrep -x virtlogd >/dev/null; then
    timed start-virtlogd virtlogd -d
    mark virtlogd
  fi
  if marked libvirtd && libvirtd_pid >/dev/null && ! libvirtd_reaped; then
    log "libvirtd was started here without tini: restarting it under tini"
    stop_marked libvirtd
  fi
  if ! libvirtd_pid >/dev/null; then
    local s
    s=$(now)
    start_libvirtd
    mark libvirtd
    wait_for 60 "libvirtd to answer" libvirt_answers || die "libvirtd does not answer"
    record start-libvirtd "$s"
  else
    wait_for 30 "libvirtd to answer" libvirt_answers || die "libvirtd runs but does not answer"
  fi
}

ovs_answers() { ovs-vsctl --timeout=3 show; }

start_ovs() {
  if ! ovs_answers >/dev/null 2>&1; then
    local s
    s=$(now)
    /usr/share/openvswitch/scripts/ovs-ctl start >"$LOG_DIR/ovs-ctl.log" 2>&1 || {
      cat "$LOG_DIR/ovs-ctl.log" >&2
      die "ovs-ctl start failed"
    }
    mark ovs
    wait_for 30 "ovsdb" ovs_answers || die "Open vSwitch does not answer"
    record start-ovs "$s"
  fi
  if ! ovs-vsctl br-exists br-int; then
    ovs-vsctl --may-exist add-br br-int -- set Bridge br-int datapath_type=netdev
    mark br-int
  fi
}

# ---------------------------------------------------------------------------------------------
# Neutron: MariaDB, RabbitMQ, neutron-server, neutron-openvswitch-agent, second-host reporter

MYSQL_RUN=$RUN_DIR/mysqld

mysql_cli() { mariadb --defaults-file="$ETC_DIR/mariadb.cnf" -uroot; }
mariadb_answers() { mariadb-admin --defaults-file="$ETC_DIR/mariadb.cnf" -uroot ping; }

start_mariadb() {
  mkdir -p "$MYSQL_RUN"
  chown mysql:mysql "$MYSQL_RUN"
  render mariadb.cnf.in "$ETC_DIR/mariadb.cnf"
  if alive mariadb && mariadb_answers >/dev/null 2>&1; then
    return
  fi
  if [[ ! -d $STATE_DIR/mysql/mysql ]]; then
    mkdir -p "$STATE_DIR/mysql"
    chown mysql:mysql "$STATE_DIR/mysql"
    mariadb-install-db --defaults-file="$ETC_DIR/mariadb.cnf" --user=mysql \
      --auth-root-authentication-method=socket --skip-test-db \
      >"$LOG_DIR/mariadb-install-db.log" 2>&1 || {
      cat "$LOG_DIR/mariadb-install-db.log" >&2
      die "mariadb-install-db failed"
    }
  fi
  touch "$LOG_DIR/mariadb.log"
  chown mysql:mysql "$LOG_DIR/mariadb.log"
  start_bg mariadb mysqld_safe --defaults-file="$ETC_DIR/mariadb.cnf"
  wait_alive mariadb 60 "MariaDB" mariadb_answers || {
    tail -20 "$LOG_DIR/mariadb.log" >&2
    die "MariaDB did not start"
  }
}

create_neutron_db() {
  mysql_cli <<EOF
CREATE DATABASE IF NOT EXISTS neutron CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS 'neutron'@'127.0.0.1' IDENTIFIED BY '$DB_PASSWORD';
GRANT ALL PRIVILEGES ON neutron.* TO 'neutron'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF
}

stop_mariadb() {
  if [[ -f $ETC_DIR/mariadb.cnf ]] && mariadb_answers >/dev/null 2>&1; then
    log "stopping MariaDB"
    mariadb-admin --defaults-file="$ETC_DIR/mariadb.cnf" -uroot shutdown || true
  fi
  stop_bg mariadb 30
}

# RabbitMQ: every Erlang command (server, rabbitmqctl, epmd) sees these variables, so epmd and
# the distribution port bind to loopback only.
rabbit_env() {
  export ERL_EPMD_ADDRESS=127.0.0.1
  export RABBITMQ_NODENAME=rabbit@localhost
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$RABBIT_PORT
  export RABBITMQ_DIST_PORT=25672
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export RABBITMQ_MNESIA_BASE=$STATE_DIR/rabbitmq/mnesia
  export RABBITMQ_LOG_BASE=$LOG_DIR/rabbitmq
  export RABBITMQ_PID_FILE=$STATE_DIR/rabbitmq/rabbit.pid
  export RABBITMQ_ENABLED_PLUGINS_FILE=$STATE_DIR/rabbitmq/enabled_plugins
  export HOME=/var/lib/rabbitmq
}
rabbitmqctl_() { (rabbit_env && runuser -u rabbitmq -- env HOME=/var/lib/rabbitmq rabbitmqctl -q "$@"); }
rabbit_answers() { rabbitmqctl_ status; }

start_rabbitmq() {
  if alive rabbitmq && rabbit_answers >/dev/null 2>&1; then
    return
  fi
  mkdir -p "$STATE_DIR/rabbitmq/mnesia" "$LOG_DIR/rabbitmq"
  [[ -e $STATE_DIR/rabbitmq/enabled_plugins ]] || echo '[].' >"$STATE_DIR/rabbitmq/enabled_plugins"
  chown -R rabbitmq:rabbitmq "$STATE_DIR/rabbitmq" "$LOG_DIR/rabbitmq"
  (
    rabbit_env
    start_bg rabbitmq runuser -u rabbitmq -- env HOME=/var/lib/rabbitmq /usr/lib/rabbitmq/bin/rabbitmq-server
  )
  wait_alive rabbitmq 90 "RabbitMQ" rabbitmqctl_ await_startup --timeout 5 || {
    tail -30 "$LOG_DIR/rabbitmq.log" >&2
    die "RabbitMQ did not start"
  }
}

stop_rabbitmq() {
  if alive rabbitmq; then
    log "stopping RabbitMQ"
    rabbitmqctl_ stop >/dev/null 2>&1 || true
  fi
  stop_bg rabbitmq 30
  # epmd was started by our RabbitMQ (it daemonizes out of the process group): stop it unless
  # some other Erlang node still uses it.
  if (rabbit_env && epmd -names 2>/dev/null | grep -q '^name '); then
    log "epmd still serves other Erlang nodes: left running"
  else
    (rabbit_env && epmd -kill >/dev/null 2>&1) || true
  fi
}

neutron_answers() { api GET /v2.0/networks?limit=1; }

# agent_alive HOST [OVS_HYBRID_PLUG [SINCE]]: an Open vSwitch agent on HOST is alive (with that
# ovs_hybrid_plug, and started — first report with start_flag — at or after unix time SINCE).
agent_alive() {
  local out
  out=$(api GET "/v2.0/agents?host=$1&agent_type=Open+vSwitch+agent") || return 1
  jq -e --arg h "${2:-any}" --argjson since "${3:-0}" '.agents | length > 0 and all(
      .alive
      and ($h == "any" or (.configurations.ovs_hybrid_plug | tostring) == $h)
      and ((.started_at | sub("\\.[0-9]+$"; "") | strptime("%Y-%m-%d %H:%M:%S") | mktime) >= $since))' \
    <<<"$out" >/dev/null
}

# The events token vireo's endpoint takes from Neutron: made once (0600), kept.
ensure_events_token() {
  [[ -s $EVENTS_TOKEN_FILE ]] && return
  mkdir -p "$ETC_DIR"
  (umask 077 && od -An -tx1 -N24 /dev/urandom | tr -d ' \n' >"$EVENTS_TOKEN_FILE.tmp")
  mv "$EVENTS_TOKEN_FILE.tmp" "$EVENTS_TOKEN_FILE"
}

write_neutron_config() {
  ensure_events_token
  [[ -n $NOVA_TOKEN ]] || NOVA_TOKEN=$(<"$EVENTS_TOKEN_FILE")
  mkdir -p "$STATE_DIR/neutron/lock"
  render neutron.conf.in "$ETC_DIR/neutron.conf"
  render ml2_conf.ini.in "$ETC_DIR/ml2_conf.ini"
  render openvswitch_agent.ini.in "$ETC_DIR/openvswitch_agent.ini"
  render linuxbridge_agent.ini.in "$ETC_DIR/linuxbridge_agent.ini"
  render neutron-ovn.conf.in "$ETC_DIR/neutron-ovn.conf"
  render ml2_conf_ovn.ini.in "$ETC_DIR/ml2_conf_ovn.ini"
  echo "$FIREWALL" >"$STATE_DIR/firewall"
}

start_neutron_server() {
  if alive neutron-server && stale neutron-server neutron.conf ml2_conf.ini; then
    log "configuration changed: restarting neutron-server"
    stop_bg neutron-server 30
  fi
  if alive neutron-server && neutron_answers >/dev/null 2>&1; then
    return
  fi
  local s
  s=$(now)
  neutron-db-manage --config-file "$ETC_DIR/neutron.conf" --config-file "$ETC_DIR/ml2_conf.ini" \
    upgrade heads >"$LOG_DIR/neutron-db-manage.log" 2>&1 || {
    tail -30 "$LOG_DIR/neutron-db-manage.log" >&2
    die "neutron-db-manage upgrade heads failed"
  }
  record neutron-db-manage "$s"
  s=$(now)
  start_bg neutron-server neutron-server --config-file "$ETC_DIR/neutron.conf" \
    --config-file "$ETC_DIR/ml2_conf.ini" --log-file "$LOG_DIR/neutron-server.log"
  stamp neutron-server neutron.conf ml2_conf.ini
  wait_alive neutron-server 90 "neutron-server API" neutron_answers || {
    tail -30 "$LOG_DIR/neutron-server.log" >&2
    die "neutron-server did not answer"
  }
  record start-neutron-server "$s"
}

hybrid_for() { # firewall driver -> ovs_hybrid_plug
  case $1 in
  iptables_hybrid) echo true ;;
  openvswitch | noop) echo false ;;
  *) die "unknown firewall driver $1" ;;
  esac
}

start_neutron_agent() {
  if ! ovs-vsctl br-exists br-phys; then
    ovs-vsctl --may-exist add-br br-phys -- set Bridge br-phys datapath_type=netdev
  fi
  if alive neutron-ovs-agent && changed neutron.conf openvswitch_agent.ini; then
    log "configuration changed: restarting the Open vSwitch agent"
    stop_neutron_agent
    restore_after_agent
    ovs-vsctl --may-exist add-br br-phys -- set Bridge br-phys datapath_type=netdev
  fi
  if alive neutron-ovs-agent; then
    return
  fi
  local s
  s=$(now)
  start_bg neutron-ovs-agent neutron-openvswitch-agent --config-file "$ETC_DIR/neutron.conf" \
    --config-file "$ETC_DIR/openvswitch_agent.ini" --log-file "$LOG_DIR/neutron-openvswitch-agent.log"
  wait_alive neutron-ovs-agent 120 "the Open vSwitch agent on $HOST" \
    agent_alive "$HOST" "$(hybrid_for "$FIREWALL")" "${s%.*}" || {
    tail -30 "$LOG_DIR/neutron-openvswitch-agent.log" >&2
    die "the Open vSwitch agent did not report alive"
  }
  record start-neutron-ovs-agent "$s"
}

stop_neutron_agent() { stop_bg neutron-ovs-agent 5; }

# lb_agent_alive: the Linux bridge agent reports alive (started at or after unix time $1).
lb_agent_alive() {
  local out
  out=$(api GET "/v2.0/agents?host=$LB_HOST&agent_type=Linux+bridge+agent") || return 1
  jq -e --argjson since "${1:-0}" '.agents | length > 0 and all(.alive
      and ((.started_at | sub("\\.[0-9]+$"; "") | strptime("%Y-%m-%d %H:%M:%S") | mktime) >= $since))' \
    <<<"$out" >/dev/null
}

# The Linux bridge agent, as host LB_HOST: its uplink (a veth pair) first, since the agent
# refuses to start without the interface its mapping names.
start_lb_agent() {
  if ! ip link show "$LB_UPLINK" >/dev/null 2>&1; then
    ip link add "$LB_UPLINK" type veth peer name "$LB_UPLINK_PEER"
  fi
  ip link set "$LB_UPLINK" up
  ip link set "$LB_UPLINK_PEER" up
  if alive neutron-lb-agent && stale neutron-lb-agent neutron.conf linuxbridge_agent.ini; then
    log "configuration changed: restarting the Linux bridge agent"
    stop_lb_agent
  fi
  alive neutron-lb-agent && return
  local s
  s=$(now)
  start_bg neutron-lb-agent neutron-linuxbridge-agent --config-file "$ETC_DIR/neutron.conf" \
    --config-file "$ETC_DIR/linuxbridge_agent.ini" --log-file "$LOG_DIR/neutron-linuxbridge-agent.log"
  stamp neutron-lb-agent neutron.conf linuxbridge_agent.ini
  wait_alive neutron-lb-agent 120 "the Linux bridge agent ($LB_HOST)" lb_agent_alive "${s%.*}" || {
    tail -30 "$LOG_DIR/neutron-linuxbridge-agent.log" >&2
    die "the Linux bridge agent did not report alive"
  }
  record start-neutron-lb-agent "$s"
}

stop_lb_agent() { stop_bg neutron-lb-agent 5; }

# Removes what the Linux bridge agent made: the bridges of its network (brq + the network id's
# first 11 characters) and the uplink veth pair.
restore_after_lb_agent() {
  local net
  net=$(api GET "/v2.0/networks?name=$LB_NET_NAME" 2>/dev/null | jq -r '.networks[0].id // empty') || true
  [[ -n $net ]] && ip link del "brq${net:0:11}" 2>/dev/null
  ip link del "$LB_UPLINK" 2>/dev/null
  return 0
}

# ---------------------------------------------------------------------------------------------
# ML2/OVN

ovn_sb() { ovn-sbctl --db="unix:$OVN_DIR/run/sb.sock" --timeout=10 "$@"; }
# The Nova tier's Neutron and port form (NOVA_NETWORK_FILE): "ovs pre-created" by default
# (the agent's own default form).
nova_network() {
  local words=()
  [[ -s $NOVA_NETWORK_FILE ]] && read -r -a words <"$NOVA_NETWORK_FILE"
  echo "${words[0]:-ovs} ${words[1]:-pre-created}"
}
# NOVA_NEUTRON_PORT, NOVA_OVS_BRIDGE, NOVA_OVS_FORM and COMPUTE_HOST of the Nova tier's network.
nova_network_settings() {
  local network
  read -r network NOVA_OVS_FORM <<<"$(nova_network)"
  NOVA_NEUTRON_PORT=$NEUTRON_PORT
  NOVA_OVS_BRIDGE=br-int
  COMPUTE_HOST=$HOST
  case $network in
  ovn)
    NOVA_NEUTRON_PORT=$NEUTRON_OVN_PORT
    NOVA_OVS_BRIDGE=$OVN_BRIDGE
    ;;
  lb) COMPUTE_HOST=$LB_HOST ;;
  esac
}
# The hostname OVN_HOST's chassis reports: nova-compute's host while the Nova tier runs on OVN.
ovn_hostname() { if [[ $(nova_network) == ovn\ * ]]; then echo "$HOST"; else echo "$OVN_HOST"; fi; }
# The chassis of OVN_HOST is registered (ovn-controller connected to the southbound database).
ovn_chassis_up() { [[ $(ovn_sb --bare --columns=hostname find Chassis "name=$OVN_HOST") == "$(ovn_hostname)" ]]; }

# ovn_db NAME: the northbound or southbound ovsdb-server (NAME nb or sb), its database created once.
ovn_db() {
  local name=$1 schema
  [[ $name == nb ]] && schema=ovn-nb || schema=ovn-sb
  [[ -s $OVN_DIR/db/$name.db ]] || ovsdb-tool create "$OVN_DIR/db/$name.db" "/usr/share/ovn/$schema.ovsschema"
  alive "ovn-$name" && return
  start_bg "ovn-$name" ovsdb-server "$OVN_DIR/db/$name.db" --remote="punix:$OVN_DIR/run/$name.sock" \
    --unixctl="$OVN_DIR/run/$name.ctl" --log-file="$LOG_DIR/ovn-$name-db.log" -vconsole:off --no-chdir
  wait_for 10 "OVN's $name database" ovsdb-client list-dbs "unix:$OVN_DIR/run/$name.sock" ||
    die "OVN's $name ovsdb-server does not answer"
}

# OVN's databases, northd and one ovn-controller as chassis OVN_HOST. The controller shares this
# machine's Open vSwitch with the OVS agent, so its settings are the chassis-named external_ids
# (ovn-controller(8): `-n` and `external_ids:<option>-<chassis>`), and its bridge is its own.
start_ovn() {
  mkdir -p "$OVN_DIR"/{db,run}
  ovn_db nb
  ovn_db sb
  alive ovn-northd || start_bg ovn-northd ovn-northd --ovnnb-db="unix:$OVN_DIR/run/nb.sock" \
    --ovnsb-db="unix:$OVN_DIR/run/sb.sock" --unixctl="$OVN_DIR/run/northd.ctl" \
    --log-file="$LOG_DIR/ovn-northd.log" -vconsole:off --no-chdir
  local c=$OVN_HOST
  ovs-vsctl set Open_vSwitch . "external_ids:ovn-remote-$c=unix:$OVN_DIR/run/sb.sock" \
    "external_ids:ovn-encap-type-$c=geneve" "external_ids:ovn-encap-ip-$c=127.0.0.1" \
    "external_ids:ovn-bridge-$c=$OVN_BRIDGE" "external_ids:ovn-bridge-datapath-type-$c=netdev" \
    "external_ids:hostname-$c=$(ovn_hostname)"
  if ! alive ovn-controller; then
    start_bg ovn-controller env "OVN_RUNDIR=$OVN_DIR/run" ovn-controller -n "$c" \
      unix:/var/run/openvswitch/db.sock --log-file="$LOG_DIR/ovn-controller.log" -vconsole:off --no-chdir
  fi
  wait_alive ovn-controller 30 "ovn-controller ($c)" ovn_chassis_up || {
    tail -20 "$LOG_DIR/ovn-controller.log" >&2
    die "ovn-controller did not register its chassis"
  }
}

# The OVN agent of OVN_HOST, as the ML2/OVN Neutron's agents API shows it (by its hostname).
ovn_agent_alive() {
  local out
  out=$(NEUTRON_URL=$NEUTRON_OVN_URL api GET "/v2.0/agents?host=$(ovn_hostname)&agent_type=OVN+Controller+agent") ||
    return 1
  jq -e '.agents | length > 0 and all(.alive)' <<<"$out" >/dev/null
}

# The ML2/OVN neutron-server: Debian's eventlet server (the uwsgi API of neutron-api never
# connects ML2/OVN to its databases in Zed), its database and vhost made once.
start_neutron_ovn_server() {
  if alive neutron-ovn-server && stale neutron-ovn-server neutron.conf neutron-ovn.conf ml2_conf_ovn.ini; then
    log "configuration changed: restarting the ML2/OVN neutron-server"
    stop_bg neutron-ovn-server 30
  fi
  alive neutron-ovn-server && ovn_agent_alive && return
  mysql_cli <<EOF
CREATE DATABASE IF NOT EXISTS neutron_ovn CHARACTER SET utf8mb4;
GRANT ALL PRIVILEGES ON neutron_ovn.* TO 'neutron'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF
  rabbitmqctl_ add_vhost ovn >/dev/null 2>&1 || true
  rabbitmqctl_ set_permissions -p ovn guest '.*' '.*' '.*' >/dev/null
  mkdir -p "$STATE_DIR/neutron-ovn/lock"
  local s files=(--config-file "$ETC_DIR/neutron.conf" --config-file "$ETC_DIR/neutron-ovn.conf"
    --config-file "$ETC_DIR/ml2_conf_ovn.ini")
  s=$(now)
  neutron-db-manage "${files[@]}" upgrade heads >"$LOG_DIR/neutron-ovn-db-manage.log" 2>&1 || {
    tail -30 "$LOG_DIR/neutron-ovn-db-manage.log" >&2
    die "neutron-db-manage upgrade heads (ML2/OVN) failed"
  }
  stop_bg neutron-ovn-server 30
  start_bg neutron-ovn-server neutron-server "${files[@]}" --log-file "$LOG_DIR/neutron-ovn-server.log"
  stamp neutron-ovn-server neutron.conf neutron-ovn.conf ml2_conf_ovn.ini
  wait_alive neutron-ovn-server 90 "the ML2/OVN neutron-server and its $OVN_HOST agent" ovn_agent_alive || {
    tail -30 "$LOG_DIR/neutron-ovn-server.log" >&2
    die "the ML2/OVN neutron-server did not answer"
  }
  record start-neutron-ovn-server "$s"
}

# Creates (once) the ML2/OVN Neutron's geneve network and subnet.
ensure_ovn_network() {
  local net sub
  net=$(NEUTRON_URL=$NEUTRON_OVN_URL api GET "/v2.0/networks?name=$OVN_NET_NAME" | jq -r '.networks[0].id // empty')
  if [[ -z $net ]]; then
    net=$(NEUTRON_URL=$NEUTRON_OVN_URL api POST /v2.0/networks "{\"network\": {\"name\": \"$OVN_NET_NAME\",
      \"project_id\": \"vireo\", \"admin_state_up\": true}}" | jq -r .network.id)
  fi
  sub=$(NEUTRON_URL=$NEUTRON_OVN_URL api GET "/v2.0/subnets?name=$OVN_SUBNET_NAME&network_id=$net" | jq -r '.subnets[0].id // empty')
  if [[ -z $sub ]]; then
    sub=$(NEUTRON_URL=$NEUTRON_OVN_URL api POST /v2.0/subnets "{\"subnet\": {\"name\": \"$OVN_SUBNET_NAME\",
      \"project_id\": \"vireo\", \"network_id\": \"$net\", \"ip_version\": 4,
      \"cidr\": \"$OVN_SUBNET_CIDR\", \"enable_dhcp\": false, \"gateway_ip\": null}}" | jq -r .subnet.id)
  fi
  [[ -n $net && $net != null && -n $sub && $sub != null ]] || die "could not create the ML2/OVN network"
  OVN_NETWORK_ID=$net
}

stop_ovn() {
  stop_bg neutron-ovn-server 30
  stop_bg ovn-controller 10
  stop_bg ovn-northd 10
  stop_bg ovn-sb 10
  stop_bg ovn-nb 10
  if ovs_answers >/dev/null 2>&1; then
    ovs-vsctl --if-exists del-br "$OVN_BRIDGE"
    local k
    for k in ovn-remote ovn-encap-type ovn-encap-ip ovn-bridge ovn-bridge-datapath-type hostname; do
      ovs-vsctl remove Open_vSwitch . external_ids "$k-$OVN_HOST" 2>/dev/null || true
    done
  fi
  rm -rf "$OVN_DIR" "$STATE_DIR/neutron-ovn"
}

launch_second_host() {
  if alive second-host-reporter && [[ $(cat "$STATE_DIR/second_host.args" 2>/dev/null) != "$SECOND_HOST $FIREWALL" ]] || changed neutron.conf; then
    stop_bg second-host-reporter 10
  fi
  alive second-host-reporter && return
  echo "$SECOND_HOST $FIREWALL" >"$STATE_DIR/second_host.args"
  SECOND_HOST_START=$(now)
  start_bg second-host-reporter "$PY" "$SETUP_DIR/second_host_state_reporter.py" \
    --config-file "$ETC_DIR/neutron.conf" --host "$SECOND_HOST" \
    --firewall-driver "$FIREWALL" --bridge-mappings physnet1:br-phys --tunnel-types vxlan
  echo "$SECOND_HOST" >"$STATE_DIR/second_host"
}

wait_second_host() {
  local s=${SECOND_HOST_START:-0}
  wait_alive second-host-reporter 60 "the state of $SECOND_HOST" \
    agent_alive "$SECOND_HOST" "$(hybrid_for "$FIREWALL")" "${s%.*}" || {
    tail -30 "$LOG_DIR/second-host-reporter.log" >&2
    die "the state reporter for $SECOND_HOST did not get through"
  }
  [[ $s == 0 ]] || record second-host-reporter-reported "$s"
}

# Creates (once) the vxlan tenant network and its subnet the tests use; prints their ids.
ensure_test_network() {
  local net sub
  net=$(api GET "/v2.0/networks?name=$NET_NAME" | jq -r '.networks[0].id // empty')
  if [[ -z $net ]]; then
    net=$(api POST /v2.0/networks "{\"network\": {\"name\": \"$NET_NAME\", \"project_id\": \"vireo\",
      \"provider:network_type\": \"vxlan\", \"admin_state_up\": true}}" | jq -r .network.id)
  fi
  sub=$(api GET "/v2.0/subnets?name=$SUBNET_NAME&network_id=$net" | jq -r '.subnets[0].id // empty')
  if [[ -z $sub ]]; then
    sub=$(api POST /v2.0/subnets "{\"subnet\": {\"name\": \"$SUBNET_NAME\", \"project_id\": \"vireo\",
      \"network_id\": \"$net\", \"ip_version\": 4, \"cidr\": \"$SUBNET_CIDR\",
      \"enable_dhcp\": false, \"gateway_ip\": null}}" | jq -r .subnet.id)
  fi
  [[ -n $net && $net != null && -n $sub && $sub != null ]] || die "could not create the test network"
  NETWORK_ID=$net
  SUBNET_ID=$sub
}

# Creates (once) the Linux bridge agent's flat network on physnet1 and its subnet.
ensure_lb_network() {
  local net sub
  net=$(api GET "/v2.0/networks?name=$LB_NET_NAME" | jq -r '.networks[0].id // empty')
  if [[ -z $net ]]; then
    net=$(api POST /v2.0/networks "{\"network\": {\"name\": \"$LB_NET_NAME\", \"project_id\": \"vireo\",
      \"provider:network_type\": \"flat\", \"provider:physical_network\": \"physnet1\",
      \"admin_state_up\": true}}" | jq -r .network.id)
  fi
  sub=$(api GET "/v2.0/subnets?name=$LB_SUBNET_NAME&network_id=$net" | jq -r '.subnets[0].id // empty')
  if [[ -z $sub ]]; then
    sub=$(api POST /v2.0/subnets "{\"subnet\": {\"name\": \"$LB_SUBNET_NAME\", \"project_id\": \"vireo\",
      \"network_id\": \"$net\", \"ip_version\": 4, \"cidr\": \"$LB_SUBNET_CIDR\",
      \"enable_dhcp\": false, \"gateway_ip\": null}}" | jq -r .subnet.id)
  fi
  [[ -n $net && $net != null && -n $sub && $sub != null ]] || die "could not create the Linux bridge network"
  # Without port security: the agent's ARP and MAC spoofing rules are ebtables `among` matches,
  # which Debian 12's ebtables-nft adds but cannot delete ("RULE_DELETE failed (Invalid
  # argument)"; the kernel has no legacy ebtables nat table): the agent retries the delete
  # forever when a tap comes back, and never reports it (docs/EVENT_MODEL.md, section 9).
  if [[ $(api GET "/v2.0/networks/$net" | jq -r .network.port_security_enabled) != false ]]; then
    api PUT "/v2.0/networks/$net" '{"network": {"port_security_enabled": false}}' >/dev/null ||
      die "could not turn port security off on the Linux bridge network"
  fi
  LB_NETWORK_ID=$net
}

write_env_file() {
  cat >"$ENV_FILE.tmp" <<EOF
VIREO_NEUTRON_URL=$NEUTRON_URL
VIREO_NEUTRON_HOST=$HOST
VIREO_NEUTRON_SECOND_HOST=$SECOND_HOST
VIREO_NEUTRON_NETWORK_ID=$NETWORK_ID
VIREO_NEUTRON_SUBNET_ID=$SUBNET_ID
VIREO_NEUTRON_FIREWALL=$FIREWALL
VIREO_NEUTRON_LB_HOST=$LB_HOST
VIREO_NEUTRON_LB_NETWORK_ID=$LB_NETWORK_ID
VIREO_OVN_NEUTRON_URL=$NEUTRON_OVN_URL
VIREO_OVN_HOST=$OVN_HOST
VIREO_OVN_NETWORK_ID=$OVN_NETWORK_ID
VIREO_OVN_BRIDGE=$OVN_BRIDGE
VIREO_OVN_NB_DB=unix:$OVN_DIR/run/nb.sock
VIREO_NOVA_PORT=$NOVA_PORT
VIREO_EVENTS_TOKEN_FILE=$EVENTS_TOKEN_FILE
EOF
  mv "$ENV_FILE.tmp" "$ENV_FILE"
}

# Binds a fresh port on NETWORK (the test network by default) to HOST and prints its binding
# (vif_type ovs_hybrid_plug); deletes it.
probe_binding() { # probe_binding HOST [NETWORK]
  local port out
  port=$(api POST /v2.0/ports "{\"port\": {\"network_id\": \"${2:-$NETWORK_ID}\", \"project_id\": \"vireo\",
    \"name\": \"vireo-probe\", \"device_owner\": \"compute:nova\",
    \"device_id\": \"$(cat /proc/sys/kernel/random/uuid)\", \"binding:host_id\": \"$1\"}}") || return 1
  out=$(jq -r '.port | "\(."binding:vif_type") \(."binding:vif_details".ovs_hybrid_plug)"' <<<"$port")
  api DELETE "/v2.0/ports/$(jq -r .port.id <<<"$port")" >/dev/null || true
  echo "$out"
}

start_neutron() {
  mkdir -p "$ETC_DIR"
  # FIREWALL from the command line wins; otherwise keep what a previous `up` chose.
  [[ $FIREWALL_SET == 1 || ! -s $STATE_DIR/firewall ]] || FIREWALL=$(cat "$STATE_DIR/firewall")
  hybrid_for "$FIREWALL" >/dev/null
  write_neutron_config
  timed start-mariadb start_mariadb
  create_neutron_db
  timed start-rabbitmq start_rabbitmq
  start_neutron_server
  launch_second_host
  start_neutron_agent
  start_lb_agent
  timed start-ovn start_ovn
  start_neutron_ovn_server
  wait_second_host
  ensure_test_network
  ensure_lb_network
  ensure_ovn_network
  local b
  b=$(probe_binding "$SECOND_HOST")
  [[ $b == "ovs $(hybrid_for "$FIREWALL")" ]] || die "binding a port to $SECOND_HOST gave: $b"
  log "a port binds to $SECOND_HOST: vif_type/ovs_hybrid_plug = $b"
  b=$(probe_binding "$LB_HOST" "$LB_NETWORK_ID")
  [[ $b == "bridge "* ]] || die "binding a port to $LB_HOST gave: $b"
  log "a port binds to $LB_HOST: vif_type $b"
  b=$(NEUTRON_URL=$NEUTRON_OVN_URL probe_binding "$OVN_HOST" "$OVN_NETWORK_ID")
  [[ $b == "ovs null" ]] || die "binding a port to $OVN_HOST (ML2/OVN) gave: $b"
  log "a port binds to $OVN_HOST (ML2/OVN): vif_type ovs, no bridge named"
  write_env_file
}

# Removes what the Open vSwitch agent added: its iptables chains and ipsets, br-tun, br-phys and
# its controller, fail mode, flows and patch ports on br-int.
restore_after_agent() {
  local t ipt chain rule
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle raw; do
      "$ipt" -t "$t" -S >/dev/null 2>&1 || continue
      # Rules in other chains that jump into neutron chains.
      while read -r rule; do
        [[ -n $rule ]] || continue
        eval "\"$ipt\" -t \"$t\" ${rule/#-A/-D}" 2>/dev/null || true
      done < <("$ipt" -t "$t" -S 2>/dev/null | grep -E '^-A ' | grep -vE '^-A neutron-' | grep -E -- '-j neutron-' || true)
      while read -r chain; do
        "$ipt" -t "$t" -F "$chain" 2>/dev/null || true
      done < <("$ipt" -t "$t" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^neutron-/ { print $2 }')
      while read -r chain; do
        "$ipt" -t "$t" -X "$chain" 2>/dev/null || true
      done < <("$ipt" -t "$t" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^neutron-/ { print $2 }')
    done
  done
  if command -v ipset >/dev/null; then
    while read -r chain; do
      ipset destroy "$chain" 2>/dev/null || true
    done < <(ipset list -n 2>/dev/null | grep -E '^NIPv[46]' || true)
  fi
  if ovs_answers >/dev/null 2>&1; then
    ovs-vsctl --if-exists del-br br-tun
    ovs-vsctl --if-exists del-br br-phys
    # The agent's ovsdbapp registers its connection as a Manager; ovsdb-server keeps serving the
    # socket from its command line.
    local m
    for m in $(ovs-vsctl --bare --columns=_uuid find Manager target='"punix:/var/run/openvswitch/db.sock"'); do
      ovs-vsctl remove Open_vSwitch . manager_options "$m"
    done
    if ovs-vsctl br-exists br-int; then
      local p
      for p in $(ovs-vsctl list-ports br-int); do
        if [[ $(ovs-vsctl get Interface "$p" type) == patch ]]; then
          ovs-vsctl --if-exists del-port br-int "$p"
        fi
      done
      ovs-vsctl del-controller br-int -- del-fail-mode br-int \
        -- clear Bridge br-int protocols \
        -- remove Bridge br-int other_config mac-table-size \
        -- remove Bridge br-int other_config mcast-snooping-disable-flood-unregistered
      ovs-ofctl del-flows br-int
      ovs-ofctl add-flow br-int priority=0,actions=NORMAL
    fi
  fi
}

stop_neutron() {
  stop_bg second-host-reporter 10
  stop_ovn
  stop_neutron_agent
  stop_lb_agent
  [[ -e $ETC_DIR/linuxbridge_agent.ini ]] && restore_after_lb_agent
  stop_bg neutron-server 30
  # Only a host where this script configured the agent gets the agent's changes undone.
  [[ -e $ETC_DIR/openvswitch_agent.ini ]] && restore_after_agent
  stop_rabbitmq
  stop_mariadb
  rm -f "$ETC_DIR/neutron.conf" "$ETC_DIR/ml2_conf.ini" "$ETC_DIR/openvswitch_agent.ini" \
    "$ETC_DIR/linuxbridge_agent.ini" "$ETC_DIR/neutron-ovn.conf" "$ETC_DIR/ml2_conf_ovn.ini" \
    "$ETC_DIR/mariadb.cnf"
  rm -rf "$STATE_DIR/mysql" "$STATE_DIR/rabbitmq" "$STATE_DIR/neutron" "$ENV_FILE" \
    "$STATE_DIR/firewall" "$STATE_DIR/second_host" "$STATE_DIR/second_host.args"
}

# ---------------------------------------------------------------------------------------------
# a small OpenStack: placement, glance, Nova with vireo as this host's compute driver

NOVA_CONF=$ETC_DIR/nova.conf
COMPUTE_DRIVER_CONF=$ETC_DIR/nova-compute-driver.conf
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
VIREO_BIN=${VIREO_BIN:-$REPO_DIR/target/debug/vireo}

# Debian's python3-nova ships the nova.cmd modules but not their console scripts (those come
# with nova-api, nova-compute, ... and their systemd units), and the modules have no __main__.
nova_cmd() { # nova_cmd MODULE ARGS...: runs nova.cmd.MODULE's main() as its console script
  local module=$1
  shift
  "$PY" -c "import sys; from nova.cmd.$module import main; sys.exit(main())" "$@"
}
nova_manage() { nova_cmd manage --config-file "$NOVA_CONF" "$@"; }
os_api() { # os_api URL: GET with the noauth2 admin token
  curl -sS -f --max-time 10 -H "X-Auth-Token: $OS_TOKEN" "$1"
}
placement_answers() { curl -sS -f --max-time 5 "http://127.0.0.1:$PLACEMENT_PORT/"; }
glance_answers() { curl -sS -f --max-time 5 "http://127.0.0.1:$GLANCE_PORT/v2/images"; }
nova_api_answers() { os_api "http://127.0.0.1:$NOVA_API_PORT/v2.1/"; }
vireo_agent_answers() { curl -sS -f --max-time 5 "http://127.0.0.1:$AGENT_PORT/healthz"; }
compute_registered() { # the hypervisor shows up once nova-compute reported and was discovered
  os_api "http://127.0.0.1:$NOVA_API_PORT/v2.1/os-hypervisors/detail" |
    jq -e --arg h "$COMPUTE_HOST" '.hypervisors[] | select(.hypervisor_hostname == $h and .state == "up")'
}

create_nova_dbs() {
  mysql_cli <<EOF
CREATE DATABASE IF NOT EXISTS nova_api CHARACTER SET utf8mb4;
CREATE DATABASE IF NOT EXISTS nova CHARACTER SET utf8mb4;
CREATE DATABASE IF NOT EXISTS nova_cell0 CHARACTER SET utf8mb4;
CREATE DATABASE IF NOT EXISTS placement CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS 'nova'@'127.0.0.1' IDENTIFIED BY '$DB_PASSWORD';
GRANT ALL PRIVILEGES ON nova_api.* TO 'nova'@'127.0.0.1';
GRANT ALL PRIVILEGES ON nova.* TO 'nova'@'127.0.0.1';
GRANT ALL PRIVILEGES ON nova_cell0.* TO 'nova'@'127.0.0.1';
GRANT ALL PRIVILEGES ON placement.* TO 'nova'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF
}

detect_domain_type() { # kvm where the host has it, else TCG
  if [[ -e /dev/kvm ]]; then DOMAIN_TYPE=kvm; else DOMAIN_TYPE=qemu; fi
}

write_nova_config() {
  mkdir -p "$ETC_DIR/placement" "$STATE_DIR/nova/lock" "$STATE_DIR/nova/instances" \
    "$STATE_DIR/glance/images" "$STATE_DIR/glance/tasks" "$STATE_DIR/glance/staging" \
    "$STATE_DIR/vireo-agent/images"
  detect_domain_type
  render nova.conf.in "$NOVA_CONF"
  cp "$SETUP_DIR/nova-api-paste.ini" "$ETC_DIR/nova-api-paste.ini"
  render placement.conf.in "$ETC_DIR/placement/placement.conf"
  render glance-api.conf.in "$ETC_DIR/glance-api.conf"
  render vireo-agent.toml.in "$ETC_DIR/vireo-agent.toml"
  if [[ ! -s $ETC_DIR/vireo-agent-token ]]; then
    (umask 077 && head -c 24 /dev/urandom | base64 >"$ETC_DIR/vireo-agent-token")
  fi
  cat >"$ETC_DIR/clouds.yaml" <<EOF
# The integration tier's OpenStack, no Keystone:
#   OS_CLIENT_CONFIG_FILE=$ETC_DIR/clouds.yaml openstack --os-cloud vireo server list
clouds:
  vireo:
    auth_type: admin_token
    auth:
      token: $OS_TOKEN
      endpoint: http://127.0.0.1:$NOVA_API_PORT/v2.1
    # The root, not /v2.1: discovery is unauthenticated and noauth2 answers it with 204.
    compute_endpoint_override: http://127.0.0.1:$NOVA_API_PORT/
    image_endpoint_override: http://127.0.0.1:$GLANCE_PORT
    network_endpoint_override: http://127.0.0.1:$NOVA_NEUTRON_PORT
    placement_endpoint_override: http://127.0.0.1:$PLACEMENT_PORT
EOF
}

start_placement() {
  alive placement && placement_answers >/dev/null 2>&1 && return
  placement-manage --config-file "$ETC_DIR/placement/placement.conf" db sync \
    >"$LOG_DIR/placement-manage.log" 2>&1 || {
    tail -20 "$LOG_DIR/placement-manage.log" >&2
    die "placement-manage db sync failed"
  }
  start_bg placement env OS_PLACEMENT_CONFIG_DIR="$ETC_DIR/placement" \
    placement-api --host 127.0.0.1 --port "$PLACEMENT_PORT"
  wait_alive placement 60 "placement-api" placement_answers || {
    tail -20 "$LOG_DIR/placement.log" >&2
    die "placement-api did not answer"
  }
}

start_glance() {
  alive glance-api && glance_answers >/dev/null 2>&1 && return
  glance-manage --config-file "$ETC_DIR/glance-api.conf" db_sync \
    >"$LOG_DIR/glance-manage.log" 2>&1 || {
    tail -20 "$LOG_DIR/glance-manage.log" >&2
    die "glance-manage db_sync failed"
  }
  start_bg glance-api glance-api --config-file "$ETC_DIR/glance-api.conf"
  wait_alive glance-api 90 "glance-api" glance_answers || {
    tail -20 "$LOG_DIR/glance-api.log" >&2
    die "glance-api did not answer"
  }
}

# Once per Nova tier (nova-down drops the databases and STATE_DIR/nova) and Nova version: the
# syncs take 12 s, and nova-network runs nova-up again for every network it moves to.
NOVA_DB_MARK=$STATE_DIR/nova/db-synced
nova_version() { dpkg-query -W -f='${Version}' python3-nova; }
setup_nova_dbs() {
  [[ -s $NOVA_DB_MARK && $(<"$NOVA_DB_MARK") == "$(nova_version)" ]] && return
  nova_manage api_db sync >"$LOG_DIR/nova-manage.log" 2>&1 &&
    nova_manage cell_v2 map_cell0 --database_connection \
      "mysql+pymysql://nova:$DB_PASSWORD@127.0.0.1:$DB_PORT/nova_cell0" \
      >>"$LOG_DIR/nova-manage.log" 2>&1 || {
    tail -20 "$LOG_DIR/nova-manage.log" >&2
    die "nova-manage api_db sync / map_cell0 failed"
  }
  # Read whole before searching: grep -q stops reading early, and the SIGPIPE nova-manage then
  # dies of fails the pipeline (pipefail), which made a second nova-up create cell1 again.
  local cells
  cells=$(nova_manage cell_v2 list_cells 2>/dev/null || true)
  if ! grep -q ' cell1 ' <<<"$cells"; then
    nova_manage cell_v2 create_cell --name cell1 >>"$LOG_DIR/nova-manage.log" 2>&1 || {
      tail -20 "$LOG_DIR/nova-manage.log" >&2
      die "nova-manage cell_v2 create_cell failed"
    }
  fi
  nova_manage db sync >>"$LOG_DIR/nova-manage.log" 2>&1 || {
    tail -20 "$LOG_DIR/nova-manage.log" >&2
    die "nova-manage db sync failed"
  }
  nova_version >"$NOVA_DB_MARK"
}

start_nova_service() { # start_nova_service NAME MODULE [FILE...]: FILEs also restart it
  local name=$1 module=$2
  shift 2
  local files=(nova.conf nova-api-paste.ini "$@") confs=(--config-file "$NOVA_CONF")
  # nova-compute also reads the driver's file (nova-compute-driver: vireo or libvirt).
  if [[ $name == nova-compute ]]; then
    files+=("$COMPUTE_DRIVER_CONF")
    confs+=(--config-file "$COMPUTE_DRIVER_CONF")
  fi
  if alive "$name" && stale "$name" "${files[@]}"; then stop_bg "$name" 30; fi
  alive "$name" && return
  # PYTHONPATH: nova-api's paste pipeline loads setup/nova_context_token.py.
  start_bg "$name" env PYTHONPATH="$SETUP_DIR" \
    "$PY" -c "import sys; from nova.cmd.$module import main; sys.exit(main())" "${confs[@]}"
  stamp "$name" "${files[@]}"
}

# The driver host A's nova-compute loads: vireo (nova.conf's own) or Nova's libvirt driver.
write_compute_driver_config() { # write_compute_driver_config vireo|libvirt
  case $1 in
  vireo)
    if [[ $COMPUTE_HOST == "$HOST" ]]; then
      printf '# nova-compute on vireo.VireoDriver (nova.conf); nothing to add\n'
    else
      printf '# nova-compute on vireo.VireoDriver as the host of the Nova tier'"'"'s network\n'
      printf '[DEFAULT]\nhost = %s\n' "$COMPUTE_HOST"
    fi >"$COMPUTE_DRIVER_CONF"
    ;;
  libvirt) render nova-compute-libvirt.conf.in "$COMPUTE_DRIVER_CONF" ;;
  *) die "no compute driver $1 here (vireo or libvirt)" ;;
  esac
}

# forced_down HOST true|false: Nova counts HOST's nova-compute down (or by its heartbeat), if
# it knows it. Not disabled: disabling asks the compute service over RPC, which waits out
# rpc_response_timeout (60 s) for one that no longer runs.
forced_down() {
  local api=http://127.0.0.1:$NOVA_API_PORT/v2.1/os-services id
  local h=(-sS -f --max-time 10 -H "X-Auth-Token: $OS_TOKEN" -H 'OpenStack-API-Version: compute 2.53')
  id=$(curl "${h[@]}" "$api?binary=nova-compute&host=$1" | jq -r '.services[0].id // empty') || return 1
  [[ -z $id ]] || curl "${h[@]}" -X PUT -H 'Content-Type: application/json' \
    -d "{\"forced_down\": $2}" "$api/$id" >/dev/null
}

# Up with nova-compute's current process: its service reported after it started.
compute_reported_since() { # compute_reported_since UTC-TIME
  os_api "http://127.0.0.1:$NOVA_API_PORT/v2.1/os-services?binary=nova-compute&host=$COMPUTE_HOST" |
    jq -e --arg t "$1" '.services[] | select(.state == "up" and .updated_at > $t)'
}

start_vireo_agent() {
  [[ -x $VIREO_BIN ]] || die "no vireo binary at $VIREO_BIN (cargo build -p vireo, or set VIREO_BIN)"
  # A new configuration or a rebuilt binary restarts a running agent (as two-host.sh does
  # for host B's).
  local bin
  bin=$(realpath "$VIREO_BIN")
  if alive vireo-agent && stale vireo-agent vireo-agent.toml "$bin"; then stop_bg vireo-agent 30; fi
  alive vireo-agent && vireo_agent_answers >/dev/null 2>&1 && return
  start_bg vireo-agent "$VIREO_BIN" agent --config "$ETC_DIR/vireo-agent.toml"
  stamp vireo-agent vireo-agent.toml "$bin"
  wait_alive vireo-agent 60 "the vireo agent" vireo_agent_answers || {
    tail -20 "$LOG_DIR/vireo-agent.log" >&2
    die "the vireo agent did not answer"
  }
}

cmd_nova_up() {
  local start s
  start=$(now)
  mkdir -p "$RUN_DIR" "$LOG_DIR" "$ETC_DIR" "$MARK_DIR"
  [[ -s $ENV_FILE ]] || die "nova-up needs the Neutron set-up: host-setup.sh up --with-neutron first"
  [[ $FIREWALL_SET == 1 || ! -s $STATE_DIR/firewall ]] || FIREWALL=$(cat "$STATE_DIR/firewall")
  timed install install_packages 1
  # Neutron posts its events to nova-api from now on (as admin: noauth2 refuses "notused").
  NOVA_PORT=$NOVA_API_PORT
  NOVA_TOKEN=admin:admin
  write_neutron_config
  timed start-mariadb start_mariadb
  timed start-rabbitmq start_rabbitmq
  create_nova_dbs
  write_nova_config
  timed start-placement start_placement
  timed start-glance start_glance
  timed nova-db setup_nova_dbs
  s=$(now)
  start_nova_service nova-api api
  start_nova_service nova-conductor conductor
  start_nova_service nova-scheduler scheduler
  wait_alive nova-api 90 "nova-api" nova_api_answers || {
    tail -20 "$LOG_DIR/nova-api.log" >&2
    die "nova-api did not answer"
  }
  record start-nova-api "$s"
  timed restart-neutron-server start_neutron_server
  # The ML2/OVN server posts to nova-api too (its neutron.conf is the other's).
  if alive neutron-ovn-server; then timed restart-neutron-ovn-server start_neutron_ovn_server; fi
  timed start-vireo-agent start_vireo_agent
  install_nova_driver
  s=$(now)
  write_compute_driver_config vireo
  # A new driver (this checkout's) restarts nova-compute.
  start_nova_service nova-compute compute "$REPO_DIR"/driver/nova/nova/virt/vireo/*.py
  forced_down "$COMPUTE_HOST" false
  wait_alive nova-compute 120 "nova-compute's hypervisor in nova-api" compute_registered || {
    tail -30 "$LOG_DIR/nova-compute.log" >&2
    die "nova-compute did not register"
  }
  record start-nova-compute "$s"
  # This machine's nova-compute of another network (HOST or LB_HOST) is down: the scheduler
  # must not pick it in the minute Nova would still count it up.
  local other
  for other in "$HOST" "$LB_HOST"; do
    [[ $other == "$COMPUTE_HOST" ]] || forced_down "$other" true
  done
  echo "nova-api: http://127.0.0.1:$NOVA_API_PORT/v2.1 (token $OS_TOKEN)"
  echo "clouds.yaml: OS_CLIENT_CONFIG_FILE=$ETC_DIR/clouds.yaml openstack --os-cloud vireo ..."
  echo "vireo agent: http://127.0.0.1:$AGENT_PORT (token file $ETC_DIR/vireo-agent-token)"
  record total "$start"
  print_timings
}

# This checkout's driver package, beside python3-nova (what nova-compute loads), before any
# start that stamps this checkout's driver files: a process started on an older installed
# copy under a new stamp would keep it through the next nova-up.
install_nova_driver() {
  bash "$REPO_DIR/driver/nova/install.sh" >"$LOG_DIR/nova-driver-install.log" 2>&1 || {
    cat "$LOG_DIR/nova-driver-install.log" >&2
    die "installing the vireo Nova driver failed"
  }
}

cmd_nova_compute_driver() { # host A's nova-compute restarted on another driver
  local driver=$1 since
  alive nova-compute || die "no nova-compute here: host-setup.sh nova-up first"
  install_nova_driver
  if [[ $driver == libvirt ]]; then
    "$PY" -c 'import libvirt' 2>/dev/null || die "Nova's libvirt driver needs python3-libvirt"
    detect_domain_type # the one vireo's agent uses here
  fi
  write_compute_driver_config "$driver"
  # Stopped first: the old process reports its heartbeat until it exits, and a server booted
  # before the new one listens is errored out by the new one's start (an interrupted build).
  stop_bg nova-compute 30
  since=$(date -u +%FT%T)
  start_nova_service nova-compute compute "$REPO_DIR"/driver/nova/nova/virt/vireo/*.py
  wait_alive nova-compute 120 "nova-compute on the $driver driver" \
    compute_reported_since "$since" || {
    tail -30 "$LOG_DIR/nova-compute.log" >&2
    die "nova-compute did not come back on the $driver driver"
  }
}

# Host A's chassis reports `ovn_hostname` (the Nova tier's Neutron decides which).
set_ovn_hostname() {
  alive ovn-controller || return 0
  ovs-vsctl set Open_vSwitch . "external_ids:hostname-$OVN_HOST=$(ovn_hostname)"
  wait_for 30 "chassis $OVN_HOST as $(ovn_hostname)" ovn_chassis_up ||
    die "chassis $OVN_HOST does not report $(ovn_hostname)"
}

cmd_nova_network() { # the Nova tier moved to another Neutron (and vireo's OVS port form)
  local network=$1 form=${2:-pre-created} start
  start=$(now)
  [[ $network == ovs || $network == ovn || $network == lb ]] ||
    die "nova-network: ovs, ovn or lb, not $network"
  [[ $form == libvirt-managed || $form == pre-created ]] ||
    die "nova-network: libvirt-managed or pre-created, not $form"
  alive nova-api || die "no Nova tier here: host-setup.sh nova-up first"
  [[ $network == ovs ]] || alive neutron-ovn-server || die "no ML2/OVN Neutron here: up --with-neutron first"
  echo "$network $form" >"$NOVA_NETWORK_FILE"
  nova_network_settings
  set_ovn_hostname
  # nova-up renders every configuration again and restarts what changed: nova-api, -conductor,
  # -scheduler, nova-compute, the agent.
  cmd_nova_up
  record nova-network "$start"
  echo "nova tier on: $network ($form); next: two-host.sh nova-up"
}

cmd_nova_down() {
  mkdir -p "$RUN_DIR"
  local n
  for n in nova-compute vireo-agent nova-scheduler nova-conductor nova-api glance-api placement; do
    stop_bg "$n" 30
  done
  # Guests a failed test left behind go with the agent's state: the next nova-up's Nova starts
  # numbering instances (instance-00000001, ...) again and would meet their domains' names.
  local dir uuid
  for dir in "$STATE_DIR"/vireo-agent/instances/*/; do
    uuid=$(basename "$dir")
    [[ $uuid =~ ^[0-9a-f-]{36}$ ]] || continue
    if virsh -c qemu:///system domuuid "$uuid" >/dev/null 2>&1; then
      log "removing guest $uuid left by the Nova tier"
      virsh -c qemu:///system destroy "$uuid" >/dev/null 2>&1 || true
      virsh -c qemu:///system undefine --nvram "$uuid" >/dev/null 2>&1 ||
        virsh -c qemu:///system undefine "$uuid" >/dev/null 2>&1 || true
    fi
  done
  rm -rf "$STATE_DIR/nova" "$STATE_DIR/glance" "$STATE_DIR/vireo-agent"
  rm -f "$NOVA_NETWORK_FILE"
  COMPUTE_HOST=$HOST
  set_ovn_hostname
  if [[ -s $ENV_FILE ]]; then
    # Neutron posts to vireo's agents again.
    [[ $FIREWALL_SET == 1 || ! -s $STATE_DIR/firewall ]] || FIREWALL=$(cat "$STATE_DIR/firewall")
    write_neutron_config
    start_neutron_server
    if alive neutron-ovn-server; then start_neutron_ovn_server; fi
    mysql_cli <<EOF
DROP DATABASE IF EXISTS nova_api;
DROP DATABASE IF EXISTS nova;
DROP DATABASE IF EXISTS nova_cell0;
DROP DATABASE IF EXISTS placement;
EOF
  fi
}

# ---------------------------------------------------------------------------------------------
# commands

cmd_up() {
  local start
  start=$(now)
  mkdir -p "$RUN_DIR" "$LOG_DIR" "$ETC_DIR" "$MARK_DIR"
  timed install install_packages "$WITH_NEUTRON"
  start_libvirt
  start_ovs
  if [[ $WITH_NEUTRON == 1 ]]; then
    start_neutron
    echo "neutron: $NEUTRON_URL host=$HOST second_host=$SECOND_HOST firewall=$FIREWALL"
    echo "network: $NETWORK_ID ($NET_NAME, vxlan)"
    echo "subnet: $SUBNET_ID ($SUBNET_NAME, $SUBNET_CIDR)"
    echo "env file: $ENV_FILE"
  fi
  record total "$start"
  print_timings
}

cmd_down() {
  mkdir -p "$RUN_DIR" "$MARK_DIR"
  stop_neutron
  if [[ $NEUTRON_ONLY == 1 ]]; then
    log "down --neutron-only: libvirtd, virtlogd, Open vSwitch and br-int left running"
    return
  fi
  # Full down: stop only what `up` started itself (a host whose daemons ran before keeps them).
  if marked br-int && ovs_answers >/dev/null 2>&1; then
    ovs-vsctl --if-exists del-br br-int
    rm -f "$MARK_DIR/br-int"
  fi
  if marked ovs; then
    /usr/share/openvswitch/scripts/ovs-ctl stop >/dev/null 2>&1 || true
    rm -f "$MARK_DIR/ovs"
  fi
  local d
  for d in libvirtd virtlogd; do
    if marked "$d"; then
      stop_marked "$d"
    fi
  done
}

cmd_status() {
  local bad=0 v
  report() { printf '%-28s %-5s %s\n' "$1" "$2" "${3:-}"; }
  if pgrep -x virtlogd >/dev/null; then report virtlogd up "pid $(pgrep -x virtlogd | head -1)"; else
    report virtlogd DOWN
    bad=1
  fi
  if v=$(virsh -c qemu:///system version 2>/dev/null); then
    report libvirtd up "$(awk '/Using library|Running hypervisor/ { printf "%s ", $0 }' <<<"$v")"
  else
    report libvirtd DOWN
    bad=1
  fi
  if ovs_answers >/dev/null 2>&1; then
    report openvswitch up "$(ovs-vsctl --version | head -1)"
    if ovs-vsctl br-exists br-int; then report br-int up "datapath_type=$(ovs-vsctl get Bridge br-int datapath_type)"; else
      report br-int DOWN
      bad=1
    fi
  else
    report openvswitch DOWN
    bad=1
  fi
  if [[ -e /dev/kvm ]]; then report kvm up /dev/kvm; else report kvm none "(guests run under TCG)"; fi
  [[ $WITH_NEUTRON == 1 || -s $ENV_FILE ]] || {
    return $bad
  }
  local second=$SECOND_HOST
  [[ -s $STATE_DIR/second_host ]] && second=$(cat "$STATE_DIR/second_host")
  if [[ -f $ETC_DIR/mariadb.cnf ]] && mariadb_answers >/dev/null 2>&1; then
    report mariadb up "$(mariadb --version | awk '{ print $5 }' | tr -d ,)"
  else
    report mariadb DOWN
    bad=1
  fi
  if rabbit_answers >/dev/null 2>&1; then
    report rabbitmq up "$(dpkg-query -W -f='${Version}' rabbitmq-server)"
  else
    report rabbitmq DOWN
    bad=1
  fi
  if neutron_answers >/dev/null 2>&1; then
    report neutron-server up "$NEUTRON_URL $(dpkg-query -W -f='${Version}' neutron-server)"
  else
    report neutron-server DOWN
    bad=1
  fi
  if agent_alive "$HOST" 2>/dev/null; then
    report "ovs-agent ($HOST)" up "firewall $(cat "$STATE_DIR/firewall" 2>/dev/null)"
  else
    report "ovs-agent ($HOST)" DOWN
    bad=1
  fi
  if alive neutron-lb-agent && lb_agent_alive 2>/dev/null; then
    report "linuxbridge-agent ($LB_HOST)" up
  else
    report "linuxbridge-agent ($LB_HOST)" DOWN
    bad=1
  fi
  if alive second-host-reporter && agent_alive "$second" 2>/dev/null; then
    report "state reporter ($second)" up
  else
    report "state reporter ($second)" DOWN
    bad=1
  fi
  [[ -s $ENV_FILE ]] && sed 's/^/  /' "$ENV_FILE"
  return $bad
}

cmd_neutron_firewall() {
  local want=$1 start
  hybrid_for "$want" >/dev/null
  log "switching the firewall driver to $want"
  [[ -s $ENV_FILE ]] || die "Neutron is not set up here: run 'up --with-neutron' first"
  # shellcheck disable=SC1090
  . "$ENV_FILE"
  NETWORK_ID=$VIREO_NEUTRON_NETWORK_ID
  SUBNET_ID=$VIREO_NEUTRON_SUBNET_ID
  LB_HOST=${VIREO_NEUTRON_LB_HOST:-$LB_HOST}
  LB_NETWORK_ID=${VIREO_NEUTRON_LB_NETWORK_ID:-}
  OVN_NETWORK_ID=${VIREO_OVN_NETWORK_ID:-}
  NOVA_PORT=$VIREO_NOVA_PORT
  SECOND_HOST=$VIREO_NEUTRON_SECOND_HOST
  start=$(now)
  FIREWALL=$want
  # With the Nova tier up, Neutron's servers keep posting to nova-api (a restart reads this);
  # the environment file keeps the standalone agents' port.
  if alive nova-api; then
    NOVA_PORT=$NOVA_API_PORT NOVA_TOKEN=admin:admin write_neutron_config
  else
    write_neutron_config
  fi
  stop_bg second-host-reporter 10 &
  stop_neutron_agent
  wait
  # The agent's iptables chains belong to the old driver: remove them before it starts again.
  restore_after_agent
  launch_second_host
  start_neutron_agent
  wait_second_host
  local b
  b=$(probe_binding "$HOST")
  [[ $b == "ovs $(hybrid_for "$want")" ]] || die "a port bound after the switch shows: $b"
  write_env_file
  record neutron-firewall "$start"
  echo "firewall: $want (new binding: vif_type/ovs_hybrid_plug = $b)"
  print_timings
}

usage() {
  sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

[[ $# -ge 1 ]] || usage
CMD=$1
shift
WITH_NEUTRON=0
NEUTRON_ONLY=0
FIREWALL_SET=0
POS=()
while [[ $# -gt 0 ]]; do
  case $1 in
  --with-neutron) WITH_NEUTRON=1 ;;
  --neutron-only) NEUTRON_ONLY=1 ;;
  --firewall)
    FIREWALL=${2:?--firewall needs a driver}
    FIREWALL_SET=1
    shift
    ;;
  --firewall=*)
    FIREWALL=${1#*=}
    FIREWALL_SET=1
    ;;
  --nova-port)
    NOVA_PORT=${2:?--nova-port needs a port}
    shift
    ;;
  --nova-port=*) NOVA_PORT=${1#*=} ;;
  --second-host)
    SECOND_HOST=${2:?--second-host needs a name}
    shift
    ;;
  --second-host=*) SECOND_HOST=${1#*=} ;;
  -h | --help) usage 0 ;;
  -*) die "unknown option $1" ;;
  *) POS+=("$1") ;;
  esac
  shift
done
[[ $(id -u) == 0 ]] || die "run as root"
[[ -n ${VIREO_FIREWALL:-} ]] && FIREWALL_SET=1
nova_network_settings

case $CMD in
build-deps)
  mkdir -p "$LOG_DIR"
  install_build_deps
  ;;
up) cmd_up ;;
down) cmd_down ;;
nova-up) cmd_nova_up ;;
nova-down) cmd_nova_down ;;
nova-compute-driver)
  [[ ${#POS[@]} == 1 ]] || die "usage: host-setup.sh nova-compute-driver vireo|libvirt"
  cmd_nova_compute_driver "${POS[0]}"
  ;;
status) cmd_status ;;
vireo-agent-up)
  [[ -s $ETC_DIR/vireo-agent.toml ]] || die "no vireo agent configured here: host-setup.sh nova-up first"
  start_vireo_agent
  ;;
nova-network)
  [[ ${#POS[@]} == 1 || ${#POS[@]} == 2 ]] ||
    die "usage: host-setup.sh nova-network ovs|ovn|lb [pre-created|libvirt-managed]"
  cmd_nova_network "${POS[@]}"
  ;;
neutron-firewall)
  [[ ${#POS[@]} == 1 ]] || die "usage: host-setup.sh neutron-firewall iptables_hybrid|openvswitch"
  cmd_neutron_firewall "${POS[0]}"
  ;;
env)
  [[ -s $ENV_FILE ]] || die "no Neutron set-up here"
  sed 's/^/export /' "$ENV_FILE"
  ;;
*) usage ;;
esac
