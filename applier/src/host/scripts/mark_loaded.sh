# mark_loaded LIVE SHA256 RELOADS UPSTAT SOCKET VERSION: see mark_loaded in lib.sh; then, with
# SOCKET and VERSION, tells the running worker that version (tell_version). Prints nothing;
# fails if the live file is not SHA256.
mark_loaded "$1" "$2" "$3" "$4" || exit 1
tell_version "$5" "$6"
