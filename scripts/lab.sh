# Sourced by demo.sh and bench-latency.sh: a two-namespace lab with bypassd
# on side A and a real `sockperf server` on side B, removed on exit.
# Sets NS_A/NS_B/IF_A/IF_B/IP4_A/IP4_B (from netlab), LAB_TMP and
# BYPASSD_SOCK. Needs root and the binaries in $BIN.
BIN=${BIN:-bin}
lab_name="lab$$"
LAB_TMP=$(mktemp -d /tmp/bypassd-lab.XXXXXX)
BYPASSD_SOCK="$LAB_TMP/bypassd.sock"
lab_daemon_pid="" lab_server_pid=""

lab_cleanup() {
  set +e
  [ -n "$lab_daemon_pid" ] && kill -TERM "$lab_daemon_pid" 2>/dev/null && wait "$lab_daemon_pid" 2>/dev/null
  [ -n "$lab_server_pid" ] && kill "$lab_server_pid" 2>/dev/null && wait "$lab_server_pid" 2>/dev/null
  "$BIN/netlab" down --name "$lab_name" >/dev/null 2>&1
  rm -rf "$LAB_TMP"
}
trap lab_cleanup EXIT INT TERM

eval "$("$BIN/netlab" up --name "$lab_name")"

# lab_start_server starts `sockperf server` on B's address, port 11111.
lab_start_server() {
  ip netns exec "$NS_B" sockperf server -i "$IP4_B" -p 11111 >"$LAB_TMP/sockperf-server.log" 2>&1 &
  lab_server_pid=$!
}

# lab_start_daemon [bypassd options...] starts bypassd on A's interface and
# waits for its control socket.
lab_start_daemon() {
  ip netns exec "$NS_A" "$BIN/bypassd" --interface "$IF_A" --socket "$BYPASSD_SOCK" \
    --run-dir "$LAB_TMP" --stats-dir "$LAB_TMP/stats" --log-format console "$@" 2>"$LAB_TMP/bypassd.log" &
  lab_daemon_pid=$!
  for _ in $(seq 100); do
    [ -S "$BYPASSD_SOCK" ] && return 0
    kill -0 "$lab_daemon_pid" 2>/dev/null || break
    sleep 0.05
  done
  cat "$LAB_TMP/bypassd.log" >&2
  echo "bypassd did not start" >&2
  return 1
}

# lab_stop_daemon stops bypassd gracefully (its log keeps its counters).
lab_stop_daemon() {
  kill -TERM "$lab_daemon_pid"
  wait "$lab_daemon_pid"
  lab_daemon_pid=""
}

# pct FILE P prints sockperf's "percentile P" value from its output in FILE.
pct() { awk -v p="$2" '$0 ~ "percentile "p" =" {print $NF}' "$1"; }

# median prints the median of the numbers on stdin, one per line.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
