"""Re-recording stale GPU snippets within the device calls a session has.

A device call is a fresh machine with a time limit. Run one after another, the records of a cold
machine are mostly compile time (tilelang kernels, fla's and FlashQLA's) and autotuning; that fits
in parallel processes, the timing does not. So a call has two phases:

1. **In parallel**: every check snippet (one that times nothing) is run and recorded; every timing
   snippet (one that calls ``kda.bench.median_ms``) is run bare, output discarded, to fill the
   compile caches, and stopped at ``warm_s``. The bare runs write their Triton cache to a folder
   of their own: the autotuning they do beside a dozen other processes is not kept, only the
   compiled kernels, which are copied into the real cache afterwards.
2. **One at a time** on the quiet GPU: the timing snippets whose warm-up finished, quickest
   warm-up first, then the others by the seconds of their previous record; each with the time
   left; then check snippets that phase 1 cut short.

Between calls the caches travel through the call's output folder. ``pack_caches`` writes fla's
autotune choices (made in phase 2, on a quiet GPU; a few kilobytes, re-written after every
record so that a call cut short keeps them) and as much of the tilelang cache as fits, newest
kernels first, as parts under the size limit of a returned file; ``unpack_caches`` puts them
back on the next machine. The autotune choices matter most: without them fla's kernels are
autotuned again, which at level 5 takes minutes of GPU time that no cache of compiled kernels
saves.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kda.site import snippets as sn

PART_BYTES = 15 * 2**20        # a returned file may hold 16 MB
CACHE_ARCHIVE = "caches.tgz"   # the tilelang cache, in parts
CHOICES_ARCHIVE = "autotune.tgz"
PACK_RESERVE_S = 45            # kept out of the budget for packing the caches at the end


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


def _first_and_last(error: Exception) -> str:
    """A snippet's error in one line: what failed and the exception it ended with (run 88 logged
    only "raised (exit 1):" for three snippets whose assertion said why)."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return " ... ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else type(error).__name__


class Recorder:
    """Runs snippets and writes their records, logging one line per event."""

    def __init__(self, info: dict, log=print, run=None):
        self.info, self.log, self.run = info, log, run or sn.run

    def record(self, snippet: sn.Snippet, timeout: float) -> str:
        """``recorded``, ``timeout`` or ``failed``."""
        try:
            result = self.run(snippet, timeout=timeout)
            path = sn.write_record(snippet, result, self.info)
        except sn.SnippetError as e:
            self.log(f"{snippet.path}: not recorded: {_first_and_last(e)}")
            return "timeout" if isinstance(e, sn.SnippetTimeout) else "failed"
        self.log(f"{snippet.path}: recorded in {result.seconds:.1f} s -> {path.name}")
        return "recorded"

    def warm(self, snippet: sn.Snippet, timeout: float, triton_dir: Path) -> float | None:
        """Run ``snippet`` bare to fill the caches. Returns its seconds, ``None`` if it was stopped."""
        start = time.monotonic()
        try:
            self.run(snippet, timeout=timeout, env={"TRITON_CACHE_DIR": str(triton_dir)})
        except sn.SnippetError as e:
            self.log(f"{snippet.path}: warm-up stopped ({_first_and_last(e)})")
            return None
        seconds = time.monotonic() - start
        self.log(f"{snippet.path}: warm-up finished in {seconds:.0f} s")
        return seconds


def rerecord(todo: list[sn.Snippet], recorder: Recorder, budget_s: float, warm_s: float,
             after_record=lambda: None, clock=time.monotonic) -> dict[str, str]:
    """Record ``todo`` within ``budget_s`` seconds, as the module docstring says. Returns each
    snippet's outcome: ``recorded``, ``failed``, ``timeout`` or ``no time``. ``after_record`` runs after each
    record (the caller packs what is done so far, so a call cut short still returns it)."""
    start = clock()
    left = lambda: budget_s - (clock() - start)
    timed = {s.path: is_timing(s) for s in todo}
    timing = [s for s in todo if timed[s.path]]
    checks = [s for s in todo if not timed[s.path]]
    outcome: dict[str, str] = {}
    cut_short = []
    warm_s = min(warm_s, left()) if timing else left()
    with tempfile.TemporaryDirectory(prefix="kda-warm-triton-") as warm_dir:
        with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
            futures = {s.path: pool.submit(recorder.record, s, warm_s) for s in checks}
            warmed = {s.path: pool.submit(recorder.warm, s, warm_s, Path(warm_dir)) for s in timing}
        for s in checks:
            outcome[s.path] = futures[s.path].result()
            if outcome[s.path] == "timeout":
                cut_short.append(s)
        copied = keep_compiled(Path(warm_dir), triton_cache_dir())
        done = sum(outcome[s.path] == "recorded" for s in checks)
        recorder.log(f"phase 1 done at {budget_s - left():.0f} s: {done} of {len(checks)} checks recorded, "
                     f"{copied} compiled Triton kernels kept")
    after_record()
    # a finished warm-up is the best estimate of a record's time; then the previous record's
    warm_seconds = {path: f.result() for path, f in warmed.items()}
    timing.sort(key=lambda s: (warm_seconds[s.path] is None, warm_seconds[s.path] or expected_seconds(s)))
    for s in timing + cut_short:
        if left() < 30:
            outcome[s.path] = "no time"
            recorder.log(f"{s.path}: no time left")
            continue
        outcome[s.path] = recorder.record(s, left())
        after_record()
    return outcome


def pack_choices(out_dir: Path) -> Path | None:
    """fla's autotune choices (the ``*.autotune.json`` files of the Triton cache) as one archive,
    or ``None`` when there are none."""
    triton = triton_cache_dir()
    choices = sorted(triton.glob("*/*.autotune.json")) if triton.is_dir() else []
    if not choices:
        return None
    archive = Path(out_dir) / CHOICES_ARCHIVE
    with tarfile.open(archive.with_suffix(".tmp"), "w:gz") as tar:
        for choice in choices:
            tar.add(choice, arcname=f"triton/{choice.parent.name}/{choice.name}")
    archive.with_suffix(".tmp").replace(archive)          # never half an archive under the real name
    return archive


# nvcc's output keyed by CUDA source, read only when a kernel is compiled again: a cached kernel loads
# from its own folder (tilelang 0.1.15, cache/kernel_cache.py). It was about 40% of the packed bytes.
COMPILER_CACHE = "cuda-binaries"


def _kernel_entries(cache: Path) -> list[Path]:
    """The folders of the tilelang cache that hold files (one compiled kernel each, with everything
    it loads from), newest first; nvcc's own cache (``COMPILER_CACHE``) left out."""
    if not cache.is_dir():
        return []
    entries = [d for d in cache.rglob("*") if d.is_dir() and any(f.is_file() for f in d.iterdir())
               and COMPILER_CACHE not in d.relative_to(cache).parts]
    return sorted(entries, key=lambda d: d.stat().st_mtime, reverse=True)


def _write_archive(archive: Path, entries: list[Path], cache: Path) -> None:
    with tarfile.open(archive, "w:gz") as tar:
        for entry in entries:
            tar.add(entry, arcname=f"tilelang/{entry.relative_to(cache)}")


def _compressed_size(entry: Path, cache: Path) -> int:
    """Bytes that ``entry`` adds to a gzip'd tar of the cache, measured on its own."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(entry, arcname=f"tilelang/{entry.relative_to(cache)}")
    return buffer.tell()


def pack_caches(out_dir: Path, max_bytes: int = 22 * 2**20) -> list[Path]:
    """The autotune choices (``pack_choices``) and the newest kernels of the tilelang cache that
    fit in ``max_bytes`` in all (what fits beside the 38 MB offline bundle and the working tree in
    a call's 64 MiB carry), the latter as ``caches.tgz.partNN`` files under the size limit of a returned file.
    Returns the files written. Kernels are left out whole, newest kept: half an archive would
    not be read (a cut archive loses its end)."""
    out_dir = Path(out_dir)
    written = [p for p in [pack_choices(out_dir)] if p is not None]
    room = max_bytes - sum(p.stat().st_size for p in written)
    cache = tilelang_cache_dir()
    entries = _kernel_entries(cache)
    # each kernel's compressed size once, then the newest that fit: one more compression, not a search
    sizes = [_compressed_size(entry, cache) for entry in entries]
    keep, used = 0, 0
    while keep < len(entries) and used + sizes[keep] <= room:
        used += sizes[keep]
        keep += 1
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / CACHE_ARCHIVE
        while keep > 0:                       # one archive is about the sum of its entries; check it
            _write_archive(archive, entries[:keep], cache)
            if archive.stat().st_size <= room:
                break
            keep -= 1
        if keep <= 0:
            return written
        with archive.open("rb") as f:
            index = 0
            while chunk := f.read(PART_BYTES):
                written.append(out_dir / f"{CACHE_ARCHIVE}.part{index:02d}")
                written[-1].write_bytes(chunk)
                index += 1
    return written


def unpack_caches(carry_dir: Path) -> bool:
    """Put back what ``pack_caches`` wrote (its files copied into ``carry_dir``). Returns whether
    there was anything to put back."""
    carry_dir = Path(carry_dir)
    parts = sorted(carry_dir.glob(f"{CACHE_ARCHIVE}.part*"))
    choices = carry_dir / CHOICES_ARCHIVE
    if not parts and not choices.exists():
        return False
    with tempfile.TemporaryDirectory() as tmp:
        archives = [choices] if choices.exists() else []
        if parts:
            archives.append(Path(tmp) / CACHE_ARCHIVE)
            with archives[-1].open("wb") as f:
                for part in parts:
                    f.write(part.read_bytes())
        for archive in archives:
            with tarfile.open(archive, "r:gz") as tar:
                tar.extractall(tmp, filter="data")
        for name, dest in (("tilelang", tilelang_cache_dir()), ("triton", triton_cache_dir())):
            if (Path(tmp) / name).is_dir():
                shutil.copytree(Path(tmp) / name, dest, dirs_exist_ok=True)
    return True
