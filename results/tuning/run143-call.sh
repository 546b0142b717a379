#!/usr/bin/env bash
# Run 143 (2026-12-06), one device call (carry .gpu and .carry; COMMIT: this tree's commit): run141-gdn.py alone on
# whatever card comes (run 141 ran its GPU tests on an H200 and then the stale records, not the timing), within
# TOTAL seconds.
set -u
source "$(dirname "$0")/device-env.sh"
left=$(( start + ${TOTAL:-500} - 15 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run141-gdn.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-400
echo "done after $(( $(date +%s) - start )) s"
