# discard LIVE TOKEN: removes this attempt's upload. Prints nothing.
rm -f "$1.hafleet-new-$2"
