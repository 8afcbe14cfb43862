# upload_files LIVE TOKEN COUNT: on stdin a stream (Outgoing::stream) of the COUNT map files
# the host lacks and the config, each whole or as an edit of the host's own. Writes the maps
# as upload_maps.sh does and the config next to the live file (same file system, so the later
# rename is atomic) under a name no other attempt uses; prints the config's sha256 and
# `hafleet-stat <stat>` (uploaded). For a version that changes a few lines of a config of
# megabytes (its map names) and a few entries of its maps, a few hundred bytes are sent
# instead of megabytes. The caller checks the sha256. It leaves the sweep of uploads that
# attempts which died left behind to upload_validate.sh: it is on the path of every map
# change. Exits EXIT_UPLOAD on any failure.
umask 027
unpack "$1" "$2" 1 "$3"
uploaded "$1" "$2"
