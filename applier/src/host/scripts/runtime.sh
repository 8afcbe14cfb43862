# hafleet's host functions for changes through the runtime API, joined after lib.sh (whose
# functions and exit codes they use) before the operation scripts that put a change live
# through the master CLI: swap_runtime.sh, upload_files.sh and upload_validate.sh (see
# applier/src/host/scripts.rs). Apart from lib.sh so that the scripts that never send runtime
# commands do not carry them with every command.

# go_live_now PROC SESSION LIVE TOKEN SOCKET SKIP ARG...: after an upload passed its check,
# prints its `show proc` (PROC) and puts it live in the same round trip with the master CLI
# session in the file SESSION, as swap_runtime does with the ARGs after the first SKIP (the
# operation's own: LIVE_SHA LOADED_SHA [MAP...] follow them), for the worker PROC names the
# one current worker: prints `hafleet-live` (on stdout and stderr: what the check said comes
# before it), then what swap_runtime prints. Without SESSION, or without one current worker
# in PROC, prints nothing more: the applier puts the upload live in a round trip of its own.
go_live_now() {
  printf '%s\n' "$1"
  gl_pid=$(printf '%s\n' "$1" | awk '$2 == "worker" && $3 == "0" { w++; p = $1 } END { if (w == 1) print p }')
  gl_session=$2
  gl_live=$3
  gl_token=$4
  gl_sock=$5
  gl_skip=$6
  shift 6
  [ -n "$gl_session" ] && [ -n "$gl_pid" ] || return 0
  shift "$gl_skip"
  echo hafleet-live
  echo hafleet-live >&2
  swap_runtime "$gl_live" "$gl_token" "$gl_sock" "$gl_pid" "$@" < "$gl_session"
}

# swap_runtime LIVE TOKEN SOCKET PID LIVE_SHA LOADED_SHA [MAP...]: puts a change that the
# runtime API takes live in one round trip (rollout::go_live), where it took five (a read of
# the host, the swap, `show map`, `prepare map`, the commands). Checks that the live and
# loaded sha256 lines (live_shas) are still LIVE_SHA and LOADED_SHA, those the host was
# prepared on, and that PID is still the master's one current worker, whom the commands are
# for (exit EXIT_STALE if not: nothing was done). Swaps the upload TOKEN in (exit EXIT_SWAP if
# it cannot). Each MAP the change touches is `KIND`, a map it replaces whole, or
# `=KIND:COUNT`, one whose entries it edits in place, which must hold COUNT entries first
# (runtime_api::map_edits). Each is found in the worker's `show map` by its kind (the map it
# loaded from a file `<kind>-<sha>.map`, listed exactly once), and each replaced whole is
# asked for a new version (`prepare map`). Then sends the master CLI session on stdin
# (runtime::session) to the worker, each `{map:KIND}` on a command line (not in a payload)
# made `@<version> #<id>` and each `{mapid:KIND}` made `#<id>`, and prints what the session
# printed. A MAP `+crtlist` says the session changes certificates: `{crtlist}` on its command
# lines is made the name of the worker's one crt-list of hafleet's (`show ssl crt-list`), and
# a payload line `{certfile:hafleet-certs/<id>.pem}` that file's lines. A map not found once,
# one edited that does not hold its COUNT, not one crt-list of hafleet's, or a prepare not
# answered with its version, prints `hafleet-runtime-skipped` instead and sends nothing more:
# the swap stays, and the caller reloads. What `show map` and the prepares answered goes to
# stderr. `{pid}` on the session's command lines is made PID (an upload that goes live in its
# own round trip reads the worker's pid there: the applier does not know it).
swap_runtime() {
  sr_live=$1
  sr_token=$2
  sr_sock=$3
  sr_pid=$4
  sr_was=$(printf '%s\n%s\n' "$5" "$6")
  sr_now=$(live_shas "$1")
  if [ "$sr_now" != "$sr_was" ]; then
    echo "the host's config changed since it was prepared" >&2
    exit "$EXIT_STALE"
  fi
  shift 6
  # `show proc` and the worker's `show map` (and `show ssl crt-list`, asked for with
  # `+crtlist`) in one session. Each answer starts after a prompt (the text up to the first
  # `> `: `master> `), on the line it begins. One awk reads them: the current worker if there
  # is one (a line, empty if not), then `<MAP> #<id>` for each MAP in the order given, only if
  # each is there exactly once (and each edited holds its COUNT), and `+crtlist <name>` if
  # the worker has exactly one crt-list of hafleet's.
  sr_crt=
  case " $* " in *" +crtlist "*) sr_crt="@!$sr_pid show ssl crt-list" ;; esac
  sr_both=$(
    {
      printf 'prompt\nshow proc\n@!%s show map\n' "$sr_pid"
      [ -z "$sr_crt" ] || printf '%s\n' "$sr_crt"
      echo quit
    } | socat -T 30 stdio "unix-connect:$sr_sock" 2>&1
  )
  sr_found=$(printf '%s\n' "$sr_both" | awk -v want="$*" '
    BEGIN {
      k = split(want, maps, " ")
      for (i = 1; i <= k; i++) {
        kinds[i] = maps[i]
        if (sub(/^=/, "", kinds[i])) { count[i] = kinds[i]; sub(/.*:/, "", count[i]); sub(/:.*/, "", kinds[i]) }
      }
    }
    NR == 1 { prompt = substr($0, 1, index($0, "> ") + 1) }
    prompt != "" && index($0, prompt) == 1 { $0 = substr($0, length(prompt) + 1); n++ }
    n == 1 && $2 == "worker" && $3 == "0" { w++; p = $1 }
    n == 2 && $1 ~ /^[0-9]+$/ && $2 ~ /^\(.*\)$/ {
      f = substr($2, 2, length($2) - 2)
      sub(/.*\//, "", f)
      if (f !~ /^[a-z]+-[0-9a-f]+\.map$/) next
      sub(/-.*/, "", f)
      seen[f]++
      id[f] = "#" $1
      entries[f] = ""
      for (j = 3; j <= NF; j++) if ($j ~ /^entry_cnt=[0-9]+$/) entries[f] = substr($j, 11)
    }
    n == 3 && $1 ~ /^hafleet-maps\/crtlist-[0-9a-f]+\.map$/ { crts++; crt = $1 }
    END {
      print (w == 1 ? p : "")
      for (i = 1; i <= k; i++) {
        if (maps[i] == "+crtlist") {
          if (crts != 1) exit
          id[maps[i]] = crt
          continue
        }
        if (seen[kinds[i]] != 1) exit
        if ((i in count) && entries[kinds[i]] != count[i]) exit
      }
      for (i = 1; i <= k; i++) print maps[i], (maps[i] == "+crtlist" ? crt : id[kinds[i]])
    }
  ')
  sr_cur=${sr_found%%"
"*}
  sr_ids=${sr_found#"$sr_cur"}
  sr_ids=${sr_ids#"
"}
  if [ "$sr_cur" != "$sr_pid" ]; then
    echo "the master's current worker is ${sr_cur:-not one worker}, not $sr_pid" >&2
    exit "$EXIT_STALE"
  fi
  swap "$sr_live" "$sr_token"
  sr_subst=
  if [ "$#" -gt 0 ]; then
    if [ -z "$sr_ids" ]; then
      printf 'show map (not one of each kind, or not COUNT entries, of %s) or show ssl crt-list (not one of hafleet'"'"'s): %s\n' "$*" "$sr_both" >&2
      echo hafleet-runtime-skipped
      exit 0
    fi
    # Each map replaced whole is prepared; each edited is only named.
    sr_prep=
    if printf '%s\n' "$sr_ids" | grep -qv '^[=+]'; then
      sr_prep=$(
        {
          echo prompt
          printf '%s\n' "$sr_ids" | while read -r sr_map sr_id; do
            case $sr_map in =* | +*) continue ;; esac
            printf '@!%s prepare map %s\n' "$sr_pid" "$sr_id"
          done
          echo quit
        } | socat -T 30 stdio "unix-connect:$sr_sock" 2>&1
      )
    fi
    # `{map:<kind>}=@<version> #<id>` for each map replaced whole, `{mapid:<kind>}=#<id>` for
    # each edited and `{crtlist}=<name>`, a line each; nothing unless every prepare answered
    # its version.
    sr_subst=$(printf '%s\n--\n%s\n' "$sr_ids" "$sr_prep" | awk '
      !past && $0 == "--" { past = 1; next }
      !past && /^[+]crtlist / { edit[++e] = "{crtlist}=" $2; next }
      !past && /^=/ { ek = substr($1, 2); sub(/:.*/, "", ek); edit[++e] = "{mapid:" ek "}=" $2; next }
      !past { kind[++k] = $1; id[k] = $2; next }
      {
        s = $0
        while (match(s, /New version created: [0-9]+/)) {
          v = substr(s, RSTART, RLENGTH)
          sub(/.*: /, "", v)
          ver[++n] = v
          s = substr(s, RSTART + RLENGTH)
        }
      }
      END {
        if (n != k) exit 1
        for (i = 1; i <= k; i++) print "{map:" kind[i] "}=@" ver[i] " " id[i]
        for (i = 1; i <= e; i++) print edit[i]
      }
    ')
    if [ -z "$sr_subst" ]; then
      printf 'prepare map: %s\n' "$sr_prep" >&2
      echo hafleet-runtime-skipped
      exit 0
    fi
  fi
  # The substitutions go to awk as one `;`-separated value; the session itself is stdin. A
  # line `{certfile:hafleet-certs/<id>.pem}` in a `set ssl cert` payload (only there) is that
  # file's lines (chain and key, put there by the upload): no key travels in a session.
  sr_subst=$(printf '{pid}=%s\n%s' "$sr_pid" "$sr_subst")
  awk -v subst="$(printf '%s' "$sr_subst" | tr '\n' ';')" -v dir="$(dir_of "$sr_live")" '
    BEGIN {
      n = split(subst, pairs, ";")
      for (j = 1; j <= n; j++) {
        i = index(pairs[j], "=")
        if (i > 0) to[substr(pairs[j], 1, i - 1)] = substr(pairs[j], i + 1)
      }
    }
    payload && cert && index($0, "{certfile:") == 1 && substr($0, length($0)) == "}" {
      f = substr($0, 11, length($0) - 11)
      if (f ~ /^hafleet-certs\/[0-9a-f]+\.pem$/) {
        f = dir "/" f
        while ((getline l < f) > 0) if (l != "") print l
        close(f)
      }
      next
    }
    payload { print; if ($0 == "") payload = 0; next }
    {
      for (m in to) {
        while ((i = index($0, m)) > 0) $0 = substr($0, 1, i - 1) to[m] substr($0, i + length(m))
      }
      print
      if ($0 ~ / <<$/) {
        payload = 1
        cert = ($0 ~ / set ssl cert [^ ]+ <<$/)
      }
    }
  ' | socat -T 30 stdio "unix-connect:$sr_sock"
}
