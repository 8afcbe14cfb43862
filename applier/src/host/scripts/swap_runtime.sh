# swap_runtime.sh LIVE TOKEN SOCKET PID LIVE_SHA LOADED_SHA [MAP...]: swap_runtime (lib.sh), the
# session on stdin.
swap_runtime "$@"
