#!/usr/bin/env bash
# Run 147 (prepared 2026-12-07), one device call (carry .gpu and .carry; COMMIT: this tree's commit), within TOTAL
# seconds: run 146's GPU tests (the single-chunk kernels, chain_first, many short sequences), the traced pass's and the
# gate-free inverse's within TEST_S; run144-gdn.py (short packed sequences through the single-chunk kernels) within
# SHORT_S; run147-trace.py (GDN's pass warpgroup by warpgroup) within TRACE_S; then run148-inverse.py (GDN's first
# kernel with the heads first, fewer chunks a block; the op with the gate-free inverse) within what is left but 15 s.
# With RECORDS=1 on an H200 the stale records follow the tests instead (ask with needs_h200=True).
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-200} tests/test_gpu_scalar_gate.py tests/test_gpu_level5.py \
  -k "single_chunk or many_short or chain_first or traced_pass or gate_free"
if [ "${RECORDS:-0}" = 1 ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  rerecord_rest
  exit 0
fi
timeout -k 5 ${SHORT_S:-180} python results/tuning/run144-gdn.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-400
timeout -k 5 ${TRACE_S:-150} python results/tuning/run147-trace.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-3000
left=$(( start + ${TOTAL:-560} - 15 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run148-inverse.py compile time gate_free 2>&1 | grep "^{\|Error\|error" \
  | grep -v '"compile"' | cut -c1-300
echo "done after $(( $(date +%s) - start )) s"
