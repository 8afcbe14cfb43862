# upload_validate HAPROXY LIVE TOKEN SOCKET SHA256 COUNT: on stdin a stream (Outgoing::stream)
# of the COUNT map files the host lacks and the config, each whole or as an edit. After a
# sweep of what attempts that died left, upload_files.sh's upload, checked against SHA256
# (exit EXIT_UPLOAD otherwise); prints its sha256 and `hafleet-stat <stat>`, then validates
# it with `haproxy -c` and prints `show proc` (validate: a refused upload is removed, exit 1).
# One round trip.
haproxy_bin=$1
shift
umask 027
sweep_uploads "$1"
unpack "$1" "$2" 1 "$5"
uploaded "$1" "$2" "$4"
validate "$haproxy_bin" "$1" "$2" "$3"
