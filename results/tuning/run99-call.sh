#!/usr/bin/env bash
# Run 99 (carry .gpu and .carry; COMMIT: the commit of this working tree): the backward's GPU tests again
# (TEST_S seconds, in the background: the state-pass kernels now take fp16 operands for fp16 inputs, which
# every fp16 gradient test goes through), beside the first phase of `kda.site rerecord` (checks and
# warm-ups, WARM seconds, longer than the tests so that no timing runs beside them); then the timings of
# the stale records, shortest warm-up first, with what is left. Records and caches to $OUT.
set -u
source "$(dirname "$0")/device-env.sh"
export NO_MKDOCS_2_WARNING=1
OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-170}" python -m pytest -o addopts="" -n 12 -m gpu -q -p no:cacheprovider \
  tests/test_gpu_backward.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > "$OUT"/gpu-tests-backward.txt &
budget=$(( ${TOTAL:-575} - $(date +%s) + start - 15 ))
timeout -k 5 $(( budget + 10 )) python -m kda.site rerecord --out "$OUT" --budget "$budget" --warm "${WARM:-200}" \
  --commit "$COMMIT" --only "${ONLY:-snippets/}" 2>&1 | grep -v "^20" | tee "$OUT"/rerecord.txt | tail -30
wait; tail -4 "$OUT"/gpu-tests-backward.txt
echo "done after $(( $(date +%s) - start )) s"
