#!/usr/bin/env bash
# Run 114, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# 1. run114-split-host.py within SPLIT_S seconds: the split's and the routed op's time by do_bench, back to back
#    (the host's share) and by the profiler, launch by launch;
# 2. on an H200 the stale records (rerecord_rest) with what is left; on another card the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
timeout -k 5 ${SPLIT_S:-200} python results/tuning/run114-split-host.py 2>&1 | grep "^{\|Error" | cut -c1-400
if nvidia-smi -L | grep -q H200; then rerecord_rest
else timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"; fi
echo "done after $(( $(date +%s) - start )) s"
