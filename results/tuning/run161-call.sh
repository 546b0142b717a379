#!/usr/bin/env bash
# Run 161 (2026-12-07), one device call (carry .gpu; COMMIT: this tree's commit): test_split_ragged_runs again with its
# final-state bound from run 160, within TEST_S; then run161-ragged-profile.py within TIME_S.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-150} tests/test_gpu_cp.py -k "ragged_runs"
timeout -k 5 ${TIME_S:-90} python results/tuning/run161-ragged-profile.py > "$OUT"/run161-log.txt 2>&1
grep "^{\|Error\|error" "$OUT"/run161-log.txt | cut -c1-300
echo "done after $(( $(date +%s) - start )) s"
