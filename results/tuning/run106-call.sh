#!/usr/bin/env bash
# Run 106 (carry .gpu and .carry; COMMIT: the commit of this working tree): the GPU tests of the two walks by
# halvings (chunk_intra's steep chunks, PAIRWISE_BY_HALVINGS; the backward's pair sums, PAIR_SUMS_BY_HALVINGS), of
# the keys checked in chunk_intra (KEY_CHECK_IN_KERNEL) and of the layer's compile test as rewritten after run 105,
# then the pair kernel alone by halvings
# (run101-pairs.py, VARIANT_SET=run106), then run106-halvings.py (the forward's steep gates and the layer's call
# beside fla's; KDA forward + backward by halvings), then run106-layer.py (the layer's prefill with kda's ops and with
# fla's), each within what is left of TOTAL. Logs and caches to $OUT.
# PARTS=tests or PARTS=timings runs one half (two calls back to back keep the machine warm: the first try of this
# call, in one piece, lost its machine with nothing returned, and a half that returns says where that happened).
set -u
PARTS=${PARTS:-tests timings}
source "$(dirname "$0")/device-env.sh"
left() { echo $(( ${TOTAL:-540} - $(date +%s) + start )); }
TESTS="halvings or all_landed_off or layer_prefill_and_decode or keys_past_the_bound"
if [[ " $PARTS " == *" tests "* ]]; then
OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-210}" python -m pytest -o addopts="" -n 12 -m gpu -v -p no:cacheprovider \
  tests/test_gpu_compile.py tests/test_gpu_backward.py tests/test_gpu_level5.py -k "$TESTS" 2>&1 \
  | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error\|^E  " | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | cut -c1-400 \
  > "$OUT"/gpu-tests-halvings.txt
grep -c PASSED "$OUT"/gpu-tests-halvings.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests-halvings.txt | tail -12
fi
if [[ " $PARTS " == *" timings "* ]]; then
VARIANT_SET=run106 timeout -k 5 $(( $(left) > 150 ? 150 : $(left) )) python results/tuning/run101-pairs.py 2>&1 \
  | grep "^{" | tail -12
timeout -k 5 $(( $(left) - 25 )) python results/tuning/run106-halvings.py steep backward 2>&1 | grep "^{\|Error" | tail -20
[ "$(left)" -gt 80 ] && timeout -k 5 $(( $(left) - 25 )) python results/tuning/run106-layer.py 2>&1 | grep "^{\|Error" | tail -9
fi
python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))" \
  2>&1 | tail -1
echo "done after $(( $(date +%s) - start )) s"
