#!/usr/bin/env bash
# Run 157 (2026-12-07), one device call (carry .gpu and .carry; COMMIT: this tree's commit): the GPU tests of
# PACKED_TILES (its beta check: the kernel now launched before its flags are read; each arrangement of
# PACKED_TILE_CONFIG) and of the switches that went on after run 153, within TEST_S; run157-tiles.py (the
# arrangements timed, and one sequence of the same tokens padded and not) within TILES_S; the GPU test of
# TILES_OF_SHORT_SEQUENCES with them, and run158-kda-tiles.py within KDA_S where set; then, on an H200 (RECORDS=1),
# the stale GPU records by rerecord with what is left of TOTAL (phase 1 stopped at WARM).
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-150} tests/test_gpu_scalar_gate.py tests/test_gpu_cp.py tests/test_gpu_level5.py \
  -k "packed_tiles or beta_in_its_dtype or gate_free_inverse or sequence_tiles_per_channel"
timeout -k 5 ${TILES_S:-150} python results/tuning/run157-tiles.py 2>&1 | grep "^{\|Error\|error" | grep -v '"stages"' \
  | cut -c1-300
[ -n "${KDA_S:-}" ] && timeout -k 5 $KDA_S python results/tuning/run158-kda-tiles.py 2>&1 | grep "^{\|Error\|error" \
  | grep -v '"stages"' | cut -c1-300
[ "${RECORDS:-0}" = 1 ] && rerecord_rest
echo "done after $(( $(date +%s) - start )) s"
