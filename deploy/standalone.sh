#!/usr/bin/env bash
# A Spark standalone cluster from the pip-installed pyspark: a master and workers, each a JVM
# started with pyspark's bin/spark-class in its own process session (pip's pyspark ships no
# sbin/start-*.sh). See deploy/README.md.
#
#   deploy/standalone.sh start     # master + $SPARK_WORKERS workers on this machine
#   deploy/standalone.sh worker    # only workers, joining $SPARK_MASTER_URL (other machines)
#   deploy/standalone.sh status
#   deploy/standalone.sh stop      # workers (and their executors) first, then the master
#
# Settings (environment variables, defaults in brackets):
#   OCTO_CLUSTER_DIR          pid files, logs, worker dirs  [$TMPDIR/octo-spark-cluster-<uid>]
#   OCTO_BIN                  bin/ with spark-class and python        [<repo>/.venv/bin]
#   PYSPARK_PYTHON            the executors' Python (octo installed)  [$OCTO_BIN/python]
#   SPARK_MASTER_HOST         address the master binds and advertises [127.0.0.1]
#   SPARK_MASTER_PORT         master RPC port (drivers, workers)      [7077]
#   SPARK_MASTER_WEBUI_PORT   master web UI                           [8080]
#   SPARK_MASTER_URL          the master a `worker` joins
#                             [spark://$SPARK_MASTER_HOST:$SPARK_MASTER_PORT]
#   SPARK_WORKERS             workers `start` launches here           [1]
#   SPARK_WORKER_CORES        cores per worker                        [1]
#   SPARK_WORKER_MEMORY       memory per worker for executors         [2g]
#   SPARK_WORKER_WEBUI_PORT   first worker's web UI (+1 per worker)   [8081]
#   SPARK_LOCAL_IP            address workers and executors bind      [$SPARK_MASTER_HOST]
#   SPARK_DAEMON_MEMORY       heap of the master and worker JVMs      [512m]
#   OCTO_STATE_CACHE          the executors' state cache (octo)   [$OCTO_CLUSTER_DIR/work-N/octo-state-cache]
#   AWS_*                     an object store's endpoint, region and credentials (S3A and
#                             delta-rs in the executors read them): export them first
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${OCTO_CLUSTER_DIR:-${TMPDIR:-/tmp}/octo-spark-cluster-$(id -u)}"
OCTO_STATE_CACHE_ALL="${OCTO_STATE_CACHE:-}"
BIN="${OCTO_BIN:-$REPO/.venv/bin}"
HOST="${SPARK_MASTER_HOST:-127.0.0.1}"
PORT="${SPARK_MASTER_PORT:-7077}"
URL="${SPARK_MASTER_URL:-spark://$HOST:$PORT}"
WAIT="${OCTO_CLUSTER_WAIT:-120}"  # seconds to wait for a JVM to be ready

export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$BIN/python}"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-$HOST}"
export SPARK_DAEMON_MEMORY="${SPARK_DAEMON_MEMORY:-512m}"
# No REST submission server (octo's driver is the client): it would also take port 6066.
export SPARK_MASTER_OPTS="${SPARK_MASTER_OPTS:-} -Dspark.master.rest.enabled=false"

die() { echo "standalone.sh: $*" >&2; exit 1; }

# launch NAME READY-TEXT CLASS ARGS...: start a JVM in its own session, wait for READY-TEXT.
launch() {
  local name=$1 ready=$2 pid
  shift 2
  [[ -x "$BIN/spark-class" ]] || die "no $BIN/spark-class (set OCTO_BIN to the bin/ of a " \
    "Python environment with pyspark installed)"
  if [[ -f "$DIR/$name.pid" ]] && kill -0 "$(cat "$DIR/$name.pid")" 2>/dev/null; then
    die "$name already runs (pid $(cat "$DIR/$name.pid"))"
  fi
  # spark-class execs the JVM, so the pid (= its session and process group) is the JVM's.
  setsid "$BIN/spark-class" "$@" > "$DIR/$name.log" 2>&1 < /dev/null &
  pid=$!
  echo "$pid" > "$DIR/$name.pid"
  for _ in $(seq $((WAIT * 2))); do
    grep -q "$ready" "$DIR/$name.log" && { echo "$name: pid $pid, log $DIR/$name.log"; return; }
    kill -0 "$pid" 2>/dev/null || { tail -n 20 "$DIR/$name.log" >&2; die "$name exited"; }
    sleep 0.5
  done
  tail -n 20 "$DIR/$name.log" >&2
  die "$name not ready after $WAIT s (still running as pid $pid; '$0 stop' ends it)"
}

workers() {
  local i webui="${SPARK_WORKER_WEBUI_PORT:-8081}"
  for i in $(seq 1 "${SPARK_WORKERS:-1}"); do
    # each worker's executors keep octo's state cache in its own directory (as on a
    # machine of its own), unless OCTO_STATE_CACHE says where
    OCTO_STATE_CACHE="${OCTO_STATE_CACHE_ALL:-$DIR/work-$i/octo-state-cache}" \
    launch "worker-$i" "Successfully registered with master" \
      org.apache.spark.deploy.worker.Worker "$URL" --host "$SPARK_LOCAL_IP" \
      --cores "${SPARK_WORKER_CORES:-1}" --memory "${SPARK_WORKER_MEMORY:-2g}" \
      --webui-port $((webui + i - 1)) --work-dir "$DIR/work-$i"
  done
}

# stop_one PIDFILE: SIGTERM to the JVM's process group (a worker's executors and their Python
# workers with it), SIGKILL after 20 s.
stop_one() {
  local pidfile=$1 pid
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    echo "$(basename "$pidfile" .pid): stopped (pid $pid)"
  fi
  rm -f "$pidfile"
}

mkdir -p "$DIR"
case "${1:-}" in
  start)
    launch master "I have been elected leader" org.apache.spark.deploy.master.Master \
      --host "$HOST" --port "$PORT" --webui-port "${SPARK_MASTER_WEBUI_PORT:-8080}"
    workers
    echo "master: $URL   e.g. octo run --all --master $URL --warehouse /shared/warehouse"
    ;;
  worker)
    workers
    ;;
  status)
    shopt -s nullglob
    for f in "$DIR"/*.pid; do
      pid=$(cat "$f")
      state=$(kill -0 "$pid" 2>/dev/null && echo running || echo gone)
      echo "$(basename "$f" .pid): pid $pid $state"
    done
    ;;
  stop)
    shopt -s nullglob
    for f in "$DIR"/worker-*.pid; do stop_one "$f"; done
    [[ -f "$DIR/master.pid" ]] && stop_one "$DIR/master.pid"
    ;;
  *)
    die "usage: $0 start|worker|status|stop"
    ;;
esac
