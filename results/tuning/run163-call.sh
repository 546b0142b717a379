#!/usr/bin/env bash
# Run 163 (2026-12-08), one device call (carry .gpu; COMMIT: this tree's commit): the packed tiles' GPU tests with the
# checks beside the tile kernel (TILE_CHECKS_BESIDE) and each bad value in one value head alone, within TEST_S
# (TESTS_K narrows them: a -k expression); then run163-checks.py within TIME_S; where set, run163-errors.py within
# ERRORS_S (level 5's packed forms, sequence by sequence, on the failed tests' inputs).
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-150} tests/test_gpu_scalar_gate.py -k "packed_tiles${TESTS_K:+ and ($TESTS_K)}"
timeout -k 5 ${TIME_S:-200} python results/tuning/run163-checks.py 2>&1 | grep "^{\|Error\|error" | cut -c1-400
[ -n "${ERRORS_S:-}" ] && timeout -k 5 $ERRORS_S python results/tuning/run163-errors.py 2>&1 | grep "^{\|Error\|error" \
  | cut -c1-400
echo "done after $(( $(date +%s) - start )) s"
