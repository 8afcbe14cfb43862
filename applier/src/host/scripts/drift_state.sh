# drift_state LIVE SOCKET: what a drift check compares with the version a host should run. On
# stdin the names of the version's map files and certificate files
# (`../hafleet-certs/<id>.pem`), a line each, as live_state.sh takes them (read whole into a
# temporary file first, then gone through twice: the hashes, then the missing names, one
# writer at a time). Prints the live file's sha256 (always hashed), the loaded marker's
# sha256 and its second line (`reloads <count>`), a line each, empty if unknown; then
# `<name> <sha256>` for each file (`-` if missing; no line at all if the maps folder is gone,
# which reads as missing), hashed by one `sha256sum` (with 10,000 certificate files of 4 KB
# the script took 0.47 to 0.48 s); then `--` and `show proc`, then `--` and the current
# worker's `show stat` of its node checks (`hafleet_nodes`; `No such proxy.` with node health
# checks off). Changes nothing.
if [ -f "$1" ]; then
  sha256sum "$1" | cut -d' ' -f1
else
  echo
fi
if [ -f "$1.hafleet-loaded" ]; then
  head -n 1 "$1.hafleet-loaded" | head -c 64
fi
echo
if [ -f "$1.hafleet-loaded" ]; then
  sed -n 2p "$1.hafleet-loaded"
else
  echo
fi
ds_maps="$(dirname "$1")/hafleet-maps"
ds_names=$(mktemp) || exit 1
cat > "$ds_names"
(
  cd "$ds_maps" 2>/dev/null || exit 0
  while IFS= read -r ds_m; do
    [ -n "$ds_m" ] && [ -f "$ds_m" ] && printf '%s\0' "$ds_m"
  done < "$ds_names" | xargs -0 -r sha256sum -- | awk '{ print $2, $1 }'
  while IFS= read -r ds_m; do
    [ -n "$ds_m" ] && [ ! -f "$ds_m" ] && printf '%s -\n' "$ds_m"
  done < "$ds_names"
)
rm -f "$ds_names"
echo --
ds_proc=$(master_cli "$2" "show proc") || true
printf '%s\n' "$ds_proc"
echo --
ds_worker=$(printf '%s\n' "$ds_proc" | awk '$2 == "worker" && $3 == "0" { print $1; exit }')
if [ -n "$ds_worker" ]; then
  master_cli "$2" "@!$ds_worker show stat hafleet_nodes 4 -1" || true
fi
