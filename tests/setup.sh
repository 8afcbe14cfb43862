#!/usr/bin/env bash
# Installs everything the tests and the local demo need on a fresh Debian (bookworm) machine:
# nats-server, haproxy (2.6), sshd, etcd from Debian's packages; kube-apiserver built once from
# Debian's `kubernetes` source package and HAProxy 3.0 built once from trixie's `haproxy` source
# tarball (both cached under ~/.cache/hafleet, keyed by version).
# Idempotent: a second run does nothing but check. Prints `export` lines for the test
# environment on stdout (everything else goes to stderr): eval "$(bash tests/setup.sh)".
set -euo pipefail

KUBE_VERSION=1.20.2
CACHE="${HAFLEET_CACHE:-$HOME/.cache/hafleet}"
# Built with github.com/modern-go/reflect2 v1.0.2 (Debian's golang-github-modern-go-reflect2-dev)
# in place of the vendored v1.0.1, which crashes under Go >= 1.18 on the first custom resource
# (`fatal error: fault` in map iteration); the cache key says so, so an older build is replaced.
KUBE_BIN="$CACHE/kube-$KUBE_VERSION-reflect2/kube-apiserver"
REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2
# HAProxy 3.0 as trixie has it (its upstream tarball, without Debian's patches), for
# HAFLEET_HAPROXY=<path>: the test hosts and the demo run it instead of bookworm's 2.6.
# The sha256 is the one trixie's signed Sources index gives for the tarball.
HAPROXY30_VERSION=3.0.11
HAPROXY30_SHA256=a133e2d550c5fd9a849b5c7ab17bb945bcdad209ca140d41f45ebf31943ae783
HAPROXY30_BIN="$CACHE/haproxy-$HAPROXY30_VERSION/haproxy"

log() { echo "setup: $*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

need_pkgs=()
command -v nats-server >/dev/null || need_pkgs+=(nats-server)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || need_pkgs+=(haproxy)
[ -x /usr/sbin/sshd ] || need_pkgs+=(openssh-server)
command -v ssh >/dev/null || need_pkgs+=(openssh-client)
command -v etcd >/dev/null || need_pkgs+=(etcd-server)
command -v curl >/dev/null || need_pkgs+=(curl)
command -v openssl >/dev/null || need_pkgs+=(openssl)
command -v socat >/dev/null || need_pkgs+=(socat)
# The host scripts' tests run each script in dash, busybox sh and bash; CI lints them
# (applier/src/host/scripts) with shellcheck.
command -v dash >/dev/null || need_pkgs+=(dash)
command -v busybox >/dev/null || need_pkgs+=(busybox)
command -v shellcheck >/dev/null || need_pkgs+=(shellcheck)
command -v kubectl >/dev/null || need_pkgs+=(kubernetes-client)
# The image test builds and runs deploy/container with podman, on runc (see tests/e2e/image.rs).
command -v podman >/dev/null || need_pkgs+=(podman)
command -v runc >/dev/null || need_pkgs+=(runc)

have_assets=false
if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/kube-apiserver" ] && [ -x "$KUBEBUILDER_ASSETS/etcd" ]; then
  have_assets=true
fi
if [ ! -x "$HAPROXY30_BIN" ]; then
  for p in make gcc curl; do command -v $p >/dev/null || need_pkgs+=("$p"); done
  for p in libssl-dev libpcre2-dev liblua5.4-dev zlib1g-dev libsystemd-dev; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need_pkgs+=("$p")
  done
fi
if ! $have_assets && [ ! -x "$KUBE_BIN" ]; then
  command -v go >/dev/null || need_pkgs+=(golang-go)
  [ -d "$REFLECT2_SRC" ] || need_pkgs+=(golang-github-modern-go-reflect2-dev)
  for p in make rsync jq; do command -v $p >/dev/null || need_pkgs+=("$p"); done
fi

# The URIs and Signed-By of the machine's own bookworm `deb` entry (deb822 `.sources` files or
# one-line `sources.list` entries), so the deb-src entry uses the same archive the machine does.
main_archive() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '
      function flush() { if (deb && suite && uris != "") { print uris, (sb == "" ? "-" : sb); found = 1; exit } deb = suite = 0; uris = sb = "" }
      /^[[:space:]]*$/ { flush(); next }
      /^Types:/ { deb = ($0 ~ /[[:space:]]deb([[:space:]]|$)/) }
      /^URIs:/ { uris = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm") suite = 1 }
      /^Signed-By:/ { sb = $2 }
      END { if (!found) flush() }
    ' "$f" | grep . && return 0
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" { i = 2; sb = "-"; if ($2 ~ /^\[/) { for (; i <= NF && $i !~ /\]$/; i++) if ($i ~ /signed-by=/) { sb = $i; sub(/.*signed-by=/, "", sb) } ; if ($i ~ /signed-by=/) { sb = $i; sub(/.*signed-by=/, "", sb); sub(/\]$/, "", sb) } ; i++ }
           if ($(i + 1) == "bookworm") { print $i, sb; exit } }' "$f" | grep . && return 0
  done
  return 1
}

apt_updated=false
apt_update() {
  $apt_updated && return 0
  as_root apt-get update -qq >&2
  apt_updated=true
}

if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  apt_update
  # The Debian packages start system services on install; the tests never use them.
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2
  for svc in haproxy nats-server etcd ssh; do
    as_root systemctl disable --now "$svc" >/dev/null 2>&1 || true
    as_root service "$svc" stop >/dev/null 2>&1 || true
  done
fi

# SSH test hosts log in as a dedicated user with a plain /bin/sh profile, as a real HAProxy host
# would (root's profile here runs pyenv init, which would slow every remote command).
if [ "$(id -u)" -eq 0 ] && ! id hafleet-host >/dev/null 2>&1; then
  log "creating user hafleet-host"
  useradd --system --create-home --home-dir /var/lib/hafleet-host --shell /bin/sh -p '*' hafleet-host
fi
if [ "$(id -u)" -eq 0 ]; then mkdir -p /run/sshd && chmod 0755 /run/sshd; fi

if ! $have_assets && [ ! -x "$KUBE_BIN" ]; then
  log "building kube-apiserver $KUBE_VERSION from Debian's source package (4-5 minutes, once)"
  src_list=/etc/apt/sources.list.d/hafleet-deb-src.sources
  if [ ! -f "$src_list" ]; then
    read -r uris signed_by < <(main_archive) || true
    [ "${signed_by:-}" = "-" ] && signed_by=
    if [ -z "${uris:-}" ]; then
      log "no bookworm 'deb' entry found in /etc/apt/sources.list{,.d/*}; add a deb-src entry by hand or set KUBEBUILDER_ASSETS"
      exit 1
    fi
    as_root tee "$src_list" >/dev/null <<SRC
Types: deb-src
URIs: $uris
Suites: bookworm
Components: main
Signed-By: ${signed_by:-/usr/share/keyrings/debian-archive-keyring.gpg}
SRC
    apt_updated=false
  fi
  apt_update
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && { apt-get source --download-only "kubernetes=$KUBE_VERSION*" >&2 || apt-get source --download-only kubernetes >&2; })
  origs=("$work"/kubernetes_*.orig.tar.*)
  orig=${origs[0]}
  mkdir -p "$work/src"
  tar -xf "$orig" -C "$work/src" --strip-components=1
  (
    cd "$work/src"
    # reflect2 v1.0.2 for the vendored v1.0.1 (see KUBE_BIN above): its source, and the
    # version in go.mod and vendor/modules.txt, which `-mod=vendor` checks against each other.
    rm -rf vendor/github.com/modern-go/reflect2
    cp -r "$REFLECT2_SRC" vendor/github.com/modern-go/reflect2
    rm -f vendor/github.com/modern-go/reflect2/go.mod vendor/github.com/modern-go/reflect2/go.sum
    sed -i 's|github.com/modern-go/reflect2 v1.0.1|github.com/modern-go/reflect2 v1.0.2|' go.mod vendor/modules.txt
    grep -q 'github.com/modern-go/reflect2 v1.0.2' vendor/modules.txt
    mkdir -p .go/src/k8s.io
    ln -s ../../.. .go/src/k8s.io/kubernetes
    GOPATH="$PWD/.go" CGO_ENABLED=0 HOME="$work/home" GOFLAGS=-mod=vendor make WHAT=cmd/kube-apiserver >&2
  )
  mkdir -p "$(dirname "$KUBE_BIN")"
  cp "$work/src/_output/bin/kube-apiserver" "$KUBE_BIN.tmp"
  mv "$KUBE_BIN.tmp" "$KUBE_BIN"
  log "kube-apiserver cached at $KUBE_BIN"
fi

if [ ! -x "$HAPROXY30_BIN" ]; then
  log "building HAProxy $HAPROXY30_VERSION from Debian trixie's source tarball (1.5 CPU-minutes, once)"
  read -r uris _ < <(main_archive) || true
  if [ -z "${uris:-}" ]; then
    log "no bookworm 'deb' entry found in /etc/apt/sources.list{,.d/*} to fetch HAProxy's source from"
    exit 1
  fi
  hwork=$(mktemp -d)
  # Removed at exit, with the kube-apiserver build's folder if there was one.
  trap 'rm -rf "$hwork" "${work:-}"' EXIT
  tarball="haproxy_$HAPROXY30_VERSION.orig.tar.gz"
  curl -fsS -o "$hwork/$tarball" "${uris%/}/pool/main/h/haproxy/$tarball"
  if ! echo "$HAPROXY30_SHA256  $hwork/$tarball" | sha256sum -c --quiet >&2; then
    log "$tarball does not have the sha256 pinned in tests/setup.sh"
    exit 1
  fi
  mkdir -p "$hwork/src"
  tar -xzf "$hwork/$tarball" -C "$hwork/src" --strip-components=1
  make -C "$hwork/src" -j2 TARGET=linux-glibc USE_OPENSSL=1 USE_LUA=1 LUA_INC=/usr/include/lua5.4 \
    LUA_LIB_NAME=lua5.4 USE_PCRE2=1 USE_PCRE2_JIT=1 USE_PROMEX=1 USE_SYSTEMD=1 USE_ZLIB=1 >&2
  mkdir -p "$(dirname "$HAPROXY30_BIN")"
  cp "$hwork/src/haproxy" "$HAPROXY30_BIN.tmp"
  mv "$HAPROXY30_BIN.tmp" "$HAPROXY30_BIN"
  log "HAProxy $HAPROXY30_VERSION cached at $HAPROXY30_BIN"
fi

# For callers: eval "$(bash tests/setup.sh)".
if $have_assets; then
  printf 'export HAFLEET_KUBE_APISERVER=%q\n' "$KUBEBUILDER_ASSETS/kube-apiserver"
  printf 'export HAFLEET_ETCD=%q\n' "$KUBEBUILDER_ASSETS/etcd"
else
  printf 'export HAFLEET_KUBE_APISERVER=%q\n' "$KUBE_BIN"
  printf 'export HAFLEET_ETCD=%q\n' "$(command -v etcd)"
fi
# Not HAFLEET_HAPROXY itself: the hosts run bookworm's 2.6 unless told otherwise, e.g.
# HAFLEET_HAPROXY=$HAFLEET_HAPROXY30 ./deploy/local/demo.sh
printf 'export HAFLEET_HAPROXY30=%q\n' "$HAPROXY30_BIN"
