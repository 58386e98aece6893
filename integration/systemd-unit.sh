#!/usr/bin/env bash
# packaging/vireo.service under a real systemd: a Debian 12 container booted with
# systemd-nspawn (this machine's PID 1 is not systemd), with Debian's libvirtd inside and the
# vireo binary of this checkout. Checks that the unit starts and reports ready (Type=notify,
# sd_notify READY=1 with its STATUS), that the agent serves the container's qemu:///system, that
# its logs reach journald with priorities, that it keeps running — same main PID — and
# reconnects when libvirtd restarts (Wants=, not Requires=), and that it stops cleanly.
#
#   systemd-unit.sh check     set up (once), boot, run the checks, power off
#   systemd-unit.sh down      power the container off (kept for the next run)
#   systemd-unit.sh destroy   down, then remove the container's root file system
#
# The container has its own network namespace (--private-network: only its loopback), so
# nothing on this host's network changes; it lives in its own cgroup subtree. Needs root.
# VIREO_BIN names the binary (default target/debug/vireo).
set -euo pipefail
cd "$(dirname "$0")/.."

STATE_DIR=${VIREO_STATE_DIR:-/var/lib/vireo-integration}
LAB=$STATE_DIR/systemd
ROOTFS=$LAB/rootfs
NAME=vireo-systemd
PIDFILE=$LAB/nspawn.pid
MIRROR=${VIREO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
BIN=${VIREO_BIN:-target/debug/vireo}
CGROUPS=(/sys/fs/cgroup/systemd /sys/fs/cgroup/unified)
TOKEN=vireo-systemd-check-token-0123456789
PORT=8774

log() { printf '[systemd-unit %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "FAIL: $*"
  exit 1
}

nspawn_pid() {
  local p
  [[ -s $PIDFILE ]] || return 1
  p=$(<"$PIDFILE")
  kill -0 "$p" 2>/dev/null && grep -q systemd-nspawn "/proc/$p/cmdline" 2>/dev/null || return 1
  echo "$p"
}

# The container's PID 1 (its systemd), as this host sees it.
leader_pid() {
  local np c
  np=$(nspawn_pid) || return 1
  for c in $(pgrep -P "$np"); do
    if grep -qx systemd "/proc/$c/comm" 2>/dev/null; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

# Run a command inside the container (every namespace of its PID 1), clean environment.
in_ct() {
  local l
  l=$(leader_pid) || die "the container is not running"
  nsenter -t "$l" -a -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SYSTEMD_PAGER= SYSTEMD_COLORS=0 "$@"
}

# Move the calling subshell into a cgroup subtree of its own on each hierarchy: without a
# systemd on the host, nspawn would otherwise create its payload/supervisor groups at the root.
cgroup_join() {
  local h
  for h in "${CGROUPS[@]}"; do
    [[ -d $h ]] || continue
    mkdir -p "$h/$NAME"
    echo "$BASHPID" >"$h/$NAME/cgroup.procs"
  done
}

cgroup_cleanup() {
  local h d
  for h in "${CGROUPS[@]}"; do
    [[ -d $h/$NAME ]] || continue
    find "$h/$NAME" -depth -type d | while read -r d; do
      [[ -s $d/cgroup.procs ]] || rmdir "$d" 2>/dev/null || true
    done
  done
}

setup() {
  local need=()
  command -v debootstrap >/dev/null || need+=(debootstrap)
  command -v systemd-nspawn >/dev/null || need+=(systemd-container)
  if ((${#need[@]})); then
    log "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
  fi
  mkdir -p "$LAB"
  if [[ ! -x $ROOTFS/usr/sbin/libvirtd ]]; then
    rm -rf "$ROOTFS"
    log "debootstrap bookworm into $ROOTFS"
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,ca-certificates,curl \
      bookworm "$ROOTFS" "$MIRROR" >"$LAB/debootstrap.log" 2>&1 ||
      { tail -20 "$LAB/debootstrap.log"; die "debootstrap"; }
    cat >"$ROOTFS/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb $MIRROR bookworm-backports main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
    echo "$NAME" >"$ROOTFS/etc/hostname"
    # No getty on the passive console.
    ln -sf /dev/null "$ROOTFS/etc/systemd/system/console-getty.service"
    log "installing libvirt (bookworm-backports, as on the host) in the container"
    # Not booted, the host's network: only to install packages.
    (
      cgroup_join
      exec systemd-nspawn -q -D "$ROOTFS" -M "$NAME-setup" --register=no --keep-unit \
        --setenv=DEBIAN_FRONTEND=noninteractive /bin/sh -c \
        'apt-get update -q && apt-get install -y -q -t bookworm-backports --no-install-recommends libvirt0 libvirt-daemon-system libvirt-clients'
    ) >"$LAB/apt.log" 2>&1 || { tail -30 "$LAB/apt.log"; cgroup_cleanup; die "libvirt install"; }
    cgroup_cleanup
  fi
}

up() {
  nspawn_pid >/dev/null && return 0
  cgroup_cleanup
  # No system bus on this host: nspawn cannot register a machine or ask for a scope.
  (
    cgroup_join
    exec setsid systemd-nspawn -D "$ROOTFS" -M "$NAME" -b --private-network --register=no \
      --keep-unit --console=passive >"$LAB/nspawn.log" 2>&1 </dev/null
  ) &
  local started=$! i state=
  echo "$started" >"$PIDFILE"
  for ((i = 0; i < 120; i++)); do
    if leader_pid >/dev/null; then
      state=$(in_ct systemctl is-system-running 2>/dev/null || true)
      [[ $state == running || $state == degraded ]] && break
    fi
    # (The subshell becomes systemd-nspawn by exec: test the pid itself, not its name.)
    kill -0 "$started" 2>/dev/null || { cat "$LAB/nspawn.log" 2>/dev/null; die "systemd-nspawn exited"; }
    sleep 0.5
  done
  [[ $state == running || $state == degraded ]] || die "the container did not boot (state: $state)"
  log "container booted ($state)"
}

down() {
  local np i
  if np=$(nspawn_pid); then
    # nspawn passes SIGTERM on as a clean power-off.
    kill -TERM "$np"
    for ((i = 0; i < 60; i++)); do
      kill -0 "$np" 2>/dev/null || break
      sleep 0.5
    done
    kill -KILL "$np" 2>/dev/null || true
    log "container stopped"
  fi
  rm -f "$PIDFILE"
  cgroup_cleanup
}

show() { in_ct systemctl show -p "$1" --value "$2"; }

api() { # api PATH: the agent's answer (body), from inside the container
  in_ct curl -sf --max-time 10 -H "X-Auth-Token: $TOKEN" "http://127.0.0.1:$PORT$1"
}

check() {
  [[ -x $BIN ]] || die "no vireo binary at $BIN (cargo build -p vireo)"
  local t0=$SECONDS
  setup
  log "set-up took $((SECONDS - t0)) s"
  trap down EXIT
  up
  install -D -m 0755 "$BIN" "$ROOTFS/usr/bin/vireo"
  install -D -m 0644 packaging/vireo.service "$ROOTFS/etc/systemd/system/vireo.service"
  install -d -m 0700 "$ROOTFS/etc/vireo"
  (umask 077 && echo "$TOKEN" >"$ROOTFS/etc/vireo/api-token")
  # The sample, as an operator starts from it, with this container's facts: no KVM (TCG).
  sed -e 's|^#\? *domain_type = .*|domain_type = "qemu"|' packaging/agent.toml.sample \
    >"$ROOTFS/etc/vireo/agent.toml"
  grep -q '^domain_type = "qemu"' "$ROOTFS/etc/vireo/agent.toml" || die "the sample has no domain_type"
  in_ct systemctl daemon-reload
  in_ct systemctl reset-failed vireo.service 2>/dev/null || true

  # 1. Type=notify: `systemctl start` returns once READY=1 came; the status line names it.
  local t=$SECONDS i
  in_ct timeout 300 systemctl start vireo.service || {
    in_ct journalctl -u vireo --no-pager | tail -40
    die "vireo.service did not start"
  }
  log "vireo.service started (ready) in $((SECONDS - t)) s"
  [[ $(show Type vireo) == notify ]] || die "Type is $(show Type vireo)"
  [[ $(show ActiveState vireo) == active && $(show SubState vireo) == running ]] ||
    die "vireo is $(show ActiveState vireo)/$(show SubState vireo)"
  local status
  status=$(show StatusText vireo)
  [[ $status == "serving on 127.0.0.1:$PORT" ]] || die "StatusText is '$status'"
  log "ready: StatusText '$status'"

  # 2. The default URI is the host's QEMU: the container's libvirtd.
  local host
  host=$(api /v1/host) || die "GET /v1/host failed"
  [[ $(jq -r .hypervisor_type <<<"$host") == QEMU ]] || die "hypervisor: $host"

  # 3. journald, natively: the listening line at priority notice (5), identifier vireo.
  # (The journal is read whole into a variable: a reader that stops early, such as `head` or
  # `grep -q`, would make journalctl die of SIGPIPE and fail the pipeline.)
  local journal listening
  journal=$(in_ct journalctl -u vireo -o json --no-pager)
  listening=$(jq -c 'select(.MESSAGE == "agent listening") | {PRIORITY, SYSLOG_IDENTIFIER}' \
    <<<"$journal" | sed -n 1p)
  [[ $listening == '{"PRIORITY":"5","SYSLOG_IDENTIFIER":"vireo"}' ]] ||
    die "journal entry of 'agent listening': '$listening'"
  log "journald: $listening"

  # 4. libvirtd restarts: vireo keeps running (same main PID) and reconnects.
  local pid before_reconnects
  pid=$(show MainPID vireo)
  before_reconnects=$(api /metrics | awk '$1 == "vireo_libvirt_reconnects_total" {print $2}')
  in_ct systemctl restart libvirtd.service
  t=$SECONDS
  local reconnects= connected=
  while ((SECONDS - t < 60)); do
    if api /v1/host >/dev/null 2>&1; then
      local m
      m=$(api /metrics)
      reconnects=$(awk '$1 == "vireo_libvirt_reconnects_total" {print $2}' <<<"$m")
      connected=$(awk '$1 == "vireo_libvirt_connected" {print $2}' <<<"$m")
      [[ $connected == 1 && ${reconnects:-0} -gt ${before_reconnects:-0} ]] && break
    fi
    sleep 1
  done
  [[ $(show MainPID vireo) == "$pid" ]] || die "vireo's main PID changed ($pid -> $(show MainPID vireo))"
  [[ $(show ActiveState vireo) == active ]] || die "vireo is $(show ActiveState vireo) after the libvirtd restart"
  [[ $connected == 1 && ${reconnects:-0} -gt ${before_reconnects:-0} ]] ||
    die "vireo did not reconnect (reconnects ${before_reconnects:-?} -> ${reconnects:-?}, connected ${connected:-?})"
  log "libvirtd restarted: vireo kept PID $pid and reconnected in $((SECONDS - t)) s (reconnects $before_reconnects -> $reconnects)"

  # 5. A clean stop: STOPPING=1, exit 0.
  in_ct systemctl stop vireo.service
  [[ $(show Result vireo) == success && $(show ExecMainStatus vireo) == 0 ]] ||
    die "stop: Result $(show Result vireo), status $(show ExecMainStatus vireo)"
  # journald stores what it received asynchronously: give the last lines a moment.
  local stopped=
  for ((i = 0; i < 20; i++)); do
    journal=$(in_ct journalctl -u vireo --no-pager -o cat)
    if [[ $journal == *"agent stopped"* ]]; then
      stopped=1
      break
    fi
    sleep 0.25
  done
  [[ -n $stopped ]] || die "no 'agent stopped' in the journal: $(tail -n 5 <<<"$journal")"
  log "stopped cleanly; all checks passed in $((SECONDS - t0)) s"
}

case ${1:-} in
  check) check ;;
  down) down ;;
  destroy)
    down
    rm -rf "$ROOTFS"
    ;;
  *)
    sed -n '2,15p' "$0"
    exit 2
    ;;
esac
