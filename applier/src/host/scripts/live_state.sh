# live_state LIVE: what a host holds, before a version is prepared there. On stdin the names
# of the version's map files and certificate files (`../hafleet-certs/<id>.pem`), a line each.
# Prints live_shas's two lines (the live file's sha256, the loaded one's), then the names the
# host does not have yet, a line each (missing_files). Changes nothing.
live_shas "$1"
missing_files "$1"
