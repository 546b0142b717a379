#!/usr/bin/env bash
# Run 90, one device call (carry .gpu and .carry): optional GPU tests (TESTS=files), the variants of
# chunk_gated_inverse, then the pair.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0
start=$(date +%s)
bash .gpu/install.sh /tmp/site > /tmp/install.txt 2>&1 || { cat /tmp/install.txt; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
[ -d .carry ] && python -c "from kda.site.rerecord import unpack_caches; print('caches back:', unpack_caches('.carry'))"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv
if [ -n "${TESTS:-}" ]; then   # GPU tests first: the edits that landed without a GPU
  timeout "${TEST_S:-150}" python -m pytest -o addopts="" -n 14 -m gpu -q -p no:cacheprovider $TESTS 2>&1 | tee $OUT/gpu-tests.txt | tail -8
fi
timeout $(( ${TOTAL:-540} - 40 - $(date +%s) + start )) python results/tuning/run90-gdn-inverse.py compile time 2>&1 | grep -v "^20" | tail -60
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
