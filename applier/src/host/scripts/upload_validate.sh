# upload_validate HAPROXY LIVE TOKEN SOCKET SHA256 COUNT [LIVE_SHA LOADED_SHA [MAP...]]: on
# stdin a stream (Outgoing::stream) of the COUNT map files the host lacks and the config, each
# whole or as an edit. After a sweep of what attempts that died left, upload_files.sh's
# upload, checked against SHA256 (exit EXIT_UPLOAD otherwise); prints its sha256 and
# `hafleet-stat <stat>`, then validates it with `haproxy -c` and prints `show proc` (validate:
# a refused upload is removed, exit 1). One round trip. With LIVE_SHA and LOADED_SHA, the
# change goes live in the same round trip once validated, as upload_files.sh says.
haproxy_bin=$1
shift
umask 027
uv_session=
if [ "$#" -ge 7 ]; then
  uv_session="$1.hafleet-session-$2"
  trap 'rm -f "$uv_session"' EXIT
  trap 'exit 1' HUP INT TERM PIPE
fi
sweep_uploads "$1"
unpack "$1" "$2" 1 "$5" "" "" 0 "$uv_session"
uploaded "$1" "$2" "$4"
uv_proc=$(validate "$haproxy_bin" "$1" "$2" "$3") || exit $?
go_live_now "$uv_proc" "$uv_session" "$1" "$2" "$3" 5 "$@"
