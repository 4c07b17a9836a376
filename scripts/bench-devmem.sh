#!/usr/bin/env bash
# Egress staging in device memory, off vs on, with 1400-byte datagrams (every
# frame over the 204-byte inline threshold, so every frame is staged when
# on): TX throughput of a ring endpoint (udpbench, kernel sendmmsg measured in
# the same run) and ping-pong latency through the shim against a real
# `sockperf server`, bypassd restarted without and with --dev-mem-tx, the
# order alternating run by run. Prints medians and on/off ratios. On veth
# (AF_XDP copy mode) no gain is expected: this shows staging costs nothing
# measurable. Needs root and the binaries in $BIN (make build).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SECS=${SECS:-4}
SIZE=${SIZE:-1400}
POLL=${POLL:-50}
DEVMEM=${DEVMEM:-256K}

echo "== TX throughput, ${SIZE}-byte UDP, ring endpoint with staging off vs on (medians of 5 runs)"
go run ./bench/udpbench -runs 5 -duration 2s -size "$SIZE" -only tx-kernel,tx-ring -devmem-cmp -stats-cmp=false
echo

. scripts/lab.sh
lab_start_server


# run MODE I: one ping-pong through a daemon with staging MODE (off|on).
run() {
  # Staging needs a fixed provider: both runs without the TAP fallback.
  local args=(--rx-poll "$POLL" --engine-poll "$POLL" --fallback none)
  [ "$1" = on ] && args+=(--dev-mem-tx "$DEVMEM")
  lab_start_daemon "${args[@]}"
  ip netns exec "$NS_A" env BYPASSD_SOCKET="$BYPASSD_SOCK" "$BIN/bypass-perf" --no-color \
    ping-pong -i "$IP4_B" -p 11111 -m "$SIZE" -t "$SECS" >"$LAB_TMP/$1.$2" 2>&1
  # What the ring staged: proof the "on" runs took the staging path.
  "$BIN/bypass-stats" -S "$LAB_TMP/stats" -p "$lab_daemon_pid" -v 3 -c 1 | grep 'Dev Mem' | sed "s/^/$1 run $2:/" >&2
  lab_stop_daemon
  printf '%-3s run %d: p50 %8s  p99 %8s  p99.9 %8s\n' "$1" "$2" \
    "$(pct "$LAB_TMP/$1.$2" 50.000)" "$(pct "$LAB_TMP/$1.$2" 99.000)" "$(pct "$LAB_TMP/$1.$2" 99.900)" >&2
}

for i in $(seq "$RUNS"); do
  if [ $((i % 2)) = 1 ]; then run off "$i"; run on "$i"; else run on "$i"; run off "$i"; fi
done

echo "== ping-pong latency, ${SIZE}-byte sockperf ping-pong through the shim, one-way µs, median of $RUNS runs of ${SECS}s (spin ${POLL}µs)"
echo
echo "| staging | p50 | p99 | p99.9 |"
echo "|---|---|---|---|"
for mode in off on; do
  row="| $mode"
  for p in 50.000 99.000 99.900; do
    row="$row | $(for i in $(seq "$RUNS"); do pct "$LAB_TMP/$mode.$i" "$p"; done | median)"
  done
  echo "$row |"
done
on50=$(for i in $(seq "$RUNS"); do pct "$LAB_TMP/on.$i" 50.000; done | median)
off50=$(for i in $(seq "$RUNS"); do pct "$LAB_TMP/off.$i" 50.000; done | median)
echo
awk -v a="$on50" -v b="$off50" 'BEGIN {printf "p50 ratio staging on/off: %.3f (target <= 1.02)\n", a/b}'
# Run i's two daemons ran back to back: their ratio cancels drift between
# runs, which on a shared VM is larger than the effect.
paired=$(for i in $(seq "$RUNS"); do
  awk -v a="$(pct "$LAB_TMP/on.$i" 50.000)" -v b="$(pct "$LAB_TMP/off.$i" 50.000)" 'BEGIN {print a/b}'
done)
printf 'p50 ratio on/off of paired runs: median %s, min %s, max %s\n' \
  "$(echo "$paired" | median)" "$(echo "$paired" | sort -g | head -1)" "$(echo "$paired" | sort -g | tail -1)"
