# upload_files HAPROXY LIVE TOKEN SOCKET SHA256 COUNT CERTS [LIVE_SHA LOADED_SHA [MAP...]]: on
# stdin a stream of the CERTS certificate files the host lacks (cert_stream: chain and private
# key, written 0600 in a 0700 folder as upload_certs.sh does, checked and synced, then renamed
# into place), the COUNT map files it lacks (Outgoing::stream), the config, each whole or as an
# edit of the host's own, and then the config that checks the maps (`hafleet-check`). For a
# version whose config HAProxy runs but for its map files and crt-list, in one round trip:
# writes the maps as upload_maps.sh does and the config next to the live file (same file
# system, so the later rename is atomic) under a name no other attempt uses; checks the config
# against SHA256 (exit EXIT_UPLOAD otherwise) and prints its sha256 and `hafleet-stat <stat>`
# (uploaded); then checks the maps and new certificate files alone and prints `show proc`
# (check_maps: a refused check removes the upload and exits with haproxy's status). For a
# version that changes a few lines of a config of megabytes (its map names) and a few entries
# of its maps, a few hundred bytes are sent instead of megabytes. It leaves the sweep of
# uploads that attempts which died left behind to upload_validate.sh: it is on the path of
# every map change. Exits EXIT_UPLOAD on any failure to land the files.
# With LIVE_SHA and LOADED_SHA, the change goes live in the same round trip once checked: the
# stream ends with its master CLI session (`hafleet-session`), which goes as swap_runtime.sh
# sends it with LIVE_SHA, LOADED_SHA and each MAP, for the master's current worker
# (go_live_now). One round trip where it took two.
umask 027
uc_up=
uf_session=
if [ "$#" -ge 9 ]; then
  uf_session="$2.hafleet-session-$3"
fi
if [ "${7:-0}" -gt 0 ] || [ -n "$uf_session" ]; then
  [ "${7:-0}" -eq 0 ] || certs_begin "$2" "$3"
  trap 'rm -rf ${uc_up:+"$uc_up"} ${uf_session:+"$uf_session"}' EXIT
  trap 'exit 1' HUP INT TERM PIPE
fi
unpack "$2" "$3" 1 "$6" "$2.hafleet-mapcheck-$3" "$uc_up" "${7:-0}" "$uf_session"
uploaded "$2" "$3" "$5"
uf_proc=$(check_maps "$1" "$2" "$3" "$4") || exit $?
go_live_now "$uf_proc" "$uf_session" "$2" "$3" "$4" 7 "$@"
