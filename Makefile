# bypassd — build, test, benchmark. Run as root on Debian with Go installed;
# every target installs what it needs first (idempotent, see `deps`).

GO       ?= go
GOFLAGS  ?=
PKGS     := ./...
BIN      := bin
# Debian packages the tests, demo and benchmarks use.
APT_PKGS := iproute2 ethtool sockperf iputils-ping netcat-openbsd bpftool clang llvm libbpf-dev libibverbs-dev prometheus gcc libc6-dev make python3
TEST_TIMEOUT ?= 14m

.PHONY: all deps build build-verbs test bench scale demo generate check-generated lint fmt clean

all: build

# deps installs the Debian packages above when one of them is missing; a
# machine that has them all is left alone (no network access needed).
deps:
	@scripts/deps.sh $(APT_PKGS)

build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/... ./bench/... ./internal/netlab/cmd/...
	$(MAKE) -s -C socket/preload/c OUT=$(abspath $(BIN))/libbypassd.so

# build-verbs: bypassd and bypassctl with the verbs provider (cgo and
# libibverbs-dev), in bin/verbs/.
build-verbs: deps
	@mkdir -p $(BIN)/verbs
	$(GO) build -tags verbs -o $(BIN)/verbs/ ./cmd/bypassd ./cmd/bypassctl

# test: everything CI checks. Privileged tests need root; under
# BYPASSD_REQUIRE_PRIV=1 a missing privilege fails instead of skipping.
# The verbs build (-tags verbs) runs its device-free tests and the provider
# selection tests; its hardware tests skip without a ConnectX port
# (BYPASSD_VERBS_IF, docs/hardware-testing.md) whatever
# BYPASSD_REQUIRE_PRIV says, since no CI machine has one.
test: deps lint check-generated
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)
	$(GO) test -tags verbs -race -count=1 ./ring/verbs/...
	$(GO) test -tags verbs -race -count=1 -run 'Verbs|Provider' ./ring/ ./daemon/

bench: deps build
	scripts/bench.sh

# scale: what idle sockets cost the daemon and a busy socket (minutes; not
# part of bench). POINTS="0 1000 10000" for a shorter run.
scale: deps build
	scripts/bench-scale.sh

demo: deps build
	scripts/demo.sh

generate:
	$(GO) generate ./bpf/...

# check-generated verifies the committed BPF objects match the C source
# (skipped with a message when clang is absent).
check-generated:
	@bpf/check-generated.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags verbs $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)
