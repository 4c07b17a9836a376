#!/usr/bin/env bash
# make bench: ring vs kernel in one network-namespace lab (ratios printed at
# the end), then the packet-path micro-benchmarks. Needs root. Extra
# arguments go to udpbench (e.g. -runs 7 -duration 3s).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== udpbench: 64-byte UDP, ring vs kernel (medians of 5 runs)"
go run ./bench/udpbench -runs 5 -duration 2s "$@"
echo
echo "== ping-pong latency: bypass-perf on the shim vs sockperf on the kernel, same sockperf server"
scripts/bench-latency.sh
echo
echo "== unmodified sockperf through libbypassd.so vs the kernel (ping-pong, under-load, throughput; bypassd spinning or not)"
scripts/bench-preload.sh
echo
echo "== egress staging in device memory: off vs on, 1400-byte datagrams"
scripts/bench-devmem.sh
echo
echo "== receive timestamps: on vs off (ring: timestamping XDP program + metadata; shim: SO_TIMESTAMPING)"
go run ./bench/udpbench -ts-cmp -stats-cmp=false -only rx-ring,rx-shim -runs 5 -duration 2s
echo "-- per-datagram costs: AF_XDP metadata read, engine stamps (sync conversion included), shim slots"
go test -run '^$' -bench 'ReadMeta|Stamps|Timestamps' -benchtime 500ms ./ring/provider/afxdp/ ./ring/ ./socket/ | grep -E '^(Benchmark|ok)'
echo
echo "== packet pacing: rate error and jitter per rate, idle CPU with paced silent sockets"
scripts/bench-pacing.sh
echo
echo "== TAP fallback: TAP path vs afxdp vs kernel (throughput, latency), plug-out switch time and loss"
scripts/bench-tap.sh
echo
echo "== packet path micro-benchmarks (pacing: scheduler ns per paced datagram at 1, 1000, 10000 flows)"
go test -run '^$' -bench . -benchmem ./ring/wire/packet/ ./ring/wire/reassembly/ ./ring/devmem/ ./ring/clock/tsconv/ ./ring/sched/pacing/ ./internal/shmq/ | grep -E '^(Benchmark|ok|PASS)'
