# upload_maps LIVE TOKEN COUNT: on stdin a stream (Outgoing::stream) of COUNT map files. Writes
# each under a temporary name and renames them to their own only once every one has arrived
# with the sha256 its name promises, so a file under a map's name is always that content
# (unpack). One round trip whatever the number of maps. Prints nothing; exits EXIT_UPLOAD on
# any failure.
umask 027
unpack "$1" "$2" 0 "$3"
exit 0
