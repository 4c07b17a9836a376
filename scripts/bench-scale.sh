#!/usr/bin/env bash
# make scale: what idle sockets cost. One busy socket (bypass-perf on the Go
# client: 64-byte ping-pong p50/p99, then 64-byte throughput, against a
# kernel `sockperf server`) is measured on a daemon holding N idle bound
# sockets (client processes of PER sockets, 4 KiB queues) and, interleaved
# with it, on an empty daemon in a second, identical lab: the ratios compare
# the two under the same machine load, which on a shared VM moves more from
# minute to minute than the effect looked for. Each point runs ROUNDS rounds
# (empty, loaded; then loaded, empty; ...) and compares medians; the 0 point
# is an A/A check of the two labs.
#
#   POINTS   socket counts, ascending (default "0 1000 10000 100000")
#   ROUNDS   interleaved rounds per point (default 5)
#   SECS     seconds per ping-pong and per throughput run (default 2)
#   PER      sockets per client process (default 1000)
#   PER_ADDR sockets per local address (default 20000: the kernel's
#            ephemeral range holds 28,232 ports per address, so 100,000
#            sockets bind to five addresses of the loaded lab's interface)
#   PAR      client processes opening their sockets at a time (default 4)
#   POLL     engine and client spin in µs (default 0: with 50, whether the
#            client, the engine and the kernel server each find a CPU on 2
#            vCPUs decides p50 between ~15 and ~100 µs from run to run;
#            without, every datagram takes the sleep and wake-up path, the
#            one whose cost could grow with sessions, and p50 is stable)
#
# Each run's figures go to stderr as it ends. Prints one row per point and
# the verdicts: the busy socket's msg/s and
# p50 at the largest point within 10% of the empty daemon's (PASS, FAIL, or
# INCONCLUSIVE when the empty daemon's own runs there spread more than 10%
# around their median or the A/A row at 0 idle sockets is off by more than
# 10%), and the loaded daemon's RSS <= 1 GiB. Labs, daemons
# and clients are removed on any exit, Ctrl-C included.
set -euo pipefail
cd "$(dirname "$0")/.."
POINTS=${POINTS:-"0 1000 10000 100000"}
ROUNDS=${ROUNDS:-5}
SECS=${SECS:-2}
PER=${PER:-1000}
PER_ADDR=${PER_ADDR:-20000}
PAR=${PAR:-4}
POLL=${POLL:-0}
. scripts/lab.sh

prev=-1
for n in $POINTS; do
  if [ "$n" -le "$prev" ] || [ $((n % PER)) -ne 0 ] || [ $((PER_ADDR % PER)) -ne 0 ]; then
    echo "POINTS=\"$POINTS\", PER_ADDR=$PER_ADDR: want ascending multiples of PER=$PER" >&2
    exit 2
  fi
  prev=$n
done
max=$prev
start_all=$(date +%s)

# The empty daemon's lab (Z_*), then the loaded one (lab.sh's own).
lab_add Z_
# Local addresses of the loaded lab: IP4_A, then .101, .102, ... in its /24;
# the empty lab gets as many, and its daemon the same options: the two
# labs differ only in the idle sockets.
addrs=("$IP4_A")
while [ $((${#addrs[@]} * PER_ADDR)) -lt "$max" ]; do
  host=$((100 + ${#addrs[@]}))
  timeout 10 ip -n "$NS_A" addr add "${IP4_A%.*}.$host/24" dev "$IF_A"
  timeout 10 ip -n "$Z_NS_A" addr add "${Z_IP4_A%.*}.$host/24" dev "$Z_IF_A"
  addrs+=("${IP4_A%.*}.$host")
done
opts=(--rx-poll "$POLL" --engine-poll "$POLL" --max-sockets "$PER" --max-flows $((max + 10000)))
z_tmp=$LAB_TMP/z
mkdir -p "$z_tmp"
NS_B=$Z_NS_B IP4_B=$Z_IP4_B LAB_TMP=$z_tmp lab_start_server
NS_A=$Z_NS_A IF_A=$Z_IF_A LAB_TMP=$z_tmp BYPASSD_SOCK=$z_tmp/bypassd.sock lab_start_daemon "${opts[@]}"
lab_start_server
lab_start_daemon "${opts[@]}"
n_pid=$lab_daemon_pid

idle_pids=()
# The idle clients are killed, not asked to close 1,000 sockets each: the
# daemon releases a dead client's sockets at once.
scale_cleanup() {
  set +e
  for p in "${idle_pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${idle_pids[@]}"; do wait "$p" 2>/dev/null; done
  lab_cleanup
}
trap scale_cleanup EXIT

# cpu_ticks PID: the process's user+system CPU time in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
load1() { cut -d' ' -f1 /proc/loadavg; }

# measure WHICH N: one ping-pong and one throughput run on the empty (z) or
# loaded (n) lab; appends "p50 p99 msg/s" to $LAB_TMP/WHICH.N.
measure() {
  local ns=$NS_A ip=$IP4_B sock=$BYPASSD_SOCK out="$LAB_TMP/$1.$2"
  if [ "$1" = z ]; then ns=$Z_NS_A ip=$Z_IP4_B sock=$z_tmp/bypassd.sock; fi
  ip netns exec "$ns" env BYPASSD_SOCKET="$sock" timeout $((SECS + 30)) "$BIN/bypass-perf" --no-color \
    ping-pong -i "$ip" -p 11111 -m 64 -t "$SECS" >"$out.pp" 2>&1 || { cat "$out.pp" >&2; return 1; }
  ip netns exec "$ns" env BYPASSD_SOCKET="$sock" timeout $((SECS + 30)) "$BIN/bypass-perf" --no-color \
    throughput -i "$ip" -p 11111 -m 64 -t "$SECS" >"$out.tp" 2>&1 || { cat "$out.tp" >&2; return 1; }
  echo "$(pct "$out.pp" 50.000) $(pct "$out.pp" 99.000) $(awk '/Message Rate is/ {for (i=1;i<=NF;i++) if ($i=="is") {print $(i+1); exit}}' "$out.tp")" >>"$out"
  echo "  $2 idle sockets, $([ "$1" = z ] && echo empty || echo loaded) daemon: p50 p99 msg/s $(tail -1 "$out")" >&2
}

# col FILE K: the median of column K of FILE.
col() { awk -v k="$2" '{print $k}' "$1" | median; }
# spread FILE K: the median absolute deviation of column K over its median.
spread() {
  local m
  m=$(col "$1" "$2")
  awk -v k="$2" -v m="$m" '{d=$k-m; print (d<0?-d:d)/m}' "$1" | median
}

open=0
rows=()
for n in $POINTS; do
  start=$(date +%s.%N)
  # PAR clients open at a time: a client's sockets open one after the
  # other, each a round trip to the daemon, which on a loaded VM is mostly
  # waiting to be scheduled.
  while [ "$open" -lt "$n" ]; do
    batch=()
    while [ "$open" -lt "$n" ] && [ "${#batch[@]}" -lt "$PAR" ]; do
      i=${#idle_pids[@]}
      ip netns exec "$NS_A" env BYPASSD_SOCKET="$BYPASSD_SOCK" "$BIN/idlesocks" -n "$PER" \
        -addr "${addrs[$((open / PER_ADDR))]}" >"$LAB_TMP/idle.$i" 2>"$LAB_TMP/idle.$i.err" &
      idle_pids+=($!)
      batch+=("$i")
      open=$((open + PER))
    done
    for i in "${batch[@]}"; do
      deadline=$(($(date +%s) + 300))
      until grep -qx ready "$LAB_TMP/idle.$i"; do
        if ! kill -0 "${idle_pids[$i]}" 2>/dev/null || [ "$(date +%s)" -gt "$deadline" ]; then
          echo "idle client $i did not get ready:" >&2
          cat "$LAB_TMP/idle.$i.err" >&2
          exit 1
        fi
        sleep 0.05
      done
    done
  done
  opened=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e-s}')
  # What the loaded daemon spends with all its sockets idle, over 2 s.
  c0=$(cpu_ticks "$n_pid")
  sleep 2
  cpu=$(awk -v a="$c0" -v b="$(cpu_ticks "$n_pid")" -v hz="$hz" 'BEGIN {printf "%.0f", 100*(b-a)/hz/2}')
  rss=$(awk '/^VmRSS/ {printf "%.0f", $2/1024}' "/proc/$n_pid/status")
  fds=$(ls "/proc/$n_pid/fd" | wc -l)
  loads=()
  for r in $(seq "$ROUNDS"); do
    loads+=("$(load1)")
    if [ $((r % 2)) = 1 ]; then measure z "$n"; measure n "$n"; else measure n "$n"; measure z "$n"; fi
  done
  row="$n $opened $rss $fds $cpu"
  for w in n z; do row="$row $(col "$LAB_TMP/$w.$n" 1) $(col "$LAB_TMP/$w.$n" 2) $(col "$LAB_TMP/$w.$n" 3)"; done
  row="$row $(spread "$LAB_TMP/z.$n" 1) $(spread "$LAB_TMP/z.$n" 3) $(printf '%s\n' "${loads[@]}" | median)"
  echo "$n idle sockets: $row" >&2
  rows+=("$row")
done

echo "One busy socket beside N idle bound sockets (client processes of $PER, 4 KiB queues, $PER_ADDR per address),"
echo "against an empty daemon in an identical lab, interleaved: $ROUNDS rounds of ${SECS}s ping-pong + ${SECS}s throughput each, medians; spin ${POLL}µs."
echo "Idle CPU: the loaded daemon's CPU over 2 s with every socket idle."
echo
echo "| idle sockets | opened in s | daemon RSS MiB | daemon fds | idle CPU % | p50 µs | p99 µs | 64 B msg/s | empty p50 µs | empty p99 µs | empty msg/s | p50 ratio | msg/s ratio | load avg |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do
  read -r n opened rss fds cpu p50 p99 mps zp50 zp99 zmps _ _ load <<<"$r"
  awk -v n="$n" -v op="$opened" -v rss="$rss" -v fds="$fds" -v cpu="$cpu" -v p50="$p50" -v p99="$p99" -v mps="$mps" \
    -v zp50="$zp50" -v zp99="$zp99" -v zmps="$zmps" -v load="$load" \
    'BEGIN {printf "| %d | %s | %d | %d | %d | %.1f | %.0f | %.0f | %.1f | %.0f | %.0f | %.2f | %.2f | %s |\n",
      n, op, rss, fds, cpu, p50, p99, mps, zp50, zp99, zmps, p50/zp50, mps/zmps, load}'
done
echo
# The A/A row (0 idle sockets, when measured): the two labs must agree
# within 10% themselves, or no ratio says anything.
read -r n0 _ _ _ _ ap50 _ amps azp50 _ azmps _ _ _ <<<"${rows[0]}"
[ "$n0" = 0 ] || ap50=0
read -r n _ rss _ _ p50 _ mps zp50 _ zmps sp50 smps _ <<<"${rows[-1]}"
awk -v n="$n" -v p50="$p50" -v mps="$mps" -v zp50="$zp50" -v zmps="$zmps" -v sp50="$sp50" -v smps="$smps" \
  -v ap50="$ap50" -v amps="$amps" -v azp50="$azp50" -v azmps="$azmps" -v rounds="$ROUNDS" 'BEGIN {
  v = (mps/zmps >= 0.9 && p50/zp50 <= 1.1) ? "PASS" : "FAIL"
  why = sprintf("the empty daemon'"'"'s runs spread %.0f%% and %.0f%% around their medians", 100*smps, 100*sp50)
  if (sp50 > 0.1 || smps > 0.1) v = "INCONCLUSIVE"
  if (rounds < 3) { v = "INCONCLUSIVE"; why = why sprintf("; %d rounds, fewer than 3", rounds) }
  if (ap50 > 0) {
    why = why sprintf("; A/A at 0 idle sockets: msg/s ratio %.2f, p50 ratio %.2f", amps/azmps, ap50/azp50)
    if (amps/azmps < 0.9 || amps/azmps > 1.1 || ap50/azp50 < 0.9 || ap50/azp50 > 1.1) v = "INCONCLUSIVE"
  } else {
    why = why "; no A/A row (POINTS without 0)"
  }
  printf "%s: msg/s and p50 at %d idle sockets within 10%% of the empty daemon: msg/s ratio %.2f, p50 ratio %.2f (%s)\n",
    v, n, mps/zmps, p50/zp50, why }'
if [ "$n" -ge 100000 ]; then
  awk -v rss="$rss" -v n="$n" 'BEGIN {printf "%s: daemon RSS <= 1 GiB at %d sockets: %d MiB\n", (rss <= 1024 ? "PASS" : "FAIL"), n, rss}'
else
  echo "NOT MEASURED: daemon RSS <= 1 GiB at 100,000 sockets (largest point $n)"
fi
echo "make scale part 1 took $(($(date +%s) - start_all)) s"
