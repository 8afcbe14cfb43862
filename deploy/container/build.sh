#!/usr/bin/env bash
# Builds the hafleet image from deploy/container/Containerfile: an empty base (FROM scratch)
# with the three binaries and the operator CLI (hafleet), ssh, ssh-keygen and ssh-keyscan (the
# applier's), every shared library they load (as ldd lists them on this machine), and a passwd
# entry for the user the image runs as (65532, `hafleet`; ssh refuses to run as a user it
# cannot look up).
#
#   deploy/container/build.sh [--binaries DIR] [--tag TAG] [--engine podman|docker]
#
# --binaries: where hafleet-watcher, hafleet-renderer, hafleet-applier and hafleet are
# (default: build them with `cargo build --release`, into target/release). --tag: default
# hafleet:<version>. --engine: default $CONTAINER_ENGINE, else podman. Needs a Debian or Ubuntu
# build machine with openssh-client; the image runs on any Linux of the same architecture.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
binaries=""
tag=""
engine="${CONTAINER_ENGINE:-podman}"
while [ $# -gt 0 ]; do
  case "$1" in
    --binaries) binaries="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --engine) engine="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
components=(hafleet-watcher hafleet-renderer hafleet-applier hafleet)
tools=(ssh ssh-keygen ssh-keyscan)

if [ -z "$binaries" ]; then
  (cd "$root" && cargo build --release --locked -p hafleet-watcher -p hafleet-renderer -p hafleet-applier -p hafleet --bins)
  binaries="${CARGO_TARGET_DIR:-$root/target}/release"
fi
if [ -z "$tag" ]; then
  version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)"
  tag="hafleet:$version"
fi
for c in "${components[@]}"; do
  [ -x "$binaries/$c" ] || { echo "build.sh: no $binaries/$c" >&2; exit 1; }
done
for t in "${tools[@]}"; do
  command -v "$t" >/dev/null || { echo "build.sh: $t not found: install openssh-client" >&2; exit 1; }
done
command -v "$engine" >/dev/null || { echo "build.sh: $engine not found (--engine)" >&2; exit 1; }

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
rootfs="$ctx/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/usr/bin" "$rootfs/etc" "$rootfs/tmp" "$ctx/home/hafleet"
chmod 1777 "$rootfs/tmp"
for c in "${components[@]}"; do
  install -m 0755 "$binaries/$c" "$rootfs/usr/local/bin/$c"
  # Symbols are for debuggers, not pods: about a third of each binary.
  if command -v strip >/dev/null; then strip --strip-debug "$rootfs/usr/local/bin/$c"; fi
done
for t in "${tools[@]}"; do
  install -m 0755 "$(command -v "$t")" "$rootfs/usr/bin/$t"
done
# Every library any of them loads, at the path the loader looks for it (the dynamic loader
# itself included), following symlinks. One the loader cannot find here would be missing
# there too: stop.
libs="$ctx/libs"
for f in "$rootfs"/usr/local/bin/* "$rootfs"/usr/bin/*; do
  # (grep without -q reads all of ldd's output: with pipefail, an early exit would fail it.)
  if ldd "$f" | grep 'not found' >/dev/null; then
    echo "build.sh: $f needs a library this machine lacks:" >&2
    ldd "$f" | grep 'not found' >&2
    exit 1
  fi
  ldd "$f" | awk '/=> \// { print $3 } /^[[:space:]]*\/[^ ]*ld-linux/ { print $1 }'
done | sort -u > "$libs"
# glibc loads its name-service modules at run time, not at link time: user and host lookups
# (ssh's of its own user, host names in --nats-url) need them where glibc is older than 2.34,
# which has them built in.
libc="$(grep '/libc\.so\.' "$libs" | head -n 1)"
for nss in libnss_files.so.2 libnss_dns.so.2; do
  [ -e "$(dirname "$libc")/$nss" ] && echo "$(dirname "$libc")/$nss" >> "$libs"
done
while read -r lib; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done < "$libs"
# The machine's CA bundle, for whatever talks TLS to a public CA.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$rootfs/etc/ssl/certs"
  cp -L /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
fi
cat > "$rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/usr/sbin/nologin
hafleet:x:65532:65532:hafleet:/home/hafleet:/usr/sbin/nologin
PASSWD
cat > "$rootfs/etc/group" <<'GROUP'
root:x:0:
hafleet:x:65532:
GROUP
printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$rootfs/etc/nsswitch.conf"

"$engine" build -f "$here/Containerfile" -t "$tag" "$ctx" >&2
echo "$tag"
