#!/usr/bin/env bash
# make scale: what idle sockets cost. One busy socket (the Go client:
# 64-byte ping-pong p50/p99, then 64-byte throughput, against a kernel
# `sockperf server`) is measured on a daemon holding N idle bound sockets
# (client processes of PER sockets, 4 KiB queues) and, in the same run, on
# an empty daemon in a second, identical lab.
#
# How: bench/pairbench holds one socket on each daemon and switches between
# them every SLICE, so both see the same machine. On this shared 2-vCPU VM
# a run's figures move by 15-30% from one second to the next (the kernel's
# own ping-pong moves as much), more than the 10% looked for; runs taken
# one after the other compare that noise. pairbench gives the median of
# per-second ratios loaded/empty with a distribution-free 95% confidence
# interval, and each daemon's CPU time and context switches per round trip
# (what the daemon does per datagram, which scheduling noise does not
# move). The placement is fixed (PIN): both engines on one CPU, the
# measuring client and the sockperf servers on the other, so a run does not
# depend on where the scheduler happens to put the threads (unpinned,
# throughput moves by 30% between seconds). The 0 point is an A/A check of
# the two labs.
#
#   POINTS   socket counts, ascending (default "0 1000 10000 100000")
#   SECS     seconds of ping-pong and as many of throughput per point
#            (default 20: 20 one-second ratios)
#   SLICE    time on one daemon before switching (default 100ms)
#   PER      sockets per client process (default 1000)
#   PER_ADDR sockets per local address (default 20000: the kernel's
#            ephemeral range holds 28,232 ports per address, so 100,000
#            sockets bind to five addresses of the loaded lab's interface)
#   PAR      client processes opening their sockets at a time (default 4)
#   POLL     engine and client spin in µs (default 0: every datagram takes
#            the sleep and wake-up path, the one whose cost could grow with
#            sessions)
#   PIN      "ENGINE_CPU APP_CPU" (default "1 0"); empty: no pinning
#
# Prints one row per point and the verdicts at the largest point: the busy
# socket's p50 and msg/s within 10% of the empty daemon's (PASS when the
# confidence interval of the ratio lies within 10%, FAIL when it lies
# beyond, else INCONCLUSIVE; also INCONCLUSIVE when the A/A ratios at 0 idle
# sockets are off by more than 10%), and the loaded daemon's RSS <= 1 GiB.
# Labs, daemons and clients are removed on any exit, Ctrl-C included.
set -euo pipefail
cd "$(dirname "$0")/.."
POINTS=${POINTS:-"0 1000 10000 100000"}
SECS=${SECS:-20}
SLICE=${SLICE:-100ms}
PER=${PER:-1000}
PER_ADDR=${PER_ADDR:-20000}
PAR=${PAR:-4}
POLL=${POLL:-0}
PIN=${PIN-"1 0"}
read -r engine_cpu app_cpu <<<"$PIN"
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
app_pin=()
if [ -n "$PIN" ]; then
  opts+=(--cpus "$engine_cpu")
  app_pin=(taskset -c "$app_cpu")
  export LAB_SERVER_CPUS=$app_cpu
fi
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

# measure N: one pairbench run, loaded daemon (A) against empty (B); its
# key=value line goes to $LAB_TMP/pair.N.
measure() {
  timeout $((2 * SECS + 60)) "${app_pin[@]}" "$BIN/pairbench" -a "$BYPASSD_SOCK" -a-server "$IP4_B:11111" \
    -b "$z_tmp/bypassd.sock" -b-server "$Z_IP4_B:11111" -seconds "$SECS" -slice "$SLICE" >"$LAB_TMP/pair.$1" \
    || { cat "$LAB_TMP/pair.$1" >&2; return 1; }
  grep -v '=' "$LAB_TMP/pair.$1" | sed "s/^/  $1 idle sockets: /" >&2
}

# kv N KEY...: the values of KEYs in point N's pairbench line.
kv() {
  local n=$1
  shift
  awk -v keys="$*" 'index($0, "=") {
    for (i = 1; i <= NF; i++) { split($i, f, "="); v[f[1]] = f[2] }
    k = split(keys, ks, " "); out = ""
    for (j = 1; j <= k; j++) out = out (j > 1 ? " " : "") v[ks[j]]
    print out }' "$LAB_TMP/pair.$n"
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
  load=$(load1)
  measure "$n"
  row="$n $opened $rss $fds $cpu $(kv "$n" a_p50 a_p99 a_mps b_p50 b_p99 b_mps p50_ratio p50_lo p50_hi mps_ratio mps_lo mps_hi a_cpu_us b_cpu_us a_ctxsw b_ctxsw) $load"
  echo "$n idle sockets: $row" >&2
  rows+=("$row")
done

echo "One busy socket beside N idle bound sockets (client processes of $PER, 4 KiB queues, $PER_ADDR per address),"
echo "against an empty daemon in an identical lab, switching between them every $SLICE: ${SECS}s of ping-pong, then ${SECS}s of throughput; spin ${POLL}µs; pinned (engines, client and servers): ${PIN:-no}."
echo "p50/p99: latency as sockperf reports it (RTT/2). Ratios loaded/empty: median of the per-second ratios [95% confidence interval]."
echo "Daemon CPU and context switches: per ping-pong round trip, loaded / empty daemon. Idle CPU: the loaded daemon's over 2 s with every socket idle."
echo
echo "| idle sockets | opened in s | daemon RSS MiB | daemon fds | idle CPU % | p50 µs | p99 µs | 64 B msg/s | empty p50 µs | empty p99 µs | empty msg/s | p50 ratio | msg/s ratio | daemon CPU µs/rt | daemon ctxsw/rt | load avg |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do
  read -r n opened rss fds cpu p50 p99 mps zp50 zp99 zmps rp rpl rph rm rml rmh ncpu zcpu nsw zsw load <<<"$r"
  printf '| %d | %s | %d | %d | %d | %.1f | %.0f | %.0f | %.1f | %.0f | %.0f | %.2f [%.2f–%.2f] | %.2f [%.2f–%.2f] | %.1f / %.1f | %.2f / %.2f | %s |\n' \
    "$n" "$opened" "$rss" "$fds" "$cpu" "$p50" "$p99" "$mps" "$zp50" "$zp99" "$zmps" "$rp" "$rpl" "$rph" "$rm" "$rml" "$rmh" \
    "$ncpu" "$zcpu" "$nsw" "$zsw" "$load"
done
echo
# The A/A row (0 idle sockets, when measured): the two labs must agree
# within 10% themselves, or no ratio says anything.
read -r n0 _ _ _ _ _ _ _ _ _ _ arp _ _ arm _ <<<"${rows[0]}"
[ "$n0" = 0 ] || arp=0
read -r n _ rss _ _ _ _ _ _ _ _ rp rpl rph rm rml rmh _ <<<"${rows[-1]}"
awk -v n="$n" -v rp="$rp" -v rpl="$rpl" -v rph="$rph" -v rm="$rm" -v rml="$rml" -v rmh="$rmh" \
  -v arp="$arp" -v arm="$arm" -v secs="$SECS" 'BEGIN {
  v = "INCONCLUSIVE"
  if (rph <= 1.1 && rml >= 0.9) v = "PASS"
  if (rpl > 1.1 || rmh < 0.9) v = "FAIL"
  why = sprintf("%d one-second ratios", secs)
  if (secs < 6) { v = "INCONCLUSIVE"; why = why ", fewer than 6" }
  if (arp > 0) {
    why = why sprintf("; A/A at 0 idle sockets: p50 ratio %.2f, msg/s ratio %.2f", arp, arm)
    if (arm < 0.9 || arm > 1.1 || arp < 0.9 || arp > 1.1) v = "INCONCLUSIVE"
  } else {
    why = why "; no A/A row (POINTS without 0)"
  }
  printf "%s: p50 and msg/s at %d idle sockets within 10%% of the empty daemon: p50 ratio %.2f [95%% CI %.2f–%.2f], msg/s ratio %.2f [%.2f–%.2f] (%s)\n",
    v, n, rp, rpl, rph, rm, rml, rmh, why }'
if [ "$n" -ge 100000 ]; then
  awk -v rss="$rss" -v n="$n" 'BEGIN {printf "%s: daemon RSS <= 1 GiB at %d sockets: %d MiB\n", (rss <= 1024 ? "PASS" : "FAIL"), n, rss}'
else
  echo "NOT MEASURED: daemon RSS <= 1 GiB at 100,000 sockets (largest point $n)"
fi
echo "make scale part 1 took $(($(date +%s) - start_all)) s"
