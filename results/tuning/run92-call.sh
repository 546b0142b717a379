#!/usr/bin/env bash
# Run 92, one device call (carry .gpu and .carry): GDN's scalar-gate path on packed sequences, at 32
# heads and in the long-context split (run92-gdn.py); rows in $OUT/run92.jsonl.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0
start=$(date +%s)
bash .gpu/install.sh /tmp/site > /tmp/install.txt 2>&1 || { cat /tmp/install.txt; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
[ -d .carry ] && python -c "from kda.site.rerecord import unpack_caches; print('caches back:', unpack_caches('.carry'))"
timeout $(( ${TOTAL:-560} - 40 - $(date +%s) + start )) python results/tuning/run92-gdn.py 2>&1 | grep -v "^20" | tail -40
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
