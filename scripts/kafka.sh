#!/usr/bin/env bash
# Local single-node Apache Kafka broker (KRaft combined mode) for development and tests.
#
#   scripts/kafka.sh start          fetch jars (once), format storage, start, wait until ready
#   scripts/kafka.sh stop [--wipe]  stop the broker recorded in the pid file (--wipe: delete its data)
#   scripts/kafka.sh wipe           same as stop --wipe
#   scripts/kafka.sh restart        stop, then start
#   scripts/kafka.sh status         print running / not running; exit 0 / 1
#   scripts/kafka.sh env            print KAFKA_BOOTSTRAP=127.0.0.1:<port>
#   scripts/kafka.sh --secure CMD   the same for the secured broker (also: KAFKA_SECURE=1)
#
# The secured broker is the same single KRaft node with its own state dir and ports: a
# SASL_SSL listener (TLS with a CA made here by keytool, SCRAM-SHA-512 users admin,
# loopwatch, runner and outsider with random passwords in <state>/secrets/<user>.password),
# the StandardAuthorizer with the ACLs of scripts/kafka/secure-acls.conf (everything else
# denied), and the topics tool-calls, loop-verdicts and tool-calls-dlq created up front.
# `env` then also prints the protocol, mechanism, CA file and secrets dir.
#
# The broker comes from Maven Central jars (org.apache.kafka:kafka_2.13 plus a log4j2
# backend, see scripts/kafka/pom.xml) run on the installed JDK; no Docker, no tarball.
#
# Environment:
#   KAFKA_PORT             broker port (default 19092), bound on 127.0.0.1 only
#   KAFKA_CONTROLLER_PORT  KRaft controller port (default 19093)
#   KAFKA_STATE_DIR        server.properties, data, pid file, logs (default <repo>/.kafka)
#   KAFKA_SECURE_PORT      secured broker port (default KAFKA_PORT + 2)
#   KAFKA_SECURE_CONTROLLER_PORT  its controller port (default KAFKA_SECURE_PORT + 1)
#   KAFKA_SECURE_STATE_DIR its state dir (default <repo>/.kafka-secure)
#   KAFKA_SECURE_PARTITIONS partitions of the topics it creates (default 4)
#   KAFKA_VERSION          kafka_2.13 version to fetch (default: the one in the POM)
#   KAFKA_HEAP             JVM heap: a size such as 1g, or full JVM flags (default -Xmx512m)
#   KAFKA_READY_TIMEOUT    seconds to wait for readiness (default 90)
#   LOOPWATCH_CACHE        jar cache root (default ~/.cache/loopwatch)
#   JAVA_HOME, MVN         java / maven to use (default: from PATH)
set -euo pipefail

# --secure anywhere on the command line selects the secured broker.
SECURE="${KAFKA_SECURE:-}"
if [[ "$SECURE" == 0 ]]; then SECURE=""; fi
ARGS=()
for arg in "$@"; do
    if [[ "$arg" == --secure ]]; then SECURE=1; else ARGS+=("$arg"); fi
done

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd -P)"
POM="$SCRIPT_DIR/kafka/pom.xml"
READY_JAVA="$SCRIPT_DIR/kafka/ReadyCheck.java"

DEFAULT_KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM" | head -n1)"
KAFKA_VERSION="${KAFKA_VERSION:-$DEFAULT_KAFKA_VERSION}"
PORT="${KAFKA_PORT:-19092}"
CPORT="${KAFKA_CONTROLLER_PORT:-19093}"
if [[ -n "$SECURE" ]]; then
    PORT="${KAFKA_SECURE_PORT:-$((PORT + 2))}"
    CPORT="${KAFKA_SECURE_CONTROLLER_PORT:-$((PORT + 1))}"
fi
HOST=127.0.0.1
BOOTSTRAP="$HOST:$PORT"
READY_TIMEOUT="${KAFKA_READY_TIMEOUT:-90}"
CACHE_ROOT="${LOOPWATCH_CACHE:-${HOME:-/root}/.cache/loopwatch}"
CACHE_DIR="$CACHE_ROOT/kafka-$KAFKA_VERSION"
LIB="$CACHE_DIR/lib"

if [[ -n "$SECURE" ]]; then
    STATE_DIR="${KAFKA_SECURE_STATE_DIR:-$REPO_ROOT/.kafka-secure}"
else
    STATE_DIR="${KAFKA_STATE_DIR:-$REPO_ROOT/.kafka}"
fi
case "$STATE_DIR" in /*) ;; *) STATE_DIR="$PWD/$STATE_DIR" ;; esac
DATA_DIR="$STATE_DIR/data"
PROPS="$STATE_DIR/server.properties"
LOG4J_CONF="$STATE_DIR/log4j2.xml"
PID_FILE="$STATE_DIR/kafka.pid"
BROKER_LOG="$STATE_DIR/broker.log"   # log4j output (WARN+, plus startup lines)
BROKER_OUT="$STATE_DIR/broker.out"   # JVM stdout/stderr (crashes, OOM, bind errors before log4j)
CLUSTER_ID_FILE="$STATE_DIR/cluster.id"
LOCK_FILE="$STATE_DIR/.lock"
# Secured broker only:
SECRETS_DIR="$STATE_DIR/secrets"      # <user>.password (0600), the key stores' password
TLS_DIR="$STATE_DIR/tls"              # ca.crt (PEM, for clients), broker and trust stores (PKCS12)
ADMIN_PROPS="$STATE_DIR/admin.properties"  # Java client settings of the super user
ACLS="$SCRIPT_DIR/kafka/secure-acls.conf"
SETUP_JAVA="$SCRIPT_DIR/kafka/SecureSetup.java"
SECURE_USERS=(admin loopwatch runner outsider)
SECURE_TOPICS=(tool-calls loop-verdicts "tool-calls-dlq:max.message.bytes=2097152")
SECURE_PARTITIONS="${KAFKA_SECURE_PARTITIONS:-4}"

JAVA="java"
if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then JAVA="$JAVA_HOME/bin/java"; fi
MVN="${MVN:-mvn}"

log() { printf 'kafka: %s\n' "$*" >&2; }
die() { printf 'kafka: error: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
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
        PROBE_SECURE="$SECURE" PROBE_CAFILE="$TLS_DIR/ca.crt" PROBE_PASSWORD_FILE="$SECRETS_DIR/admin.password" \
            timeout 15 "$REPO_ROOT/.venv/bin/python" - "$BOOTSTRAP" >/dev/null 2>&1 <<'PY'
import asyncio, os, ssl, sys
from aiokafka.admin import AIOKafkaAdminClient

def security():
    if not os.environ.get("PROBE_SECURE"):
        return {}
    with open(os.environ["PROBE_PASSWORD_FILE"]) as f:
        password = f.read().strip()
    return dict(security_protocol="SASL_SSL", ssl_context=ssl.create_default_context(cafile=os.environ["PROBE_CAFILE"]),
                sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="admin", sasl_plain_password=password)

async def main(bootstrap):
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000, **security())
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
        return
    fi
    local props=()
    if [[ -n "$SECURE" ]]; then props=("$ADMIN_PROPS"); fi
    run_java_tool 30 "$READY_JAVA" "$BOOTSTRAP" "${props[@]}" >/dev/null 2>&1
}

# Compile the Java helpers once into the state dir (a JVM that also has to compile the
# source every second is slow on 2 cores); without javac, the source launcher runs them.
prepare_java_classes() {
    local javac="javac" out="$STATE_DIR/probe" src stale=0
    local sources=("$READY_JAVA")
    if [[ -n "$SECURE" ]]; then sources+=("$SETUP_JAVA"); fi
    JAVA_CLASSES=""
    if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/javac" ]]; then javac="$JAVA_HOME/bin/javac"; fi
    command -v "$javac" >/dev/null 2>&1 || return 0
    for src in "${sources[@]}"; do
        if [[ ! -f "$out/$(basename "$src" .java).class" || "$src" -nt "$out/$(basename "$src" .java).class" ]]; then
            stale=1
        fi
    done
    if ((stale)); then
        rm -rf "$out"
        "$javac" -nowarn -d "$out" -cp "$LIB/*" "${sources[@]}" >/dev/null 2>&1 || return 0
    fi
    JAVA_CLASSES="$out"
}

# run_java_tool SECONDS SOURCE ARGS...: one of the Java helpers, compiled or from source.
run_java_tool() {
    local seconds="$1" src="$2"
    shift 2
    if [[ -n "${JAVA_CLASSES:-}" ]]; then
        timeout "$seconds" "$JAVA" -Xmx64m -cp "$LIB/*:$JAVA_CLASSES" "$(basename "$src" .java)" "$@"
    else
        timeout "$seconds" "$JAVA" -Xmx64m -cp "$LIB/*" "$src" "$@"
    fi
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
    if have_aiokafka; then PROBE=python; else prepare_java_classes; fi
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
    local listeners
    if [[ -n "$SECURE" ]]; then
        listeners="$(secure_listeners)"
    else
        listeners="listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CPORT
advertised.listeners=PLAINTEXT://$HOST:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    fi
    cat >"$PROPS" <<EOF
# Generated by scripts/kafka.sh on each start; edits are overwritten.
# Single-node KRaft (combined broker+controller), loopback only.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CPORT
$listeners
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
    <!-- Denied requests (INFO; allowed ones are DEBUG): what an ACL refused, and to whom. -->
    <Logger name="kafka.authorizer.logger" level="INFO"/>
    <Root level="WARN">
      <AppenderRef ref="file"/>
    </Root>
  </Loggers>
</Configuration>
EOF
}

# ---------------------------------------------------------------- the secured broker

random_hex() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }

# One random password per user (and one for the key stores), made once; 0600.
ensure_secrets() {
    local user
    (umask 077 && mkdir -p "$SECRETS_DIR" "$TLS_DIR")
    if [[ ! -s "$SECRETS_DIR/admin.password" && -f "$DATA_DIR/meta.properties" ]]; then
        die "$SECRETS_DIR/admin.password is gone but $DATA_DIR was formatted with it: scripts/kafka.sh --secure wipe"
    fi
    for user in "${SECURE_USERS[@]}"; do
        if [[ ! -s "$SECRETS_DIR/$user.password" ]]; then
            (umask 077 && random_hex >"$SECRETS_DIR/$user.password")
        fi
    done
    if [[ ! -s "$TLS_DIR/store.pass" ]]; then
        (umask 077 && random_hex >"$TLS_DIR/store.pass")
    fi
}

secret() { tr -d '\n' <"$SECRETS_DIR/$1.password"; }

# A CA and a broker certificate it signs (SAN 127.0.0.1 and localhost, 10 years), made once
# with the JDK's keytool: ca.crt (PEM) for clients, broker.p12 and truststore.p12 for the broker.
ensure_tls() {
    local keytool="keytool" pass tmp
    if [[ -s "$TLS_DIR/ca.crt" && -s "$TLS_DIR/broker.p12" && -s "$TLS_DIR/truststore.p12" ]]; then return 0; fi
    if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/keytool" ]]; then keytool="$JAVA_HOME/bin/keytool"; fi
    command -v "$keytool" >/dev/null 2>&1 || die "keytool (from the JDK) is needed to make the secured broker's certificates"
    log "making a CA and the broker's TLS certificate in $TLS_DIR (once)..."
    pass="$(cat "$TLS_DIR/store.pass")"
    tmp="$(mktemp -d "$TLS_DIR/.new.XXXXXX")"
    (
        set -e
        kt() { "$keytool" -storetype PKCS12 -storepass "$pass" "$@"; }
        kt -genkeypair -keystore "$tmp/ca.p12" -alias ca -keyalg EC -groupname secp256r1 \
            -dname "CN=loopwatch local test CA" -ext bc:c -validity 3650
        kt -exportcert -keystore "$tmp/ca.p12" -alias ca -rfc -file "$tmp/ca.crt"
        kt -genkeypair -keystore "$tmp/broker.p12" -alias broker -keyalg EC -groupname secp256r1 \
            -dname "CN=localhost" -validity 3650
        kt -certreq -keystore "$tmp/broker.p12" -alias broker -file "$tmp/broker.csr"
        kt -gencert -keystore "$tmp/ca.p12" -alias ca -infile "$tmp/broker.csr" -outfile "$tmp/broker.crt" -rfc \
            -validity 3650 -ext "SAN=ip:127.0.0.1,dns:localhost" -ext KU=digitalSignature -ext EKU=serverAuth,clientAuth
        kt -importcert -keystore "$tmp/broker.p12" -alias ca -file "$tmp/ca.crt" -noprompt
        kt -importcert -keystore "$tmp/broker.p12" -alias broker -file "$tmp/broker.crt" -noprompt
        kt -importcert -keystore "$tmp/truststore.p12" -alias ca -file "$tmp/ca.crt" -noprompt
    ) >"$tmp/keytool.log" 2>&1 || { cat "$tmp/keytool.log" >&2; rm -rf "$tmp"; die "keytool failed"; }
    mv -f "$tmp/ca.crt" "$tmp/ca.p12" "$tmp/broker.p12" "$tmp/truststore.p12" "$TLS_DIR/"
    rm -rf "$tmp"
}

# The listener part of server.properties: clients and inter-broker traffic on SASL_SSL with
# SCRAM-SHA-512; the controller on SASL_SSL with PLAIN (SCRAM credentials live in the
# metadata log the controller serves, so the controller listener cannot use them). The
# broker talks to itself and to the controller as User:admin, the super user.
secure_listeners() {
    local admin store
    admin="$(secret admin)"
    store="$(cat "$TLS_DIR/store.pass")"
    cat <<EOF
listeners=SASL_SSL://$HOST:$PORT,CONTROLLER://$HOST:$CPORT
advertised.listeners=SASL_SSL://$HOST:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_SSL
listener.security.protocol.map=CONTROLLER:SASL_SSL,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$admin" user_admin="$admin";
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin";
ssl.keystore.type=PKCS12
ssl.keystore.location=$TLS_DIR/broker.p12
ssl.keystore.password=$store
ssl.truststore.type=PKCS12
ssl.truststore.location=$TLS_DIR/truststore.p12
ssl.truststore.password=$store
ssl.client.auth=none

# ACLs: scripts/kafka/secure-acls.conf; whatever they do not allow is denied.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin
allow.everyone.if.no.acl.found=false
EOF
}

write_admin_properties() {
    (umask 077 && cat >"$ADMIN_PROPS" <<EOF
# Generated by scripts/kafka.sh: the super user's client settings (Java clients).
bootstrap.servers=$BOOTSTRAP
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$(secret admin)";
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_DIR/ca.crt
EOF
    )
}

# Users, ACLs and topics, as admin (scripts/kafka/SecureSetup.java); after every start.
secure_setup() {
    local out
    prepare_java_classes
    if ! out="$(run_java_tool 120 "$SETUP_JAVA" "$ADMIN_PROPS" "$ACLS" "$SECRETS_DIR" "$SECURE_PARTITIONS" \
        "${SECURE_TOPICS[@]}" 2>&1)"; then
        printf '%s\n' "$out" >&2
        die "could not set up users, ACLs and topics on $BOOTSTRAP"
    fi
    log "$(printf '%s\n' "$out" | tail -n1)"
}

format_storage() {
    local cid scram=()
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
    # The super user's SCRAM credential must exist before the broker can authenticate anyone.
    if [[ -n "$SECURE" ]]; then scram=(--add-scram "SCRAM-SHA-512=[name=admin,password=$(secret admin)]"); fi
    "$JAVA" -Xmx128m -cp "$LIB/*" -Dlog4j2.configurationFile="$LOG4J_CONF" \
        kafka.tools.StorageTool format -t "$cid" -c "$PROPS" --ignore-formatted "${scram[@]}" >>"$BROKER_OUT" 2>&1 ||
        { show_logs; die "StorageTool format failed"; }
}

# ---------------------------------------------------------------- commands

cmd_start() {
    local pid heap
    take_lock
    if [[ -n "$SECURE" ]]; then
        ensure_secrets
        write_admin_properties
    fi
    pid="$(running_pid)"
    if [[ -n "$pid" ]]; then
        wait_ready "$pid"
        log "broker already running on $BOOTSTRAP (pid $pid)"
        if [[ -n "$SECURE" ]]; then secure_setup; fi
        return 0
    fi
    if [[ -f "$PID_FILE" ]]; then
        log "removing stale pid file ($(recorded_pid))"
        rm -f "$PID_FILE"
    fi
    if port_open "$PORT"; then die "port $PORT is in use by another process (set KAFKA_PORT)"; fi
    if port_open "$CPORT"; then die "controller port $CPORT is in use by another process (set KAFKA_CONTROLLER_PORT)"; fi

    ensure_jars
    if [[ -n "$SECURE" ]]; then ensure_tls; fi
    (umask 077 && write_config)  # the secured broker's holds passwords
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
    if [[ -n "$SECURE" ]]; then secure_setup; fi
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
    if [[ -n "$SECURE" ]]; then
        echo "KAFKA_SECURITY_PROTOCOL=SASL_SSL"
        echo "KAFKA_SASL_MECHANISM=SCRAM-SHA-512"
        echo "KAFKA_SSL_CAFILE=$TLS_DIR/ca.crt"
        echo "KAFKA_SECRETS_DIR=$SECRETS_DIR"
    fi
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

main "${ARGS[@]}"
