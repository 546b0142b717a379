#!/usr/bin/env bash
# Run 96 (carry .gpu and .carry; COMMIT: the commit of this working tree): the backward's GPU tests
# (64718ae changed what the kernels are handed), run96-backward.py within TIME_S seconds, then the
# missing or stale GPU records of the backward chapter with what is left of TOTAL seconds (fla's and
# FlashQLA's backward kernels compile and autotune for each new shape: give them a long warm-up).
set -u
source "$(dirname "$0")/device-env.sh"
export NO_MKDOCS_2_WARNING=1
left() { echo $(( ${TOTAL:-560} - $(date +%s) + start )); }
OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-200}" python -m pytest -o addopts="" -n 14 -m gpu -q -p no:cacheprovider \
  tests/test_gpu_backward.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" | tee $OUT/gpu-tests-backward.txt | tail -6
timeout -k 5 "${TIME_S:-120}" python results/tuning/run96-backward.py 2>&1 | grep -v "^20" | tail -60
budget=$(( $(left) - 15 ))
if [ "$budget" -ge 60 ]; then
  echo "rerecord ${ONLY:-snippets/backward}: ${budget} s"
  timeout -k 5 $(( budget + 10 )) python -m kda.site rerecord --out $OUT --budget $budget --warm ${WARM:-240} \
    --commit "$COMMIT" --only ${ONLY:-snippets/backward} 2>&1 | tee $OUT/rerecord.txt | grep -v "^20" | tail -25
fi
echo "done after $(( $(date +%s) - start )) s"
