# swap LIVE TOKEN: renames this attempt's validated upload over the live file (see swap in
# lib.sh). Prints nothing; exits EXIT_SWAP if it cannot.
swap "$1" "$2"
