#!/usr/bin/env bash
# integration/setup/neutron-smoke.sh [--no-events] — checks a Neutron set up by
# `host-setup.sh up --with-neutron` end to end:
#   1. a port bound to this host, plugged as a tap into br-int with iface-id/attached-mac,
#      goes ACTIVE and Neutron POSTs network-vif-plugged to the Nova endpoint (watched with
#      nova_events_listener.py on VIREO_NOVA_PORT; --no-events skips that part when the port is
#      taken, e.g. by vireo itself);
#   2. unplugging it gives network-vif-unplugged;
#   3. a port bound to the second host name gets vif_type ovs (not binding_failed).
# Everything it creates is prefixed vsmk and removed on exit. Exits non-zero on any failure.
set -euo pipefail

SETUP_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ENV_FILE=${VIREO_STATE_DIR:-/var/lib/vireo-integration}/neutron.env
[[ -s $ENV_FILE ]] || {
  echo "no $ENV_FILE: run integration/host-setup.sh up --with-neutron first" >&2
  exit 1
}
# shellcheck disable=SC1090
. "$ENV_FILE"
EVENTS=1
[[ ${1:-} == --no-events ]] && EVENTS=0

log() { printf '[neutron-smoke %s] %s\n' "$(date +%T)" "$*" >&2; }
fail() {
  log "FAIL: $*"
  exit 1
}
now() { date +%s.%N; }
elapsed() { awk -v s="$1" -v e="$(now)" 'BEGIN { printf "%.2f", e - s }'; }
api() {
  local args=(-sS -f --max-time 30 -X "$1" -H 'Content-Type: application/json'
    -H 'X-Project-Id: vireo' -H 'X-Roles: admin')
  [[ $# -ge 3 ]] && args+=(-d "$3")
  curl "${args[@]}" "$VIREO_NEUTRON_URL$2"
}

SUFFIX=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
TAP=vsmk$SUFFIX
WORK=$(mktemp -d /tmp/vireo-smoke.XXXXXX)
PORTS=()
LISTENER=
cleanup() {
  set +e
  ovs-vsctl --if-exists del-port br-int "$TAP" 2>/dev/null
  ip link del "$TAP" 2>/dev/null
  local p
  for p in "${PORTS[@]}"; do api DELETE "/v2.0/ports/$p" >/dev/null 2>&1; done
  [[ -n $LISTENER ]] && kill "$LISTENER" 2>/dev/null && wait "$LISTENER" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

wait_event() { # wait_event NAME TAG SECONDS
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    jq -n -e --arg n "$1" --arg t "$2" 'any(inputs; .name == $n and .tag == $t)' "$WORK/events" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

if ((EVENTS)); then
  if ss -ltn "sport = :$VIREO_NOVA_PORT" | grep -q LISTEN; then
    fail "127.0.0.1:$VIREO_NOVA_PORT is taken: stop its owner or pass --no-events"
  fi
  /usr/bin/python3 "$SETUP_DIR/nova_events_listener.py" --port "$VIREO_NOVA_PORT" --max-seconds 120 \
    >"$WORK/events" 2>"$WORK/listener.log" &
  LISTENER=$!
  for ((i = 0; i < 50; i++)); do
    grep -qs listening "$WORK/listener.log" && break
    sleep 0.1
  done
fi

DEVICE=$(cat /proc/sys/kernel/random/uuid)
MAC=fa:16:3e:$(od -An -N3 -tx1 /dev/urandom | sed 's/^ //; s/ /:/g')
port=$(api POST /v2.0/ports "{\"port\": {\"network_id\": \"$VIREO_NEUTRON_NETWORK_ID\",
  \"project_id\": \"vireo\", \"name\": \"vsmk-$SUFFIX\", \"mac_address\": \"$MAC\",
  \"device_owner\": \"compute:nova\", \"device_id\": \"$DEVICE\",
  \"binding:host_id\": \"$VIREO_NEUTRON_HOST\"}}") || fail "port create"
PORT_ID=$(jq -r .port.id <<<"$port")
PORTS+=("$PORT_ID")
log "port $PORT_ID bound to $VIREO_NEUTRON_HOST: $(jq -c '.port | {status, vif_type: ."binding:vif_type", hybrid: ."binding:vif_details".ovs_hybrid_plug}' <<<"$port")"
[[ $(jq -r '.port."binding:vif_type"' <<<"$port") == ovs ]] || fail "binding to $VIREO_NEUTRON_HOST failed"

ip tuntap add dev "$TAP" mode tap
ip link set "$TAP" up
start=$(now)
ovs-vsctl add-port br-int "$TAP" -- set Interface "$TAP" \
  "external_ids:iface-id=$PORT_ID" "external_ids:attached-mac=$MAC" \
  external_ids:iface-status=active "external_ids:vm-uuid=$DEVICE"
status=
for ((i = 0; i < 300; i++)); do
  status=$(api GET "/v2.0/ports/$PORT_ID" | jq -r .port.status)
  [[ $status == ACTIVE ]] && break
  sleep 0.1
done
[[ $status == ACTIVE ]] || fail "port is $status 30 s after plugging $TAP into br-int"
echo "SMOKE port-active-after-plug=$(elapsed "$start")s"
if ((EVENTS)); then
  wait_event network-vif-plugged "$PORT_ID" 15 || fail "no network-vif-plugged for $PORT_ID"
  echo "SMOKE vif-plugged-event-after-plug=$(elapsed "$start")s"
  jq -c --arg t "$PORT_ID" 'select(.tag == $t)' "$WORK/events" | sed 's/^/EVENT /'
  start=$(now)
  ovs-vsctl del-port br-int "$TAP"
  wait_event network-vif-unplugged "$PORT_ID" 15 || fail "no network-vif-unplugged for $PORT_ID"
  echo "SMOKE vif-unplugged-event-after-unplug=$(elapsed "$start")s"
fi

port2=$(api POST /v2.0/ports "{\"port\": {\"network_id\": \"$VIREO_NEUTRON_NETWORK_ID\",
  \"project_id\": \"vireo\", \"name\": \"vsmk-$SUFFIX-h2\", \"device_owner\": \"compute:nova\",
  \"device_id\": \"$DEVICE\", \"binding:host_id\": \"$VIREO_NEUTRON_SECOND_HOST\"}}") || fail "port create (second host)"
PORTS+=("$(jq -r .port.id <<<"$port2")")
vt=$(jq -r '.port."binding:vif_type"' <<<"$port2")
log "port bound to $VIREO_NEUTRON_SECOND_HOST: $(jq -c '.port | {status, vif_type: ."binding:vif_type", hybrid: ."binding:vif_details".ovs_hybrid_plug}' <<<"$port2")"
[[ $vt == ovs ]] || fail "binding to $VIREO_NEUTRON_SECOND_HOST gave vif_type $vt"
echo "SMOKE second-host-binding=ok"
echo "neutron-smoke: OK"
