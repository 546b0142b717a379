#!/usr/bin/env bash
# Run 116, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# 1. the split's GPU tests after its host path was cut down (the window's check read back with the value flags in one
#    copy that waits for neither pass; the keys' window check left out where every key was checked; the runs' pass of
#    the scalar-gate split over the runs as packed sequences, no copy of G): tests/test_gpu_cp.py whole and the
#    split tests of tests/test_gpu_scalar_gate.py, within TEST_S seconds;
# 2. run114-split-host.py again within SPLIT_S seconds (the routed op against the op, do_bench, back to back, profiled);
# 3. on an H200 the stale records (rerecord_rest) with what is left; on another card the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
KDA_FAILURES_LOG="$OUT"/gpu-failures.txt OMP_NUM_THREADS=1 timeout -k 5 ${TEST_S:-150} python -m pytest \
  -o addopts="" -n 8 -m gpu -v -p no:cacheprovider tests/test_gpu_cp.py tests/test_gpu_scalar_gate.py -k "split" \
  2>&1 | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error\|^E  " \
  | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | cut -c1-300 > "$OUT"/gpu-tests.txt
grep -c PASSED "$OUT"/gpu-tests.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests.txt | tail -12
RUN=run116 timeout -k 5 ${SPLIT_S:-120} python results/tuning/run114-split-host.py 2>&1 | grep "^{\|Error" | cut -c1-400
if nvidia-smi -L | grep -q H200; then rerecord_rest
else timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"; fi
echo "done after $(( $(date +%s) - start )) s"
