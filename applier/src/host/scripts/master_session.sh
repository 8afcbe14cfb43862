# master_session SOCKET: an interactive master CLI session on stdin (ending in `quit`); prints
# the answers. A session that stalls for 30 s is cut. (Stands alone, without lib.sh.)
socat -T 30 stdio "unix-connect:$1"
