#!/usr/bin/env bash
# Run 146 (prepared 2026-12-06): runs 144 and 145 in one device call (carry .gpu and .carry; COMMIT: this tree's commit),
# within TOTAL seconds: the GPU tests of what landed off on 2026-12-06 (the single-chunk kernels, chain_first, and the
# tests of many short sequences) within TEST_S, then run145-gdn.py and run144-gdn.py, each within half of what is left
# but 15 s. On an H200, the stale records come before the timing (rerecord_rest) where RECORDS=1.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-200} tests/test_gpu_scalar_gate.py tests/test_gpu_level5.py -k "single_chunk or many_short or chain_first"
if [ "${RECORDS:-0}" = 1 ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  rerecord_rest
  exit 0
fi
half=$(( (start + ${TOTAL:-560} - 15 - $(date +%s)) / 2 ))
timeout -k 5 $half python results/tuning/run145-gdn.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-400
left=$(( start + ${TOTAL:-560} - 15 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run144-gdn.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-400
echo "done after $(( $(date +%s) - start )) s"
