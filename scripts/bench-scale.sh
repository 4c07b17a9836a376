#!/usr/bin/env bash
# make scale: what idle sockets cost. One measured socket (bypass-perf on
# the shim against a kernel `sockperf server`) with 0, 1,000, 10,000 and
# 100,000 idle bound sockets open (client processes of 1,000 sockets each,
# 4 KiB queues), in one run: daemon RSS and descriptors, ping-pong p50/p99
# and 64-byte throughput, each also as a ratio to the 0-socket point.
# POINTS overrides the socket counts (e.g. POINTS="0 1000 10000"). The
# daemon parks its port reservations in io_uring file tables (a descriptor
# per 4,096); where it cannot, every bound socket costs it a descriptor and
# the script tries to raise the open-file limit.
set -euo pipefail
cd "$(dirname "$0")/.."
POINTS=${POINTS:-"0 1000 10000 100000"}
SECS=${SECS:-3}
PER=${PER:-1000}
POLL=${POLL:-50}
. scripts/lab.sh

max=0
for n in $POINTS; do [ "$n" -gt "$max" ] && max=$n; done
if [ "$(ulimit -Hn)" -lt $((max + 1000)) ]; then
  { ulimit -Hn $((max + 10000)) && ulimit -Sn $((max + 10000)); } 2>/dev/null ||
    echo "note: open-file limit $(ulimit -Hn): enough only while the daemon parks its port reservations in io_uring (see its log)" >&2
fi

lab_start_server
lab_start_daemon --rx-poll "$POLL" --engine-poll "$POLL" --max-sockets "$PER" --max-flows $((max + 10000))

idle_pids=()
scale_cleanup() {
  for p in "${idle_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${idle_pids[@]}"; do wait "$p" 2>/dev/null; done
  lab_cleanup
}
trap scale_cleanup EXIT INT TERM

open=0
rows=()
for n in $POINTS; do
  start=$(date +%s.%N)
  while [ "$open" -lt "$n" ]; do
    f="$LAB_TMP/idle.${#idle_pids[@]}"
    mkfifo "$f"
    ip netns exec "$NS_A" env BYPASSD_SOCKET="$BYPASSD_SOCK" "$BIN/idlesocks" -n "$PER" -addr "$IP4_A" >"$f" 2>"$f.err" &
    idle_pids+=($!)
    if ! read -r line <"$f" || [ "$line" != ready ]; then cat "$f.err" >&2; exit 1; fi
    open=$((open + PER))
  done
  opened=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e-s}')
  rss=$(awk '/^VmRSS/ {printf "%.0f", $2/1024}' "/proc/$lab_daemon_pid/status")
  fds=$(ls "/proc/$lab_daemon_pid/fd" | wc -l)
  ip netns exec "$NS_A" env BYPASSD_SOCKET="$BYPASSD_SOCK" "$BIN/bypass-perf" --no-color \
    ping-pong -i "$IP4_B" -p 11111 -m 64 -t "$SECS" >"$LAB_TMP/pp.$n" 2>&1
  ip netns exec "$NS_A" env BYPASSD_SOCKET="$BYPASSD_SOCK" "$BIN/bypass-perf" --no-color \
    throughput -i "$IP4_B" -p 11111 -m 64 -t "$SECS" >"$LAB_TMP/tp.$n" 2>&1
  p50=$(pct "$LAB_TMP/pp.$n" 50.000)
  p99=$(pct "$LAB_TMP/pp.$n" 99.000)
  mps=$(awk '/Message Rate is/ {for (i=1;i<=NF;i++) if ($i=="is") {print $(i+1); exit}}' "$LAB_TMP/tp.$n")
  echo "$n idle sockets (opened in ${opened}s): RSS ${rss} MB, fds $fds, p50 $p50 µs, p99 $p99 µs, $mps msg/s" >&2
  rows+=("$n $rss $fds $p50 $p99 $mps $opened")
done

echo "One measured socket with N idle bound sockets (client processes of $PER, 4 KiB queues); ${SECS}s per measurement, spin ${POLL}µs"
echo
echo "| idle sockets | opened in s | daemon RSS MB | daemon fds | p50 µs | p99 µs | 64 B msg/s | p50 ratio | msg/s ratio |"
echo "|---|---|---|---|---|---|---|---|---|"
read -r _ rss0 _ p500 _ mps0 _ <<<"${rows[0]}"
for r in "${rows[@]}"; do
  read -r n rss fds p50 p99 mps opened <<<"$r"
  awk -v n="$n" -v rss="$rss" -v fds="$fds" -v p50="$p50" -v p99="$p99" -v mps="$mps" -v p500="$p500" -v mps0="$mps0" -v op="$opened" \
    'BEGIN {printf "| %d | %s | %d | %d | %s | %s | %s | %.2f | %.2f |\n", n, op, rss, fds, p50, p99, mps, p50/p500, mps/mps0}'
done
echo
echo "Targets (issue 20): p50 and msg/s within 10% of the 0-socket point at 100,000 idle sockets; daemon RSS <= 1 GiB."
