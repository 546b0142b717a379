#!/usr/bin/env bash
# Run 113, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# 1. the GPU tests of the defaults that runs 111 and 112 turned on, now on every test of their files: the inverse's
#    merge by halves and packed GDN by the scalar-gate path (tests/test_gpu_scalar_gate.py, with the scan's stage tests
#    after its rows past the end were made flat), the warm-up split (tests/test_gpu_cp.py), token slots, device chunk
#    tables and the checked decode (tests/test_gpu_decode.py), and the compile tests (tests/test_gpu_compile.py: the
#    compiled layer against float64 as rewritten after run 105, not yet re-run), within TEST_S seconds;
# 2. on an H200, the stale records (rerecord_rest) with what is left; on another card, the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
KDA_FAILURES_LOG="$OUT"/gpu-failures.txt OMP_NUM_THREADS=1 timeout -k 5 ${TEST_S:-200} python -m pytest \
  -o addopts="" -n 8 -m gpu -v -p no:cacheprovider tests/test_gpu_scalar_gate.py tests/test_gpu_cp.py tests/test_gpu_compile.py \
  tests/test_gpu_decode.py 2>&1 | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error\|^E  " \
  | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | cut -c1-300 > "$OUT"/gpu-tests.txt
grep -c PASSED "$OUT"/gpu-tests.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests.txt | tail -12
if nvidia-smi -L | grep -q H200; then rerecord_rest
else timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"; fi
echo "done after $(( $(date +%s) - start )) s"
