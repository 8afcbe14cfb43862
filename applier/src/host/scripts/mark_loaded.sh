# mark_loaded LIVE SHA256 RELOADS UPSTAT: see mark_loaded in lib.sh. Prints nothing; fails if
# the live file is not SHA256.
mark_loaded "$1" "$2" "$3" "$4"
