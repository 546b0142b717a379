#!/usr/bin/env bash
# Run 144 (prepared 2026-12-06), one device call (carry .gpu and .carry; COMMIT: this tree's commit), within TOTAL
# seconds: the GPU tests of single_chunk_output (scalar_gate.SINGLE_CHUNK_OUTPUT, off) with the scalar-gate file's
# packed tests (TEST_S seconds), then run144-gdn.py with what is left but 15 s. Where it passes and wins, the switch
# goes on (kda/cuda_paths.py names the log).
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-150} tests/test_gpu_scalar_gate.py -k "single_chunk or packed or short"
left=$(( start + ${TOTAL:-480} - 15 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run144-gdn.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-400
echo "done after $(( $(date +%s) - start )) s"
