#!/usr/bin/env bash
# Run 104 (carry .gpu and .carry; COMMIT: the commit of this working tree): the GPU tests of what went on by default
# after run 103 (the backward's switches: the pair pieces, scores and inverse from the forward, the pair kernel by 32
# channels, gradients in the inputs' dtype, the level passes from the inputs, packed state kernels; the L2 norm in
# chunk_intra or its own kernel; the activations in chunk_intra) and of the compile fixes (a training step and the
# layer under torch.compile on CUDA), then the backward records they staled, one at a time, with what is left.
# Logs, records and caches to $OUT.
set -u
source "$(dirname "$0")/device-env.sh"
export NO_MKDOCS_2_WARNING=1
left() { echo $(( ${TOTAL:-560} - $(date +%s) + start )); }
TESTS="against_token_recurrence or packed_sequences or with_the_chunk_kernel or with_every_kernel or training_step"
TESTS="$TESTS or without_states or off_switch or compiles_fullgraph or l2norm or activations or values_out_of_range"
TESTS="$TESTS or grouped_value_heads or many_short or varlen or norm_kernel"
OMP_NUM_THREADS=1 timeout -k 5 "${TEST_S:-270}" python -m pytest -o addopts="" -n 12 -m gpu -v -p no:cacheprovider \
  tests/test_gpu_compile.py tests/test_gpu_backward.py tests/test_gpu_level5.py -k "$TESTS" 2>&1 \
  | grep "PASSED\|FAILED\|ERROR\|passed\|failed\|Error\|^E  " | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' \
  > "$OUT"/gpu-tests-defaults.txt
grep -c PASSED "$OUT"/gpu-tests-defaults.txt; grep "FAILED\|ERROR\|passed\|failed" "$OUT"/gpu-tests-defaults.txt | tail -8
for snippet in ${RECORDS:-snippets/backward/latency snippets/backward/gpu_error snippets/backward/training}; do
  budget=$(( $(left) - 40 )); [ "$budget" -gt 220 ] && budget=220
  record "$snippet" "$budget"
done
rerecord_rest
echo "done after $(( $(date +%s) - start )) s"
