# swap_reload LIVE TOKEN SOCKET LOOKS SECS MARK UPSTAT FIRST LIVE_SHA LOADED_SHA VERSION: checks that
# the live and loaded sha256 lines (live_shas) are still LIVE_SHA and LOADED_SHA, those of
# when the host was prepared (exit EXIT_STALE if not), reads `show proc` (exit EXIT_NO_PROC if
# it cannot), swaps the upload TOKEN in (exit EXIT_SWAP if it cannot), then reloads as
# reload_wait.sh does, in one round trip: a host prepared while the canary went live needs no
# round trip of its own to read them again. Before the swap, a failure has done nothing.
sr_was="$9 ${10} "
sr_now=$(live_shas "$1" | tr '\n' ' ')
if [ "$sr_now" != "$sr_was" ]; then
  echo "the host's config changed since it was prepared" >&2
  exit "$EXIT_STALE"
fi
read_before "$3"
swap "$1" "$2"
reload_and_wait "$1" "$3" "$4" "$5" "$6" "$7" "$8" "${11}"
exit 0
