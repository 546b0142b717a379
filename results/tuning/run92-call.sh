#!/usr/bin/env bash
# Run 92, one device call (carry .gpu and .carry): GDN's scalar-gate path on packed sequences, at 32
# heads and in the long-context split (run92-gdn.py); rows in $OUT/run92.jsonl.
set -u
source "$(dirname "$0")/device-env.sh"
timeout $(( ${TOTAL:-560} - 40 - $(date +%s) + start )) python results/tuning/run92-gdn.py 2>&1 | grep -v "^20" | tail -40
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
