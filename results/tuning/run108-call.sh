#!/usr/bin/env bash
# Run 108 (carry .gpu and .carry; COMMIT: the commit of this working tree). PARTS=tests: what run 107 left open,
# each failure's message written as it happens (KDA_FAILURES_LOG, tests/conftest.py): chunk_intra's steep-chunk
# variants in bf16 (the halvings, the diagonal about the sub-chunks' middles alone and with halvings; every steep
# gate kind, safe_gate's included) and level 5's halvings in fp16 (all failed in run 107, messages cut off), the
# op-level steep tests, KEY_CHECK_IN_KERNEL's and all_landed_off. PARTS=timings: run106-halvings.py steep (the
# forward and the layer's call by exp, products, halvings, middles, middles with halvings, beside fla's) and
# backward (PAIR_SUMS_BY_HALVINGS, which passed its tests in run 107, against the reference rows), then run 94
# (the scalar-gate inverse's grid order, never run), each within what is left of TOTAL. Logs and caches to $OUT.
# Added in the session of f89825d: the GPU tests of the split's warm-up starts (tests/test_gpu_cp.py -k warmup, 12),
# and run108-warmup.py (PARTS=warmup): one call PARTS="tests warmup" TOTAL=560.
# Two calls back to back keep the machine warm: PARTS=tests TOTAL=420, then PARTS=timings TOTAL=540.
set -u
PARTS=${PARTS:-tests timings}
source "$(dirname "$0")/device-env.sh"
left() { echo $(( ${TOTAL:-540} - $(date +%s) + start )); }
if [[ " $PARTS " == *" tests "* ]]; then
TESTS="(steep_chunk_variants and not products and (dtype1 or level5-halvings)) or keys_past_the_bound"
TESTS="$TESTS or all_landed_off or warmup"                                            # 80 tests
test_s=$(( $(left) - 40 )); [ "$test_s" -gt "${TEST_S:-9999}" ] && test_s=$TEST_S
KDA_FAILURES_LOG="$OUT"/gpu-failures.txt OMP_NUM_THREADS=1 timeout -k 5 $test_s python -m pytest \
  -o addopts="" -n 12 -m gpu -v -p no:cacheprovider tests/test_gpu_backward.py tests/test_gpu_level5.py tests/test_gpu_cp.py -k "$TESTS" \
  2>&1 | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error\|^E  " | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' \
  | cut -c1-400 > "$OUT"/gpu-tests-steep.txt
grep -c PASSED "$OUT"/gpu-tests-steep.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests-steep.txt | tail -12
fi
if [[ " $PARTS " == *" warmup "* ]]; then
timeout -k 5 $(( $(left) - 25 )) python results/tuning/run108-warmup.py 2>&1 | grep "^{\|Error" | cut -c1-260 | tail -40
fi
if [[ " $PARTS " == *" timings "* ]]; then
timeout -k 5 $(( $(left) - 150 )) python results/tuning/run106-halvings.py steep backward 2>&1 | grep "^{\|Error" \
  | tail -24
[ "$(left)" -gt 100 ] && timeout -k 5 $(( $(left) - 30 )) python results/tuning/run94-gdn-inverse.py compile time 2>&1 \
  | grep "^{\|Error" | tail -12
fi
python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))" \
  2>&1 | tail -1
echo "done after $(( $(date +%s) - start )) s"
