#!/usr/bin/env bash
# Run 117, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# run117-floor.py within FLOOR_S seconds (the op's split with runs of 128, 64 and 32 chunks at least, FlashQLA's
# automatic split beside it); then on an H200 the stale records (rerecord_rest) with what is left, else the caches.
set -u
source "$(dirname "$0")/device-env.sh"
timeout -k 5 ${FLOOR_S:-200} python results/tuning/run117-floor.py 2>&1 | grep "^{\|Error" | cut -c1-300
if nvidia-smi -L | grep -q H200; then rerecord_rest
else timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"; fi
echo "done after $(( $(date +%s) - start )) s"
