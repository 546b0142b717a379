"""The re-recording of stale GPU snippets (kda.site.rerecord): which snippets time, the order and
budget of a device call, the Triton cache that keeps compiled kernels but not autotune choices made
under load, and the caches carried from one call to the next."""

import os
import tarfile
import threading
import time
from pathlib import Path

import pytest

from kda.site import rerecord as rr
from kda.site import snippets as sn

ROOT = Path(__file__).resolve().parents[1]


def test_the_timing_snippets_are_those_that_call_the_timer():
    gpu = [s for s in sn.discover(ROOT) if s.where == "gpu"]
    timing = {s.path for s in gpu if rr.is_timing(s)}
    assert {"snippets/level5/latency.py", "snippets/cp/split_latency.py", "snippets/bench/sdpa.py"} <= timing
    assert not any("error" in path for path in timing)
    assert {s.path for s in gpu if "kernel_error" in s.path} and all(
        not rr.is_timing(s) for s in gpu if "kernel_error" in s.path)


def test_only_compiled_kernels_leave_the_warm_up_cache(tmp_path):
    warm, cache = tmp_path / "warm", tmp_path / "cache"
    for name, files in {"aaa": ["k.cubin", "k.json"], "bbb": ["k.autotune.json"], "ccc": ["c.cubin"]}.items():
        (warm / name).mkdir(parents=True)
        for f in files:
            (warm / name / f).write_text(name)
    (cache / "ccc").mkdir(parents=True)
    (cache / "ccc" / "c.cubin").write_text("kept")
    assert rr.keep_compiled(warm, cache) == 1
    assert sorted(p.name for p in cache.iterdir()) == ["aaa", "ccc"]
    assert (cache / "ccc" / "c.cubin").read_text() == "kept"            # an existing entry is left alone
    assert rr.keep_compiled(tmp_path / "absent", cache) == 0


def _snippets(root: Path, specs: dict) -> list:
    """GPU snippets under ``root``: name -> (timing?, seconds of a previous record or None)."""
    (root / "snippets").mkdir(parents=True)
    out = []
    for name, (timing, seconds) in specs.items():
        body = "from kda.bench import median_ms\nprint(median_ms(lambda: 0))\n" if timing else "print(1)\n"
        (root / "snippets" / f"{name}.py").write_text("# snippet: gpu\n" + body)
        s = sn.load(root, f"snippets/{name}.py")
        if seconds is not None:
            sn.write_record(s, sn.Result("old", None, {}, seconds), {"device": "NVIDIA H200"}, digest="0" * 16)
        out.append(s)
    return out


class FakeRecorder(rr.Recorder):
    """Each snippet takes ``cost[name]`` seconds of a fake clock, capped at its timeout: in phase 1
    side by side (the phase lasts as long as its longest run), in phase 2 one after another."""

    def __init__(self, cost, fail=()):
        super().__init__({"device": "test"}, log=lambda line: None)
        self.now, self.cost, self.fail, self.phase2, self.lock = 0.0, cost, fail, False, threading.Lock()
        self.events, self.packs = [], 0

    def clock(self):
        return self.now

    def _spend(self, name, timeout):
        spent = min(self.cost[name], timeout)
        self.now = self.now + spent if self.phase2 else max(self.now, spent)

    def record(self, snippet, timeout):
        name = Path(snippet.path).stem
        with self.lock:
            self.events.append(("record", name, timeout, self.phase2))
            self._spend(name, timeout)
            if name in self.fail:
                return "failed"
            return "timeout" if self.cost[name] > timeout else "recorded"

    def warm(self, snippet, timeout, triton_dir):
        name = Path(snippet.path).stem
        with self.lock:
            self.events.append(("warm", name, timeout, self.phase2))
            self._spend(name, timeout)
            return self.cost[name] if self.cost[name] <= timeout else None

    def after_record(self):
        self.phase2, self.packs = True, self.packs + 1


def test_a_call_records_checks_in_parallel_then_timings_alone_quickest_first(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    (tmp_path / "triton").mkdir()
    todo = _snippets(tmp_path, {"err_a": (False, 10), "err_slow": (False, 300), "err_bad": (False, 5),
                                "lat_long": (True, 20), "lat_short": (True, 40), "lat_new": (True, None),
                                "lat_cold": (True, 30)})
    rec = FakeRecorder({"err_a": 10, "err_slow": 300, "err_bad": 1, "lat_long": 250, "lat_short": 40,
                        "lat_new": 100, "lat_cold": 200}, fail={"err_bad"})
    outcome = rr.rerecord(todo, rec, budget_s=560, warm_s=180, after_record=rec.after_record, clock=rec.clock)
    phase1 = {(kind, name) for kind, name, timeout, later in rec.events if not later}
    assert phase1 == {("record", "err_a"), ("record", "err_slow"), ("record", "err_bad"),
                      ("warm", "lat_long"), ("warm", "lat_short"), ("warm", "lat_new"), ("warm", "lat_cold")}
    assert all(timeout == 180 for _, _, timeout, later in rec.events if not later)
    # phase 2: finished warm-ups by their seconds, then the stopped ones by the previous record's
    # seconds (a record of 20 s whose warm-up did not finish in 180 s is not quick any more)
    assert [(name, timeout) for kind, name, timeout, later in rec.events if later] == [
        ("lat_short", 380), ("lat_new", 340), ("lat_long", 240)]
    assert {Path(p).stem: state for p, state in outcome.items()} == {
        "err_a": "recorded", "err_bad": "failed", "lat_short": "recorded", "lat_new": "recorded",
        "lat_long": "timeout", "lat_cold": "no time", "err_slow": "no time"}
    assert rec.packs == 4                                       # after phase 1 and after each record


def test_without_timing_snippets_the_checks_get_the_whole_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    todo = _snippets(tmp_path, {"err_a": (False, 10), "err_b": (False, 400)})
    rec = FakeRecorder({"err_a": 10, "err_b": 400})
    outcome = rr.rerecord(todo, rec, budget_s=560, warm_s=180, after_record=rec.after_record, clock=rec.clock)
    assert {e[2] for e in rec.events} == {560}
    assert set(outcome.values()) == {"recorded"}


def _kernel(cache: Path, name: str, size: int, mtime: float) -> None:
    """A tilelang cache entry as tilelang 0.1.15 lays it out: the kernel's folder, files that do not
    compress, and beside it nvcc's cubin in the compiler cache."""
    entry = cache / "0.1.15" / "linux-x86_64" / "kernels" / name
    entry.mkdir(parents=True)
    (entry / "executable.so").write_bytes(os.urandom(size))
    os.utime(entry, (mtime, mtime))
    binary = cache / "0.1.15" / rr.COMPILER_CACHE / f"{name}-source-hash"
    binary.mkdir(parents=True)
    (binary / "kernel.cubin").write_bytes(os.urandom(size))


def test_caches_travel_in_parts_and_come_back(tmp_path, monkeypatch):
    tl, tr = tmp_path / "tl", tmp_path / "tr"
    _kernel(tl, "k1", 1000, 1e9)
    (tr / "h1").mkdir(parents=True)
    (tr / "h1" / "f.autotune.json").write_text('{"config": 1}')
    (tr / "h2").mkdir()
    (tr / "h2" / "f.cubin").write_bytes(b"binary")              # binaries stay: only the choices travel
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tl))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tr))
    monkeypatch.setattr(rr, "PART_BYTES", 400)                  # several parts from a small archive
    out = tmp_path / "out"
    out.mkdir()
    files = rr.pack_caches(out)
    parts = [f for f in files if f.name.startswith(rr.CACHE_ARCHIVE)]
    assert files[0].name == rr.CHOICES_ARCHIVE
    assert len(parts) > 1 and all(p.stat().st_size <= 400 for p in parts)

    fresh_tl, fresh_tr = tmp_path / "fresh_tl", tmp_path / "fresh_tr"
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(fresh_tl))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(fresh_tr))
    assert rr.unpack_caches(out)
    kernel = Path("0.1.15") / "linux-x86_64" / "kernels" / "k1" / "executable.so"
    assert (fresh_tl / kernel).read_bytes() == (tl / kernel).read_bytes()
    assert not (fresh_tl / "0.1.15" / rr.COMPILER_CACHE).exists()   # nvcc's cache stays behind
    assert (fresh_tr / "h1" / "f.autotune.json").read_text() == '{"config": 1}'
    assert not (fresh_tr / "h2").exists()
    assert not rr.unpack_caches(tmp_path / "empty")


def test_a_cache_too_large_keeps_the_choices_and_the_newest_kernels(tmp_path, monkeypatch):
    tl, tr = tmp_path / "tl", tmp_path / "tr"
    for n in range(6):
        _kernel(tl, f"k{n}", 10_000, 1e9 + n)                   # k5 is the newest
    (tr / "h1").mkdir(parents=True)
    (tr / "h1" / "f.autotune.json").write_text('{"config": 1}')
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tl))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tr))
    out = tmp_path / "out"
    out.mkdir()
    files = rr.pack_caches(out, max_bytes=35_000)               # room for about three kernels
    assert sum(f.stat().st_size for f in files) <= 35_000
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(fresh / "tl"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(fresh / "tr"))
    assert rr.unpack_caches(out)
    kept = sorted(p.name for p in (fresh / "tl" / "0.1.15" / "linux-x86_64" / "kernels").iterdir())
    assert 2 <= len(kept) <= 3 and kept == [f"k{n}" for n in range(6 - len(kept), 6)]
    assert (fresh / "tr" / "h1" / "f.autotune.json").exists()
    # no room for any kernel: the choices still travel
    for f in out.iterdir():
        f.unlink()
    assert [f.name for f in rr.pack_caches(out, max_bytes=5_000)] == [rr.CHOICES_ARCHIVE]


def test_a_cut_archive_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tl"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tr"))
    _kernel(tmp_path / "tl", "k", 8000, 1e9)                    # does not compress: several parts
    monkeypatch.setattr(rr, "PART_BYTES", 1000)
    parts = rr.pack_caches(tmp_path)
    assert len(parts) > 2
    parts[-1].unlink()
    with pytest.raises((EOFError, tarfile.ReadError)):
        rr.unpack_caches(tmp_path)


def test_the_command_records_what_is_stale_and_returns_it(tmp_path, monkeypatch):
    """``python -m kda.site rerecord`` end to end with the GPU faked: a stale check and a stale
    timing snippet are recorded, a current one is left alone, and ``--out`` holds the records and
    the caches."""
    from kda.site import __main__ as cli

    todo = _snippets(tmp_path, {"err_a": (False, 10), "lat_b": (True, 20), "lat_ok": (True, 30)})
    current = todo[2]
    sn.write_record(current, sn.Result("kept", None, {}, 30.0), {"device": "NVIDIA H200"})
    ran = []

    def fake_run(snippet, timeout=None, env=None):
        ran.append((Path(snippet.path).stem, "TRITON_CACHE_DIR" in (env or {})))
        return sn.Result(f"new {snippet.path}", {"ok": 1}, {}, 1.0)

    monkeypatch.setattr(cli, "ROOT", tmp_path)
    monkeypatch.setattr(sn, "provenance", lambda commit=None: {"device": "NVIDIA H200", "commit": commit})
    monkeypatch.setattr(sn, "run", fake_run)
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tl"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tr"))
    _kernel(tmp_path / "tl", "k", 100, 1e9)
    out = tmp_path / "out"
    assert cli.main(["rerecord", "--out", str(out), "--budget", "100", "--warm", "5", "--commit", "abc"]) == 0
    assert sorted(ran) == [("err_a", False), ("lat_b", False), ("lat_b", True)]   # a warm-up, then the record
    for s in todo:
        assert sn.record_status(s)[0] == "ok"
    assert sn.read_record(current)["output"] == "kept"
    with tarfile.open(out / "records.tar") as tar:
        names = sorted(n for n in tar.getnames() if n.endswith(".json"))
    assert names == ["./err_a.nvidia-h200.json", "./lat_b.nvidia-h200.json", "./lat_ok.nvidia-h200.json"]
    assert [p.name for p in out.glob("caches.tgz.part*")] == ["caches.tgz.part00"]


def test_the_recorder_hashes_the_modules_of_the_run(tmp_path):
    """The record's hash is taken over the modules the run reports, and the record keeps the list."""
    snippet = _snippets(tmp_path, {"probe": (False, None)})[0]
    run = lambda snippet, timeout=None, env=None: sn.Result("| a |", None, {}, 1.0, ["kda/metrics.py"])
    assert rr.Recorder({"device": "NVIDIA H200"}, log=lambda line: None, run=run).record(snippet, 1.0) == "recorded"
    record = sn.read_record(snippet)
    assert record["modules"] == ["kda/metrics.py"]
    assert record["hash_scheme"] == sn.HASH_SCHEME
    assert record["source_hash"] == sn.source_hash(snippet, modules=["kda/metrics.py"]) != sn.source_hash(
        snippet, modules=[])
    assert sn.record_status(snippet)[0] == "ok"


def test_the_recorder_tells_a_timeout_from_a_failure(tmp_path):
    """A timeout is retried later in the call, a failure is not: the recorder tells them apart by
    the error's type (sn.SnippetTimeout), whatever its message."""
    snippet = _snippets(tmp_path, {"probe": (False, None)})[0]

    def run_raising(error):
        def run(snippet, timeout=None, env=None):
            raise error
        return run

    outcome = lambda error: rr.Recorder({"device": "NVIDIA H200"}, log=lambda line: None,
                                        run=run_raising(error)).record(snippet, 1.0)
    assert outcome(sn.SnippetTimeout("slow")) == "timeout"
    assert outcome(sn.SnippetError("raised (exit 1): did not finish the table")) == "failed"


def test_a_timeout_stops_what_the_snippet_started(tmp_path):
    """A GPU snippet runs in a session of its own: at its timeout the processes it started (a
    compiler, say) are stopped with it, and do not go on beside the next record."""
    (tmp_path / "snippets").mkdir()
    pid_file = tmp_path / "child.pid"
    (tmp_path / "snippets" / "spawn.py").write_text(
        "# snippet: gpu\nimport subprocess, time\n"
        f"p = subprocess.Popen(['sleep', '60'])\nopen({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n")
    snippet = sn.load(tmp_path, "snippets/spawn.py")
    with pytest.raises(sn.SnippetTimeout):
        sn.run(snippet, timeout=3)
    pid = int(pid_file.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_failure_is_logged_with_the_exception_it_ended_with(tmp_path):
    """The log line of a failed snippet names the last line of its error, the exception, not only
    "raised (exit 1):" (run 88 lost a call's three GDN records to an assertion it did not show)."""
    snippet = _snippets(tmp_path, {"probe": (False, None)})[0]
    lines = []

    def run(snippet, timeout=None, env=None):
        raise sn.SnippetError("snippet snippets/probe.py raised (exit 1):\nTraceback ...\n"
                              "AssertionError: run with FLA_FLASH_QLA=0")

    recorder = rr.Recorder({"device": "NVIDIA H200"}, log=lines.append, run=run)
    assert recorder.record(snippet, 1.0) == "failed"
    assert recorder.warm(snippet, 1.0, tmp_path) is None
    assert all("raised (exit 1):" in line and "AssertionError: run with FLA_FLASH_QLA=0" in line for line in lines)


def test_gpu_snippets_run_with_fla_own_gdn_kernels(tmp_path):
    """Every snippet runs with FLA_FLASH_QLA=0 unless the caller says otherwise: the GDN snippets
    time fla's Triton kernels beside FlashQLA, and fla would dispatch to FlashQLA without it."""
    (tmp_path / "snippets").mkdir()
    (tmp_path / "snippets" / "probe.py").write_text("# snippet: gpu\nimport os\nprint(os.environ['FLA_FLASH_QLA'])\n")
    assert sn.run(sn.load(tmp_path, "snippets/probe.py"), timeout=120).output.strip() == "0"
