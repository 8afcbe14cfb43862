# master_cli SOCKET COMMAND: prints the master CLI's answer to COMMAND. (Stands alone, without
# lib.sh: it is sent for every runtime API change.)
printf '%s\n' "$2" | socat -t 5 stdio "unix-connect:$1"
