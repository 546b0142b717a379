#!/usr/bin/env bash
# Run 141 (prepared 2026-12-06), one device call (carry .gpu; COMMIT: the commit of this working tree), within TOTAL
# seconds: tests/test_gpu_scalar_gate.py's pass and op tests with the new test_whole_stores_same_bits, and
# test_gpu_level5.py's test_kda_pass_whole_stores_same_bits (TEST_S seconds), then run141-gdn.py (GDN's pass with
# whole_stores against the default, FlashQLA and fla's Triton GDN; KDA's packed pass the same way) with what is left
# but 15 s (on an H200 the stale records instead). Where a whole_stores form passes and wins, its module's WHOLE_STORES goes on (and its entry in
# tests/test_kernels_compile.py's ELEMENTWISE_BARRIERS_KEPT goes).
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-200} tests/test_gpu_scalar_gate.py tests/test_gpu_level5.py -k \
  "(test_gpu_scalar_gate and not inverse) or kda_pass_whole_stores"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  rerecord_rest                          # the stale records come before tuning
else
  left=$(( start + ${TOTAL:-560} - 15 - $(date +%s) ))
  timeout -k 5 $left python results/tuning/run141-gdn.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-400
fi
echo "done after $(( $(date +%s) - start )) s"
