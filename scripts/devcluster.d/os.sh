# shellcheck shell=bash
# The Slurm release the dev cluster runs. Sourced by scripts/devcluster (needs HERE CONF_DIR
# STATE_DIR LOG_DIR RUN_DIR and die/say).
#
# DDL_DEVCLUSTER_SLURM picks it: 22.05 is this host's own Debian 12 packages; 24.11 and 26.05 come
# from the Debian trixie and forky chroots that scripts/slurm-chroot builds and caches in
# /var/cache/ddlaunch-slurm (built by `up` on first use: a few minutes, network needed). With a
# chroot:
#   - every Slurm daemon and client runs inside it, in one mount namespace ($RUN_DIR/os/SUITE.mnt)
#     where the chroot also sees the host's /proc, /sys, /dev and /etc/hosts, the dev cluster's own
#     directories, /usr/local, /var/tmp, and every top-level directory that holds users' files
#     rather than the OS (/root, /home, /tmp, /opt, a checkout's /work, ...). As on a real cluster,
#     the nodes run their own OS and share the users' files: a rank runs the login node's Python
#     (which must live in one of those directories: pyenv, conda, a venv of either) and a run
#     directory has the same path everywhere. The munged and MariaDB of the dev cluster stay the
#     host's (their protocols do not depend on the Slurm release).
#   - $RUN_DIR/bin holds one wrapper per Slurm client (sbatch, srun, squeue, ...) that runs the
#     chroot's client in that namespace, from the caller's working directory. `up` says to put it
#     first on PATH; the tests do (tests/conftest.py). Inside the chroot (batch scripts, ranks) the
#     same names run the chroot's clients directly. Entering the namespace needs root. (On the
#     host's own release the wrappers run the host's clients; on every release they note their
#     calls: os_clients.)
# Each release keeps its own Slurm state ($STATE_DIR/slurm-RELEASE) and accounting database, since
# a controller's saved state and a database schema are not read by an older release.

readonly SLURM_CACHE=${DDLAUNCH_SLURM_CACHE:-/var/cache/ddlaunch-slurm}
readonly HOST_SLURM=22.05
readonly OS_MARK=.ddlaunch-slurm-built # at the root of every chroot slurm-chroot built
readonly CLIENTS=(sacct sacctmgr salloc sattach sbatch sbcast scancel scontrol scrontab sdiag sinfo
  sprio squeue sreport srun sshare sstat strigger)
# Top-level directories of the OS image, never mounted from the host into a chroot.
readonly OS_DIRS=" bin boot dev etc lib lib32 lib64 libx32 lost+found proc run sbin sys usr var "
# the caller's PATH without the clients' directory (a caller that uses the clients has it first)
PATH_WITHOUT_CLIENTS=$(printf '%s' "$PATH" | tr : '\n' | grep -vxF "$RUN_DIR/bin" | paste -sd:)
readonly PATH_WITHOUT_CLIENTS

known_releases() {
  echo "$HOST_SLURM (this host's Debian 12 packages), 24.11 (Debian trixie, in a chroot)," \
    "26.05 (Debian forky, in a chroot)"
}

# suite_of RELEASE: the Debian suite whose chroot runs RELEASE; empty for the host's own packages.
suite_of() {
  case $1 in
    "$HOST_SLURM") echo "" ;;
    24.11) echo trixie ;;
    26.05) echo forky ;;
    *) die "DDL_DEVCLUSTER_SLURM must be one of: $(known_releases); got '$1'" ;;
  esac
}

# saved_slurm: the release the settings file remembers (empty if none: a cluster from before the
# setting existed ran the host's packages).
saved_slurm() {
  [ -r "$SETTINGS" ] && sed -n 's/^DDL_DEVCLUSTER_SLURM=\([0-9][0-9.]*\)$/\1/p' "$SETTINGS"
  return 0
}

saved_slurm_or_host() {
  local val
  val=$(saved_slurm)
  echo "${val:-$HOST_SLURM}"
}

# slurm_setting: DDL_DEVCLUSTER_SLURM, else the remembered release, else the host's.
slurm_setting() {
  local val=${DDL_DEVCLUSTER_SLURM:-$(saved_slurm_or_host)}
  suite_of "$val" >/dev/null
  echo "$val"
}

# os_select RELEASE: set SLURM_SUITE, OS_ROOT, OS_NS, OS_EXEC (the prefix that runs a command of
# the release's OS), SLURM_STATE, DB_NAME and PATH (the release's clients first) for RELEASE.
os_select() {
  SLURM=$1
  SLURM_SUITE=$(suite_of "$1")
  if [ -z "$SLURM_SUITE" ]; then
    OS_ROOT="" OS_NS="" OS_EXEC=()
    # the host release keeps the paths the dev cluster has always used
    SLURM_STATE=$STATE_DIR DB_NAME=ddlaunch_devcluster_acct
    PATH=$PATH_WITHOUT_CLIENTS
  else
    OS_ROOT=$SLURM_CACHE/$SLURM_SUITE
    OS_NS=$RUN_DIR/os/$SLURM_SUITE.mnt
    OS_EXEC=(nsenter "--mount=$OS_NS" --) # whose / is the release's OS (os_mounts)
    SLURM_STATE=$STATE_DIR/slurm-$1 DB_NAME=ddlaunch_devcluster_acct_${1//./_}
    PATH=$RUN_DIR/bin:$PATH_WITHOUT_CLIENTS
  fi
  export PATH
  SLURMD_TIMEOUT=$(slurmd_timeout_of "$1")
}

# slurmd_timeout_of RELEASE: the SlurmdTimeout its cluster runs with. 10 s (a dead node DOWN after
# ~26 s) except on 24.11: 24.11.5's controller set busy, answering nodes DOWN with no failed ping
# before it (its log: "not responding, setting DOWN", then "returned to service" in the same
# second, with no "now responding"), each time beside a node a test had just killed: 35 times in
# one day's matrix runs on this 2-core machine, so a job lost its batch host and was requeued
# (an attempt the test had not made). 22.05 and 26.05 never did so under the same tests.
slurmd_timeout_of() {
  case $1 in
    24.11) echo 30 ;;
    *) echo 10 ;;
  esac
}

# os_build: make sure the selected release's chroot exists (scripts/slurm-chroot build: cached, or
# built now). Runs before `up` touches anything, so a chroot that cannot be built leaves the
# running cluster as it was.
os_build() {
  [ -n "$SLURM_SUITE" ] || return 0
  "$HERE/slurm-chroot" build "$SLURM_SUITE" >&2 ||
    die "Slurm $SLURM needs the $SLURM_SUITE chroot, which could not be built (above); the running cluster is left as it was"
}

# shared_dirs: what the chroot sees of the host, besides /proc, /sys, /dev and /etc/hosts.
shared_dirs() {
  local d
  echo "$CONF_DIR" "$STATE_DIR" "$LOG_DIR" /usr/local /var/tmp
  for d in /*; do
    [ -d "$d" ] && [ ! -L "$d" ] || continue
    [[ "$OS_DIRS" == *" ${d#/} "* ]] || echo "$d"
  done
}

# os_mounts ROOT DIR...: run inside the new mount namespace: the host's view under ROOT, then
# ROOT made the namespace's root (pivot_root), so that whatever enters the namespace (nsenter
# --mount) runs in the release's OS with no chroot call: Apptainer refuses to run in a chroot
# ("Running inside a weak chrooted environment, prefer pivot_root"), and a / that is no mount
# point of its own ("Failed to set mount propagation: Invalid argument"). RUN_DIR is mounted
# without its submounts (the namespace files themselves); the host's root is let go.
os_mounts() {
  local root=$1 run_dir=$2 d
  shift 2
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  [ -e "$root/etc/hosts" ] || touch "$root/etc/hosts"
  mount --bind /etc/hosts "$root/etc/hosts"
  mkdir -p "$root$run_dir"
  mount --bind "$run_dir" "$root$run_dir"
  for d in "$@"; do
    mkdir -p "$root$d"
    mount --rbind "$d" "$root$d"
  done
  mkdir -p "$root/.host-root"
  cd "$root" && pivot_root . .host-root && umount -l /.host-root
}

# os_ns_up: the selected chroot's mount namespace, made once (kept in $RUN_DIR/os/SUITE.mnt).
os_ns_up() {
  [ -n "$SLURM_SUITE" ] || return 0
  # (inside, / is the release's OS: its marker, and /proc mounted)
  if mountpoint -q "$OS_NS" 2>/dev/null &&
    nsenter --mount="$OS_NS" -- sh -c "[ -e /$OS_MARK ] && mountpoint -q /proc"; then
    return 0
  fi
  mkdir -p "$RUN_DIR/os"
  # a persistent namespace file must sit on a private mount
  if ! mountpoint -q "$RUN_DIR/os"; then
    mount --bind "$RUN_DIR/os" "$RUN_DIR/os"
    mount --make-private "$RUN_DIR/os"
  fi
  umount "$OS_NS" 2>/dev/null || true
  touch "$OS_NS"
  unshare --mount="$OS_NS" --propagation private true || die "could not make a mount namespace for the $SLURM_SUITE chroot"
  # shellcheck disable=SC2046 # shared_dirs prints one path per word
  nsenter --mount="$OS_NS" -- bash -c "$(declare -f os_mounts); os_mounts \"\$@\"" _ \
    "$OS_ROOT" "$RUN_DIR" $(shared_dirs) || die "could not mount the host's directories into $OS_ROOT"
}

# os_ns_down: drop every chroot namespace (the mounts inside go with it).
os_ns_down() {
  local f
  for f in "$RUN_DIR"/os/*.mnt; do
    [ -e "$f" ] || continue
    umount "$f" 2>/dev/null || true
    rm -f "$f"
  done
  if mountpoint -q "$RUN_DIR/os" 2>/dev/null; then umount "$RUN_DIR/os" || true; fi
  return 0
}

# os_clients: $RUN_DIR/bin, one wrapper per Slurm client of the selected release: the chroot's
# client run in its namespace, or the host's own (22.05). Every wrapper also notes its call
# (calls_line) in $LOG_DIR/slurm-calls-RELEASE.log, which scripts/slurm-calls reads to say which
# commands and flags each release's tests ran.
os_clients() {
  local c tmp
  rm -rf "$RUN_DIR/bin"
  tmp=$(mktemp -d "$RUN_DIR/bin.XXXXXX")
  for c in "${CLIENTS[@]}"; do
    if [ -z "$SLURM_SUITE" ]; then
      [ -x "/usr/bin/$c" ] || continue
      {
        echo "#!/bin/sh"
        echo "# written by ddlaunch scripts/devcluster: Slurm $SLURM's $c (this host's)"
        calls_line "$c"
        echo "exec /usr/bin/$c \"\$@\""
      } >"$tmp/$c"
    else
      [ -x "$OS_ROOT/usr/bin/$c" ] || continue
      {
        echo "#!/bin/sh"
        echo "# written by ddlaunch scripts/devcluster: Slurm $SLURM's $c (the Debian $SLURM_SUITE chroot $OS_ROOT)"
        calls_line "$c"
        cat <<EOF
if [ -e /$OS_MARK ]; then exec /usr/bin/$c "\$@"; fi
exec nsenter --mount=$OS_NS -- /bin/sh -c '
cd "\$0" 2>/dev/null || { echo "$c: \$0 is not shared with the Slurm $SLURM nodes; running from /" >&2; cd /; }
exec /usr/bin/$c "\$@"' "\$PWD" "\$@"
EOF
      } >"$tmp/$c"
    fi
    chmod 755 "$tmp/$c"
  done
  chmod 755 "$tmp"
  mv "$tmp" "$RUN_DIR/bin"
}

# calls_line CLIENT: the wrapper's lines that note its call, as one line of tab-separated fields
# (who called: $DDL_DEVCLUSTER_CALLER, "ddlaunch" unless the tests' harness says so; the client;
# its arguments; for sbatch, "#SBATCH" and the options of its script, the last argument),
# written with one write, so that concurrent callers' lines do not mix. Only where the caller
# may write the log (root, as the tests run): a user's own call is not noted.
calls_line() {
  local log="$LOG_DIR/slurm-calls-$SLURM.log"
  cat <<EOF
if [ -w $LOG_DIR ]; then
  ddl_line="\${DDL_DEVCLUSTER_CALLER:-ddlaunch}	$1"
  for ddl_a in "\$@"; do ddl_line="\$ddl_line	\$ddl_a"; ddl_last=\$ddl_a; done
EOF
  if [ "$1" = sbatch ]; then
    cat <<'EOF'
  if [ -f "${ddl_last:-}" ]; then
    ddl_line="$ddl_line	#SBATCH	$(sed -n 's/^#SBATCH[[:space:]]*\([^[:space:]=]*\).*/\1/p' "$ddl_last" | tr '\n' ' ')"
  fi
EOF
  fi
  cat <<EOF
  ddl_line=\$(printf '%s' "\$ddl_line" | tr '\n' ' ')
  printf '%s\n' "\$ddl_line" >>$log 2>/dev/null || true
fi
EOF
}
