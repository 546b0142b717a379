#!/usr/bin/env bash
# Run 98 (carry .gpu and .carry; COMMIT: the commit of this working tree, on the side branch backward-records):
# the GPU tests of the level 1-4 backward (TEST_S seconds) beside the warm-up, which compiles every backward
# the chapter's two missing records run in parallel processes into a scratch Triton cache (run98-warm.py,
# WARM_S seconds; its compiled kernels kept, its autotune choices not: the records make them again on a
# quiet GPU); then the records of gpu_error and latency, one at a time, and the other stale ones whose path
# contains MORE (default: all) by rerecord with what is left. Records and caches to $OUT.
set -u
source "$(dirname "$0")/device-env.sh"
export NO_MKDOCS_2_WARNING=1
left() { echo $(( ${TOTAL:-575} - $(date +%s) + start )); }
record() {   # record the stale or missing snippets whose path contains $1, within $2 seconds each
  timeout -k 5 $(( $2 + 10 )) python -m kda.site run --gpu --stale --only "$1" --timeout "$2" --commit "$COMMIT" 2>&1 \
    | grep -v "^20" | tail -8
  python -c "import os, tarfile; t = tarfile.open(os.environ['OUT'] + '/records.tar', 'w'); t.add('results/gpu', arcname='.')"
}
# the GPU tests of the level 1-4 backward (LEVEL_BACKWARD, landed off) beside the warm-up: a check, not timed
OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-240}" python -m pytest -o addopts="" -n 4 -m gpu -q -p no:cacheprovider \
  tests/test_gpu_backward.py -k "level or without_the_delta_rule" 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > "$OUT"/gpu-tests-level-backward.txt &
tests=$!
TRITON_CACHE_DIR=/tmp/warm-triton timeout -k 5 $(( ${WARM_S:-240} + 20 )) python results/tuning/run98-warm.py \
  --budget "${WARM_S:-240}" 2>&1 | grep -v "^20" | tee "$OUT"/warm.txt
python -c "from pathlib import Path; from kda.site.rerecord import keep_compiled, triton_cache_dir; \
print('compiled Triton kernels kept:', keep_compiled(Path('/tmp/warm-triton'), triton_cache_dir()))"
wait $tests; tail -6 "$OUT"/gpu-tests-level-backward.txt
record snippets/backward/gpu_error $(( $(left) - 200 ))
record snippets/backward/latency $(( $(left) - 50 ))
# then every other stale record with what is left, by rerecord (checks beside warm-ups, then timings one at a
# time; it writes records.tar and the caches itself)
budget=$(( $(left) - 15 ))
if [ "$budget" -ge 120 ]; then
  timeout -k 5 $(( budget + 10 )) python -m kda.site rerecord --out "$OUT" --budget "$budget" --warm "${REST_WARM:-120}" \
    --commit "$COMMIT" --only "${MORE:-snippets/}" 2>&1 | grep -v "^20" | tail -25
else
  timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
fi
echo "done after $(( $(date +%s) - start )) s"
