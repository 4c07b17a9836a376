#!/usr/bin/env bash
# Packet pacing, measured from outside the daemon: bypassd (its own
# process) on side A of a lab, a paced shim socket sending 1400-byte
# datagrams as fast as its rate allows, a kernel socket on side B
# timestamping arrivals (SO_TIMESTAMPNS). Prints the rate error per
# 1-second window (mean, worst) and the inter-departure jitter against the
# ideal gap, first with the default scheduler, then with the engine thread
# at SCHED_FIFO priority 10 (--engine-priority); then the CPU an idle daemon
# uses with 1,000 silent sockets, unpaced (the baseline) and paced. The kernel cannot pace UDP here (no
# fq qdisc), so there is no kernel ratio. Needs root and `make build`.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECS:-5}
RATES=${RATES:-10,100,500}
IDLE_SOCKETS=${IDLE_SOCKETS:-1000}
IDLE_SECS=${IDLE_SECS:-10}
. scripts/lab.sh

for prio in 0 10; do
  lab_start_daemon --engine-priority "$prio"
  echo "engine priority $prio (0: normal scheduler), ${SECS} windows of 1 s per rate, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  ip netns exec "$NS_B" env BYPASSD_SOCKET="$BYPASSD_SOCK" "$BIN/pacebench" accuracy -rates "$RATES" -seconds "$SECS" -dst "$IP4_B"
  echo
  lab_stop_daemon
done

for mode in -unpaced ""; do
  lab_start_daemon --pacing-max-queues "$IDLE_SOCKETS"
  BYPASSD_SOCKET="$BYPASSD_SOCK" "$BIN/pacebench" idle -pid "$lab_daemon_pid" -sockets "$IDLE_SOCKETS" -seconds "$IDLE_SECS" $mode
  lab_stop_daemon
done
