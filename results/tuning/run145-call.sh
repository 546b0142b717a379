#!/usr/bin/env bash
# Run 145 (prepared 2026-12-06), one device call (carry .gpu and .carry; COMMIT: this tree's commit), within TOTAL
# seconds: the chain_first same-bits tests (GDN's pass with scalar_gate.CHAIN_FIRST 1 and 2 against 0, KDA's with
# gated_state_pass.CHAIN_FIRST; a deadlocked barrier protocol would hang them, so TEST_S is short), then run145-gdn.py
# with what is left but 15 s. Where a value passes and wins, its CHAIN_FIRST takes it.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-150} tests/test_gpu_scalar_gate.py tests/test_gpu_level5.py -k "chain_first"
left=$(( start + ${TOTAL:-480} - 15 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run145-gdn.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-400
echo "done after $(( $(date +%s) - start )) s"
