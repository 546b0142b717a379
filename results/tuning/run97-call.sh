#!/usr/bin/env bash
# Run 97 (carry .gpu and .carry; COMMIT: the commit of this working tree, the side branch backward-records with
# the three chunk kernels for a gate per channel on by default): the backward's GPU tests beside the record of
# the gradients' errors (a check, not timed, so the two may share the GPU), then on the quiet GPU the latency
# record, then the training record if time is left. Records, test log and caches go to $OUT as they come.
set -u
source "$(dirname "$0")/device-env.sh"
export NO_MKDOCS_2_WARNING=1
left() { echo $(( ${TOTAL:-575} - $(date +%s) + start )); }
record() {   # record the stale or missing snippet whose path contains $1, within $2 seconds
  timeout -k 5 $(( $2 + 10 )) python -m kda.site run --gpu --stale --only "$1" --timeout "$2" --commit "$COMMIT" 2>&1 \
    | grep -v "^20" | tail -8
  cp results/gpu/backward-*.json "$OUT"/ 2>/dev/null
}
OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-240}" python -m pytest -o addopts="" -n 10 -m gpu -q -p no:cacheprovider \
  --durations=5 tests/test_gpu_backward.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > "$OUT"/gpu-tests-backward.txt &
tests=$!
record snippets/backward/gpu_error "${CHECK_S:-230}" > "$OUT"/record-gpu_error.txt
wait $tests
tail -14 "$OUT"/gpu-tests-backward.txt; cat "$OUT"/record-gpu_error.txt
record snippets/backward/latency $(( $(left) - 60 ))
[ "$(left)" -gt 130 ] && record snippets/backward/training $(( $(left) - 50 ))
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
