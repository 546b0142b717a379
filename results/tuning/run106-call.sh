#!/usr/bin/env bash
# Run 106 (carry .gpu and .carry; COMMIT: the commit of this working tree): the GPU tests of the two walks by
# halvings (chunk_intra's steep chunks, PAIRWISE_BY_HALVINGS; the backward's pair sums, PAIR_SUMS_BY_HALVINGS), of
# chunk_intra's diagonal about the sub-chunks' middles (DIAGONAL_ABOUT_MIDDLES, added 2026-12-05), of the keys
# checked in chunk_intra (KEY_CHECK_IN_KERNEL) and of the layer's compile test as rewritten after run 105,
# then the pair kernel alone by halvings
# (run101-pairs.py, VARIANT_SET=run106), then run106-halvings.py (the forward's steep gates and the layer's call
# beside fla's; KDA forward + backward by halvings), then run106-layer.py (the layer's prefill with kda's ops and with
# fla's), each within what is left of TOTAL. Logs and caches to $OUT.
# PARTS=tests also runs the layout's GPU tests after them (LAYOUT_TESTS=0 skips them; give the tests part TOTAL=480).
# PARTS=tests or PARTS=timings runs one half (two calls back to back keep the machine warm: the first try of this
# call, in one piece, lost its machine with nothing returned, and a half that returns says where that happened).
set -u
PARTS=${PARTS:-tests timings}
source "$(dirname "$0")/device-env.sh"
left() { echo $(( ${TOTAL:-540} - $(date +%s) + start )); }
TESTS="halvings or all_landed_off or layer_prefill_and_decode or keys_past_the_bound or middles"
if [[ " $PARTS " == *" tests "* ]]; then
OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-210}" python -m pytest -o addopts="" -n 12 -m gpu -v -p no:cacheprovider \
  tests/test_gpu_compile.py tests/test_gpu_backward.py tests/test_gpu_level5.py -k "$TESTS" 2>&1 \
  | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error\|^E  " | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | cut -c1-400 \
  > "$OUT"/gpu-tests-halvings.txt
grep -c PASSED "$OUT"/gpu-tests-halvings.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests-halvings.txt | tail -12
# the package by role (issue 43, 2026-12-05): every launcher moved beside its kernel, checked on the CPU only; one
# test or a few per launcher and op on the GPU, with what is left of TOTAL after the tests above
BIG="test_forward_against_token_recurrence or test_gradients_against_token_recurrence or test_gated_attention_kernels"
BIG="$BIG or test_delta_rule_kernels"                                 # their first shape only, each dtype and gate
SMALL="test_linear_attention_kernel or test_states_in_and_out or test_pipelined_kernels or test_state_output_stages"
SMALL="$SMALL or test_state_pass_against_reference_stage or test_many_short_packed_sequences or test_packed_sequences"
SMALL="$SMALL or test_grouped_value_heads or test_split_forward or test_decode_against_token_recurrence"
SMALL="$SMALL or test_packed_sequences_into_a_pool or test_split_against_recurrence_and_unsplit"
SMALL="$SMALL or test_level_gradients_against_token_recurrence or test_level_gradients_with_passes_from_inputs"
SMALL="$SMALL or test_state_passes_from_inputs_against_the_stages"
LAYOUT="(($BIG) and shape0) or ($SMALL)"                              # 180 tests
[ "${LAYOUT_TESTS:-1}" = 1 ] && [ "$(left)" -gt 60 ] && OMP_NUM_THREADS=1 timeout -k 5 $(( $(left) - 20 )) \
  python -m pytest -o addopts="" -n 12 -m gpu -v -p no:cacheprovider tests/test_gpu_level12.py tests/test_gpu_level3.py \
  tests/test_gpu_level4.py tests/test_gpu_level5.py tests/test_gpu_scalar_gate.py tests/test_gpu_decode.py \
  tests/test_gpu_cp.py tests/test_gpu_backward.py -k "$LAYOUT" 2>&1 \
  | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error\|^E  " | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | cut -c1-400 \
  > "$OUT"/gpu-tests-layout.txt
[ -f "$OUT"/gpu-tests-layout.txt ] && grep -c PASSED "$OUT"/gpu-tests-layout.txt && \
  grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests-layout.txt | tail -12
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
