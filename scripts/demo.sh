#!/usr/bin/env bash
# make demo: a two-namespace lab in which a bypassd ring carries a real
# sockperf UDP ping-pong, compared with the kernel path. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./internal/cmd/ringdemo "$@"
