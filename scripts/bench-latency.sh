#!/usr/bin/env bash
# Ping-pong latency, in one lab and against the same real `sockperf server`:
# bypass-perf on the bypassd shim vs sockperf on the kernel path. Prints
# one-way p50/p99/p99.9 (µs) per run and the medians. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SECS=${SECS:-4}
SIZE=${SIZE:-64}
POLL=${POLL:-50}
. scripts/lab.sh

lab_start_server
lab_start_daemon --rx-poll "$POLL" --engine-poll "$POLL"

# pct FILE P: the value of percentile P in a sockperf summary.

for i in $(seq "$RUNS"); do
  ip netns exec "$NS_A" env BYPASSD_SOCKET="$BYPASSD_SOCK" "$BIN/bypass-perf" --no-color \
    ping-pong -i "$IP4_B" -p 11111 -m "$SIZE" -t "$SECS" >"$LAB_TMP/shim.$i" 2>&1
  ip netns exec "$NS_A" sockperf ping-pong -i "$IP4_B" -p 11111 -m "$SIZE" -t "$SECS" >"$LAB_TMP/kernel.$i" 2>&1
  for path in shim kernel; do
    printf '%-6s run %d: p50 %8s  p99 %8s  p99.9 %8s\n' "$path" "$i" \
      "$(pct "$LAB_TMP/$path.$i" 50.000)" "$(pct "$LAB_TMP/$path.$i" 99.000)" "$(pct "$LAB_TMP/$path.$i" 99.900)" >&2
  done
done

echo "${SIZE}-byte sockperf ping-pong, one-way latency in µs, median of $RUNS runs of ${SECS}s (spin ${POLL}µs)"
echo
echo "| path | p50 | p99 | p99.9 |"
echo "|---|---|---|---|"
for path in shim kernel; do
  row="| $path"
  for p in 50.000 99.000 99.900; do
    row="$row | $(for i in $(seq "$RUNS"); do pct "$LAB_TMP/$path.$i" "$p"; done | median)"
  done
  echo "$row |"
done
s50=$(for i in $(seq "$RUNS"); do pct "$LAB_TMP/shim.$i" 50.000; done | median)
k50=$(for i in $(seq "$RUNS"); do pct "$LAB_TMP/kernel.$i" 50.000; done | median)
echo
awk -v s="$s50" -v k="$k50" 'BEGIN {printf "p50 ratio shim/kernel: %.2f (target <= 1.00)\n", s/k}'
