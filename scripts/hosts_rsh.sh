#!/usr/bin/env bash
# OpenMPI's remote-shell agent for scripts/hosts.sh (its plm_rsh_agent): where ssh would log in to HOST and run
# the command line (OpenMPI's orted daemon with its arguments), this enters HOST's network namespace on this
# machine and runs the command line there with /bin/sh, as a remote login shell would.
#   hosts_rsh.sh [ssh-style options...] HOST COMMAND...
# HOST is a namespace name made by hosts.sh (<prefix>-h<i>); anything else is refused, so a hostfile that
# names a real machine fails loudly instead of starting the daemon on the launcher.
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do  # ssh options OpenMPI may pass (-x, -T, -o ...)
  case "$1" in -o|-p|-l|-i) shift 2 ;; *) shift ;; esac
done
[ $# -ge 2 ] || { echo "hosts_rsh.sh: usage: hosts_rsh.sh HOST COMMAND..." >&2; exit 2; }
host="$1"; shift
if ! ip netns list 2>/dev/null | awk '{print $1}' | grep -qx -- "$host"; then
  echo "hosts_rsh.sh: '$host' is not a network namespace made by scripts/hosts.sh (ip netns list:" \
       "$(ip netns list 2>/dev/null | awk '{print $1}' | tr '\n' ' ')); is the hostfile for this set of hosts?" >&2
  exit 255
fi
# A host of its own has its own /tmp: OpenMPI names its session directory after the hostname (the same in every
# namespace) and the job, so daemons sharing /tmp collide ("mkdir /tmp/ompi.<host>.0/jf.N: File exists") and one
# of them dies. Each host gets a private temporary directory (removed by hosts.sh down).
tmp="${MT_HOSTS_TMP:-/tmp/mt-hosts}/$host"
mkdir -p "$tmp"
export TMPDIR="$tmp" OMPI_MCA_orte_tmpdir_base="$tmp"
# The ranks inherit the daemon's environment: meshtrain's flight recorder names a rank's host by it (every
# namespace has the machine's hostname).
export MESHTRAIN_HOST="$host"
exec ip netns exec "$host" /bin/sh -c "$*"
