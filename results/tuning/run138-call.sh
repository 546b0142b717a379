#!/usr/bin/env bash
# Run 138 (prepared 2026-12-06), one device call (carry .gpu and .carry; COMMIT: the commit of this working tree),
# within TOTAL seconds: ncu on GDN's pass (inverse_state_output_pass) and on FlashQLA's fused_chunk_gdr_fwd at
# (1, 8192, 96, 128), then on our compact inverse and FlashQLA's kkt_solve, NCU_S seconds each: where their warps
# stall (run138-gdn-profile.py); the stall and throughput lines to $OUT/ncu-*.txt.
set -u
source "$(dirname "$0")/device-env.sh"
P=results/tuning/run138-gdn-profile.py
timeout -k 5 120 python $P --impl kda 2>&1 | tail -1
timeout -k 5 120 python $P --impl flashqla 2>&1 | tail -1
profile() {   # name, kernel regex, launches to skip, impl
  timeout -k 5 ${NCU_S:-100} ncu --clock-control none -k "regex:$2" --launch-skip $3 --launch-count 1 --set full \
    -o "$OUT"/ncu-$1 python $P --impl $4 > "$OUT"/ncu-$1.txt 2>&1
  ncu --import "$OUT"/ncu-$1.ncu-rep --page details 2>/dev/null | grep -i "stall\|warp cycles\|occupancy\|duration\|\
registers\|shared memory\|issued\|eligible\|throughput" | head -60 | tee -a "$OUT"/ncu-$1.txt
}
profile pass main_kernel 3 kda
profile fused_fwd fused_chunk_gdr_fwd 1 flashqla
profile inverse main_kernel 2 kda
profile kkt_solve kkt_solve 1 flashqla
echo "done after $(( $(date +%s) - start )) s"
