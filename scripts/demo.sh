#!/usr/bin/env bash
# make demo: a two-namespace lab; bypassd accelerates one side; a sockperf
# ping-pong runs through it (bypass-perf, on the bypassd shim) against a real
# `sockperf server` on the other side, then the same through the kernel
# (sockperf itself) for comparison; the daemon's counters close the show.
# Needs root. Everything it creates is removed on exit, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
SECS=${DEMO_SECONDS:-3}
SIZE=${DEMO_SIZE:-64}
name="demo$$"
tmp=$(mktemp -d /tmp/bypassd-demo.XXXXXX)
daemon_pid="" server_pid=""

cleanup() {
  set +e
  [ -n "$daemon_pid" ] && kill -TERM "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  "$BIN/netlab" down --name "$name" >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

eval "$("$BIN/netlab" up --name "$name")"
echo "lab: $NS_A ($IF_A $IP4_A) <-> $NS_B ($IF_B $IP4_B)"

ip netns exec "$NS_B" sockperf server -i "$IP4_B" -p 11111 >"$tmp/sockperf-server.log" 2>&1 &
server_pid=$!

ip netns exec "$NS_A" "$BIN/bypassd" --interface "$IF_A" --socket "$tmp/bypassd.sock" \
  --run-dir "$tmp" --stats-dir "$tmp/stats" --log-format console \
  --rx-poll "${DEMO_POLL:-50}" --engine-poll "${DEMO_POLL:-50}" 2>"$tmp/bypassd.log" &
daemon_pid=$!
for _ in $(seq 100); do
  [ -S "$tmp/bypassd.sock" ] && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$tmp/bypassd.log"; echo "demo: bypassd did not start" >&2; exit 1; }
  sleep 0.05
done
[ -S "$tmp/bypassd.sock" ] || { cat "$tmp/bypassd.log"; echo "demo: bypassd did not create its socket" >&2; exit 1; }
echo "bypassd running on $IF_A (pid $daemon_pid), control socket $tmp/bypassd.sock"

echo
echo "== bypass-perf ping-pong through bypassd (AF_XDP ring), ${SIZE}-byte messages, ${SECS}s"
ip netns exec "$NS_A" env BYPASSD_SOCKET="$tmp/bypassd.sock" \
  "$BIN/bypass-perf" ping-pong -i "$IP4_B" -p 11111 -m "$SIZE" -t "$SECS"

echo
echo "== sockperf ping-pong through the kernel, same server"
ip netns exec "$NS_A" sockperf ping-pong -i "$IP4_B" -p 11111 -m "$SIZE" -t "$SECS" | grep -E "Summary|percentile|observation|avg-latency" || true

kill -TERM "$daemon_pid"
wait "$daemon_pid"
daemon_pid=""
echo
echo "== bypassd counters at shutdown"
grep -E "ring closed" "$tmp/bypassd.log" | sed 's/^.*ring closed/ring closed/'
