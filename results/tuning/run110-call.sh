#!/usr/bin/env bash
# Run 110, one device call (carry .gpu and .carry): chunk_gated_inverse's tf32 halves and shuffle-scan cumsum and
# chunk_intra's SOLVE_BY_HALVES, their GPU tests, then run110-gdn-inverse.py (each arrangement timed and checked against the default, FlashQLA's
# kkt_solve beside them, the op with the best); rows in $OUT/run110.jsonl, within TOTAL seconds.
set -u
source "$(dirname "$0")/device-env.sh"
left() { echo $(( ${TOTAL:-300} - $(date +%s) + start )); }
OMP_NUM_THREADS=1 timeout -k 5 ${TEST_S:-100} python -m pytest -o addopts="" -n 8 -m gpu -v -p no:cacheprovider \
  tests/test_gpu_scalar_gate.py tests/test_gpu_level5.py \
  -k "inverse_against_reference_stage or inverse_arrangement or solve_by_halves" 2>&1 \
  | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error\|^E  " | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' \
  | cut -c1-300 > "$OUT"/gpu-tests-inverse.txt
grep -c PASSED "$OUT"/gpu-tests-inverse.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests-inverse.txt | tail -8
timeout -k 5 $(( $(left) - 10 )) python results/tuning/run110-gdn-inverse.py compile time kda 2>&1 | grep "^{\|Error" \
  | cut -c1-400
echo "done after $(( $(date +%s) - start )) s"
