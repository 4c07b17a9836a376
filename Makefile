# bypassd — build, test, benchmark. Run as root on Debian with Go installed;
# every target installs what it needs first (idempotent, see `deps`).

GO       ?= go
GOFLAGS  ?=
PKGS     := ./...
BIN      := bin
# Debian packages the tests, demo and benchmarks use (podman, buildah and
# runc for the container test, deploy/image; iperf3 and curl for the
# preload library's TCP tests).
APT_PKGS := iproute2 ethtool sockperf iputils-ping netcat-openbsd bpftool clang llvm libbpf-dev libibverbs-dev prometheus gcc libc6-dev make python3 podman buildah runc iperf3 curl
TEST_TIMEOUT ?= 14m

.PHONY: all deps build build-verbs test test-chart helm-template bench scale soak demo generate check-generated lint fmt clean deb test-deb image

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

# test: everything CI checks (TestSocketsAtScale, 20 processes with 1,000
# sockets each, and TestTCPThousandConnections run without the race
# detector: with it, minutes each). Privileged tests need root; under
# BYPASSD_REQUIRE_PRIV=1 a missing privilege fails instead of skipping.
# The verbs build (-tags verbs) runs its device-free tests and the provider
# selection tests; its hardware tests skip without a ConnectX port
# (BYPASSD_VERBS_IF, docs/hardware-testing.md) whatever
# BYPASSD_REQUIRE_PRIV says, since no CI machine has one.
test: deps lint check-generated
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)
	$(GO) test -count=1 -timeout 10m -run '^(TestSocketsAtScale|TestTCPThousandConnections)$$' ./daemon/ ./socket/
	$(GO) test -tags verbs -race -count=1 ./ring/provider/verbs/...
	$(GO) test -tags verbs -race -count=1 -run 'Verbs|Provider' ./ring/ ./daemon/ ./daemon/config/
	$(MAKE) -s test-chart

# test-chart: the Helm chart and deploy/k8s (deploy/chartcheck, a module of
# its own so the daemon does not depend on Helm): the real helm command's
# lint --strict and template with the default and the full values, then the
# tests that lint and render through Helm's Go packages and decode every
# manifest strictly into the Kubernetes API types. helm is built from the Go
# module cache (`go tool`); the first run compiles Helm (minutes), later ones
# take seconds.
HELM  := $(GO) tool -modfile=deploy/chartcheck/go.mod helm
CHART := deploy/helm/bypassd
test-chart:
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict -f $(CHART)/ci/full-values.yaml $(CHART)
	$(HELM) template bypassd $(CHART) -n kube-system -f $(CHART)/ci/full-values.yaml >/dev/null
	cd deploy/chartcheck && $(GO) test -count=1 ./...

# helm-template: the chart's manifests on stdout: the real `helm template`,
# built from the Go module cache, nothing to install. Helm's options go in
# HELM_ARGS, e.g.
#   make -s helm-template HELM_ARGS="-n kube-system --set interfaces={eth2}" | kubectl apply -f -
HELM_ARGS ?= -n kube-system
helm-template:
	@$(HELM) template bypassd $(CHART) $(HELM_ARGS)

bench: deps build
	scripts/bench.sh

# scale: what idle sockets cost the daemon and a busy socket (minutes; not
# part of bench or test): 0, 1,000, 10,000 and 100,000 idle bound sockets,
# the busy socket measured against an empty daemon in a second lab, both
# from one process switching every 100 ms (bench/pairbench; POINTS="0 1000
# 10000" for a shorter run; see the script's header), then the
# 100,000-socket echo test (100 client processes, five addresses).
scale: deps build
	scripts/bench-scale.sh
	BYPASSD_REQUIRE_PRIV=1 BYPASSD_SCALE_CLIENTS=100 $(GO) test -count=1 -timeout 30m -run '^TestSocketsAtScale$$' -v ./daemon/

# soak: the chaos soak (TestSoak in cmd/bypassd): upgrades in place,
# daemon crashes, client kills and link flaps under traffic for
# SOAK_MINUTES, then a report. `make test` runs it for one minute.
SOAK_MINUTES ?= 10
soak: deps
	BYPASSD_SOAK_MINUTES=$(SOAK_MINUTES) \
	  $(GO) test -count=1 -timeout 0 -v -run TestSoak ./cmd/bypassd/

demo: deps build
	scripts/demo.sh

# deb: the Debian package in bin/deb/ (deploy/debian/build.sh): static
# binaries, libbypassd.so, the systemd unit, docs. Reproducible: the file
# mtimes are the last commit's time (SOURCE_DATE_EPOCH).
deb:
	deploy/debian/build.sh $(BIN)/deb

# test-deb: builds the package twice (same sha256), checks its files and
# control fields, installs it into a scratch root and runs bypassd --version.
test-deb:
	deploy/debian/test.sh $(BIN)/deb-test

# image: the daemon's OCI image FROM scratch (deploy/image/build.sh), with
# buildah or podman; nothing is pulled. Tagged localhost/bypassd:VERSION;
# prints its digest, the same for two builds of one commit.
image: deps
	deploy/image/build.sh $(BIN)/image

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
