# restore LIVE: puts last-known-good back, atomically: copied to a temporary name, synced,
# renamed over the live file, the folder synced. Prints nothing; fails if there is none.
set -e
[ -f "$1.hafleet-last-good" ]
cp -p "$1.hafleet-last-good" "$1.hafleet-restore"
sync_files "$1.hafleet-restore"
mv -f "$1.hafleet-restore" "$1"
sync_files "$(dirname "$1")"
