# validate_maps HAPROXY LIVE TOKEN SOCKET: as upload_validate.sh's check, for an upload already
# made (upload_files.sh), of a version whose config HAProxy runs but for its map files and
# crt-list: `haproxy -c` on the config on stdin, which loads only the maps and new
# certificate files (written next to the live file, so relative paths resolve alike, and
# removed after). Its output goes to stderr; a refused check removes the upload and exits
# with haproxy's status. Then prints `show proc`.
vm_check="$2.hafleet-mapcheck-$3"
cat > "$vm_check"
vm_out=$("$1" -c -f "$vm_check" 2>&1)
vm_rc=$?
rm -f "$vm_check"
if [ "$vm_rc" -ne 0 ]; then
  rm -f "$2.hafleet-new-$3"
fi
printf '%s\n' "$vm_out" >&2
[ "$vm_rc" -eq 0 ] || exit "$vm_rc"
master_cli "$4" "show proc" || true
