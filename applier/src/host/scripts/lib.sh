# hafleet's library of host functions, prepended at compile time to each operation script
# of this folder that calls one (see applier/src/host/scripts.rs). The applier runs an
# operation as `sh -c '<lib.sh><operation>.sh' hafleet ARG...` over SSH, so all of it is
# POSIX sh (dash, busybox sh and bash run it; tests run it with each) over GNU coreutils
# (`stat -c`, `mv -T`, `sha256sum -c --quiet`), awk, sed and socat. What goes over the wire
# is these files without their comment lines, blank lines and indentation.
#
# Scripts answer on stdout, in lines read in one place (applier/src/host/answer.rs), and say
# why they failed on stderr. Functions use variables of their own prefix: sh has no `local`.

# Exit codes of the operations that do several steps in one round trip, naming the step that
# failed; no tool they run exits with these (host::answer::Exit reads them).
# shellcheck disable=SC2034 # used by the operation scripts
EXIT_UPLOAD=64
# shellcheck disable=SC2034
EXIT_SWAP=65
# shellcheck disable=SC2034
EXIT_ASK_RELOAD=66
# The host's live file or loaded marker is not what it was when it was prepared: nothing was
# done.
# shellcheck disable=SC2034
EXIT_STALE=67
# The master's `show proc` could not be read before the reload: nothing was done.
# shellcheck disable=SC2034
EXIT_NO_PROC=68

# Unnamed map files more than two minutes old that a host keeps before it sweeps them, not
# waiting for them to be an hour old (mark_loaded).
MAPS_KEPT=64

# sync_files PATH...: makes PATHs durable, files (their content) and folders (the names
# renamed into them), with one `sync` for all: a new file is synced before the rename that
# makes it live and its folder after, so a power loss never leaves a live name on an empty
# or half-written file. GNU coreutils (8.24 and later) and busybox `sync` take paths; one
# that does not (or fails on them) syncs every file system instead: slower, as safe.
sync_files() {
  sync -- "$@" 2>/dev/null || sync
}

# dir_of PATH: prints the folder of PATH, an absolute path (the inventory allows no other), as
# `dirname` would, without running a program: every process a script starts is about a
# millisecond on the path of a change.
dir_of() {
  case $1 in
    /*/*) printf '%s\n' "${1%/*}" ;;
    *) echo / ;;
  esac
}

# master_cli SOCKET COMMAND: prints the master CLI's answer to COMMAND.
master_cli() {
  printf '%s\n' "$2" | socat -t 5 stdio "unix-connect:$1"
}

# live_shas LIVE: prints the sha256 of the live config LIVE and the sha256 of the config
# HAProxy last loaded (the first line of the marker LIVE.hafleet-loaded), a line each, empty
# if unknown. The live file is hashed unless it is the very file the marker records (same
# device, inode, size, modification and change times, as mark_loaded saw them when it
# marked it; any write or `touch` changes the change time): 25 ms saved per apply at 10,000
# backends. Drift checks always hash (drift_state.sh). The marker is read by one awk, which
# says both its sha256 and whether it records this very file.
live_shas() {
  ls_m=
  if [ -f "$1" ] && [ -f "$1.hafleet-loaded" ]; then
    ls_m=$(awk -v s="stat $(stat -c '%d %i %s %y %z' "$1")" '
      NR == 1 { print substr($0, 1, 64) }
      NR > 1 && $0 == s { print "same" }
    ' "$1.hafleet-loaded")
  elif [ -f "$1.hafleet-loaded" ]; then
    ls_m=$(head -c 64 "$1.hafleet-loaded")
  fi
  ls_loaded=${ls_m%"
same"}
  if [ "$ls_loaded" != "$ls_m" ]; then
    echo "$ls_loaded"
  elif [ -f "$1" ]; then
    sha256sum "$1" | cut -d' ' -f1
  else
    echo
  fi
  echo "$ls_loaded"
}

# missing_files LIVE: reads names on stdin, a line each, of map files (`<kind>-<sha>.map`,
# in hafleet-maps/ beside LIVE) and certificate files (`../hafleet-certs/<id>.pem`), and
# prints those the host does not have, a line each. The folders are listed by the shell's
# own globs, written before the names into one awk that looks each name up: no test a name
# (10,000 tests took 0.4-0.6 s a host), no command line of 10,000 names, and no `ls`.
missing_files() {
  mf_d=$(dir_of "$1")
  {
    for mf_f in "$mf_d"/hafleet-maps/* "$mf_d"/hafleet-certs/*; do
      [ -e "$mf_f" ] || continue
      case $mf_f in
        "$mf_d"/hafleet-certs/*) printf '../hafleet-certs/%s\n' "${mf_f##*/}" ;;
        *) printf '%s\n' "${mf_f##*/}" ;;
      esac
    done
    echo "/"
    cat
  } | awk '
    !asked { if ($0 == "/") asked = 1; else have[$0] = 1; next }
    $0 != "" && !($0 in have)
  '
}

# unpack LIVE TOKEN WANT COUNT [CHECK [CERTS N [SESSION]]]: unpacks the stream on stdin
# (Outgoing::stream in applier/src/rollout/prepare.rs) of COUNT map files and, if WANT is 1, a
# config, then, with CHECK, the config that checks the maps (a `hafleet-check` record after
# the config), into the file CHECK, then, with SESSION, the master CLI session of a change
# that goes live in the same round trip (a `hafleet-session` record, last), into the file
# SESSION. With CERTS (certs_begin's folder), N certificate files
# come first (`hafleet-cert <name> <sha256> <lines>` records, cert_stream's): each is written
# into CERTS, checked with the maps, synced with them, made 0600 and renamed into
# hafleet-certs/ with them. Each map goes to a
# name of this attempt's in hafleet-maps/, the config to this attempt's upload
# LIVE.hafleet-new-TOKEN (same file system as LIVE: the later rename is atomic); a file sent
# as an edit is made by `sed` from the host's own (a map from the map it names, the config
# from the live file). Then checks every map's sha256 (one `sha256sum -c`), syncs the maps
# and the upload (one `sync`), renames the maps to their own names only if all are whole, and
# syncs the folder; the caller checks the config's sha256. The awk program refuses a record
# it cannot read (3), data cut short or a missing config (4), and data past the config (5).
# Prints nothing; exits EXIT_UPLOAD on any failure, leaving no file of its own behind.
unpack() {
  up_d="$(dir_of "$1")/hafleet-maps"
  [ -d "$up_d" ] || mkdir -p "$up_d" || exit "$EXIT_UPLOAD"
  up_u="$1.hafleet-new-$2"
  up_t=$2
  up_c=$5
  up_cu=${6:-}
  up_cn=${7:-0}
  up_s=${8:-}
  awk -v d="$up_d" -v t="$up_t" -v cfg="$up_u" -v want="$3" -v chk="$up_c" -v cu="$up_cu" \
      -v ses="$up_s" '
    n == 0 {
      if (sent) { bad = 5; exit }
      if ($1 == "hafleet-cert") {
        if (cu == "" || maps || done || NF != 4 || $2 !~ /^[0-9a-f]+\.pem$/ ||
            $3 !~ /^[0-9a-f]+$/ || $4 !~ /^[0-9]+$/ || $4 == 0) { bad = 3; exit }
        f = cu "/" $2
        print $3 "  " $2 > (cu "/.sums")
        n = $4
        nl = 1
        printf "" > f
        next
      }
      if (done) {
        if ($1 == "hafleet-check" && NF == 3 && chk != "" && !checked) {
          f = chk
          checked = 1
        } else if ($1 == "hafleet-session" && NF == 3 && ses != "" && (checked || chk == "")) {
          f = ses
          sent = 1
        } else {
          bad = 5
          exit
        }
      } else if (($1 == "hafleet-config" || $1 == "hafleet-config-edit") && NF == 3 && want) {
        f = cfg
        if ($1 == "hafleet-config-edit") f = cfg ".sed"
        done = 1
      } else if (($1 == "hafleet-map" && NF == 5 ||
                  $1 == "hafleet-map-edit" && NF == 6 && $4 ~ /^[a-z]+-[0-9a-f]+\.map$/) &&
                 $2 ~ /^[a-z]+-[0-9a-f]+\.map$/ && length($3) == 64 && $3 !~ /[^0-9a-f]/) {
        f = d "/." $2 "." t
        maps = 1
        print $3 "  ." $2 "." t > (d "/.sums." t)
        if (NF == 6) {
          f = f ".sed"
          print $2, $4 > (d "/.edits." t)
        }
      } else {
        bad = 3
        exit
      }
      if ($(NF - 1) !~ /^[0-9]+$/) { bad = 3; exit }
      n = $(NF - 1)
      nl = $NF
      printf "" > f
      if (n == 0) close(f)
      next
    }
    {
      if (n == 1 && nl == 0) printf "%s", $0 > f
      else print > f
      n--
      if (n == 0) close(f)
    }
    END {
      if (bad) exit bad
      if (n != 0 || (want && !done) || (chk != "" && !checked) || (ses != "" && !sent)) exit 4
    }
  ' || unpack_drop "the map files and config did not arrive whole"
  if [ -f "$up_d/.edits.$up_t" ]; then
    while read -r up_m up_b; do
      sed -f "$up_d/.$up_m.$up_t.sed" "$up_d/$up_b" > "$up_d/.$up_m.$up_t" 2>/dev/null
      rm -f "$up_d/.$up_m.$up_t.sed"
    done < "$up_d/.edits.$up_t"
    rm -f "$up_d/.edits.$up_t"
  fi
  if [ -f "$up_u.sed" ]; then
    sed -f "$up_u.sed" "$1" > "$up_u" 2>/dev/null
    rm -f "$up_u.sed"
  fi
  up_k=0
  [ ! -f "$up_d/.sums.$up_t" ] || up_k=$(wc -l < "$up_d/.sums.$up_t")
  if [ "$up_k" -ne "$4" ] || { [ "$up_k" -gt 0 ] && ! unpack_sums_match; }; then
    unpack_drop "$up_k of $4 map files arrived, or one has another sha256"
  fi
  if [ -n "$up_cu" ]; then
    up_c2=0
    [ ! -f "$up_cu/.sums" ] || up_c2=$(wc -l < "$up_cu/.sums")
    if [ "$up_c2" -ne "$up_cn" ] ||
      { [ "$up_c2" -gt 0 ] && ! (cd "$up_cu" && sha256sum -c --quiet .sums >/dev/null 2>&1); }; then
      unpack_drop "$up_c2 of $up_cn certificate files arrived, or one has another sha256"
    fi
    rm -f "$up_cu/.sums"
  fi
  # The maps', the certificates' and the upload's content on disk, in one sync, before any
  # name makes them live.
  set --
  [ ! -f "$up_u" ] || set -- "$up_u"
  if [ "$up_k" -gt 0 ]; then
    while read -r _ up_f; do
      set -- "$@" "$up_d/$up_f"
    done < "$up_d/.sums.$up_t"
  fi
  if [ -n "$up_cu" ]; then
    for up_f in "$up_cu"/*.pem; do
      [ ! -f "$up_f" ] || set -- "$@" "$up_f"
    done
  fi
  [ "$#" -eq 0 ] || sync_files "$@"
  if [ "$up_k" -gt 0 ]; then
    while read -r _ up_f; do
      up_n=${up_f#.}
      up_n=${up_n%."$up_t"}
      mv -fT "$up_d/$up_f" "$up_d/$up_n" ||
        unpack_drop "cannot put $up_d/$up_n in place (a directory in the way?)"
    done < "$up_d/.sums.$up_t"
    sync_files "$up_d"
  fi
  rm -f "$up_d/.sums.$up_t"
  if [ -n "$up_cu" ]; then
    set -- "$up_cu"/*.pem
    if [ -f "$1" ]; then
      chmod 600 -- "$@"
      mv -f -- "$@" "${up_cu%/*}"/ || unpack_drop "cannot put the certificate files in place"
      sync_files "${up_cu%/*}"
    fi
    rm -rf "$up_cu"
  fi
}

# certs_begin LIVE TOKEN: the folder this attempt's certificate files arrive in, $uc_up, inside
# hafleet-certs/ beside LIVE, which only the SSH user may enter (0700); unpack writes them
# there (its sixth argument) ahead of the maps. Folders that attempts which died left behind
# are swept once an hour old: the shell's glob looks for one first (no `find` over a folder of
# 10,000 certificates on every upload).
certs_begin() {
  uc_dir="$(dir_of "$1")/hafleet-certs"
  { mkdir -p "$uc_dir" && chmod 700 "$uc_dir"; } || exit "$EXIT_UPLOAD"
  for uc_old in "$uc_dir"/.up-*; do
    [ -d "$uc_old" ] || break
    find "$uc_dir" -maxdepth 1 -name '.up-*' -type d -mmin +60 -exec rm -rf {} + 2>/dev/null || true
    break
  done
  uc_up="$uc_dir/.up-$2"
  rm -rf "$uc_up"
  (umask 077 && mkdir "$uc_up") || exit "$EXIT_UPLOAD"
}

# unpack_sums_match: whether every map unpack wrote has the sha256 its name promises.
unpack_sums_match() {
  (cd "$up_d" && sha256sum -c --quiet ".sums.$up_t" >/dev/null 2>&1)
}

# unpack_drop MESSAGE: removes what unpack wrote, says MESSAGE on stderr, exits EXIT_UPLOAD.
unpack_drop() {
  rm -f "$up_d"/.*."$up_t" "$up_d"/.*."$up_t".sed "$up_u" "$up_u.sed" ${up_c:+"$up_c"} \
    ${up_s:+"$up_s"}
  [ -z "$up_cu" ] || rm -rf "$up_cu"
  echo "$*" >&2
  exit "$EXIT_UPLOAD"
}

# uploaded LIVE TOKEN [SHA256]: prints the sha256 of this attempt's upload
# LIVE.hafleet-new-TOKEN, then `hafleet-stat <inode> <size> <mtime>` (a rename keeps them,
# so a live file with that stat later is this upload, and marking it loaded need not hash
# it). An upload that is not there, or not SHA256 when given, exits EXIT_UPLOAD (removed).
uploaded() {
  ud_sha=$(sha256sum "$1.hafleet-new-$2" | cut -d' ' -f1) || exit "$EXIT_UPLOAD"
  ud_stat=$(stat -c '%i %s %y' "$1.hafleet-new-$2") || exit "$EXIT_UPLOAD"
  if [ -n "$3" ] && [ "$ud_sha" != "$3" ]; then
    rm -f "$1.hafleet-new-$2"
    echo "uploaded file has sha256 $ud_sha instead of $3" >&2
    exit "$EXIT_UPLOAD"
  fi
  echo "$ud_sha"
  echo "hafleet-stat $ud_stat"
}

# sweep_uploads LIVE: deletes uploads (and the sessions of changes that go live with them)
# that attempts which died left beside LIVE, once an hour old.
sweep_uploads() {
  su_b=$(basename "$1")
  find "$(dir_of "$1")" -maxdepth 1 \( -name "$su_b.hafleet-new-*" -o -name "$su_b.hafleet-session-*" \) \
    -mmin +60 -delete 2>/dev/null
}

# validate HAPROXY LIVE TOKEN SOCKET: checks this attempt's upload with `haproxy -c` (its
# output on stderr; a refused upload is removed and exits 1), then prints `show proc` for the
# reload check to come (not being able to is not the config's fault: it shows as an
# unreadable `show proc`, a failure that may pass).
# `haproxy -c` asks glibc to back its heap with transparent huge pages (the tunable only
# takes effect where THP is `madvise` or `always`; an unknown tunable, an older glibc or
# another libc ignore it, and a GLIBC_TUNABLES set in the SSH session's environment is kept
# as it is): at 10,000 backends the check touches 210 MB in 51,000 page faults, and with huge
# pages it takes 193 ms instead of 292 (`hafleet-bench reload`, BENCHMARKS.md). It is on the
# path of every reload change.
validate() {
  vd_out=$(GLIBC_TUNABLES="${GLIBC_TUNABLES-glibc.malloc.hugetlb=1}" \
    "$1" -c -f "$2.hafleet-new-$3" 2>&1)
  vd_rc=$?
  if [ "$vd_rc" -ne 0 ]; then
    rm -f "$2.hafleet-new-$3"
  fi
  printf '%s\n' "$vd_out" >&2
  [ "$vd_rc" -eq 0 ] || exit 1
  master_cli "$4" "show proc" || true
}

# check_maps HAPROXY LIVE TOKEN SOCKET: checks the upload LIVE.hafleet-new-TOKEN of a
# version whose config HAProxy runs but for its map files and crt-list: `haproxy -c` on the
# config in LIVE.hafleet-mapcheck-TOKEN, which loads only the maps and new certificate files
# (written next to the live file, so relative paths resolve alike; removed after). Its
# output goes to stderr; a refused check removes the upload and exits with haproxy's status.
# Then prints `show proc`.
check_maps() {
  cm_check="$2.hafleet-mapcheck-$3"
  cm_out=$("$1" -c -f "$cm_check" 2>&1)
  cm_rc=$?
  rm -f "$cm_check"
  if [ "$cm_rc" -ne 0 ]; then
    rm -f "$2.hafleet-new-$3"
  fi
  printf '%s\n' "$cm_out" >&2
  [ "$cm_rc" -eq 0 ] || exit "$cm_rc"
  master_cli "$4" "show proc" || true
}

# swap LIVE TOKEN: renames this attempt's validated upload over LIVE (its content was synced
# when it arrived), then syncs the folder. Last-known-good is written only once a config
# loaded and passed its probes (mark_loaded); on a host hafleet never verified a config on,
# the file HAProxy was started with is kept as last-known-good first. Exits EXIT_SWAP if it
# cannot. The loaded marker is emptied first (by the shell alone): until mark_loaded records
# what HAProxy then runs, it is not known. A runtime change cut short, or a reload that
# failed after runtime commands that were taken in part, leaves a worker that runs neither
# file; the next apply, finding no marker, reloads rather than editing what it cannot see.
swap() {
  [ ! -f "$1.hafleet-loaded" ] || : > "$1.hafleet-loaded"
  if [ -f "$1" ] && [ ! -f "$1.hafleet-last-good" ]; then
    cp -p "$1" "$1.hafleet-last-good-$2" || exit "$EXIT_SWAP"
    sync_files "$1.hafleet-last-good-$2"
    mv -f "$1.hafleet-last-good-$2" "$1.hafleet-last-good" || exit "$EXIT_SWAP"
  fi
  mv -f "$1.hafleet-new-$2" "$1" || exit "$EXIT_SWAP"
  sync_files "$(dir_of "$1")"
}

# read_before SOCKET: reads the master's `show proc` (exits EXIT_NO_PROC if it cannot) and
# prints it and `--`. Sets rb_reloads and rb_failed, the master's reload and failed-reload
# counts, and rb_pids, its workers (`pid pid `), for reload_and_wait.
read_before() {
  rb_proc=$(master_cli "$1" "show proc" 2>&1)
  rb_counts=$(printf '%s\n' "$rb_proc" |
    awk '$2 == "master" && $4 == "[failed:" { print $3 " " $5; exit }')
  if [ -z "$rb_counts" ]; then
    printf "cannot read \`show proc\` from the master socket %s: %s\n" "$1" "$rb_proc" >&2
    exit "$EXIT_NO_PROC"
  fi
  rb_failed=${rb_counts#* }
  rb_failed=${rb_failed%]}
  rb_reloads=${rb_counts%% *}
  rb_pids=$(printf '%s\n' "$rb_proc" | awk '$2 == "worker" { printf "%s ", $1 }')
  printf '%s\n--\n' "$rb_proc"
}

# reload_and_wait LIVE SOCKET LOOKS SECS MARK UPSTAT FIRST, after read_before: asks the
# master to reload (exits EXIT_ASK_RELOAD if it cannot) and prints its answer, each line as
# `hafleet-answer <line>` (HAProxy 3.1 and later answer `Success=1` or `Success=0`, then `--`
# and the startup logs; 2.6 closes the connection without a word). Then, unless the
# master said `Success=0` (it did not reload: one look is enough), waits FIRST seconds (`0`,
# or a decimal such as `0.450`; not after an answer, which comes once the reload is over)
# and looks at `show proc` every 3 ms (GNU or busybox `sleep`),
# on the host, until the counts moved and either a reload failed or a worker that was not
# there runs, or LOOKS looks or SECS seconds went by (each look is cut after a second).
# Prints the last `show proc` and `hafleet-looks <looks>`; whether the reload is ours is
# decided by the applier, from the two `show proc`. A look costs about 5 ms of the host's CPU
# (socat, awk, sleep): looking all through a reload that takes 600 ms would take most of a
# core from HAProxy, which needs it to start the new worker.
# With MARK, when the reload is provably ours (one more, none failed, a new worker), it runs
# mark_loaded for that sha256 with the new reload count and UPSTAT, in a subshell, and prints
# `hafleet-marked-loaded` if that passed (for a host without probes, where loading is
# passing). A mark that fails prints nothing and fails nothing: the applier then marks as
# usual, and fails loudly.
reload_and_wait() {
  rw_answer=$(master_cli "$2" reload) || {
    echo "cannot ask the master socket $2 for a reload" >&2
    exit "$EXIT_ASK_RELOAD"
  }
  rw_looks=$3
  rw_first=$7
  if [ -n "$rw_answer" ]; then
    printf '%s\n' "$rw_answer" | sed 's/^/hafleet-answer /'
    # A master that answers does so once the new worker is up or failed: look at once.
    rw_first=0
  fi
  case $rw_answer in
    Success=0*)
      rw_looks=1
      rw_first=0
      ;;
  esac
  [ "$rw_first" = 0 ] || sleep "$rw_first"
  rw_n=0
  rw_st=
  rw_end=$(($(date +%s) + $4))
  # The awk program prints `done <reloads>` for exactly our reload (one more, none failed, a
  # new worker), `settled` for any other outcome, and nothing (exit 1) while it is pending.
  while :; do
    rw_out=$(printf '%s\n' "show proc" | socat -t 1 stdio "unix-connect:$2" 2>/dev/null) &&
      rw_st=$(printf '%s\n' "$rw_out" | awk -v r="$rb_reloads" -v f="$rb_failed" \
        -v pids=" $rb_pids " '
        $2 == "master" { mr = $3; mf = $5; sub(/]/, "", mf) }
        $2 == "worker" && $3 == "0" && index(pids, " " $1 " ") == 0 { nw = 1 }
        END {
          if (mr == "" || mr == r) exit 1
          if (mf != f) { print "settled"; exit 0 }
          if (!nw) exit 1
          if (mr == r + 1) print "done " mr
          else print "settled"
        }
      ') &&
      [ -n "$rw_st" ] &&
      break
    rw_n=$((rw_n + 1))
    [ "$rw_n" -lt "$rw_looks" ] || break
    [ "$rw_n" -lt 10 ] || [ "$(date +%s)" -lt "$rw_end" ] || break
    sleep 0.003
  done
  printf '%s\n' "$rw_out"
  echo "hafleet-looks $rw_n"
  case $rw_st in
    "done "*)
      tell_version "$2" "$8"
      if [ -n "$5" ] && (mark_loaded "$1" "$5" "${rw_st#done }" "$6") >/dev/null 2>&1; then
        echo hafleet-marked-loaded
      fi
      ;;
  esac
}

# tell_version SOCKET VERSION: tells the master's current worker (the one that has seen no
# reload; old workers finishing their connections keep what they were told) which version it
# serves, as `proc.hafleet_version` (access logs print it). Best effort: a master that
# refuses (an HAProxy without `set var` on its CLI) changes nothing else. VERSION is digits
# only.
tell_version() {
  [ -n "$1" ] && [ -n "$2" ] || return 0
  tv_pid=$(printf '%s\n' "show proc" | socat -t 2 stdio "unix-connect:$1" 2>/dev/null |
    awk '$2 == "worker" && $3 == "0" { print $1; exit }')
  [ -n "$tv_pid" ] || return 0
  printf 'experimental-mode on; @!%s set var proc.hafleet_version str(%s)\n' "$tv_pid" "$2" |
    socat -t 2 stdio "unix-connect:$1" >/dev/null 2>&1 || true
  return 0
}

# mark_loaded LIVE SHA256 RELOADS UPSTAT: records the live file's sha256 (and RELOADS, the
# master's reload count after our reload, if given, and the file's device, inode, size and
# times if they did not change while it was hashed) as what HAProxy has loaded, in
# LIVE.hafleet-loaded, and the file as last-known-good, LIVE.hafleet-last-good: both
# written under temporary names, synced (one `sync`), renamed, and the folder synced. Run
# only after a verified reload or runtime change and passed probes. Fails (status 1) if the
# live file is not SHA256 (empty: whatever is live, after a restore). A live file with the
# stat UPSTAT (`%i %s %y`, of the upload that became it) is that upload, whose sha256 was
# checked on arrival: it is not hashed again.
# Then, best effort, deletes map files that neither the live config nor last-known-good
# names, once they are an hour old (an upload of another attempt may not be swapped in yet),
# or two minutes old when more than MAPS_KEPT of them are;
# the configs are read for the names they use only when there is such a file. Certificate
# files (and their keys) go the same way: kept while the live or last-known-good config, or a
# crt-list either names, lists them.
mark_loaded() {
  ml_s1=$(stat -c '%d %i %s %y %z' "$1") || return 1
  if [ -n "$2" ] && [ -n "$4" ] && [ "$(stat -c '%i %s %y' "$1")" = "$4" ]; then
    ml_sha=$2
    ml_s2=$ml_s1
  else
    ml_sha=$(sha256sum "$1" | cut -d' ' -f1)
    ml_s2=$(stat -c '%d %i %s %y %z' "$1") || return 1
  fi
  if [ -n "$2" ] && [ "$ml_sha" != "$2" ]; then
    echo "live file is $ml_sha, not $2: another applier swapped it" >&2
    return 1
  fi
  printf '%s\n' "$ml_sha" > "$1.hafleet-loaded.tmp" || return 1
  if [ -n "$3" ]; then
    printf 'reloads %s\n' "$3" >> "$1.hafleet-loaded.tmp" || return 1
  fi
  if [ "$ml_s1" = "$ml_s2" ]; then
    printf 'stat %s\n' "$ml_s1" >> "$1.hafleet-loaded.tmp" || return 1
  fi
  cp -p "$1" "$1.hafleet-last-good.tmp" || return 1
  sync_files "$1.hafleet-loaded.tmp" "$1.hafleet-last-good.tmp"
  mv -f "$1.hafleet-loaded.tmp" "$1.hafleet-loaded" || return 1
  mv -f "$1.hafleet-last-good.tmp" "$1.hafleet-last-good" || return 1
  sync_files "$(dir_of "$1")"
  # Both sweeps when there is something an hour old (one `find` for both folders). The
  # maps' also when more than MAPS_KEPT map files are two minutes old: each version brings
  # map files of its own (half a megabyte at 10,000 routes), so an hour of changes a second
  # would hold gigabytes; an upload of another attempt is seconds old.
  ml_d=$(dir_of "$1")
  ml_age=
  if [ -n "$(find "$ml_d/hafleet-maps" "$ml_d/hafleet-certs" -maxdepth 1 -type f -mmin +60 \
    2>/dev/null)" ]; then
    sweep_certs "$1"
    ml_age=60
  fi
  ml_n=$(find "$ml_d/hafleet-maps" -maxdepth 1 -type f -mmin +2 2>/dev/null | {
    ml_c=0
    while read -r _; do ml_c=$((ml_c + 1)); done
    echo "$ml_c"
  })
  [ "$ml_n" -le "$MAPS_KEPT" ] || ml_age=2
  [ -z "$ml_age" ] || sweep_maps "$1" "$ml_age"
  return 0
}

# sweep_certs LIVE: deletes certificate files an hour old that neither LIVE nor
# LIVE.hafleet-last-good, nor a crt-list either names, lists (a rotated key, an upload left
# behind). Best effort.
sweep_certs() {
  sc_dir="$(dir_of "$1")/hafleet-certs"
  [ -d "$sc_dir" ] || return 0
  sc_old=$(find "$sc_dir" -maxdepth 1 -type f -mmin +60)
  [ -n "$sc_old" ] || return 0
  sc_lists=$(cat "$1" "$1.hafleet-last-good" 2>/dev/null |
    grep -o 'hafleet-maps/crtlist-[0-9a-f]*\.map' | sort -u)
  sc_keep=$(
    {
      cat "$1" "$1.hafleet-last-good" 2>/dev/null
      for sc_list in $sc_lists; do
        cat "$(dir_of "$1")/$sc_list" 2>/dev/null
      done
    } | grep -o 'hafleet-certs/[0-9a-f]*\.pem' | sort -u
  )
  printf '%s\n' "$sc_old" | while read -r sc_f; do
    case $sc_keep in
      *"hafleet-certs/$(basename "$sc_f")"*) ;;
      *) rm -f "$sc_f" ;;
    esac
  done
  return 0
}

# sweep_maps LIVE MINUTES: deletes map files MINUTES old that neither LIVE nor
# LIVE.hafleet-last-good names. Best effort.
sweep_maps() {
  sm_dir="$(dir_of "$1")/hafleet-maps"
  [ -d "$sm_dir" ] || return 0
  sm_old=$(find "$sm_dir" -maxdepth 1 -type f -mmin "+$2")
  [ -n "$sm_old" ] || return 0
  sm_keep=$(cat "$1" "$1.hafleet-last-good" 2>/dev/null |
    grep -o 'hafleet-maps/[a-z]*-[0-9a-f]*\.map' | sort -u)
  printf '%s\n' "$sm_old" | while read -r sm_f; do
    case $sm_keep in
      *"hafleet-maps/$(basename "$sm_f")"*) ;;
      *) rm -f "$sm_f" ;;
    esac
  done
  return 0
}
