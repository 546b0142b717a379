#!/usr/bin/env bash
# Run 94, one device call (carry .gpu and .carry): chunk_gated_inverse with the heads first in its grid
# (run94-gdn-inverse.py); rows in $OUT/run94.jsonl.
set -u
source "$(dirname "$0")/device-env.sh"
timeout -k 5 $(( ${TOTAL:-560} - 40 - $(date +%s) + start )) python results/tuning/run94-gdn-inverse.py compile time 2>&1 \
  | grep -v "^20" | tail -40
timeout 40 python -c "import os; from pathlib import Path; from kda.site.rerecord import pack_caches; pack_caches(Path(os.environ['OUT']))"
echo "done after $(( $(date +%s) - start )) s"
