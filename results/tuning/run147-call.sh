#!/usr/bin/env bash
# Run 147 (prepared 2026-12-07), one device call (carry .gpu and .carry; COMMIT: this tree's commit), within TOTAL
# seconds: run 146's GPU tests (the single-chunk kernels, chain_first, many short sequences) and the traced pass's test
# within TEST_S, then run147-trace.py (GDN's pass warpgroup by warpgroup) within TRACE_S, run148-inverse.py (GDN's first
# kernel with the heads first, fewer chunks a block) within INVERSE_S (not with RECORDS), then run144-gdn.py (short
# packed sequences through the single-chunk kernels) within what is left but 15 s. The trace times chain_first on
# the pass alone; run145-gdn.py (chain_first through the ops) waits for a call of its own if it wins there. With
# RECORDS=1 on an H200 the stale records follow the trace instead of the timings (ask with needs_h200=True).
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-200} tests/test_gpu_scalar_gate.py tests/test_gpu_level5.py \
  -k "single_chunk or many_short or chain_first or traced_pass"
timeout -k 5 ${TRACE_S:-150} python results/tuning/run147-trace.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-3000
if [ "${RECORDS:-0}" = 1 ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  rerecord_rest
  exit 0
fi
timeout -k 5 ${INVERSE_S:-100} python results/tuning/run148-inverse.py compile time 2>&1 | grep "^{\|Error\|error" \
  | grep -v '"compile"' | cut -c1-300
left=$(( start + ${TOTAL:-560} - 15 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run144-gdn.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-400
echo "done after $(( $(date +%s) - start )) s"
