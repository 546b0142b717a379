#!/usr/bin/env bash
# Run 91 (carry .gpu and .carry): the GPU tests of the CUDA backward (issue 18, landed unverified),
# its timing against fla and FlashQLA (run91-backward.py), then the training check (run91-train.py),
# each within what is left of TOTAL seconds; STAGES picks some ("tests time train"), BACKENDS the training
# runs ("kda fla"); results in $OUT.
set -u
source "$(dirname "$0")/device-env.sh"
stages=${STAGES:-tests time train}
left() { echo $(( ${TOTAL:-560} - 40 - $(date +%s) + start )); }
# one thread per worker: the float64 recurrences on the host would otherwise oversubscribe its cores
[[ $stages == *tests* ]] && OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-240}" python -m pytest -o addopts="" -n 14 \
  -m gpu -q -p no:cacheprovider --durations=12 tests/test_gpu_backward.py 2>&1 | tee $OUT/gpu-tests-backward.txt | tail -15
[[ $stages == *time* ]] && timeout -k 5 "$(left)" python results/tuning/run91-backward.py 2>&1 | grep -v "^20" | tail -40
[[ $stages == *train* ]] && timeout -k 5 "$(left)" python results/tuning/run91-train.py "${STEPS:-300}" cuda ${BACKENDS:-kda fla} 2>&1 | tail -12
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
