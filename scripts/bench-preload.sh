#!/usr/bin/env bash
# Unmodified sockperf through libbypassd.so vs the same binary on the
# kernel, in one lab against the same real `sockperf server`: ping-pong
# p50/p99/p99.9, under-load at MPS msg/s (p50/p99) and throughput msg/s,
# with bypassd spinning (--rx-poll/--engine-poll POLL µs) and not (0);
# then the same over TCP (sockperf --tcp ping-pong and throughput against
# `sockperf server --tcp`; the library's connection is carried by the
# daemon's TCP stack), with spinning. Also bypass-perf --kernel under-load next to sockperf's (they must agree),
# and the library's cost on a call it passes through (callcost). Prints
# medians of RUNS runs. PARTS picks the parts (default "udp tcp").
# Needs root and `make build`.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SECS=${SECS:-3}
SIZE=${SIZE:-64}
POLL=${POLL:-50}
MPS=${MPS:-50000}
PARTS=${PARTS:-udp tcp}
want() { [[ " $PARTS " == *" $1 "* ]]; }
. scripts/lab.sh
LIB="$(cd "$BIN" && pwd)/libbypassd.so"
make -s -C socket/preload/c callcost COSTBIN="$LAB_TMP/callcost"

SRV=(-i "$IP4_B" -p 11111 -m "$SIZE" -t "$SECS")

# run NAME PATH ARGS...: one sockperf run in A, output in $LAB_TMP/NAME.
run() {
  local name=$1 path=$2
  shift 2
  if [ "$path" = kernel ]; then
    ip netns exec "$NS_A" sockperf "$@" "${SRV[@]}" >"$LAB_TMP/$name" 2>&1
  else
    ip netns exec "$NS_A" env LD_PRELOAD="$LIB" BYPASSD_SOCKET="$BYPASSD_SOCK" BYPASSD_REQUIRE=1 \
      sockperf "$@" "${SRV[@]}" >"$LAB_TMP/$name" 2>&1
  fi
}
rate() { awk '/Message Rate is/ {print $(NF-1); exit}' "$1"; }
med() { local f=$1 p=$2; for i in $(seq "$RUNS"); do pct "$LAB_TMP/$f.$i" "$p"; done | median; }
medrate() { for i in $(seq "$RUNS"); do rate "$LAB_TMP/$1.$i"; done | median; }

if want udp; then
lab_start_server

for poll in "$POLL" 0; do
  lab_start_daemon --rx-poll "$poll" --engine-poll "$poll"
  for i in $(seq "$RUNS"); do
    for path in kernel preload; do
      [ "$path" = kernel ] && [ "$poll" = 0 ] && continue # the kernel path does not depend on bypassd's spin
      tag=$path; [ "$path" = preload ] && tag="preload-$poll"
      run "$tag-pp.$i" "$path" ping-pong
      run "$tag-ul.$i" "$path" under-load --mps "$MPS"
      run "$tag-tp.$i" "$path" throughput
    done
    if [ "$poll" = "$POLL" ]; then
      ip netns exec "$NS_A" "$BIN/bypass-perf" --no-color --kernel under-load --mps "$MPS" "${SRV[@]}" >"$LAB_TMP/bpk-ul.$i" 2>&1
    fi
  done
  lab_stop_daemon
done

echo "sockperf ${SIZE} B through libbypassd vs the kernel, medians of $RUNS runs of ${SECS}s; latency one-way µs"
echo
echo "| path | ping-pong p50 | p99 | p99.9 | under-load ${MPS}/s p50 | p99 | throughput msg/s |"
echo "|---|---|---|---|---|---|---|"
for tag in kernel "preload-$POLL" preload-0; do
  name=$tag
  case $tag in
    kernel) name="kernel";;
    preload-0) name="libbypassd, no spinning";;
    *) name="libbypassd, spin ${POLL} µs";;
  esac
  echo "| $name | $(med "$tag-pp" 50.000) | $(med "$tag-pp" 99.000) | $(med "$tag-pp" 99.900) | $(med "$tag-ul" 50.000) | $(med "$tag-ul" 99.000) | $(medrate "$tag-tp") |"
done
echo "| bypass-perf --kernel under-load | | | | $(med bpk-ul 50.000) | $(med bpk-ul 99.000) | |"
echo
k=$(med kernel-pp 50.000) p=$(med "preload-$POLL-pp" 50.000)
ku=$(med kernel-ul 50.000) pu=$(med "preload-$POLL-ul" 50.000) bu=$(med bpk-ul 50.000)
kt=$(medrate kernel-tp) pt=$(medrate "preload-$POLL-tp")
k99=$(med kernel-pp 99.000) p99=$(med "preload-$POLL-pp" 99.000)
awk -v k="$k" -v p="$p" -v ku="$ku" -v pu="$pu" -v kt="$kt" -v pt="$pt" -v bu="$bu" -v k99="$k99" -v p99="$p99" 'BEGIN {
  printf "ping-pong p50 preload/kernel %.2f (target <= 1.00), p99 %.2f (target <= 1.50)\n", p/k, p99/k99
  printf "under-load p50 preload/kernel %.2f (target <= 1.00)\n", pu/ku
  printf "throughput preload/kernel %.2f (target >= 2.00)\n", pt/kt
  printf "bypass-perf/sockperf under-load p50 on the kernel: %.2f (target 0.80..1.20)\n", bu/ku
}'
fi

if want tcp; then
# TCP: sockperf --tcp against a kernel `sockperf server --tcp` in B.
ip netns exec "$NS_B" sockperf server --tcp -i "$IP4_B" -p 11112 >"$LAB_TMP/sockperf-tcp-server.log" 2>&1 &
tcp_server_pid=$!
trap 'kill "$tcp_server_pid" 2>/dev/null; lab_cleanup' EXIT INT TERM
sleep 0.5
SRV=(--tcp -i "$IP4_B" -p 11112 -m "$SIZE" -t "$SECS")
lab_start_daemon --rx-poll "$POLL" --engine-poll "$POLL"
for i in $(seq "$RUNS"); do
  for path in kernel preload; do
    run "tcp-$path-pp.$i" "$path" ping-pong
    run "tcp-$path-tp.$i" "$path" throughput
  done
done
lab_stop_daemon
echo
echo "sockperf --tcp ${SIZE} B through libbypassd vs the kernel, medians of $RUNS runs of ${SECS}s; latency one-way µs"
echo
echo "| path | ping-pong p50 | p99 | p99.9 | throughput msg/s |"
echo "|---|---|---|---|---|"
for path in kernel preload; do
  name=kernel; [ "$path" = preload ] && name="libbypassd (daemon TCP stack), spin ${POLL} µs"
  echo "| $name | $(med "tcp-$path-pp" 50.000) | $(med "tcp-$path-pp" 99.000) | $(med "tcp-$path-pp" 99.900) | $(medrate "tcp-$path-tp") |"
done
awk -v k="$(med tcp-kernel-pp 50.000)" -v p="$(med tcp-preload-pp 50.000)" \
  -v kt="$(medrate tcp-kernel-tp)" -v pt="$(medrate tcp-preload-tp)" 'BEGIN {
  printf "TCP ping-pong p50 preload/kernel %.2f (issue 15 target <= 1.00); throughput preload/kernel %.2f\n", p/k, pt/kt
}'
fi
echo
echo "pass-through call cost (fcntl on a TCP socket): $(LD_PRELOAD="$LIB" "$LAB_TMP/callcost") (target: added <= 20 ns)"
