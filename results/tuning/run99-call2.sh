#!/usr/bin/env bash
# Run 99, second call (carry .gpu and .carry; COMMIT: the commit of this working tree): the backward's GPU
# tests of fp16 and the state-pass kernels alone on the GPU (TEST_S seconds, verbose: the first call's were
# cut with no names), then backward/gpu_error and backward/latency one at a time, then the other stale
# records by rerecord with what is left. Records and caches to $OUT.
set -u
source "$(dirname "$0")/device-env.sh"
export NO_MKDOCS_2_WARNING=1
left() { echo $(( ${TOTAL:-575} - $(date +%s) + start )); }
record() {   # record the stale snippets whose path contains $1, within $2 seconds
  timeout -k 5 $(( $2 + 10 )) python -m kda.site run --gpu --stale --only "$1" --timeout "$2" --commit "$COMMIT" 2>&1 \
    | grep -v "^20" | tail -4
  python -c "import os, tarfile; t = tarfile.open(os.environ['OUT'] + '/records.tar', 'w'); t.add('results/gpu', arcname='.')"
}
OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-150}" python -m pytest -o addopts="" -n 12 -m gpu -v -p no:cacheprovider \
  tests/test_gpu_backward.py -k "state_pass_kernels or dtype1" 2>&1 | grep "PASSED\|FAILED\|ERROR\|passed\|failed" \
  | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' > "$OUT"/gpu-tests-fp16.txt
grep -c PASSED "$OUT"/gpu-tests-fp16.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests-fp16.txt | tail -8
record snippets/backward/gpu_error $(( $(left) - 150 ))
record snippets/backward/latency $(( $(left) - 40 ))
budget=$(( $(left) - 15 ))
if [ "$budget" -ge 100 ]; then
  timeout -k 5 $(( budget + 10 )) python -m kda.site rerecord --out "$OUT" --budget "$budget" --warm 60 \
    --commit "$COMMIT" 2>&1 | grep -v "^20" | tail -12
else
  timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
fi
echo "done after $(( $(date +%s) - start )) s"
