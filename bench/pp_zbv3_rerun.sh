#!/bin/sh
# Issue 26 (zb-v <= 0.78x 1F1B at m 8, 1 MB): A/B of the message path before and after branch zbv3, one binary.
#   A: --message-copy: the executor's copy of every activation and gradient into its message, as before zbv3;
#   B: the defaults: activations and gradients written by the emulated forward and backward straight into their
#      message buffers (StageRunner::forward_into, backward_into).
# Alternating A, B in one job; 3 pairs of `bench pipeline --stages 4 --micro-batches 8 --steps 6` with zb-h2 and zb-v
# (each run also runs 1F1B): about 4.5 minutes on the idle 2-core guest.
#   sh bench/pp_zbv3_rerun.sh [path/to/meshtrain] [pairs]
set -e
BIN=$(readlink -f "${1:-build/meshtrain}")
PAIRS=${2:-3}
HERE=$(dirname "$0")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat > "$TMP/A" <<EOT
#!/bin/sh
exec "$BIN" "\$@" --message-copy
EOT
chmod +x "$TMP/A"
uname -r
uptime
/usr/bin/python3 "$HERE/pp_p2p_ab.py" --a "$TMP/A" --b "$BIN" --pairs "$PAIRS" --steps 6 --activation-kb 1024 \
  --schedules zb-h2,zb-v
uptime
