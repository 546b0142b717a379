#!/usr/bin/env bash
# Run 96 (carry .gpu and .carry; COMMIT: the commit of this working tree; on the side branch
# backward-records, whose two snippets are still to be recorded): STAGES (default "tests time records")
# picks what runs, in this order within TOTAL seconds:
#   tests   the backward's GPU tests (ff324ba changed what the kernels are handed; the three kernels for a
#           gate per channel have never run), within TEST_S seconds;
#   time    run96-backward.py (timing at both shapes, KDA's new kernels as a variant, a profile of GDN's
#           step), within TIME_S seconds;
#   records the missing or stale GPU records whose path contains ONLY (default snippets/backward), with
#           what is left (fla's and FlashQLA's backward kernels compile and autotune for each new shape:
#           give them a long warm-up, WARM).
set -u
source "$(dirname "$0")/device-env.sh"
export NO_MKDOCS_2_WARNING=1
STAGES=${STAGES:-tests time records}
left() { echo $(( ${TOTAL:-560} - $(date +%s) + start )); }
if [[ " $STAGES " == *" tests "* ]]; then
  OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-200}" python -m pytest -o addopts="" -n 14 -m gpu -q -p no:cacheprovider \
    --durations=5 tests/test_gpu_backward.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
    | tee $OUT/gpu-tests-backward.txt | tail -12
fi
if [[ " $STAGES " == *" time "* ]]; then
  timeout -k 5 "${TIME_S:-120}" python results/tuning/run96-backward.py 2>&1 | grep -v "^20" | tail -60
fi
if [[ " $STAGES " == *" records "* ]]; then
  budget=$(( $(left) - 15 ))
  if [ "$budget" -ge 60 ]; then
    echo "rerecord ${ONLY:-snippets/backward}: ${budget} s"
    timeout -k 5 $(( budget + 10 )) python -m kda.site rerecord --out $OUT --budget $budget --warm ${WARM:-240} \
      --commit "$COMMIT" --only ${ONLY:-snippets/backward} 2>&1 | tee $OUT/rerecord.txt | grep -v "^20" | tail -25
  fi
fi
[[ " $STAGES " == *" records "* ]] || timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
