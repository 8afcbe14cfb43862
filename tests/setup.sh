#!/usr/bin/env bash
# Installs everything the tests and the local demo need on a fresh Debian (bookworm) machine:
# nats-server, haproxy, sshd, etcd from Debian's packages, and kube-apiserver built once from
# Debian's `kubernetes` source package (cached under ~/.cache/hafleet, keyed by version).
# Idempotent: a second run does nothing but check. Prints `export` lines for the test
# environment on stdout (everything else goes to stderr): eval "$(bash tests/setup.sh)".
set -euo pipefail

KUBE_VERSION=1.20.2
CACHE="${HAFLEET_CACHE:-$HOME/.cache/hafleet}"
KUBE_BIN="$CACHE/kube-$KUBE_VERSION/kube-apiserver"

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
# The host scripts' tests run each script in dash, busybox sh and bash; CI checks them with
# shellcheck (applier/src/host/scripts).
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
if ! $have_assets && [ ! -x "$KUBE_BIN" ]; then
  command -v go >/dev/null || need_pkgs+=(golang-go)
  for p in make rsync jq; do command -v $p >/dev/null || need_pkgs+=($p); done
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
  (cd "$work" && apt-get source --download-only "kubernetes=$KUBE_VERSION*" >&2 2>&1 || apt-get source --download-only kubernetes >&2)
  orig=$(ls "$work"/kubernetes_*.orig.tar.* | head -1)
  mkdir -p "$work/src"
  tar -xf "$orig" -C "$work/src" --strip-components=1
  (
    cd "$work/src"
    mkdir -p .go/src/k8s.io
    ln -s ../../.. .go/src/k8s.io/kubernetes
    GOPATH="$PWD/.go" CGO_ENABLED=0 HOME="$work/home" GOFLAGS=-mod=vendor make WHAT=cmd/kube-apiserver >&2
  )
  mkdir -p "$(dirname "$KUBE_BIN")"
  cp "$work/src/_output/bin/kube-apiserver" "$KUBE_BIN.tmp"
  mv "$KUBE_BIN.tmp" "$KUBE_BIN"
  log "kube-apiserver cached at $KUBE_BIN"
fi

# For callers: eval "$(bash tests/setup.sh)".
if $have_assets; then
  printf 'export HAFLEET_KUBE_APISERVER=%q\n' "$KUBEBUILDER_ASSETS/kube-apiserver"
  printf 'export HAFLEET_ETCD=%q\n' "$KUBEBUILDER_ASSETS/etcd"
else
  printf 'export HAFLEET_KUBE_APISERVER=%q\n' "$KUBE_BIN"
  printf 'export HAFLEET_ETCD=%q\n' "$(command -v etcd)"
fi
