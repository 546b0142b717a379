#!/usr/bin/env bash
# Run 141 (prepared 2026-12-06), one device call (carry .gpu; COMMIT: the commit of this working tree), within TOTAL
# seconds: tests/test_gpu_scalar_gate.py's pass and op tests with the new test_whole_stores_same_bits (TEST_S
# seconds), then run141-gdn.py (the pass with whole_stores against the default, FlashQLA and fla's Triton GDN) with
# what is left but 15 s. If whole_stores passes and wins, kda.kernels.scalar_gate.WHOLE_STORES goes on (and its entry
# in tests/test_kernels_compile.py's ELEMENTWISE_BARRIERS_KEPT goes).
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-200} tests/test_gpu_scalar_gate.py -k "not inverse"
left=$(( start + ${TOTAL:-560} - 15 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run141-gdn.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-400
echo "done after $(( $(date +%s) - start )) s"
