#!/usr/bin/env bash
# Run 103 (carry .gpu and .carry; COMMIT: the commit of this working tree): the GPU tests of the backward switches
# that landed off after run 102 (SCORES_FROM_FORWARD, PAIR_KERNEL_TWO_BLOCKS, PAIR_KERNEL_BY_CHANNELS,
# GRADS_IN_INPUT_DTYPE, LEVEL_PIECES, PAIR_PIECES_FROM_FORWARD and its chunk_intra outputs, INVERSE_FROM_FORWARD,
# LEVEL_PASSES_FROM_INPUTS, PACKED_STATE_KERNELS), their time and a profile of the defaults (run103-backward.py),
# the pair kernel's splits by channels alone (run101-pairs.py, VARIANT_SET=run103), then with what is left the
# stale level-5 records (ONLY; the backward's wait for the switches that go on).
# Too much for one call of 600 s: PARTS picks what a call runs, "tests" (the 159 GPU tests, about 340 s) or
# "timings" (the timings and the profile, GDN's chunk kernel alone, the pair kernel alone, then rerecord with what
# is left), both by default.
# Logs, records and caches to $OUT (device-env.sh bundles the logs).
set -u
source "$(dirname "$0")/device-env.sh"
export NO_MKDOCS_2_WARNING=1
PARTS=${PARTS:-tests timings}
TESTS="landed_off or level_pieces or by_channels or backward_outputs or forwards_inverse or from_inputs"
TESTS="$TESTS or packed_state_kernels or compiles_fullgraph or l2norm_fused or pairwise_by_products or products"
TESTS="$TESTS or activations_in_chunk_intra or norm_kernel"
if [[ " $PARTS " == *" tests "* ]]; then
  OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-360}" python -m pytest -o addopts="" -n 12 -m gpu -v -p no:cacheprovider \
    tests/test_gpu_backward.py tests/test_gpu_compile.py tests/test_gpu_level5.py -k "$TESTS" 2>&1 | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error" \
    | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' > "$OUT"/gpu-tests-switches.txt
  grep -c PASSED "$OUT"/gpu-tests-switches.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests-switches.txt | tail -8
fi
if [[ " $PARTS " == *" timings "* ]]; then
  timeout -k 5 "${SWITCHES_S:-280}" python results/tuning/run103-backward.py l2norm steep packed switches levels profile 2>&1 \
    | grep -v "^20" | tail -8
  timeout -k 5 "${CHUNK_S:-90}" python results/tuning/run103-chunk.py compile time 2>&1 | grep -v "^20" | tail -12
  VARIANT_SET=run103 timeout -k 5 "${PAIRS_S:-70}" python results/tuning/run101-pairs.py compile time 2>&1 \
    | grep -v "^20" | tail -12
  ONLY=${ONLY:-snippets/level5} rerecord_rest
fi
echo "done after $(( $(date +%s) - start )) s"
