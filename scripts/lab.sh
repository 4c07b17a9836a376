# Sourced by demo.sh and bench-latency.sh: a two-namespace lab with bypassd
# on side A and a real `sockperf server` on side B, removed on exit.
# Sets NS_A/NS_B/IF_A/IF_B/IP4_A/IP4_B (from netlab), LAB_TMP and
# BYPASSD_SOCK. Needs root and the binaries in $BIN.
BIN=${BIN:-bin}
lab_name="lab$$"
lab_names=("$lab_name")
LAB_TMP=$(mktemp -d /tmp/bypassd-lab.XXXXXX)
BYPASSD_SOCK="$LAB_TMP/bypassd.sock"
lab_daemon_pid="" lab_server_pid=""
lab_pids=() # every daemon and server started here, stopped on exit

# lab_cleanup stops what the lab functions started and removes the labs;
# it runs on exit, also after Ctrl-C or a failure.
lab_cleanup() {
  set +e
  for p in "${lab_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${lab_pids[@]}"; do wait "$p" 2>/dev/null; done
  lab_pids=()
  for n in "${lab_names[@]}"; do "$BIN/netlab" down --name "$n" >/dev/null 2>&1; done
  rm -rf "$LAB_TMP"
}
trap lab_cleanup EXIT
trap 'exit 130' INT TERM

eval "$("$BIN/netlab" up --name "$lab_name")"

# lab_add PREFIX creates one more lab, removed on exit like the first, and
# sets its variables with PREFIX in front (lab_add Z_: Z_NS_A, Z_IP4_B, ...).
# To start a daemon or server in it, call lab_start_daemon or
# lab_start_server with NS_A, IF_A, NS_B, IP4_B, LAB_TMP and BYPASSD_SOCK
# set to its values for the call.
lab_add() {
  local name="lab$$${1%_}"
  lab_names+=("$name")
  eval "$("$BIN/netlab" up --name "$name" | sed "s/^/$1/")"
}

# lab_forget PID drops a process stopped by hand from the exit list.
lab_forget() {
  local p keep=()
  for p in "${lab_pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  lab_pids=("${keep[@]}")
}

# lab_start_server starts `sockperf server` on B's address, port 11111
# (on the CPUs of LAB_SERVER_CPUS, a taskset list, when set).
lab_start_server() {
  local pin=()
  [ -z "${LAB_SERVER_CPUS:-}" ] || pin=(taskset -c "$LAB_SERVER_CPUS")
  ip netns exec "$NS_B" "${pin[@]}" sockperf server -i "$IP4_B" -p 11111 >"$LAB_TMP/sockperf-server.log" 2>&1 &
  lab_server_pid=$!
  lab_pids+=("$lab_server_pid")
}

# lab_start_daemon [bypassd options...] starts bypassd on A's interface and
# waits for its control socket.
lab_start_daemon() {
  ip netns exec "$NS_A" "$BIN/bypassd" --interface "$IF_A" --socket "$BYPASSD_SOCK" \
    --run-dir "$LAB_TMP" --stats-dir "$LAB_TMP/stats" --log-format console "$@" 2>"$LAB_TMP/bypassd.log" &
  lab_daemon_pid=$!
  lab_pids+=("$lab_daemon_pid")
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
  lab_forget "$lab_daemon_pid"
  lab_daemon_pid=""
}

# pct FILE P prints sockperf's "percentile P" value from its output in FILE.
pct() { awk -v p="$2" '$0 ~ "percentile "p" =" {print $NF}' "$1"; }

# median prints the median of the numbers on stdin, one per line.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
