# snippet: cpu
"""``python -m kda.export chunk_kda <dir>`` into a temporary folder: what the folder holds, and the
CPU check of its own test, run in a fresh interpreter that refuses every import of ``kda`` (the
kernel compiles and the CUDA check of every export run in ``tests/test_export.py``)."""
import re
import tempfile
from pathlib import Path

from kda import export

with tempfile.TemporaryDirectory() as tmp:
    folder = export.export("chunk_kda", Path(tmp))
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    print("```text\n" + "\n".join(files) + "\n```\n")
    summary = export.run_exported_test(folder, "-k", "cpu").stdout.strip().splitlines()[-1]
    print(f"Its CPU check, without `kda`: {re.sub(r' in [0-9.]+s', '', summary).strip('= ')}. "
          f"Verified on: {export.VERIFIED_ON}.")
