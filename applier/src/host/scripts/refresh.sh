# refresh LIVE SOCKET: live_shas's two lines, `--`, then the master's `show proc`: what a host
# prepared ahead for the runtime API checks when its turn comes, in one round trip (one
# prepared for a reload checks in the reload's: swap_reload.sh). Changes nothing.
live_shas "$1"
echo --
master_cli "$2" "show proc" || true
