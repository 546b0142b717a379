#!/usr/bin/env bash
# Run 105 (carry .gpu and .carry; COMMIT: the commit of this working tree): the two GPU tests that run 104 failed
# and that were fixed in the tests (the compiled layer against eager with the activations in torch; GDN's route
# with the fused norm and the norm's kernel off), a profile of one step of the defaults (run100-profile.py,
# PROFILE_S seconds, 0 for none), then the backward's two stale records (gpu_error, training), then
# rerecord of the other stale records with what is left of TOTAL. Logs, records and caches to $OUT.
set -u
source "$(dirname "$0")/device-env.sh"
export NO_MKDOCS_2_WARNING=1
TOTAL=${TOTAL:-560}
OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-120}" python -m pytest -o addopts="" -n 4 -m gpu -v -p no:cacheprovider \
  tests/test_gpu_compile.py tests/test_gpu_level5.py -k "compiles_fullgraph or gdn_route_with_the_norm" 2>&1 \
  | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|^E  " | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | cut -c1-400 \
  > "$OUT"/gpu-tests-fixed.txt
grep -c PASSED "$OUT"/gpu-tests-fixed.txt; grep "FAILED\|passed\|failed" "$OUT"/gpu-tests-fixed.txt | tail -6
# where the step's time goes with run 104's defaults: KDA and GDN forward + backward, fla's and FlashQLA's beside
[ "${PROFILE_S:-150}" -gt 0 ] && timeout -k 5 "${PROFILE_S:-150}" python results/tuning/run100-profile.py profile 2>&1 | tail -2
record_each 240 ${RECORDS:-snippets/backward/gpu_error snippets/backward/training}
rerecord_rest
echo "done after $(( $(date +%s) - start )) s"
