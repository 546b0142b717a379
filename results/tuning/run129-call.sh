#!/usr/bin/env bash
# Run 129, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# run 128's tests (the fp16 fix and the 5 run 127 did not reach), TEST_S seconds; then, on an H200 (the card the
# records are keyed to), the stale records by rerecord with what is left; on any other card run 128's profiles
# (ncu on chunk_intra of the layer's and the plain call) and the caches packed.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-110} tests/test_gpu_level5.py -k "(activations_in_chunk_intra and dtype0 and fast) or \
(activations_in_chunk_intra and dtype1 and sigmoid and packed and activated) or \
(chunk_kda_steep_chunk_variants and dtype1 and safe_layer and chunk_kda and middles) or \
(l2norm_fused_in_chunk_intra and kda and dtype1 and packed) or (solve_by_halves and kda and dtype1 and logsigmoid and packed)"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  rerecord_rest
  exit
fi
P=results/tuning/run128-profile.py
timeout -k 5 120 python $P --warm-all 2>&1 | grep "warm\|Error" | cut -c1-300
for c in layer plain; do
  timeout -k 5 ${NCU_S:-90} ncu --clock-control none -k "regex:main_kernel|with_activations_kernel" --launch-skip 2 \
    --launch-count 1 --set full --import-source yes -o "$OUT"/ncu-$c python $P --call $c > "$OUT"/ncu-$c.txt 2>&1
  ncu --import "$OUT"/ncu-$c.ncu-rep --page details 2>/dev/null | grep -i "stall\|warp cycles\|occupancy\|duration\|registers\|shared memory\|issued\|eligible\|throughput" \
    | head -60 | tee -a "$OUT"/ncu-$c.txt
done
timeout 120 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
