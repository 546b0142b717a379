# snippet: cpu
"""``python -m kda.export chunk_kda <dir>`` into a temporary folder: what the folder holds, and the
CPU check of its own test, run in a fresh interpreter that refuses every import of ``kda`` (the
kernel compiles and the CUDA check of every export run in ``tests/test_export.py``)."""
import re
import tempfile
from pathlib import Path

from kda import export
from kda.site.runtime import text

with tempfile.TemporaryDirectory() as tmp:
    folder = export.export("chunk_kda", Path(tmp))
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    print("```text\n" + "\n".join(files) + "\n```\n")
    summary = export.run_exported_test(folder, "-k", "cpu", check=True).stdout.strip().splitlines()[-1]
    result = re.sub(r' in [0-9.]+s', '', summary).strip('= ')
    print(text(zh=f"它的 CPU 检查（不依赖 `kda`）：{result}。验证所用的 GPU：{export.VERIFIED_ON}。",
               en=f"Its CPU check, without `kda`: {result}. Verified on: {export.VERIFIED_ON}."))
