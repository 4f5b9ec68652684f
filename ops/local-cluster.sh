#!/usr/bin/env bash
# Run N Terrascale nodes on loopback:   ops/local-cluster.sh up N   |   ops/local-cluster.sh down
#
# Node i (1..N) is "n<i>": HTTP on 127.0.0.1:$((7400 + 10*(i-1))), its own data dir
# $DIR/n<i>/ (block device, cache, Raft journal), a config $DIR/n<i>.toml and a log
# $DIR/n<i>.log. All nodes share one object store ($DIR/objects). With N=1 the catalog is
# trkv:// (single node); with N>1 it is raft:// on port HTTP+1 with a shared secret file
# ($DIR/cluster.secret, mode 0600). `up` returns once every node answers /readyz with 200.
# `down` sends SIGTERM (clean stop) and waits; the data stays for the next `up` (remove
# $DIR to start from scratch).
#
# Environment: TERRASCALE_CLUSTER_DIR (default ./local-cluster), TERRASCALE (the CLI,
# default .venv/bin/terrascale or the one on PATH), TERRASCALE_BASE_PORT (default 7400).
set -euo pipefail

DIR=${TERRASCALE_CLUSTER_DIR:-./local-cluster}
BASE=${TERRASCALE_BASE_PORT:-7400}
HERE=$(cd "$(dirname "$0")/.." && pwd)
if [[ -z "${TERRASCALE:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/terrascale" ]]; then TERRASCALE="$HERE/.venv/bin/terrascale"
  else TERRASCALE=$(command -v terrascale || true); fi
fi
PY=$(dirname "${TERRASCALE:-/nonexistent}")/python

die() { echo "local-cluster: $*" >&2; exit 1; }

http_port() { echo $((BASE + 10 * ($1 - 1))); }

write_config() {  # write_config I N
  local i=$1 n=$2 d port members="" j
  d=$(cd "$DIR" && pwd)
  port=$(http_port "$i")
  {
    echo "[node]"
    echo "id = \"n$i\""
    echo "listen = \"127.0.0.1:$port\""
    echo "shutdown_timeout = \"20s\""
    echo "[storage]"
    echo "block = \"trfs://$d/n$i/block\""
    echo "volatile = \"trfs://$d/n$i/cache\""
    echo "objects = \"trfs://$d/objects\""
    echo "[catalog]"
    if (( n == 1 )); then
      echo "uri = \"trkv://$d/n$i/catalog\""
    else
      for j in $(seq 1 "$n"); do members+="${members:+,}127.0.0.1:$(( $(http_port "$j") + 1 ))"; done
      echo "uri = \"raft://$members?self=127.0.0.1:$((port + 1))\""
      echo "secret_file = \"$d/cluster.secret\""
      echo "dir = \"$d/n$i/raft\""
    fi
  } > "$DIR/n$i.toml"
}

wait_ready() {  # wait_ready I PID
  local url="http://127.0.0.1:$(http_port "$1")/readyz" deadline=$((SECONDS + 90))
  while (( SECONDS < deadline )); do
    kill -0 "$2" 2>/dev/null || { tail -n 5 "$DIR/n$1.log" >&2; die "n$1 exited (log: $DIR/n$1.log)"; }
    if "$PY" - "$url" <<'EOF' 2>/dev/null; then return 0; fi
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=2)
EOF
    sleep 0.2
  done
  die "n$1 did not become ready within 90 s (log: $DIR/n$1.log)"
}

up() {
  local n=${1:-}
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "usage: $0 up N   (N >= 1)"
  [[ -x "${TERRASCALE:-}" ]] || die "terrascale not found: run 'make venv' first or set TERRASCALE"
  mkdir -p "$DIR/objects"
  if [[ -f "$DIR/nodes" && "$(cat "$DIR/nodes")" != "$n" ]]; then
    die "$DIR holds a $(cat "$DIR/nodes")-node cluster; 'down' it and remove $DIR to start a $n-node one"
  fi
  for f in "$DIR"/n*.pid; do
    [[ -e "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null && die "already up (pid file $f); run '$0 down' first"
  done
  echo "$n" > "$DIR/nodes"
  if (( n > 1 )) && [[ ! -s "$DIR/cluster.secret" ]]; then
    (umask 077 && "$PY" -c 'import secrets; print(secrets.token_hex(32))' > "$DIR/cluster.secret")
  fi
  local pids=() i
  for i in $(seq 1 "$n"); do
    mkdir -p "$DIR/n$i"
    write_config "$i" "$n"
    nohup "$TERRASCALE" node run --config "$DIR/n$i.toml" >>"$DIR/n$i.log" 2>&1 < /dev/null &
    echo $! > "$DIR/n$i.pid"
    pids+=($!)
  done
  for i in $(seq 1 "$n"); do wait_ready "$i" "${pids[$((i - 1))]}"; done
  echo "local-cluster: $n node(s) ready (data and logs in $DIR):"
  for i in $(seq 1 "$n"); do echo "  n$i  http://127.0.0.1:$(http_port "$i")  pid ${pids[$((i - 1))]}"; done
  echo "  try: curl -s http://127.0.0.1:$BASE/v1/admin/cluster"
  echo "       $TERRASCALE --endpoint http://127.0.0.1:$BASE admin cluster"
}

down() {
  local f pid stopped=0
  shopt -s nullglob
  for f in "$DIR"/n*.pid; do
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      if kill -0 "$pid" 2>/dev/null; then
        echo "local-cluster: $(basename "$f" .pid) (pid $pid) did not stop in 30 s; sending SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
      fi
      stopped=$((stopped + 1))
    fi
    rm -f "$f"
  done
  echo "local-cluster: stopped $stopped node(s); data kept in $DIR"
}

case "${1:-}" in
  up) up "${2:-}" ;;
  down) down ;;
  *) echo "usage: $0 up N | down" >&2; exit 2 ;;
esac
