#!/usr/bin/env bash
# Run 122, one device call (carry .gpu and .carry; COMMIT: the commit of this working tree), within TOTAL seconds:
# run122-stages.py (the layer's KDA call and the grouped GDN split, kernel by kernel, beside fla), then the caches
# packed. The 18 tests run 121's time cut (TEST_S seconds, where set).
set -u
source "$(dirname "$0")/device-env.sh"
[ -n "${TEST_S:-}" ] && gpu_tests "$TEST_S" tests/test_gpu_backward.py -k "(switches_landed_off and dtype1) or \
(gradients_with_every_kernel and gdn) or level_gradients_against_token_recurrence"
timeout -k 5 $(( ${TOTAL:-570} - $(date +%s) + start - 60 )) python results/tuning/run122-stages.py 2>&1 \
  | grep "^{\|Error" | cut -c1-600
timeout 50 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
