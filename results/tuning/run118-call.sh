#!/usr/bin/env bash
# Run 118, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# 1. the split's GPU tests again, the scalar-gate split's runs' pass back to a batch of dense runs (run 116 had it
#    slower as packed sequences) and SPLIT_IN_OP on by default, within TEST_S seconds;
# 2. run114-split-host.py at CASES (default GDN (1, 32768, 32), (1, 32768, 4), (1, 131072, 4)), rows to run118.jsonl;
# 3. on an H200 the stale records (rerecord_rest) with what is left; on another card the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
KDA_FAILURES_LOG="$OUT"/gpu-failures.txt OMP_NUM_THREADS=1 timeout -k 5 ${TEST_S:-150} python -m pytest \
  -o addopts="" -n 8 -m gpu -v -p no:cacheprovider tests/test_gpu_cp.py tests/test_gpu_scalar_gate.py -k "split" \
  2>&1 | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error\|^E  " \
  | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | cut -c1-300 > "$OUT"/gpu-tests.txt
grep -c PASSED "$OUT"/gpu-tests.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests.txt | tail -12
RUN=run118 CASES=${CASES:-0,1,2} timeout -k 5 ${SPLIT_S:-100} python results/tuning/run114-split-host.py 2>&1 \
  | grep "^{\|Error" | cut -c1-400
if nvidia-smi -L | grep -q H200; then rerecord_rest
else timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"; fi
echo "done after $(( $(date +%s) - start )) s"
