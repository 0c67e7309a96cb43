#!/usr/bin/env bash
# Makes what deploy/compose/compose.yaml and deploy/local/run.sh need and git
# must never hold: the NATS credentials authority and each program's
# credentials, a CA and the NATS nodes' certificate, the brokers' API token,
# the bot's webhook secret, and the nodes' data directories.
#
#   deploy/compose/setup.sh [--out DIR] [--broker BIN] [--san DNS:name|IP:addr]...
#
# --out     where to write (default deploy/compose/generated, which git ignores)
# --broker  a built cmd/broker for `broker creds` and `broker token`
#           (default: go build it into OUT/bin)
# --san     another name of the NATS nodes for their certificate, repeatable
#           (the Kubernetes service names: docs/deploy.md)
#
# It needs openssl. Running it again keeps the authority, the CA, the
# certificate, the token and the secret it made before, and issues the
# credentials again. Layout of OUT:
#
#   keys/                  the credentials authority (broker creds init): keep it private
#   nats/accounts.conf     the operator and accounts, included by deploy/compose/nats.conf
#   tls/ca.pem ca-key.pem  the deployment's CA (ca-key.pem: keep it private)
#   tls/nats.pem nats-key.pem   the NATS nodes' certificate (server and route)
#   creds/broker-1.creds broker-2.creds bot.creds agent-demo.creds approver-ops.creds
#   auth/auth.yaml         the brokers' API tokens, hashed; auth/ops.token the token itself
#   bot.env                CI_WEBHOOK_SECRET, the bot's inbound webhook secret
#   data/nats-1..3         the nodes' JetStream stores
#   backups/               where `broker backup` run in a broker container writes
#                          (docs/deploy.md, "Upgrading the compose stack")
#
# Run as root, it gives what the containers read or write (nats/, tls/ but
# the CA's key, creds/, auth/, data/, backups/) to the images' user 65532, and Compose runs
# every container as 65532; run as anyone else, as that user.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$here/generated"
broker=""
sans=("DNS:localhost" "IP:127.0.0.1" "DNS:nats-1" "DNS:nats-2" "DNS:nats-3")

usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --broker) broker="${2:?--broker needs a file}"; shift 2 ;;
    --san) sans+=("${2:?--san needs DNS:name or IP:address}"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "setup.sh: unknown argument $1" >&2; usage; exit 2 ;;
  esac
done

say() { echo "setup: $*"; }
command -v openssl >/dev/null 2>&1 || {
  echo "setup.sh: openssl not found: install it (Debian, Ubuntu: apt-get install openssl) and run this again" >&2
  exit 1
}

umask 077
mkdir -p "$out"
out="$(cd "$out" && pwd)"
mkdir -p "$out/nats" "$out/tls" "$out/creds" "$out/auth" "$out/data/nats-1" "$out/data/nats-2" "$out/data/nats-3" "$out/backups"

if [ -z "$broker" ]; then
  command -v go >/dev/null 2>&1 || {
    echo "setup.sh: go not found: install Go, or give a built broker with --broker BIN" >&2
    exit 1
  }
  say "building cmd/broker into $out/bin"
  (cd "$root" && CGO_ENABLED=0 go build -trimpath -o "$out/bin/broker" ./cmd/broker)
  broker="$out/bin/broker"
fi
[ -x "$broker" ] || { echo "setup.sh: $broker is not an executable broker" >&2; exit 1; }

say "credentials authority in $out/keys"
"$broker" creds init --dir "$out/keys" >/dev/null
# The server side of operator mode: everything from "operator:" on of the
# configuration `broker creds server-config` prints. The nodes share this file
# and their store's volume, so the accounts stay in memory: after `broker creds
# revoke`, run this script again so that a restarted node keeps the revocation.
"$broker" creds server-config --dir "$out/keys" --resolver memory | sed -n '/^operator:/,$p' >"$out/nats/accounts.conf"
grep -q '^resolver_preload' "$out/nats/accounts.conf" || {
  echo "setup.sh: \`broker creds server-config\` printed no operator block; is $broker an Assent broker?" >&2
  exit 1
}
chmod 644 "$out/nats/accounts.conf" # public JWTs only

issue() { # ROLE NAME FILE [FLAGS...]
  local role="$1" name="$2" file="$3"
  shift 3
  "$broker" creds "$role" "$name" --dir "$out/keys" --out "$out/creds/$file" "$@" 2>/dev/null
}
say "credentials in $out/creds"
issue broker broker-1 broker-1.creds
issue broker broker-2 broker-2.creds
issue bot approver-bot bot.creds --principals ci-bot
issue agent demo agent-demo.creds
issue approver ops approver-ops.creds

if [ ! -f "$out/tls/ca.pem" ]; then
  say "CA in $out/tls/ca.pem"
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
    -keyout "$out/tls/ca-key.pem" -out "$out/tls/ca.pem" -days 825 \
    -subj "/CN=Assent deployment CA" \
    -addext "basicConstraints=critical,CA:true" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
if [ ! -f "$out/tls/nats.pem" ]; then
  san="$(IFS=,; echo "${sans[*]}")"
  say "NATS certificate in $out/tls/nats.pem for $san"
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
    -keyout "$out/tls/nats-key.pem" -out "$out/tls/nats.csr" -subj "/CN=nats" 2>/dev/null
  printf 'basicConstraints=CA:false\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' "$san" >"$out/tls/nats.ext"
  openssl x509 -req -in "$out/tls/nats.csr" -CA "$out/tls/ca.pem" -CAkey "$out/tls/ca-key.pem" -CAcreateserial \
    -out "$out/tls/nats.pem" -days 825 -extfile "$out/tls/nats.ext" 2>/dev/null
  rm -f "$out/tls/nats.csr" "$out/tls/nats.ext" "$out/tls/ca.srl"
fi
chmod 644 "$out/tls/ca.pem" "$out/tls/nats.pem"

if [ ! -f "$out/auth/ops.token" ]; then
  say "API token for principal ops (an admin) in $out/auth/ops.token"
  "$broker" token create ops --principal ops --admin --auth "$out/auth/auth.yaml" >"$out/auth/ops.token" 2>/dev/null
fi

if [ ! -f "$out/bot.env" ]; then
  say "the bot's inbound webhook secret in $out/bot.env"
  echo "CI_WEBHOOK_SECRET=whsec_$(openssl rand -base64 32)" >"$out/bot.env"
fi

# Compose runs every container as the user who owns the files it mounts, so
# that they stay readable by their owner only: the user who ran this, or,
# when that is root, the images' own non-root user, who is then given them
# (the authority in keys/ and the CA's key stay root's).
user="$(id -u):$(id -g)"
if [ "$(id -u)" = 0 ]; then
  user="65532:65532"
  say "running as root: the files the containers read go to user $user"
  chown "$user" "$out/nats/accounts.conf" "$out/tls/ca.pem" "$out/tls/nats.pem" "$out/tls/nats-key.pem"
  chown -R "$user" "$out/creds" "$out/auth" "$out/data"
  chown "$user" "$out/backups"
fi
if [ "$out" = "$here/generated" ]; then
  # Compose's .env: HOST_USER, and whatever else is there (IMAGE_TAG) kept.
  env="$here/.env"
  { [ -f "$env" ] && grep -v '^HOST_USER=' "$env" || true; echo "HOST_USER=$user"; } >"$env.new"
  mv "$env.new" "$env"
fi
say "done: $out"
