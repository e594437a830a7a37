#!/usr/bin/env bash
# Local single-node Apache Kafka broker (KRaft combined mode) for development and tests.
#
#   scripts/kafka.sh start          fetch jars (once), format storage, start, wait until ready
#   scripts/kafka.sh stop [--wipe]  stop the broker recorded in the pid file (--wipe: delete its data)
#   scripts/kafka.sh wipe           same as stop --wipe
#   scripts/kafka.sh restart        stop, then start
#   scripts/kafka.sh status         print running / not running; exit 0 / 1
#   scripts/kafka.sh env            print KAFKA_BOOTSTRAP=127.0.0.1:<port>
#
# The broker comes from Maven Central jars (org.apache.kafka:kafka_2.13 plus a log4j2
# backend, see scripts/kafka/pom.xml) run on the installed JDK; no Docker, no tarball.
#
# Environment:
#   KAFKA_PORT             broker port (default 19092), bound on 127.0.0.1 only
#   KAFKA_CONTROLLER_PORT  KRaft controller port (default 19093)
#   KAFKA_STATE_DIR        server.properties, data, pid file, logs (default <repo>/.kafka)
#   KAFKA_VERSION          kafka_2.13 version to fetch (default: the one in the POM)
#   KAFKA_HEAP             JVM heap: a size such as 1g, or full JVM flags (default -Xmx512m)
#   KAFKA_READY_TIMEOUT    seconds to wait for readiness (default 90)
#   LOOPWATCH_CACHE        jar cache root (default ~/.cache/loopwatch)
#   JAVA_HOME, MVN         java / maven to use (default: from PATH)
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd -P)"
POM="$SCRIPT_DIR/kafka/pom.xml"
READY_JAVA="$SCRIPT_DIR/kafka/ReadyCheck.java"

DEFAULT_KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM" | head -n1)"
KAFKA_VERSION="${KAFKA_VERSION:-$DEFAULT_KAFKA_VERSION}"
PORT="${KAFKA_PORT:-19092}"
CPORT="${KAFKA_CONTROLLER_PORT:-19093}"
HOST=127.0.0.1
BOOTSTRAP="$HOST:$PORT"
READY_TIMEOUT="${KAFKA_READY_TIMEOUT:-90}"
CACHE_ROOT="${LOOPWATCH_CACHE:-${HOME:-/root}/.cache/loopwatch}"
CACHE_DIR="$CACHE_ROOT/kafka-$KAFKA_VERSION"
LIB="$CACHE_DIR/lib"

STATE_DIR="${KAFKA_STATE_DIR:-$REPO_ROOT/.kafka}"
case "$STATE_DIR" in /*) ;; *) STATE_DIR="$PWD/$STATE_DIR" ;; esac
DATA_DIR="$STATE_DIR/data"
PROPS="$STATE_DIR/server.properties"
LOG4J_CONF="$STATE_DIR/log4j2.xml"
PID_FILE="$STATE_DIR/kafka.pid"
BROKER_LOG="$STATE_DIR/broker.log"   # log4j output (WARN+, plus startup lines)
BROKER_OUT="$STATE_DIR/broker.out"   # JVM stdout/stderr (crashes, OOM, bind errors before log4j)
CLUSTER_ID_FILE="$STATE_DIR/cluster.id"
LOCK_FILE="$STATE_DIR/.lock"

JAVA="java"
if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then JAVA="$JAVA_HOME/bin/java"; fi
MVN="${MVN:-mvn}"

log() { printf 'kafka: %s\n' "$*" >&2; }
die() { printf 'kafka: error: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit "${1:-2}"
}

heap_opts() {
    local h="${KAFKA_HEAP:-}"
    if [[ -z "$h" ]]; then
        printf '%s\n' "-Xmx512m"
    elif [[ "$h" == -* ]]; then
        printf '%s\n' "$h"
    else
        printf '%s\n' "-Xmx$h"
    fi
}

# Serialize start/stop of the same state dir (two `make` targets racing, say).
take_lock() {
    mkdir -p "$STATE_DIR"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$LOCK_FILE"
        if ! flock -w 120 9; then die "another kafka.sh holds $LOCK_FILE"; fi
    fi
}

# ---------------------------------------------------------------- process helpers

# PID recorded in the pid file, or empty.
recorded_pid() {
    local pid=""
    if [[ -f "$PID_FILE" ]]; then
        pid="$(tr -dc '0-9' <"$PID_FILE" || true)"
    fi
    printf '%s' "$pid"
}

# True if PID is alive and is *our* broker (guards against PID reuse after a reboot
# or a crash: we only ever signal a java process running kafka.Kafka on our PROPS).
is_our_broker() {
    local pid="$1" cmd
    [[ -n "$pid" ]] || return 1
    pid_alive "$pid" || return 1
    [[ -r "/proc/$pid/cmdline" ]] || return 0   # no procfs: trust kill -0
    cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
    [[ "$cmd" == *kafka.Kafka* && "$cmd" == *"$PROPS"* ]]
}

# PID of our running broker, or empty.
running_pid() {
    local pid
    pid="$(recorded_pid)"
    if is_our_broker "$pid"; then printf '%s' "$pid"; fi
}

port_open() {
    # bash's /dev/tcp; the subshell keeps a refused connect from leaking an fd or failing the script
    (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

have_aiokafka() {
    [[ -x "$REPO_ROOT/.venv/bin/python" ]] &&
        "$REPO_ROOT/.venv/bin/python" -c 'import aiokafka.admin' >/dev/null 2>&1
}

# One readiness probe: an admin client's describe-cluster answers with a broker.
probe_ready() {
    port_open "$PORT" || return 1
    if [[ "$PROBE" == python ]]; then
        timeout 15 "$REPO_ROOT/.venv/bin/python" - "$BOOTSTRAP" >/dev/null 2>&1 <<'PY'
import asyncio, sys
from aiokafka.admin import AIOKafkaAdminClient

async def main(bootstrap):
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await admin.start()
    try:
        info = await admin.describe_cluster()
    finally:
        await admin.close()
    return bool(info.get("brokers"))

try:
    ok = asyncio.run(asyncio.wait_for(main(sys.argv[1]), 10))
except Exception:
    ok = False
sys.exit(0 if ok else 1)
PY
    elif [[ -n "$PROBE_CLASSES" ]]; then
        timeout 30 "$JAVA" -Xmx64m -cp "$LIB/*:$PROBE_CLASSES" ReadyCheck "$BOOTSTRAP" >/dev/null 2>&1
    else
        timeout 30 "$JAVA" -Xmx64m -cp "$LIB/*" "$READY_JAVA" "$BOOTSTRAP" >/dev/null 2>&1
    fi
}

# Compile the Java probe once into the state dir (a JVM that also has to compile the
# source every second is slow on 2 cores); fall back to the source launcher without javac.
prepare_java_probe() {
    local javac="javac" out="$STATE_DIR/probe"
    PROBE_CLASSES=""
    if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/javac" ]]; then javac="$JAVA_HOME/bin/javac"; fi
    command -v "$javac" >/dev/null 2>&1 || return 0
    if [[ ! -f "$out/ReadyCheck.class" || "$READY_JAVA" -nt "$out/ReadyCheck.class" ]]; then
        rm -rf "$out"
        "$javac" -nowarn -d "$out" -cp "$LIB/*" "$READY_JAVA" >/dev/null 2>&1 || return 0
    fi
    PROBE_CLASSES="$out"
}

show_logs() {
    if [[ -s "$BROKER_OUT" ]]; then
        log "---- last 20 lines of $BROKER_OUT"
        tail -n 20 "$BROKER_OUT" >&2 || true
    fi
    if [[ -s "$BROKER_LOG" ]]; then
        log "---- last 50 lines of $BROKER_LOG"
        tail -n 50 "$BROKER_LOG" >&2 || true
    fi
}

# wait_ready PID [launched]: with "launched", a broker that never gets ready is stopped
# again, so a failed start leaves nothing behind.
wait_ready() {
    local pid="$1" launched="${2:-}" deadline
    PROBE=java
    if have_aiokafka; then PROBE=python; else prepare_java_probe; fi
    deadline=$((SECONDS + READY_TIMEOUT))
    while ((SECONDS < deadline)); do
        if ! is_our_broker "$pid"; then
            log "broker process $pid exited during startup"
            show_logs
            rm -f "$PID_FILE"
            exit 1
        fi
        if probe_ready; then return 0; fi
        sleep 0.5
    done
    log "broker (pid $pid) not ready on $BOOTSTRAP after ${READY_TIMEOUT}s"
    show_logs
    if [[ "$launched" == launched ]]; then
        stop_pid "$pid"
        rm -f "$PID_FILE"
    fi
    exit 1
}

# Alive and not a zombie (a broker launched by this very script is our child until we exit).
pid_alive() {
    local state=""
    kill -0 "$1" 2>/dev/null || return 1
    if [[ -r "/proc/$1/stat" ]]; then
        state="$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1 || true)"
    fi
    [[ "$state" != Z ]]
}

# SIGTERM (controlled shutdown), up to 30 s, then SIGKILL. Only ever a PID we recorded.
stop_pid() {
    local pid="$1" i
    log "stopping broker (pid $pid)..."
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 300; i++)); do
        pid_alive "$pid" || break
        sleep 0.1
    done
    if pid_alive "$pid"; then
        log "broker did not exit within 30s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            pid_alive "$pid" || break
            sleep 0.1
        done
    fi
    log "broker stopped"
}

# ---------------------------------------------------------------- jars

# Resolve the broker classpath into $LIB once. Maven writes into a temp dir that is
# renamed into place only when complete, so an interrupted fetch is never mistaken
# for a finished one. The POM's hash is kept beside it: editing the POM refetches.
ensure_jars() {
    local want_hash have_hash="" tmp old
    want_hash="$( { cat "$POM"; printf '%s\n' "$KAFKA_VERSION"; } | sha256sum | cut -c1-16)"
    if [[ -f "$CACHE_DIR/pom.hash" ]]; then have_hash="$(cat "$CACHE_DIR/pom.hash")"; fi
    if [[ -f "$LIB/kafka_2.13-$KAFKA_VERSION.jar" && "$have_hash" == "$want_hash" ]]; then
        return 0
    fi
    command -v "$MVN" >/dev/null 2>&1 || die "maven ('$MVN') not found; it is needed once to fetch the Kafka jars"
    mkdir -p "$CACHE_ROOT"
    # Leftovers of fetches that were killed (SIGKILL skips the cleanup trap).
    find "$CACHE_ROOT" -maxdepth 1 -name ".kafka-*.tmp.*" -mmin +60 -exec rm -rf {} + 2>/dev/null || true
    log "fetching Kafka $KAFKA_VERSION jars into $CACHE_DIR (once)..."
    tmp="$(mktemp -d "$CACHE_ROOT/.kafka-$KAFKA_VERSION.tmp.XXXXXX")"
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    # Maven's output is kept out of sight (even -q -B prints stray ANSI resets) unless it fails.
    if ! "$MVN" -B -q -Dstyle.color=never -f "$POM" \
        org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
        -DincludeScope=runtime -Dkafka.version="$KAFKA_VERSION" \
        -DoutputDirectory="$tmp/lib" >"$tmp/mvn.log" 2>&1; then
        cat "$tmp/mvn.log" >&2
        die "maven could not resolve org.apache.kafka:kafka_2.13:$KAFKA_VERSION"
    fi
    rm -f "$tmp/mvn.log"
    [[ -f "$tmp/lib/kafka_2.13-$KAFKA_VERSION.jar" ]] || die "maven finished but kafka_2.13-$KAFKA_VERSION.jar is missing"
    printf '%s\n' "$want_hash" >"$tmp/pom.hash"
    if [[ -e "$CACHE_DIR" ]]; then
        # Stale or partial leftovers: move aside, then swap in the new tree.
        old="$CACHE_ROOT/.kafka-$KAFKA_VERSION.old.$$"
        mv -T "$CACHE_DIR" "$old"
        mv -T "$tmp" "$CACHE_DIR"
        rm -rf "$old"
    elif ! mv -T "$tmp" "$CACHE_DIR" 2>/dev/null; then
        # Lost a race with a concurrent fetch: theirs is complete too, keep it.
        rm -rf "$tmp"
    fi
    trap - EXIT
}

# ---------------------------------------------------------------- config

write_config() {
    mkdir -p "$STATE_DIR" "$DATA_DIR"
    cat >"$PROPS" <<EOF
# Generated by scripts/kafka.sh on each start; edits are overwritten.
# Single-node KRaft (combined broker+controller), loopback only.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CPORT
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CPORT
advertised.listeners=PLAINTEXT://$HOST:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$DATA_DIR

# One broker: internal topics must not ask for more replicas than exist.
offsets.topic.replication.factor=1
offsets.topic.min.isr=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1

# Tests: no join delay, and the app creates its own topics.
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=1

# Sized for a 2-core machine.
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
EOF

    cat >"$LOG4J_CONF" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by scripts/kafka.sh: broker log at WARN, plus the 'Kafka Server started/shut down' lines. -->
<Configuration status="WARN" shutdownHook="disable">
  <Appenders>
    <File name="file" fileName="$BROKER_LOG" append="true">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Logger name="kafka.server.KafkaRaftServer" level="INFO"/>
    <Root level="WARN">
      <AppenderRef ref="file"/>
    </Root>
  </Loggers>
</Configuration>
EOF
}

format_storage() {
    local cid
    if [[ -f "$DATA_DIR/meta.properties" ]]; then return 0; fi
    if [[ -s "$CLUSTER_ID_FILE" ]]; then
        cid="$(cat "$CLUSTER_ID_FILE")"
    else
        cid="$("$JAVA" -Xmx128m -cp "$LIB/*" -Dlog4j2.configurationFile="$LOG4J_CONF" \
            kafka.tools.StorageTool random-uuid | tail -n1)"
        [[ -n "$cid" ]] || die "StorageTool random-uuid printed nothing"
        printf '%s\n' "$cid" >"$CLUSTER_ID_FILE"
    fi
    log "formatting storage in $DATA_DIR (cluster id $cid)..."
    "$JAVA" -Xmx128m -cp "$LIB/*" -Dlog4j2.configurationFile="$LOG4J_CONF" \
        kafka.tools.StorageTool format -t "$cid" -c "$PROPS" --ignore-formatted >>"$BROKER_OUT" 2>&1 ||
        { show_logs; die "StorageTool format failed"; }
}

# ---------------------------------------------------------------- commands

cmd_start() {
    local pid heap
    take_lock
    pid="$(running_pid)"
    if [[ -n "$pid" ]]; then
        wait_ready "$pid"
        log "broker already running on $BOOTSTRAP (pid $pid)"
        return 0
    fi
    if [[ -f "$PID_FILE" ]]; then
        log "removing stale pid file ($(recorded_pid))"
        rm -f "$PID_FILE"
    fi
    if port_open "$PORT"; then die "port $PORT is in use by another process (set KAFKA_PORT)"; fi
    if port_open "$CPORT"; then die "controller port $CPORT is in use by another process (set KAFKA_CONTROLLER_PORT)"; fi

    ensure_jars
    write_config
    format_storage

    log "starting broker (Kafka $KAFKA_VERSION, state in $STATE_DIR)..."
    heap="$(heap_opts)"
    : >"$BROKER_OUT"
    printf '[%s] ---- scripts/kafka.sh: starting Kafka %s on %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$KAFKA_VERSION" "$BOOTSTRAP" >>"$BROKER_LOG"
    # The inner shell records its own PID and then execs java, so the pid file holds the
    # JVM's PID whether or not setsid had to fork. setsid+nohup detach it from the caller's
    # terminal and process group, so Ctrl-C in `make` does not take the broker down.
    # 9>&- : the broker must not inherit (and so hold forever) our flock on $LOCK_FILE.
    # shellcheck disable=SC2016
    setsid nohup bash -c 'echo $$ >"$1"; shift; exec "$@"' kafka-launch "$PID_FILE" \
        "$JAVA" $heap -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
        -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$LOG4J_CONF" \
        -cp "$LIB/*" kafka.Kafka "$PROPS" \
        </dev/null >>"$BROKER_OUT" 2>&1 9>&- &
    # Wait (briefly) for the launcher to record the PID.
    local i
    for ((i = 0; i < 50; i++)); do
        pid="$(recorded_pid)"
        if [[ -n "$pid" ]]; then break; fi
        sleep 0.1
    done
    [[ -n "$pid" ]] || die "broker launcher did not record a pid"
    wait_ready "$pid" launched
    log "broker ready on $BOOTSTRAP (pid $pid)"
}

cmd_stop() {
    local wipe=0 pid
    while (($#)); do
        case "$1" in
            --wipe) wipe=1 ;;
            *) die "stop: unknown option $1" ;;
        esac
        shift
    done
    take_lock
    pid="$(running_pid)"
    if [[ -n "$pid" ]]; then
        stop_pid "$pid"
    else
        log "broker not running"
    fi
    rm -f "$PID_FILE"
    if ((wipe)); then
        if [[ -n "$DATA_DIR" && "$DATA_DIR" == "$STATE_DIR/data" && -d "$DATA_DIR" ]]; then
            rm -rf -- "$DATA_DIR"
        fi
        rm -f -- "$CLUSTER_ID_FILE" "$BROKER_LOG" "$BROKER_OUT"
        log "wiped broker data in $DATA_DIR"
    fi
}

cmd_status() {
    local pid
    pid="$(running_pid)"
    if [[ -z "$pid" ]]; then
        echo "kafka: not running"
        return 1
    fi
    if port_open "$PORT"; then
        echo "kafka: running on $BOOTSTRAP (pid $pid)"
        return 0
    fi
    echo "kafka: process $pid alive but not accepting connections on $BOOTSTRAP"
    return 1
}

cmd_env() {
    echo "KAFKA_BOOTSTRAP=$BOOTSTRAP"
}

main() {
    local cmd="${1:-}"
    if (($#)); then shift; fi
    case "$cmd" in
        start) cmd_start "$@" ;;
        stop) cmd_stop "$@" ;;
        wipe) cmd_stop --wipe "$@" ;;
        restart) cmd_stop "$@"; cmd_start ;;
        status) cmd_status ;;
        env) cmd_env ;;
        -h | --help | help) usage 0 ;;
        *) usage ;;
    esac
}

main "$@"
