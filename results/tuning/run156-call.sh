#!/usr/bin/env bash
# Run 156 (2026-12-07), one device call on an H200 (carry .gpu and .carry; COMMIT: this tree's commit): the GPU
# test of PACKED_TILES' beta check (its kernel now launched before its flags are read), with the other switches
# that went on after run 153 (WALK_IDENTITIES, BETA_IN_ITS_DTYPE, GATE_FREE_IN_SPLIT) in their op tests, within
# TEST_S; run156-tail.py (GDN's op at a T the split pads) within TAIL_S; then the stale GPU records by rerecord with what is left of TOTAL (phase 1 stopped at WARM).
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-120} tests/test_gpu_scalar_gate.py tests/test_gpu_cp.py -k "packed_tiles or beta_in_its_dtype or gate_free_inverse"
timeout -k 5 ${TAIL_S:-70} python results/tuning/run156-tail.py 2>&1 | grep "^{\|Error\|error" | cut -c1-400
rerecord_rest
echo "done after $(( $(date +%s) - start )) s"
