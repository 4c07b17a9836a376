#!/usr/bin/env bash
# The TAP fallback path next to the afxdp path and the kernel: 64-byte UDP
# throughput of a ring endpoint (udpbench, the ring forced onto its TAP vs
# afxdp vs kernel sendmmsg/recvmmsg, all in the same run), ping-pong latency
# through the shim against a real `sockperf server` with bypassd on its fast
# path, on its TAP path (--fallback tap) and sockperf on the kernel path, and
# the switch time and loss of the plug-out lab test (a 50,000 datagrams/s
# stream, the XDP link detached mid-stream, restored a second later).
# Needs root and the binaries in $BIN (make build).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SECS=${SECS:-4}
SIZE=${SIZE:-64}
POLL=${POLL:-50}

echo "== throughput, ${SIZE}-byte UDP: ring on the TAP path vs afxdp vs kernel (medians of 5 runs)"
go run ./bench/udpbench -runs 5 -duration 2s -size "$SIZE" -only tx-kernel,tx-ring,rx-kernel,rx-ring -tap-cmp -stats-cmp=false
echo

. scripts/lab.sh
lab_start_server


# run PATH I: one ping-pong on PATH (afxdp: bypassd's default; tap: bypassd
# --fallback tap; kernel: sockperf itself).
run() {
  if [ "$1" = kernel ]; then
    ip netns exec "$NS_A" sockperf ping-pong -i "$IP4_B" -p 11111 -m "$SIZE" -t "$SECS" >"$LAB_TMP/$1.$2" 2>&1
  else
    local args=(--rx-poll "$POLL" --engine-poll "$POLL")
    [ "$1" = tap ] && args+=(--fallback tap)
    lab_start_daemon "${args[@]}"
    ip netns exec "$NS_A" env BYPASSD_SOCKET="$BYPASSD_SOCK" "$BIN/bypass-perf" --no-color \
      ping-pong -i "$IP4_B" -p 11111 -m "$SIZE" -t "$SECS" >"$LAB_TMP/$1.$2" 2>&1
    lab_stop_daemon
  fi
  printf '%-6s run %d: p50 %8s  p99 %8s  p99.9 %8s\n' "$1" "$2" \
    "$(pct "$LAB_TMP/$1.$2" 50.000)" "$(pct "$LAB_TMP/$1.$2" 99.000)" "$(pct "$LAB_TMP/$1.$2" 99.900)" >&2
}

for i in $(seq "$RUNS"); do
  for path in afxdp tap kernel; do run "$path" "$i"; done
done

echo "== ping-pong latency, ${SIZE}-byte sockperf ping-pong, one-way µs, median of $RUNS runs of ${SECS}s (spin ${POLL}µs)"
echo
echo "| path | p50 | p99 | p99.9 |"
echo "|---|---|---|---|"
for path in afxdp tap kernel; do
  row="| $path"
  for p in 50.000 99.000 99.900; do
    row="$row | $(for i in $(seq "$RUNS"); do pct "$LAB_TMP/$path.$i" "$p"; done | median)"
  done
  echo "$row |"
done
t50=$(for i in $(seq "$RUNS"); do pct "$LAB_TMP/tap.$i" 50.000; done | median)
a50=$(for i in $(seq "$RUNS"); do pct "$LAB_TMP/afxdp.$i" 50.000; done | median)
k50=$(for i in $(seq "$RUNS"); do pct "$LAB_TMP/kernel.$i" 50.000; done | median)
echo
awk -v t="$t50" -v a="$a50" -v k="$k50" 'BEGIN {printf "p50 ratio tap/afxdp: %.2f, tap/kernel: %.2f\n", t/a, t/k}'
echo

echo "== plug-out under load: 50,000 datagrams/s, XDP link detached, TAP path, fast path restored ($RUNS runs)"
for i in $(seq "$RUNS"); do
  go test -count=1 -run '^TestPlugOutUnderLoad$' -v ./ring/ 2>&1 | grep -E 'sent [0-9]+, lost' | sed -E "s/^ *fallback_test.go:[0-9]+: /run $i: /"
done
