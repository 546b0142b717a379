"""Re-recording stale GPU snippets within the device calls a session has.

A device call is a fresh machine with a time limit. Run one after another, the records of a cold
machine are mostly compile time (tilelang kernels, fla's and FlashQLA's) and autotuning; that fits
in parallel processes, the timing does not. So a call has two phases:

1. **In parallel**: every check snippet (one that times nothing) is run and recorded; every timing
   snippet (one that calls ``kda.bench.median_ms``) is run bare, output discarded, to fill the
   compile caches, and stopped at ``warm_s``. The bare runs write their Triton cache to a folder
   of their own: the autotuning they do beside a dozen other processes is not kept, only the
   compiled kernels, which are copied into the real cache afterwards.
2. **One at a time** on the quiet GPU: the timing snippets, shortest expected first (a record's
   previous ``seconds``), each with the time left; then check snippets that phase 1 cut short.

Between calls the caches travel through the call's output folder: ``pack_caches`` writes the
tilelang cache and fla's autotune choices (made in phase 2, on a quiet GPU) as parts under the
size limit of a returned file, ``unpack_caches`` puts them back on the next machine.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kda.site import snippets as sn

PART_BYTES = 15 * 2**20        # a returned file may hold 16 MB
CACHE_ARCHIVE = "caches.tgz"


def is_timing(snippet: sn.Snippet) -> bool:
    """A timing snippet measures with ``kda.bench.median_ms``, the project's one timer; it must
    run alone on the GPU."""
    return "median_ms(" in snippet.file.read_text(encoding="utf-8")


def expected_seconds(snippet: sn.Snippet, device: str = sn.DEFAULT_DEVICE) -> float:
    """How long the snippet took when it was last recorded (``inf`` when it never was)."""
    record = sn.read_record(snippet, device=device)
    return float(record["seconds"]) if record and "seconds" in record else float("inf")


def triton_cache_dir() -> Path:
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def tilelang_cache_dir() -> Path:
    return Path(os.environ.get("TILELANG_CACHE_DIR") or Path.home() / ".tilelang" / "cache")


def keep_compiled(warm: Path, cache: Path) -> int:
    """Copy the compiled kernels of a Triton cache ``warm`` into ``cache``, leaving out every
    entry that holds an autotune choice (``*.autotune.json``). Returns the entries copied."""
    copied = 0
    for entry in sorted(p for p in Path(warm).iterdir() if p.is_dir()) if Path(warm).is_dir() else []:
        if any(f.name.endswith(".autotune.json") for f in entry.iterdir()) or (cache / entry.name).exists():
            continue
        shutil.copytree(entry, cache / entry.name)
        copied += 1
    return copied


class Recorder:
    """Runs snippets and writes their records, logging one line per event."""

    def __init__(self, info: dict, log=print, run=None):
        self.info, self.log, self.run = info, log, run or sn.run

    def record(self, snippet: sn.Snippet, timeout: float) -> str:
        """``recorded``, ``timeout`` or ``failed``."""
        try:
            digest = sn.source_hash(snippet)
            result = self.run(snippet, timeout=timeout)
            path = sn.write_record(snippet, result, digest, self.info)
        except sn.SnippetError as e:
            self.log(f"{snippet.path}: not recorded: {str(e).splitlines()[0]}")
            return "timeout" if isinstance(e, sn.SnippetTimeout) else "failed"
        self.log(f"{snippet.path}: recorded in {result.seconds:.1f} s -> {path.name}")
        return "recorded"

    def warm(self, snippet: sn.Snippet, timeout: float, triton_dir: Path) -> None:
        try:
            self.run(snippet, timeout=timeout, env={"TRITON_CACHE_DIR": str(triton_dir)})
            self.log(f"{snippet.path}: warm-up finished")
        except sn.SnippetError as e:
            self.log(f"{snippet.path}: warm-up stopped ({str(e).splitlines()[0]})")


def rerecord(todo: list[sn.Snippet], recorder: Recorder, budget_s: float, warm_s: float,
             after_record=lambda: None, clock=time.monotonic) -> dict[str, str]:
    """Record ``todo`` within ``budget_s`` seconds, as the module docstring says. Returns each
    snippet's outcome: ``recorded``, ``failed``, ``timeout`` or ``no time``. ``after_record`` runs after each
    record (the caller packs what is done so far, so a call cut short still returns it)."""
    start = clock()
    left = lambda: budget_s - (clock() - start)
    timed = {s.path: is_timing(s) for s in todo}
    timing = sorted((s for s in todo if timed[s.path]), key=expected_seconds)
    checks = [s for s in todo if not timed[s.path]]
    outcome: dict[str, str] = {}
    cut_short = []
    warm_s = min(warm_s, left()) if timing else left()
    with tempfile.TemporaryDirectory(prefix="kda-warm-triton-") as warm_dir:
        with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
            futures = {s.path: pool.submit(recorder.record, s, warm_s) for s in checks}
            for s in timing:
                pool.submit(recorder.warm, s, warm_s, Path(warm_dir))
        for s in checks:
            outcome[s.path] = futures[s.path].result()
            if outcome[s.path] == "timeout":
                cut_short.append(s)
        copied = keep_compiled(Path(warm_dir), triton_cache_dir())
        done = sum(outcome[s.path] == "recorded" for s in checks)
        recorder.log(f"phase 1 done at {budget_s - left():.0f} s: {done} of {len(checks)} checks recorded, "
                     f"{copied} compiled Triton kernels kept")
    after_record()
    for s in timing + cut_short:
        if left() < 30:
            outcome[s.path] = "no time"
            recorder.log(f"{s.path}: no time left")
            continue
        outcome[s.path] = recorder.record(s, left())
        after_record()
    return outcome


def pack_caches(out_dir: Path, max_bytes: int = 24 * 2**20) -> list[Path]:
    """The tilelang cache and fla's autotune choices as ``caches.tgz.partNN`` files under the
    size limit of a returned file, or none if they pass ``max_bytes`` in all (what fits beside
    the 38 MB offline bundle in a call's 64 MiB carry; half a cache is not carried: a cut archive
    loses its end)."""
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / CACHE_ARCHIVE
        with tarfile.open(archive, "w:gz") as tar:
            if tilelang_cache_dir().is_dir():
                tar.add(tilelang_cache_dir(), arcname="tilelang")
            triton = triton_cache_dir()
            for choice in sorted(triton.glob("*/*.autotune.json")) if triton.is_dir() else []:
                tar.add(choice, arcname=f"triton/{choice.parent.name}/{choice.name}")
        size = archive.stat().st_size
        if size > max_bytes:
            return []
        parts = []
        with archive.open("rb") as f:
            while chunk := f.read(PART_BYTES):
                parts.append(out_dir / f"{CACHE_ARCHIVE}.part{len(parts):02d}")
                parts[-1].write_bytes(chunk)
        return parts


def unpack_caches(carry_dir: Path) -> bool:
    """Put back what ``pack_caches`` wrote (its parts copied into ``carry_dir``). Returns whether
    there was anything to put back."""
    parts = sorted(Path(carry_dir).glob(f"{CACHE_ARCHIVE}.part*"))
    if not parts:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / CACHE_ARCHIVE
        with archive.open("wb") as f:
            for part in parts:
                f.write(part.read_bytes())
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(tmp, filter="data")
        for name, dest in (("tilelang", tilelang_cache_dir()), ("triton", triton_cache_dir())):
            if (Path(tmp) / name).is_dir():
                shutil.copytree(Path(tmp) / name, dest, dirs_exist_ok=True)
    return True
