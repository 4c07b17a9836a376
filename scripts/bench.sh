#!/usr/bin/env bash
# make bench: ring vs kernel in one network-namespace lab (ratios printed at
# the end), then the packet-path micro-benchmarks. Needs root. Extra
# arguments go to udpbench (e.g. -runs 7 -duration 3s).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== udpbench: 64-byte UDP, ring vs kernel (medians of 5 runs)"
go run ./bench/udpbench -runs 5 -duration 2s "$@"
echo
echo "== every queue: ring vs kernel with 1, 2 and 4 veth queues (RX of 64 flows at one offered load, TX a sender per queue)"
go run ./bench/udpbench -queues 1,2,4 -runs 3 -duration 2s
echo
echo "== ping-pong latency: bypass-perf on the shim vs sockperf on the kernel, same sockperf server"
scripts/bench-latency.sh
echo
echo "== unmodified sockperf through libbypassd.so vs the kernel (ping-pong, under-load, throughput; bypassd spinning or not)"
scripts/bench-preload.sh
echo
echo "== TCP: bypassd (client queues + daemon stack), the ring's stack in process, kernel TCP; 64-byte ping-pong and single-stream bulk, same run"
for i in 1 2 3; do go run ./bench/tcpbench -duration 2s -bulk 128000000; done
echo
echo "== egress staging in device memory: off vs on, 1400-byte datagrams"
scripts/bench-devmem.sh
echo
echo "== receive timestamps: on vs off (ring: timestamping XDP program + metadata; shim: SO_TIMESTAMPING)"
go run ./bench/udpbench -ts-cmp -stats-cmp=false -only rx-ring,rx-shim -runs 5 -duration 2s
echo "-- per-datagram costs: AF_XDP metadata read, engine stamps (sync conversion included), shim slots"
go test -run '^$' -bench 'ReadMeta|Stamps|Timestamps' -benchtime 500ms ./ring/provider/afxdp/ ./ring/ ./socket/ | grep -E '^(Benchmark|ok)'
echo "-- the handoff between rings: ns per frame pushed into the home ring's inbox and taken out"
go test -run '^$' -bench 'Inbox' -benchtime 500ms ./ring/ | grep -E '^(Benchmark|ok)'
echo
echo "== packet pacing: rate error and jitter per rate, idle CPU with paced silent sockets"
scripts/bench-pacing.sh
echo
echo "== TAP fallback: TAP path vs afxdp vs kernel (throughput, latency), plug-out switch time and loss"
scripts/bench-tap.sh
echo
echo "== jumbo frames: 8000-byte UDP at MTU 1500 (6 fragments) vs 9000 (one frame, 3-buffer chains), kernel vs ring vs shim"
for mtu in 1500 9000; do
	go run ./bench/udpbench -bulk -mtu "$mtu" -size 8000 -stats-cmp=false -runs 5 -duration 2s
done
echo
echo "== traffic classes: scheduler ns per datagram (Pick + Charge: 1 class, 8 ETS classes, 8 mixed classes with limits), then shares and a class limit measured at a kernel receiver"
go test -run '^$' -bench Pick -benchtime 500ms -count 3 ./ring/sched/qos/ | grep -E '^(Benchmark|ok)'
go test -count=1 -run 'TestQoSSharesAndStrict|TestQoSClassLimitAndForcedHeader' -v ./ring/ | grep -E 'ETS 30/70|limited to|^(ok|FAIL)'
echo
echo "== VXLAN overlays: 64-byte UDP between VXLAN devices, the ring (XDP steering by VNI, engine encap/decap) vs plain UDP on the ring vs the kernel's VXLAN path, same run"
go run ./bench/udpbench -vxlan-cmp -stats-cmp=false -only tx-kernel,tx-ring,rx-kernel,rx-ring -runs 5 -duration 2s
echo "-- per frame: build (plain vs encapsulated) and parse (plain vs outer + decap + inner)"
go test -run '^$' -bench . -benchtime 500ms ./ring/wire/vxlan/ | grep -E '^(Benchmark|ok)'
echo
echo "== packet path micro-benchmarks (pacing: scheduler ns per paced datagram at 1, 1000, 10000 flows)"
go test -run '^$' -bench . -benchmem ./ring/wire/packet/ ./ring/wire/reassembly/ ./ring/devmem/ ./ring/clock/tsconv/ ./ring/sched/pacing/ ./internal/shmq/ | grep -E '^(Benchmark|ok|PASS)'
