#!/usr/bin/env bash
# Run 144 (prepared 2026-12-06), one device call (carry .gpu and .carry; COMMIT: this tree's commit), within TOTAL
# seconds: the GPU tests of single_chunk_output and single_chunk_gated_output (scalar_gate.SINGLE_CHUNK_OUTPUT and
# gated_state_pass.SINGLE_CHUNK_OUTPUT, off) with both files' tests of many short sequences (TEST_S seconds), then run144-gdn.py
# with what is left but 15 s. Where one passes and wins, its switch goes on (kda/cuda_paths.py names the log).
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-180} tests/test_gpu_scalar_gate.py tests/test_gpu_level5.py -k "single_chunk or many_short"
left=$(( start + ${TOTAL:-480} - 15 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run144-gdn.py --warm 2>&1 | grep "^{\|Error\|error" | cut -c1-400
echo "done after $(( $(date +%s) - start )) s"
