# upload_certs LIVE TOKEN COUNT: on stdin COUNT certificate files (chain and private key), each
# a line `hafleet-cert <name> <sha256> <lines>` and then its `<lines>` lines (cert_stream in
# applier/src/rollout/prepare.rs). Writes them into a folder of this attempt's inside hafleet-certs/
# beside LIVE, which only the SSH user may enter (0700), each readable by it alone (0600);
# checks every sha256 (one `sha256sum -c`), and only then syncs them (one `sync`), renames
# them all to their own names, so a file under a certificate's name is always that content,
# and syncs the folder. A handful of processes whatever the number of files: a host joining a
# fleet of 1,000 certificates takes them in one round trip. Folders that attempts which died
# left behind are swept once an hour old. Prints nothing; fails (1) with the reason on stderr.
set -e
umask 077
uc_dir="$(dirname "$1")/hafleet-certs"
mkdir -p "$uc_dir"
chmod 700 "$uc_dir"
find "$uc_dir" -maxdepth 1 -name '.up-*' -type d -mmin +60 -exec rm -rf {} + 2>/dev/null || true
uc_up="$uc_dir/.up-$2"
rm -rf "$uc_up"
mkdir "$uc_up"
trap 'rm -rf "$uc_up"' EXIT
trap 'exit 1' HUP INT TERM PIPE
awk -v u="$uc_up" '
  n == 0 {
    if ($1 != "hafleet-cert" || $2 !~ /^[0-9a-f]+\.pem$/ || $3 !~ /^[0-9a-f]+$/ ||
        $4 !~ /^[0-9]+$/ || $4 == 0) exit 3
    f = u "/" $2
    print $3 "  " $2 > (u "/.sums")
    n = $4
    next
  }
  {
    print > f
    n--
    if (n == 0) close(f)
  }
  END { if (n != 0) exit 4 }
' || {
  echo "the certificate files did not arrive whole" >&2
  exit 1
}
cd "$uc_up"
sha256sum -c --quiet .sums >/dev/null 2>&1 || {
  echo "an uploaded certificate file has another sha256" >&2
  exit 1
}
uc_count=0
[ ! -f .sums ] || uc_count=$(wc -l < .sums)
[ "$uc_count" -eq "$3" ] || {
  echo "$uc_count of $3 certificate files arrived" >&2
  exit 1
}
rm -f .sums
set -- *.pem
[ -f "$1" ] || exit 0
chmod 600 -- "$@"
sync_files "$@"
mv -f -- "$@" "$uc_dir"/
sync_files "$uc_dir"
