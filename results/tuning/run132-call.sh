#!/usr/bin/env bash
# Run 132, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# CAPPED_STEPS' bf16 GPU tests with the capped steps by one pass down the chunk (capped_cumsum_in_place) in place of
# run 130's walk per element, TEST_S seconds (0: none; TESTS: a -k expression, by default every bf16 capped case); then
# run130-layer.py (CAPPED_STEPS against the defaults on the model's calls, fla beside; SHAPES_N, CALLS, STAGES and
# FLA limit it; WARM= empty: no parallel compiles first) with what is left but 30 s; the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
[ "${TEST_S:-200}" -gt 0 ] && gpu_tests ${TEST_S:-200} tests/test_gpu_level5.py -k "${TESTS:-capped and not dtype0}"
left=$(( start + ${TOTAL:-560} - 30 - $(date +%s) ))
timeout -k 5 $left python results/tuning/run130-layer.py ${WARM---warm} 2>&1 | grep "^{\|Error\|warm" | cut -c1-600
timeout 25 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
