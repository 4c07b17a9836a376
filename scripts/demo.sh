#!/usr/bin/env bash
# make demo: a two-namespace lab; bypassd accelerates one side; a sockperf
# ping-pong runs through it, first the real, unmodified sockperf under
# libbypassd.so, then bypass-perf on the Go shim, against a real `sockperf
# server` on the other side, then sockperf through the kernel for
# comparison; the daemon's counters close the show.
# Needs root. Everything it creates is removed on exit, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${DEMO_SECONDS:-3}
SIZE=${DEMO_SIZE:-64}
POLL=${DEMO_POLL:-50}
. scripts/lab.sh

echo "lab: $NS_A ($IF_A $IP4_A) <-> $NS_B ($IF_B $IP4_B)"
lab_start_server
lab_start_daemon --rx-poll "$POLL" --engine-poll "$POLL"
echo "bypassd running on $IF_A (pid $lab_daemon_pid), control socket $BYPASSD_SOCK"

echo
echo "== the real sockperf, unmodified, through bypassd: LD_PRELOAD=libbypassd.so BYPASSD_REQUIRE=1 sockperf ping-pong"
ip netns exec "$NS_A" env LD_PRELOAD="$(cd "$BIN" && pwd)/libbypassd.so" BYPASSD_SOCKET="$BYPASSD_SOCK" BYPASSD_REQUIRE=1 \
  BYPASSD_LOG_LEVEL=info sockperf ping-pong -i "$IP4_B" -p 11111 -m "$SIZE" -t "$SECS" 2>&1 |
  grep -E "libbypassd|Summary|percentile|observation|avg-latency"

echo
echo "== bypass-perf ping-pong through bypassd (AF_XDP ring), ${SIZE}-byte messages, ${SECS}s"
ip netns exec "$NS_A" env BYPASSD_SOCKET="$BYPASSD_SOCK" \
  "$BIN/bypass-perf" ping-pong -i "$IP4_B" -p 11111 -m "$SIZE" -t "$SECS"

echo
echo "== sockperf ping-pong through the kernel, same server"
ip netns exec "$NS_A" sockperf ping-pong -i "$IP4_B" -p 11111 -m "$SIZE" -t "$SECS" |
  grep -E "Summary|percentile|observation|avg-latency"

echo
echo "== bypass-stats -p $lab_daemon_pid -v 3 (the daemon's rings)"
"$BIN/bypass-stats" -S "$LAB_TMP/stats" -p "$lab_daemon_pid" -v 3 -c 1

echo
echo "== bypassctl rings and devices (what the daemon serves, asked over its control socket)"
"$BIN/bypassctl" --socket "$BYPASSD_SOCK" rings
"$BIN/bypassctl" --socket "$BYPASSD_SOCK" devices

lab_stop_daemon
echo
echo "== bypassd counters at shutdown"
grep -E "ring closed" "$LAB_TMP/bypassd.log" | sed 's/^.*ring closed/ring closed/'
