#!/bin/sh
# Rewrites import paths and document paths from the pre-issue-13 layout to the
# current one, for branches started before the moves. Usage: scripts/relayout-imports.sh [files...]
# (default: every tracked .go, .md, Makefile and script file).
set -eu
[ $# -gt 0 ] || set -- $(git ls-files '*.go' '*.md' '*.sh' Makefile '*.yaml' '*.c' '*.h' | grep -v relayout-imports)
sed -i \
  -e 's#ring/afxdp\b#ring/provider/afxdp#g' \
  -e 's#ring/verbs\b#ring/provider/verbs#g' \
  -e 's#ring/tap\b#ring/provider/tapfd#g' \
  -e 's#ring/packet\b#ring/wire/packet#g' \
  -e 's#ring/reassembly\b#ring/wire/reassembly#g' \
  -e 's#ring/pacing\b#ring/sched/pacing#g' \
  -e 's#ring/tsconv\b#ring/clock/tsconv#g' \
  -e 's#ring/phc\b#ring/clock/phc#g' \
  "$@"
