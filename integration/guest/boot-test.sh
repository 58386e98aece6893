#!/usr/bin/env bash
# integration/guest/boot-test.sh [--accel auto|kvm|tcg] [--kvm-timeout S] [--tcg-timeout S] [--keep]
#
# Boots the guest of build-guest.sh on qemu:///system (direct kernel boot, console on ttyS0 into
# a file) with two virtio NICs: one on a Linux bridge this script creates, one `ethernet` tap that
# libvirt creates. Waits for VIREO-GUEST-READY, prints the VIREO-NIC lines and the time to ready,
# checks that the guest saw both NICs with the MACs given to libvirt, and removes everything it
# created (domain, bridge, files), also on failure or Ctrl-C.
#
# --accel auto (default): KVM when /dev/kvm can boot a stock kernel, else TCG. /dev/kvm served by
#   kvm_pvm (PVM, software virtualization without VT-x/AMD-V) cannot: see integration/README.md.
#   When KVM does not reach READY within --kvm-timeout, it falls back to TCG.
# Exit status 0 only when the guest reported READY with the expected NICs.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ACCEL=auto
KVM_TIMEOUT=60
TCG_TIMEOUT=180
KEEP=0
while [[ $# -gt 0 ]]; do
  case $1 in
  --accel) ACCEL=${2:?}; shift ;;
  --kvm-timeout) KVM_TIMEOUT=${2:?}; shift ;;
  --tcg-timeout) TCG_TIMEOUT=${2:?}; shift ;;
  --keep) KEEP=1 ;;
  *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
case $ACCEL in auto | kvm | tcg) ;; *) echo "--accel auto|kvm|tcg" >&2; exit 2 ;; esac

URI=qemu:///system
ID=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
NAME=vireo-boot-$ID
BR=vbt${ID}br
TAP0=vbt${ID}t0
TAP1=vbt${ID}t1
MAC0=fa:16:3e:$(od -An -N3 -tx1 /dev/urandom | sed 's/^ //; s/ /:/g')
MAC1=fa:16:3e:$(od -An -N3 -tx1 /dev/urandom | sed 's/^ //; s/ /:/g')
WORK=$(mktemp -d "/tmp/$NAME.XXXXXX")
chmod 755 "$WORK"

log() { printf '[boot-test %s] %s\n' "$(date +%T)" "$*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v s="$1" -v e="$(now)" 'BEGIN { printf "%.1f", e - s }'; }

cleanup() {
  set +e
  virsh -c "$URI" destroy "$NAME" >/dev/null 2>&1
  ip link del "$BR" 2>/dev/null
  ip link del "$TAP1" 2>/dev/null
  if ((KEEP)); then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bash "$HERE/build-guest.sh" "$WORK" >/dev/null

ip link add "$BR" type bridge
ip link set "$BR" up

domain_xml() { # domain_xml kvm|qemu
  cat <<EOF
<domain type='$1'>
  <name>$NAME</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>$WORK/vmlinuz</kernel>
    <initrd>$WORK/initrd.img</initrd>
    <cmdline>console=ttyS0 panic=-1 quiet vireo.nics=2</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <interface type='bridge'>
      <source bridge='$BR'/>
      <target dev='$TAP0'/>
      <mac address='$MAC0'/>
      <model type='virtio'/>
    </interface>
    <interface type='ethernet'>
      <target dev='$TAP1'/>
      <mac address='$MAC1'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'>
      <source path='$WORK/console.log'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
</domain>
EOF
}

# boot TYPE TIMEOUT: 0 when the guest reached READY within TIMEOUT seconds.
boot() {
  local type=$1 timeout=$2 start
  rm -f "$WORK/console.log"
  domain_xml "$type" >"$WORK/domain.xml"
  start=$(now)
  virsh -c "$URI" create "$WORK/domain.xml" >/dev/null
  log "domain $NAME started (type=$type, created in $(elapsed "$start")s); waiting up to ${timeout}s"
  while ! grep -qs VIREO-GUEST-READY "$WORK/console.log"; do
    if awk -v s="$start" -v e="$(now)" -v t="$timeout" 'BEGIN { exit !(e - s > t) }'; then
      log "no VIREO-GUEST-READY after ${timeout}s under $type; console ends with:"
      tail -c 300 "$WORK/console.log" 2>/dev/null | sed 's/^/    /' >&2
      virsh -c "$URI" destroy "$NAME" >/dev/null 2>&1 || true
      return 1
    fi
    sleep 0.2
  done
  READY_AFTER=$(elapsed "$start")
  RAN=$type
}

kvm_usable() {
  [[ -c /dev/kvm && -r /dev/kvm && -w /dev/kvm ]] || {
    WHY="no usable /dev/kvm"
    return 1
  }
  if [[ -d /sys/module/kvm_pvm ]]; then
    WHY="/dev/kvm is PVM (kvm_pvm): it boots only PVM-enabled guest kernels; a stock kernel crawls in instruction emulation"
    return 1
  fi
}

RAN=
WHY=
case $ACCEL in
kvm) boot kvm "$KVM_TIMEOUT" || true ;;
tcg) boot qemu "$TCG_TIMEOUT" || true ;;
auto)
  if kvm_usable; then
    boot kvm "$KVM_TIMEOUT" || {
      WHY="KVM did not reach READY in ${KVM_TIMEOUT}s"
      log "$WHY: falling back to TCG"
    }
  else
    log "not trying KVM: $WHY"
  fi
  [[ -n $RAN ]] || boot qemu "$TCG_TIMEOUT" || true
  ;;
esac
[[ -n $RAN ]] || {
  log "FAIL: the guest never reported ready"
  exit 1
}

grep -a 'VIREO-NIC' "$WORK/console.log" | tr -d '\r'
grep -a 'VIREO-GUEST-READY' "$WORK/console.log" | tr -d '\r'
accel=$([[ $RAN == kvm ]] && echo kvm || echo tcg)
echo "BOOT accel=$accel ready_after=${READY_AFTER}s${WHY:+ (kvm not used: $WHY)}"

fail=0
for mac in "$MAC0" "$MAC1"; do
  grep -a "VIREO-NIC .*mac=$mac " "$WORK/console.log" | grep -q 'carrier=1' || {
    log "FAIL: the guest did not report NIC $mac with carrier"
    fail=1
  }
done
[[ $(ip -o link show master "$BR" | grep -c "$TAP0") == 1 ]] || {
  log "FAIL: $TAP0 is not a port of $BR"
  fail=1
}
ip link show "$TAP1" >/dev/null 2>&1 || {
  log "FAIL: libvirt did not create tap $TAP1"
  fail=1
}
((fail == 0)) && echo "boot-test: OK"
exit "$fail"
