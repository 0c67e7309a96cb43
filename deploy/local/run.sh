#!/usr/bin/env bash
# Runs deploy/compose's topology as local processes on loopback: three NATS
# nodes from deploy/compose/nats.conf (the same accounts and TLS, other
# ports), two broker replicas and the approver bot from deploy/compose's
# policy.yaml and bot.yaml (docs/deploy.md). Ctrl-C or SIGTERM stops
# everything, the bot and the brokers first.
#
#   deploy/local/run.sh [--dir DIR] [--base-port PORT] [--bin DIR]
#
# --dir        where the programs, keys, credentials, data and logs go
#              (default deploy/local/run, which git ignores); kept between runs
# --base-port  the first of the ports it uses (default 14220):
#              NATS clients PORT..PORT+2, routes PORT+3..PORT+5,
#              monitoring PORT+6..PORT+8, brokers' HTTP PORT+10 and PORT+11,
#              the bot's HTTP PORT+12
# --bin        take broker, approver-bot and nats-server from this directory
#              instead of building them into DIR/bin
#
# It needs go (unless --bin) and openssl. integration/ops/deploy_test.go runs it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
compose="$root/deploy/compose"
dir="$here/run"
base=14220
prebuilt=""

usage() { sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir="${2:?--dir needs a directory}"; shift 2 ;;
    --base-port) base="${2:?--base-port needs a port}"; shift 2 ;;
    --bin) prebuilt="${2:?--bin needs a directory}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; usage; exit 2 ;;
  esac
done
[[ "$base" =~ ^[0-9]+$ ]] && [ "$base" -ge 1024 ] && [ "$base" -le 65000 ] ||
  { echo "run.sh: --base-port $base: want a number from 1024 to 65000" >&2; exit 2; }

say() { echo "run: $*"; }
needs=(openssl setsid)
[ -n "$prebuilt" ] || needs+=(go)
for prog in "${needs[@]}"; do
  command -v "$prog" >/dev/null 2>&1 || {
    echo "run.sh: $prog not found: install it (openssl: apt-get install openssl) and run this again" >&2
    exit 1
  }
done

client=($((base)) $((base + 1)) $((base + 2)))
route=($((base + 3)) $((base + 4)) $((base + 5)))
monitor=($((base + 6)) $((base + 7)) $((base + 8)))
http=($((base + 10)) $((base + 11)))
botport=$((base + 12))
for p in "${client[@]}" "${route[@]}" "${monitor[@]}" "${http[@]}" "$botport"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "run.sh: port $p on 127.0.0.1 is in use: stop what listens there, or choose other ports with --base-port" >&2
    exit 1
  fi
done

mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
bin="$dir/bin"
gen="$dir/generated"
logs="$dir/logs"
mkdir -p "$bin" "$logs"

if [ -n "$prebuilt" ]; then
  bin="$(cd "$prebuilt" && pwd)"
  for prog in broker approver-bot nats-server; do
    [ -x "$bin/$prog" ] || { echo "run.sh: --bin $bin: no executable $prog there" >&2; exit 1; }
  done
else
  say "building broker, approver-bot and nats-server into $bin (the first time takes a minute or two)"
  (
    cd "$root"
    CGO_ENABLED=0 go build -trimpath -ldflags="-X main.version=local" -o "$bin/" ./cmd/broker ./cmd/approver-bot
    CGO_ENABLED=0 go build -trimpath -o "$bin/nats-server" github.com/nats-io/nats-server/v2
  )
fi

"$compose/setup.sh" --out "$gen" --broker "$bin/broker" | sed 's/^/  /'
# nats.conf includes accounts.conf from its own directory.
cp "$compose/nats.conf" "$gen/nats/nats.conf"

urls="tls://127.0.0.1:${client[0]},tls://127.0.0.1:${client[1]},tls://127.0.0.1:${client[2]}"
routes="[nats-route://127.0.0.1:${route[0]}, nats-route://127.0.0.1:${route[1]}, nats-route://127.0.0.1:${route[2]}]"

# The bot's configuration: compose's, with this machine's paths and ports.
sed -e "s#url: tls://nats-1:4222,tls://nats-2:4222,tls://nats-3:4222#url: $urls#" \
  -e "s#listen: 0.0.0.0:8090#listen: 127.0.0.1:$botport#" \
  -e "s#public_url: http://localhost:8090#public_url: http://127.0.0.1:$botport#" \
  -e "s#web_ui: http://localhost:8081#web_ui: http://127.0.0.1:${http[0]}#" \
  -e "s#/etc/assent/policy.yaml#$compose/policy.yaml#" \
  -e "s#/etc/assent/#$gen/#g" \
  "$compose/bot.yaml" >"$gen/bot.yaml"

names=()
pids=()
: >"$dir/run.pids"
# start NAME COMMAND...: runs COMMAND in the background in a session of its
# own, so that Ctrl-C reaches this script alone and it stops them in order;
# its output goes to logs/NAME.log, its process id to DIR/run.pids.
start() {
  local name="$1"
  shift
  setsid "$@" >"$logs/$name.log" 2>&1 &
  names+=("$name")
  pids+=($!)
  echo "$name $!" >>"$dir/run.pids"
}

stopping=""
stop_all() {
  [ -n "$stopping" ] && return
  stopping=1
  trap '' INT TERM
  local i pid n
  # The bot, then the brokers, then NATS: the reverse of starting.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    pid="${pids[i]}"
    kill -0 "$pid" 2>/dev/null || continue
    kill -TERM "$pid" 2>/dev/null || true
    for ((n = 0; n < 300; n++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      say "${names[i]} did not stop within 30s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
    say "stopped ${names[i]}"
  done
}
trap 'say "stopping"; stop_all; exit 0' INT TERM
trap 'stop_all' EXIT

# wait_healthy NAME URL: until URL answers 200, 60s at most, while NAME runs.
wait_healthy() {
  local name="$1" url="$2" n i
  for ((n = 0; n < 600; n++)); do
    "$bin/approver-bot" health --url "$url" --wait 1s >/dev/null 2>&1 && return 0
    for i in "${!names[@]}"; do
      if ! kill -0 "${pids[i]}" 2>/dev/null; then
        echo "run.sh: ${names[i]} exited; the end of $logs/${names[i]}.log:" >&2
        tail -n 20 "$logs/${names[i]}.log" >&2
        exit 1
      fi
    done
    sleep 0.1
  done
  echo "run.sh: $name not ready at $url within 60s; the end of $logs/$name.log:" >&2
  tail -n 20 "$logs/$name.log" >&2
  exit 1
}

for i in 0 1 2; do
  n=$((i + 1))
  mkdir -p "$gen/data/nats-$n"
  say "starting nats-$n: clients tls://127.0.0.1:${client[i]}, routes ${route[i]}, monitoring http://127.0.0.1:${monitor[i]}"
  start "nats-$n" env -C "$gen" \
    NATS_SERVER_NAME="nats-$n" NATS_LISTEN="127.0.0.1:${client[i]}" NATS_MONITOR="127.0.0.1:${monitor[i]}" \
    NATS_CLUSTER_LISTEN="127.0.0.1:${route[i]}" NATS_ROUTES="$routes" NATS_STORE_DIR="$gen/data/nats-$n" \
    "$bin/nats-server" -c "$gen/nats/nats.conf"
done
for i in 0 1 2; do
  wait_healthy "nats-$((i + 1))" "http://127.0.0.1:${monitor[i]}/healthz"
done
say "NATS cluster up"

for i in 0 1; do
  n=$((i + 1))
  say "starting broker-$n: HTTP http://127.0.0.1:${http[i]}"
  # Configured as compose.yaml configures its brokers: ASSENT_ variables,
  # the credentials on the command line.
  start "broker-$n" env ASSENT_NAME="broker-$n" ASSENT_NATS_URL="$urls" ASSENT_NATS_CA="$gen/tls/ca.pem" \
    ASSENT_REPLICAS=3 ASSENT_POLICY="$compose/policy.yaml" ASSENT_AUTH="$gen/auth/auth.yaml" \
    ASSENT_HTTP="127.0.0.1:${http[i]}" ASSENT_LOG_JSON=true \
    "$bin/broker" --nats-creds "$gen/creds/broker-$n.creds"
done
for i in 0 1; do
  wait_healthy "broker-$((i + 1))" "http://127.0.0.1:${http[i]}/readyz"
done

say "starting approver-bot: HTTP http://127.0.0.1:$botport"
start approver-bot env "$(cat "$gen/bot.env")" "$bin/approver-bot" run --config "$gen/bot.yaml" --log-json
wait_healthy approver-bot "http://127.0.0.1:$botport/readyz"

cat <<INFO
run: ready
  NATS          $urls
                CA $gen/tls/ca.pem, credentials in $gen/creds
  brokers       http://127.0.0.1:${http[0]}  http://127.0.0.1:${http[1]}  (API token: $gen/auth/ops.token)
  approver-bot  http://127.0.0.1:$botport  (inbound webhook /webhooks/in/ci, secret in $gen/bot.env)
  logs          $logs
run: Ctrl-C stops everything
INFO

# Until a signal, or until a process exits on its own: then stop the rest.
set +e
wait -n "${pids[@]}"
for i in "${!names[@]}"; do
  if ! kill -0 "${pids[i]}" 2>/dev/null; then
    echo "run.sh: ${names[i]} exited on its own; the end of $logs/${names[i]}.log:" >&2
    tail -n 20 "$logs/${names[i]}.log" >&2
  fi
done
stop_all
exit 1
