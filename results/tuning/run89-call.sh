#!/usr/bin/env bash
# Run 89, one device call (carry .gpu and .carry): install the offline bundle, the GPU tests of the
# scalar-gate GDN path (and level 5's, which share its entry points), then run89's timings.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0
start=$(date +%s)
bash .gpu/install.sh /tmp/site > /tmp/install.txt 2>&1 || { cat /tmp/install.txt; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
[ -d .carry ] && python -c "from kda.site.rerecord import unpack_caches; print('caches back:', unpack_caches('.carry'))"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv
(timeout 150 python results/tuning/run89-gdn-scalar-path.py compile > $OUT/run89-compile.txt 2>&1 &)
timeout ${TEST_S:-300} python -m pytest -o addopts="" -n 14 -q -p no:cacheprovider ${TESTS:-tests/test_gpu_scalar_gate.py} \
  2>&1 | tee $OUT/run89-gpu-tests.txt | tail -25
echo "tests done after $(( $(date +%s) - start )) s"
cp $OUT/run89.jsonl $OUT/run89-compile.jsonl 2>/dev/null; rm -f $OUT/run89.jsonl
left=$(( ${TOTAL:-570} - ($(date +%s) - start) ))
timeout $(( left > 30 ? left - 10 : 20 )) python results/tuning/run89-gdn-scalar-path.py split time packed 2>&1 | grep -v "^20" | tail -80
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
