#!/usr/bin/env bash
# Builds stand-ins for the three base images that deploy/Dockerfile and
# deploy/compose/compose.yaml name, on a machine that cannot pull them (no
# container registry reachable), under the same names, so that the Dockerfile
# and the Compose file build and run unchanged:
#
#   golang:1.26                                 this machine's Go toolchain (go env GOROOT)
#                                               with busybox's sh, on an empty root
#   gcr.io/distroless/static-debian12:nonroot   an empty root with passwd/group (nonroot
#                                               65532), CA certificates and /tmp, user 65532
#   nats:2.15.2-alpine                          nats-server at go.mod's version, built here,
#                                               with busybox (sh, wget for the health check)
#
#   tools/containers/standins.sh [--force]
#
# A stand-in is not the upstream image: it has what Assent's build and
# Compose use of it, no more. An image of that name already present (pulled,
# or built before) is kept unless --force. Needs buildah (Debian: apt-get
# install buildah), Go and busybox-static. Each stand-in is labelled
# assent.standin=true, so `podman image inspect` tells a stand-in from the
# real image.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
force=false
[ "${1:-}" = "--force" ] && force=true

say() { echo "standins: $*"; }
for p in buildah go; do
  command -v "$p" >/dev/null 2>&1 || { echo "standins.sh: $p not found (Debian: apt-get install buildah; Go from go.dev)" >&2; exit 1; }
done
# A static busybox (ldd fails on a static program): busybox-static's.
busybox=""
for b in /bin/busybox /usr/bin/busybox.static; do
  if [ -x "$b" ] && ! ldd "$b" >/dev/null 2>&1; then busybox="$b"; break; fi
done
[ -n "$busybox" ] || { echo "standins.sh: a static busybox is needed (Debian: apt-get install busybox-static)" >&2; exit 1; }

natsv=$(cd "$root" && go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)
gov=$(go env GOVERSION)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

have() { buildah inspect --type image "$1" >/dev/null 2>&1 && ! $force; }

# base ROOTFS: what every stand-in has: /etc/passwd and /etc/group with root
# and nonroot (65532), CA certificates, /tmp.
base() {
  local r="$1"
  mkdir -p "$r/etc/ssl/certs" "$r/tmp" "$r/home/nonroot" "$r/root"
  chmod 1777 "$r/tmp"
  chown 65532:65532 "$r/home/nonroot"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$r/etc/group"
  cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/ca-certificates.crt"
  echo 'hosts: files dns' >"$r/etc/nsswitch.conf"
}

# withbusybox ROOTFS: /bin/busybox and links for the commands the images use.
withbusybox() {
  local r="$1"
  mkdir -p "$r/bin"
  cp "$busybox" "$r/bin/busybox"
  for c in sh mkdir cp mv rm ls cat env wget chmod ln; do ln -sf busybox "$r/bin/$c"; done
}

# commit NAME ROOTFS CONFIG...: an image from a root file system, with
# buildah config's flags.
commit() {
  local name="$1" r="$2"
  shift 2
  local c
  c=$(buildah from --quiet scratch)
  buildah copy --quiet "$c" "$r" / >/dev/null
  buildah config --label assent.standin=true "$@" "$c"
  buildah commit --quiet --format docker --rm "$c" "$name" >/dev/null
}

name=docker.io/library/golang:1.26
if have "$name"; then say "$name: present, kept"; else
  say "$name: stand-in from this machine's $gov"
  r="$work/golang"
  base "$r"
  withbusybox "$r"
  mkdir -p "$r/usr/local" "$r/go"
  cp -a "$(go env GOROOT)" "$r/usr/local/go"
  # The module proxy and checksum database this machine uses; GOTOOLCHAIN
  # local: the stand-in's Go is the one there is.
  commit "$name" "$r" \
    --env PATH=/go/bin:/usr/local/go/bin:/bin \
    --env GOPATH=/go --env GOTOOLCHAIN=local \
    --env GOPROXY="$(go env GOPROXY)" --env GOSUMDB="$(go env GOSUMDB)" \
    --workingdir /go --cmd /bin/sh
fi

name=gcr.io/distroless/static-debian12:nonroot
if have "$name"; then say "$name: present, kept"; else
  say "$name: stand-in: an empty root with users, CA certificates and /tmp"
  r="$work/static"
  base "$r"
  commit "$name" "$r" --user 65532:65532 --workingdir /home/nonroot \
    --env PATH=/usr/local/bin:/usr/bin:/bin --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
fi

name=docker.io/library/nats:2.15.2-alpine
if have "$name"; then say "$name: present, kept"; else
  say "$name: stand-in: nats-server $natsv (go.mod's) built here, with busybox"
  r="$work/nats"
  base "$r"
  withbusybox "$r"
  mkdir -p "$r/usr/local/bin"
  (cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$r/usr/local/bin/nats-server" github.com/nats-io/nats-server/v2)
  # As the official image's docker-entrypoint.sh: arguments that start with
  # "-" are nats-server's.
  printf '#!/bin/sh\nset -e\ncase "$1" in -*) set -- nats-server "$@" ;; esac\nexec "$@"\n' >"$r/usr/local/bin/docker-entrypoint.sh"
  chmod 755 "$r/usr/local/bin/docker-entrypoint.sh"
  commit "$name" "$r" --env PATH=/usr/local/bin:/bin \
    --port 4222 --port 6222 --port 8222 \
    --entrypoint '["docker-entrypoint.sh"]' --cmd '["nats-server","--config","/etc/nats/nats-server.conf"]'
fi
say "done"
