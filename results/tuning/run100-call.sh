#!/usr/bin/env bash
# Run 100 (carry .gpu and .carry): the GPU tests of the four backward switches that landed off
# (STATES_AS_OPERANDS, TOKEN_MAJOR_STATES, SHARED_PAIR_SUMS, GATE_IN_PAIR_KERNEL), their time against the defaults, a profile of the backward step by
# kernel, KDA's three chunk kernels alone and the pair sums' variants (run101-pairs.py), levels 1-4's forward +
# backward against fla, then run 94's grid order of GDN's inverse with what is left; rows, logs and profile
# tables in $OUT. STAGES picks among "tests switches profile pairs levels grid" (one call fits about four).
set -u
source "$(dirname "$0")/device-env.sh"
left() { echo $(( ${TOTAL:-570} - $(date +%s) + start )); }
stages=" ${STAGES:-tests switches profile pairs levels grid} "
if [[ $stages == *" tests "* ]]; then
  OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-150}" python -m pytest -o addopts="" -n 12 -m gpu -v -p no:cacheprovider \
    tests/test_gpu_backward.py -k "as_operands or shared_pairs or gate_in_pair or landed_off" 2>&1 | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error" \
    | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' > "$OUT"/gpu-tests-switches.txt
  grep -c PASSED "$OUT"/gpu-tests-switches.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests-switches.txt | tail -8
fi
if [[ $stages == *" switches "* ]]; then
  timeout -k 5 "${SWITCHES_S:-110}" python results/tuning/run100-profile.py switches 2>&1 | grep -v "^20" | tail -8
fi
if [[ $stages == *" profile "* ]]; then
  timeout -k 5 "${PROFILE_S:-140}" python results/tuning/run100-profile.py profile 2>&1 | grep -v "^20" \
    | grep "cuda_ms\|Error\|error" | tail -12
fi
if [[ $stages == *" pairs "* ]] && [ "$(left)" -gt 100 ]; then
  timeout -k 5 $(( $(left) - 60 )) python results/tuning/run101-pairs.py compile time 2>&1 | grep -v "^20" | tail -12
fi
if [[ $stages == *" levels "* ]] && [ "$(left)" -gt 120 ]; then
  budget=$(( $(left) - 90 )); [ "$budget" -gt "${LEVELS_S:-200}" ] && budget=${LEVELS_S:-200}
  timeout -k 5 $(( budget + 30 )) python results/tuning/run100-levels.py "$budget" 2>&1 | grep -v "^20" | tail -24
fi
if [[ $stages == *" grid "* ]] && [ "$(left)" -gt 100 ]; then
  timeout -k 5 $(( $(left) - 45 )) python results/tuning/run94-gdn-inverse.py compile time 2>&1 | grep -v "^20" | tail -20
fi
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
