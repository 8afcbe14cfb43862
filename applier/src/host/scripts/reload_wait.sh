# reload_wait LIVE SOCKET LOOKS SECS MARK UPSTAT FIRST VERSION: reads `show proc` and prints it and
# `--` (read_before: exit EXIT_NO_PROC if it cannot), then asks for a reload and waits for it
# (reload_and_wait: exit EXIT_ASK_RELOAD if it cannot ask). MARK is the sha256 to mark loaded
# once the reload is provably ours, or empty; UPSTAT the upload's stat, or empty; FIRST the
# seconds to wait before the first look; VERSION the version number the new worker is told it
# serves (tell_version), or empty.
read_before "$2"
reload_and_wait "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8"
exit 0
