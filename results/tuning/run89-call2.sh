#!/usr/bin/env bash
# Run 89, call 2 (carry .gpu and .carry; COMMIT = this tree's commit, with the scalar-gate path's
# switch on): the scalar-gate path's GPU tests; only if every one passes, the GDN latency record of
# this commit, then run 89's split and shape timings in what time is left.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0 NO_MKDOCS_2_WARNING=1
start=$(date +%s)
bash .gpu/install.sh /tmp/site > /tmp/install.txt 2>&1 || { cat /tmp/install.txt; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv
timeout ${TEST_S:-170} python -m pytest -o addopts="" -n 14 -q -p no:cacheprovider tests/test_gpu_scalar_gate.py \
  > $OUT/gpu-tests.txt 2>&1
rc=$?
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu-tests.txt | tail -30
echo "tests rc=$rc after $(( $(date +%s) - start )) s"
[ $rc -eq 0 ] || exit 1
left=$(( ${TOTAL:-560} - ($(date +%s) - start) ))
timeout $(( ${RECORD_S:-230} + 20 )) python -m kda.site rerecord --out $OUT --budget ${RECORD_S:-230} --warm 60 \
  --commit "$COMMIT" --carry .carry --only level5/gdn_latency 2>&1 | grep -v "^20" | tail -25
left=$(( ${TOTAL:-560} - ($(date +%s) - start) ))
echo "timings with ${left} s left"
[ $left -gt 40 ] && timeout $(( left - 15 )) python results/tuning/run89-gdn-scalar-path.py split time 2>&1 | grep -v "^20" | tail -40
echo "done after $(( $(date +%s) - start )) s"
