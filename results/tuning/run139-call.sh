#!/usr/bin/env bash
# Run 139 (prepared 2026-12-06), one device call (carry .gpu; COMMIT: the commit of this working tree), within TOTAL
# seconds: run 137's tests (tests/test_gpu_scalar_gate.py and tests/test_gpu_layer.py, TEST_S seconds), then on an
# H200 the stale records with what is left (rerecord_rest); else run 138's profiles of GDN's pass and FlashQLA's
# fused_chunk_gdr_fwd (NCU_S seconds each), then run137-safe.py with what is left but 20 s.
set -u
source "$(dirname "$0")/device-env.sh"
gpu_tests ${TEST_S:-240} tests/test_gpu_scalar_gate.py tests/test_gpu_layer.py
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  rerecord_rest
else
  P=results/tuning/run138-gdn-profile.py
  profile() {   # name, kernel regex, launches to skip, impl
    timeout -k 5 ${NCU_S:-90} ncu --clock-control none -k "regex:$2" --launch-skip $3 --launch-count 1 --set full \
      -o "$OUT"/ncu-$1 python $P --impl $4 > "$OUT"/ncu-$1.txt 2>&1
    ncu --import "$OUT"/ncu-$1.ncu-rep --page details 2>/dev/null | grep -i "stall\|warp cycles\|occupancy\|duration\|\
registers\|shared memory\|issued\|eligible\|throughput" | head -60 | tee -a "$OUT"/ncu-$1.txt | head -30
  }
  profile pass main_kernel 3 kda
  profile fused_fwd fused_chunk_gdr_fwd 1 flashqla
  left=$(( start + ${TOTAL:-560} - 20 - $(date +%s) ))
  [ $left -gt 40 ] && timeout -k 5 $left python results/tuning/run137-safe.py --warm 2>&1 | grep "^{\|Error\|warm" | cut -c1-600
fi
echo "done after $(( $(date +%s) - start )) s"
