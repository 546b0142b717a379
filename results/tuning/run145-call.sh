#!/usr/bin/env bash
# Run 145 (prepared 2026-12-06), one device call (carry .gpu and .carry; COMMIT: this tree's commit), within TOTAL
# seconds: test_chain_first_same_bits (the pass with scalar_gate.CHAIN_FIRST 1 and 2 against 0, bit for bit; a
# deadlocked barrier protocol would hang it, so TEST_S is short), then run145-gdn.py with what is left but 15 s. Where
# a value passes and wins, CHAIN_FIRST takes it.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-120} tests/test_gpu_scalar_gate.py -k "chain_first"
left=$(( start + ${TOTAL:-480} - 15 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run145-gdn.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-400
echo "done after $(( $(date +%s) - start )) s"
