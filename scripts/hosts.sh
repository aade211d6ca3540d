#!/usr/bin/env bash
# K "hosts" on one machine, as Linux network namespaces, for trying meshtrain's multi-host runs without a
# cluster. Each host is a namespace <P>-h<i> with its own loopback and one interface eth0 (address
# 10.77.0.<i+1>/24); eth0 is one end of a veth pair whose other end, v<i>, is a port of the bridge br0 in the
# namespace <P>-net (the switch). <P>-net also holds the launcher's address 10.77.0.254 on br0: mpirun runs
# there and reaches its daemons (orted) over the same bridge. Nothing is added to the machine's own network
# namespace (no address, no route, no interface): the private range exists only inside these namespaces and
# traffic never leaves the machine. Namespaces share the filesystem, /dev/shm and process table with the
# machine; only the network is separate, so MPI is told to use TCP only (btl tcp,self, pml ob1): no shared
# memory between hosts.
#
#   [<P>-h0: lo, eth0 10.77.0.1] ==veth== v0 \
#   [<P>-h1: lo, eth0 10.77.0.2] ==veth== v1 -- br0 10.77.0.254  [<P>-net: the switch and mpirun]
#   ...                                      /
#
# Commands (P is --prefix, default mt; several sets with different prefixes can exist at once):
#   hosts.sh up K [--rate R]      make K hosts (tearing down an older set with the same prefix first);
#                                 with --rate, every link gets R each way (tc tbf: e.g. 100mbit, 1gbit)
#   hosts.sh down                 remove the set: kill what still runs in its namespaces, delete them
#                                 (idempotent: nothing to remove is not an error, also after a crash)
#   hosts.sh status               namespaces, addresses, qdiscs and byte counters of the set
#   hosts.sh rate I R | off       limit host I's link to R each way (tbf), or remove the limit
#   hosts.sh cut I | heal I       take host I's link down (ip link set down) or bring it back up
#   hosts.sh bytes                one line per host, "h<i> TX RX" (bytes of its eth0), then "launcher TX RX" (br0
#                                 in <P>-net: the launcher's own traffic, mpirun to its daemons). Bytes between
#                                 hosts = the hosts' TX summed minus the launcher's RX.
#   hosts.sh hostfile N           an OpenMPI hostfile with N slots on every host (to stdout)
#   hosts.sh mpirun N ARGS...     mpirun over all K hosts with N ranks per host (ranks by host: rank r runs on
#                                 host r / N), TCP only, from the launcher namespace; ARGS is the program.
#                                 A job that failed but that mpirun cannot end (a host behind a cut link) is
#                                 ended MT_HOSTS_GRACE s (default 15) later; after every job whatever is left on
#                                 the hosts is killed; after a failed meshtrain job with --metrics M the ranks'
#                                 flight recorder rings are gathered (meshtrain flight --metrics M). One job per
#                                 set at a time (the clean-up kills everything on the set's hosts).
#   hosts.sh exec I CMD...        run CMD inside host I's namespace
# Exit status: 0 on success; 2 on a usage error; 3 when namespaces cannot be made here (not root, no `ip`,
# no veth/bridge support), with the reason on stderr (tests skip on 3).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PREFIX="${MT_HOSTS_PREFIX:-mt}"
SUBNET=10.77.0
RATE=""

die() { echo "hosts.sh: $*" >&2; exit 2; }
cannot() { echo "hosts.sh: cannot make network namespaces here: $*" >&2; exit 3; }

args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || die "--prefix needs a value"; PREFIX="$2"; shift 2 ;;
    --rate) [ $# -ge 2 ] || die "--rate needs a value (e.g. 100mbit)"; RATE="$2"; shift 2 ;;
    --) shift; args+=("$@"); break ;;
    *) args+=("$1"); shift
       # everything after `mpirun N` or `exec I` belongs to the program
       if [ ${#args[@]} -eq 2 ] && { [ "${args[0]}" = mpirun ] || [ "${args[0]}" = exec ]; }; then
         args+=("$@"); break
       fi ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"
[ $# -ge 1 ] || die "usage: hosts.sh [--prefix P] up K [--rate R] | down | status | rate I R|off | cut I | heal I | bytes | hostfile N | mpirun N PROGRAM... | exec I CMD..."
# Interface names are at most 15 bytes and namespace names become file names: keep the prefix short and plain.
[[ "$PREFIX" =~ ^[A-Za-z0-9][A-Za-z0-9_]{0,9}$ ]] || die "--prefix '$PREFIX' must be 1-10 letters, digits or _"
NET="$PREFIX-net"

host_ns() { echo "$PREFIX-h$1"; }
hosts() {  # the host indices of the current set, in order
  ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^$PREFIX-h\([0-9][0-9]*\)\$/\1/p" | sort -n
}
need_set() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$NET" || die "no hosts with prefix '$PREFIX' (run: hosts.sh up K)"; }
need_host() {
  [[ "$1" =~ ^[0-9]+$ ]] || die "host index '$1' is not a number"
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$(host_ns "$1")" || die "no host $1 in set '$PREFIX' (hosts: $(hosts | tr '\n' ' '))"
}

preflight() {
  [ "$(id -u)" = 0 ] || cannot "not root (uid $(id -u)); network namespaces, veth pairs and bridges need CAP_NET_ADMIN"
  command -v ip > /dev/null || cannot "the ip command is missing (Debian package iproute2)"
}

down() {
  local ns pids
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-(net|h[0-9]+)\$" || true); do
    # Processes left in a namespace (a crashed run's orted or ranks) keep it alive after `ip netns del`.
    read -ra pids <<< "$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ' || true)"
    if [ ${#pids[@]} -gt 0 ]; then
      kill -KILL "${pids[@]}" 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true  # its veth ends go with it, and so do their peers
  done
  # the hosts' private temporary directories (hosts_rsh.sh) and the launcher's (run_mpirun)
  rm -rf "${MT_HOSTS_TMP:-/tmp/mt-hosts}/$PREFIX"-h* "${MT_HOSTS_TMP:-/tmp/mt-hosts}/$PREFIX-net"
}

set_rate() {  # set_rate I RATE|off: tbf on both directions of host I's link
  local i="$1" r="$2" ns; ns="$(host_ns "$i")"
  ip -n "$ns" link show eth0 > /dev/null 2>&1 || die "host $i has no eth0"
  tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
  tc -n "$NET" qdisc del dev "v$i" root 2>/dev/null || true
  [ "$r" = off ] && return 0
  # burst: at least one full frame at the rate's timer granularity; 64 KB keeps 1 Gbit/s reachable while a
  # 100 Mbit/s link still shapes to within a few percent over a transfer of megabytes.
  tc -n "$ns" qdisc add dev eth0 root tbf rate "$r" burst 64kb latency 100ms ||
    die "tc tbf with rate '$r' failed on host $i (rates look like 100mbit, 1gbit)"
  tc -n "$NET" qdisc add dev "v$i" root tbf rate "$r" burst 64kb latency 100ms
}

up() {
  local k="$1" i ns
  [[ "$k" =~ ^[0-9]+$ ]] && [ "$k" -ge 1 ] && [ "$k" -le 200 ] || die "up: K '$k' must be 1..200"
  preflight
  down
  ip netns add "$NET" || cannot "ip netns add $NET failed"
  trap down ERR
  ip netns exec "$NET" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 || true
  ip -n "$NET" link set lo up
  ip -n "$NET" link add br0 type bridge || { down; cannot "no bridge support (ip link add type bridge failed)"; }
  ip -n "$NET" addr add "$SUBNET.254/24" dev br0
  ip -n "$NET" link set br0 up
  for ((i = 0; i < k; i++)); do
    ns="$(host_ns "$i")"
    ip netns add "$ns"
    # No IPv6: its neighbour and router chatter would add bytes to the counters the tests read.
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 || true
    ip -n "$ns" link set lo up
    ip -n "$NET" link add "v$i" type veth peer name eth0 netns "$ns" ||
      { down; cannot "no veth support (ip link add type veth failed)"; }
    ip -n "$NET" link set "v$i" master br0
    ip -n "$NET" link set "v$i" up
    ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    [ -z "$RATE" ] || set_rate "$i" "$RATE"
  done
  trap - ERR
  # Wait (bounded) until every host answers the launcher over the bridge.
  for ((i = 0; i < k; i++)); do
    local ok=0 out
    for _ in $(seq 1 50); do
      # A TCP connect to a closed port: "refused" (a reset) proves the path works; no ping needed.
      out="$(ip netns exec "$NET" timeout 2 bash -c "exec 3<>/dev/tcp/$SUBNET.$((i + 1))/9" 2>&1 || true)"
      if [[ "$out" == *refused* ]]; then
        ok=1; break
      fi
      sleep 0.1
    done
    [ "$ok" = 1 ] || { down; cannot "host $i ($SUBNET.$((i + 1))) cannot be reached from the launcher within 5 s"; }
  done
  echo "hosts.sh: $k hosts up: $(for ((i = 0; i < k; i++)); do printf '%s=%s.%d ' "$(host_ns $i)" "$SUBNET" $((i + 1)); done)launcher $NET=$SUBNET.254${RATE:+, links $RATE each way}"
}

hostfile() {
  local n="$1" i
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || die "hostfile: slots '$n' must be >= 1"
  for i in $(hosts); do echo "$(host_ns "$i") slots=$n max_slots=$n"; done
}

# The processes on the set's hosts (daemons and ranks: everything in the hosts' namespaces, not the launcher's),
# one "namespace pid command" line each.
host_procs() {
  local i ns p
  for i in $(hosts); do
    ns="$(host_ns "$i")"
    for p in $(ip netns pids "$ns" 2>/dev/null || true); do
      echo "$ns $p $(cat "/proc/$p/comm" 2>/dev/null || echo '?')"
    done
  done
}

# end_hosts WHY: SIGKILL whatever still runs on the hosts (naming it, with WHY), wait (bounded) until it is gone,
# then empty the hosts' temporary directories (OpenMPI's session directories, which a killed daemon leaves).
end_hosts() {
  local why="$1" left i
  left="$(host_procs)"
  if [ -n "$left" ]; then
    echo "hosts.sh: $why: killing what is left on the hosts: $(echo "$left" |
      awk '{printf "%s%s pid %s (%s)", (NR > 1 ? ", " : ""), $1, $2, $3}')" >&2
    # shellcheck disable=SC2046
    kill -KILL $(echo "$left" | awk '{print $2}') 2>/dev/null || true
    for _ in $(seq 1 50); do
      [ -z "$(host_procs)" ] && break
      sleep 0.1
    done
    left="$(host_procs)"
    [ -z "$left" ] || echo "hosts.sh: still on the hosts after SIGKILL (5 s): $left" >&2
  fi
  if [ -z "$left" ]; then
    for i in $(hosts); do rm -rf "${MT_HOSTS_TMP:-/tmp/mt-hosts}/$(host_ns "$i")"/*; done
  fi
}

run_mpirun() {
  local n="$1"; shift
  [ $# -ge 1 ] || die "mpirun: no program given"
  need_set
  local k hf; k="$(hosts | wc -l)"
  command -v mpirun > /dev/null || die "mpirun is not on PATH (bash scripts/setup.sh mpi)"
  # --metrics M among the program's arguments: failing meshtrain ranks write their flight recorder rings to
  # M.flight.rank<R>.json (src/comm/mpi/mpi_flight.h); after a failed job they are gathered into the verdict.
  local metrics="" prev="" a
  for a in "$@"; do
    [ "$prev" = --metrics ] && metrics="$a"
    case "$a" in --metrics=*) metrics="${a#--metrics=}" ;; esac
    prev="$a"
  done
  # The program: the first argument that is an executable file (mpirun's own options may come first).
  local bin=""
  for a in "$@"; do
    if [ -f "$a" ] && [ -x "$a" ]; then bin="$a"; break; fi
  done
  local prog; prog="$(basename -- "${bin:-$1}")"; prog="${prog:0:15}"  # /proc/PID/comm holds 15 characters
  # Ring files of an earlier job with the same --metrics would read as this job's failure.
  [ -z "$metrics" ] || rm -f "$metrics".flight.rank*.json
  hf="$(mktemp "${TMPDIR:-/tmp}/mt-hostfile.XXXXXX")"
  hostfile "$n" > "$hf"
  local rc=0
  # --map-by ppr:n:node fills host 0 with ranks 0..n-1, host 1 with n..2n-1 (the mesh's tp-fastest order then
  # keeps a tp group of n inside one host). The TCP interfaces are pinned to the private range so neither the
  # runtime (oob) nor MPI (btl) tries another route; vader (shared memory) and UCX are not loaded at all.
  # --leave-session-attached keeps each orted in the foreground of its agent, so an orted that fails is reported
  # and ends the job; daemonized (the default for an rsh agent) it vanished and mpirun waited forever. (The
  # failure was two daemons creating the same session directory in the shared /tmp, 1 launch in 40-60; each host
  # now has its own TMPDIR, see hosts_rsh.sh.)
  # odls_base_sigkill_timeout 5: when the job is aborted, ranks get SIGTERM and 5 s (OpenMPI's default: 1) before
  # SIGKILL, time for meshtrain's ranks to write their flight recorder rings on a loaded machine.
  # mpirun's own session directory goes to a directory of the set's (like the hosts', hosts_rsh.sh), so what a
  # killed mpirun leaves is found and removed below. Only TMPDIR: mpirun hands its OMPI_MCA_* variables on to the
  # daemons' command lines, which would put every daemon's session directory back into one place (hosts_rsh.sh).
  local ltmp="${MT_HOSTS_TMP:-/tmp/mt-hosts}/$NET"
  mkdir -p "$ltmp"
  TMPDIR="$ltmp" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    ip netns exec "$NET" mpirun --hostfile "$hf" -np $((k * n)) --map-by "ppr:$n:node" --bind-to none \
      --mca plm rsh --mca plm_rsh_agent "$HERE/hosts_rsh.sh" --mca plm_rsh_no_tree_spawn 1 --leave-session-attached \
      --mca pml ob1 --mca btl tcp,self --mca osc sm,pt2pt \
      --mca btl_tcp_if_include "$SUBNET.0/24" --mca oob_tcp_if_include "$SUBNET.0/24" \
      --mca odls_base_sigkill_timeout 5 \
      -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM -x MT_HOSTS_PREFIX="$PREFIX" \
      "$@" &
  local mp=$!
  trap 'kill -TERM $mp 2> /dev/null || true' INT TERM HUP
  # The watchdog. mpirun ends a job when a rank fails, but it cannot reach a daemon behind a cut link, and then
  # waits (for its --timeout, or for ever) with that daemon and its ranks still running. Once the job has failed
  # -- with --metrics: a rank wrote its flight recorder ring; without: a rank process has ended while mpirun runs
  # on (which also happens when ranks end normally at different times: a rank still working MT_HOSTS_GRACE
  # seconds after another one ended, e.g. saving a large model, would be cut short; pass --metrics) -- mpirun gets
  # MT_HOSTS_GRACE seconds (default 15) to end by itself; then whatever is left on the hosts is killed, and 5 s
  # later mpirun itself (SIGTERM, then SIGKILL after 5 s more: it does not end when it loses its daemons then).
  local grace="${MT_HOSTS_GRACE:-15}" failed_at="" killed_at="" termed_at="" most=0 now cnt
  while kill -0 "$mp" 2> /dev/null; do
    now=$SECONDS
    if [ -z "$failed_at" ]; then
      if [ -n "$metrics" ]; then  # a shell glob: no process started per poll
        compgen -G "$metrics.flight.rank*.json" > /dev/null && failed_at=$now
      else
        cnt="$(host_procs | awk -v p="$prog" '$3 == p' | wc -l)"
        [ "$cnt" -gt "$most" ] && most="$cnt"
        [ "$cnt" -lt "$most" ] && failed_at=$now
      fi
    elif [ -z "$killed_at" ] && [ $((now - failed_at)) -ge "$grace" ]; then
      end_hosts "the job failed $grace s ago and mpirun has not ended it on host(s) $(host_procs | awk '{print $1}' |
        sort -u | tr '\n' ' ')(mpirun cannot reach them: a link down, or a daemon that does not answer)"
      killed_at=$now
    elif [ -n "$killed_at" ] && [ $((now - killed_at)) -ge 5 ] && [ -z "$termed_at" ]; then
      echo "hosts.sh: mpirun did not end 5 s after its hosts were emptied: ending it (SIGTERM, SIGKILL after 5 s)" >&2
      kill -TERM "$mp" 2> /dev/null || true
      termed_at=$now
    elif [ -n "$termed_at" ] && [ $((now - termed_at)) -ge 5 ]; then
      kill -KILL "$mp" 2> /dev/null || true
    fi
    sleep 0.2
  done
  wait "$mp" || rc=$?
  trap - INT TERM HUP
  rm -f "$hf"
  [ -z "$killed_at" ] || [ "$rc" -ne 0 ] || rc=1
  # Daemons and ranks that outlived mpirun (a daemon behind a cut link; a daemon still exiting gets 2 s).
  for _ in $(seq 1 20); do
    [ -z "$(host_procs)" ] && break
    sleep 0.1
  done
  end_hosts "mpirun has ended (exit $rc)"
  rm -rf "${ltmp:?}"/*
  if [ "$rc" -ne 0 ] && [ -n "$metrics" ] && compgen -G "$metrics.flight.rank*.json" > /dev/null &&
     [ -n "$bin" ] && [ "$(basename -- "$bin")" = meshtrain ]; then
    "$bin" flight --metrics "$metrics" >&2 || true
  fi
  return $rc
}

cmd="$1"; shift
case "$cmd" in
  up) [ $# -eq 1 ] || die "usage: hosts.sh up K [--rate R]"; up "$1" ;;
  down) [ $# -eq 0 ] || die "usage: hosts.sh down"; down ;;
  status)
    need_set
    echo "launcher $NET:"; ip -n "$NET" -br addr show br0
    for i in $(hosts); do
      echo "host $i $(host_ns "$i"): $(ip -n "$(host_ns "$i")" -br addr show eth0)"
      tc -n "$(host_ns "$i")" qdisc show dev eth0 | sed 's/^/  /'
    done ;;
  rate) [ $# -eq 2 ] || die "usage: hosts.sh rate I R|off"; need_host "$1"; set_rate "$1" "$2" ;;
  cut) [ $# -eq 1 ] || die "usage: hosts.sh cut I"; need_host "$1"; ip -n "$(host_ns "$1")" link set eth0 down ;;
  heal) [ $# -eq 1 ] || die "usage: hosts.sh heal I"; need_host "$1"; ip -n "$(host_ns "$1")" link set eth0 up ;;
  bytes)
    need_set
    for i in $(hosts); do
      ns="$(host_ns "$i")"
      echo "h$i $(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes) $(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/rx_bytes)"
    done
    echo "launcher $(ip netns exec "$NET" cat /sys/class/net/br0/statistics/tx_bytes) $(ip netns exec "$NET" cat /sys/class/net/br0/statistics/rx_bytes)" ;;
  hostfile) [ $# -eq 1 ] || die "usage: hosts.sh hostfile N"; need_set; hostfile "$1" ;;
  mpirun) [ $# -ge 2 ] || die "usage: hosts.sh mpirun N PROGRAM [ARGS...]"; run_mpirun "$@" ;;
  exec) [ $# -ge 2 ] || die "usage: hosts.sh exec I CMD..."; need_host "$1"; ns="$(host_ns "$1")"; shift; exec ip netns exec "$ns" "$@" ;;
  *) die "unknown command '$cmd' (up, down, status, rate, cut, heal, bytes, hostfile, mpirun, exec)" ;;
esac
