#!/usr/bin/env bash
# Run 160 (2026-12-07), one device call (carry .gpu, and .carry where a call returned caches; COMMIT: this tree's
# commit): the GPU tests of RAGGED_RUNS (GDN's split over a short last run where it lies) and of the split's other
# paths beside it, within TEST_S; run160-ragged-runs.py (the op off and on at lengths that are and are not whole runs,
# FlashQLA and fla beside) within TIME_S; then, on an H200 (RECORDS=1), the stale GPU records by rerecord with what is
# left of TOTAL (phase 1 stopped at WARM).
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-200} tests/test_gpu_cp.py tests/test_gpu_scalar_gate.py \
  -k "ragged_runs or split_forward or split_warmup_starts or op_takes_the_split or gate_free_inverse"
timeout -k 5 ${TIME_S:-150} python results/tuning/run160-ragged-runs.py 2>&1 | grep "^{\|Error\|error" \
  | grep -v '"stages"' | cut -c1-300
[ "${RECORDS:-0}" = 1 ] && rerecord_rest
echo "done after $(( $(date +%s) - start )) s"
