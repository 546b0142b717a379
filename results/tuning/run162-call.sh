#!/usr/bin/env bash
# Run 162 (2026-12-07), one device call (carry .gpu, and .carry where a call returned caches; COMMIT: this tree's
# commit): the GPU tests of the packed tiles (in order, early scores, gathered by best fit, checks first) and of
# level 5's stream of chunks within TEST_S, then run162-tiles.py within TIME_S (0: skipped); where set,
# run159-tile-errors.py within ERRORS_S and run158-kda-tiles.py within KDA_S (KDA through the chunk table, the tiles
# and the stream; prepared for run 158 and never run); then, on an H200 (RECORDS=1), the stale GPU records with what
# is left of TOTAL.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-200} tests/test_gpu_scalar_gate.py tests/test_gpu_level5.py -k "packed_tiles or stream_of_chunks"
[ "${TIME_S:-150}" -gt 0 ] && timeout -k 5 ${TIME_S:-150} python results/tuning/run162-tiles.py 2>&1 \
  | grep "^{\|Error\|error" | grep -v '"stages"' | cut -c1-400
[ -n "${ERRORS_S:-}" ] && timeout -k 5 $ERRORS_S python results/tuning/run159-tile-errors.py 2>&1 \
  | grep "^{\|Error\|error" | cut -c1-400
[ -n "${KDA_S:-}" ] && timeout -k 5 $KDA_S python results/tuning/run158-kda-tiles.py 2>&1 | grep "^{\|Error\|error" \
  | grep -v '"stages"' | cut -c1-300
[ "${RECORDS:-0}" = 1 ] && rerecord_rest
echo "done after $(( $(date +%s) - start )) s"
