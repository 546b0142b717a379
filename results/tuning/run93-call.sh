#!/usr/bin/env bash
# Run 93 (carry .gpu and .carry): the backward's GPU tests on what landed since run 91 (SubChunked by
# blocks at once, the memory budget), then run93-backward.py within what is left of TOTAL seconds;
# results in $OUT.
set -u
source "$(dirname "$0")/device-env.sh"
left() { echo $(( ${TOTAL:-560} - 40 - $(date +%s) + start )); }
# one thread per worker: the float64 recurrences on the host would otherwise oversubscribe its cores
OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-120}" python -m pytest -o addopts="" -n 14 -m gpu -q -p no:cacheprovider \
  --durations=5 tests/test_gpu_backward.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  | tee $OUT/gpu-tests-backward.txt | tail -12
timeout -k 5 "$(left)" python results/tuning/run93-backward.py 2>&1 | grep -v "^20" | tail -40
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
