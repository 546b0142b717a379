"""Snippets: small programs whose printed Markdown appears under their code on a page.

A snippet is a Python file under ``snippets/`` whose first line says where it runs::

    # snippet: cpu
    # snippet: gpu
    # snippet: cpu uses=snippets/level1/latency.py     (reads that snippet's recorded data)
    #   uses=snippets/level2/latency.py                 (more uses= on comment lines right below)

It prints Markdown (tables, text, ``runtime.figure`` images) to stdout. CPU snippets run
while the site builds and are cached by their source hash; GPU snippets run through
``python -m kda.site run --gpu`` on a GPU machine, which writes one record per snippet and
device under ``results/gpu/``; the build injects the record and checks its hash.

The source hash covers the snippet, the ``kda`` modules it runs and the records it ``uses``. A
GPU record lists the ``kda`` modules its run had imported when it ended (``modules``), and its
hash covers those files: a kernel module that a snippet never loaded does not make its record
stale. Where a record has no list (records made before it existed) and for CPU snippets, the
modules are found by reading the imports, followed through the package's own imports, function
bodies included.
"""

from __future__ import annotations

import ast
import datetime
import functools
import hashlib
import importlib.util
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HEADER = re.compile(r"^#\s*snippet:\s*(cpu|gpu)\b(.*)$")
USES_LINE = re.compile(r"^#\s+uses=")
DEFAULT_DEVICE = "nvidia-h200"


class SnippetError(Exception):
    """A snippet that cannot be run or shown; the message names the snippet."""


class SnippetTimeout(SnippetError):
    """A snippet that did not finish within its time (the re-recorder retries these later)."""


@dataclass
class Snippet:
    root: Path            # the project root (where mkdocs.yml is)
    path: str             # relative to root, e.g. "snippets/level1/agreement.py"
    where: str            # "cpu" or "gpu"
    uses: list[str] = field(default_factory=list)

    @property
    def file(self) -> Path:
        return self.root / self.path

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]", "-", self.path.removeprefix("snippets/").removesuffix(".py"))


def load(root: Path, path: str) -> Snippet:
    file = Path(root) / path
    if not file.is_file():
        raise SnippetError(f"snippet {path} does not exist")
    lines = file.read_text(encoding="utf-8").splitlines()
    m = HEADER.match(lines[0]) if lines else None
    if m is None:
        raise SnippetError(f"snippet {path} must start with '# snippet: cpu' or '# snippet: gpu'")
    uses = re.findall(r"uses=(\S+)", m.group(2))
    for line in lines[1:]:                       # more uses= on the comment lines right below
        if not USES_LINE.match(line):
            break
        uses += re.findall(r"uses=(\S+)", line)
    return Snippet(Path(root), path, m.group(1), uses)


def discover(root: Path) -> list[Snippet]:
    return [load(root, p.relative_to(root).as_posix()) for p in sorted((Path(root) / "snippets").rglob("*.py"))
            if not p.name.startswith("_")]


# --- hashing -------------------------------------------------------------------------------

def _imported_modules(source: str, package: str | None) -> set[str]:
    """The modules an ``import`` anywhere in ``source`` names. ``from X import Y`` names the
    module ``X.Y`` when there is one, else ``X`` (``Y`` is an attribute of ``X``)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level and package:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                names.add(sub if _module_file(sub) is not None else base)
    return names


@functools.lru_cache(maxsize=None)
def _module_imports(file: Path, mtime_ns: int, package: str) -> frozenset:
    """``_imported_modules`` of a module file, parsed once per version of the file (44 snippets
    share the same few modules; parsing each for every snippet took seconds per build)."""
    return frozenset(_imported_modules(file.read_text(encoding="utf-8"), package))


@functools.lru_cache(maxsize=None)
def _module_file(name: str) -> Path | None:
    if name != "kda" and not name.startswith("kda."):
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def kda_closure(source: str) -> list[Path]:
    """The files of the ``kda`` modules ``source`` imports by name, transitively.

    A package's ``__init__`` counts only where it is imported by name (``import kda``), not
    for every submodule, so that exporting a new level does not invalidate the records of
    the old ones. ``kda.site`` (this plumbing) is left out: it formats, it does not measure.
    """
    seen: dict[str, Path] = {}
    todo = list(_imported_modules(source, None))
    while todo:
        name = todo.pop()
        if name in seen or not _measured(name):
            continue
        file = _module_file(name)
        if file is None:
            continue
        seen[name] = file
        package = name if file.name == "__init__.py" else name.rpartition(".")[0]
        todo.extend(_module_imports(file, file.stat().st_mtime_ns, package))
    return sorted(set(seen.values()))


def _measured(name: str) -> bool:
    """A ``kda`` module whose code a record depends on: ``kda.site`` (this plumbing) formats, it
    does not measure."""
    return (name == "kda" or name.startswith("kda.")) and not (name == "kda.site" or name.startswith("kda.site."))


def _kda_dir() -> Path | None:
    """The folder of the ``kda`` package this process imports."""
    file = _module_file("kda")
    return None if file is None else file.parent


def _kda_path(file) -> str:
    """``kda/...py``: a module file's path from the package's folder."""
    return "kda/" + Path(file).resolve().as_posix().rsplit("/kda/", 1)[-1]


def loaded_kda_modules(modules: dict) -> list[str]:
    """The measured ``kda`` modules among ``modules`` (a copy of ``sys.modules`` taken when a
    snippet's run ended), as ``kda/...py`` paths."""
    return sorted({_kda_path(m.__file__) for name, m in modules.items()
                   if _measured(name) and (getattr(m, "__file__", None) or "").endswith(".py")})


def _module_files(snippet: Snippet, modules: list[str] | None) -> list[tuple[str, Path | None]]:
    """(``kda/...py``, its file) for the modules a hash covers: ``modules`` where given (a run's, or
    those its record lists), else the ``kda_closure`` of the snippet's imports; sorted."""
    if modules is not None:
        kda_dir = _kda_dir()
        return [(rel, kda_dir / rel.removeprefix("kda/") if kda_dir is not None else None) for rel in sorted(modules)]
    return [(_kda_path(file), file) for file in kda_closure(snippet.file.read_text(encoding="utf-8"))]


# How a GPU record's hash reads its Python inputs. "code": the syntax tree without docstrings, so that an
# edit of comments, docstrings or layout alone (which cannot change what a run measures) leaves records
# fresh; "raw": the bytes, as records made before the scheme existed (no ``hash_scheme``) were hashed.
# The tree is written by ``_tree_text``, not ``ast.dump``: the GPU machine's Python (3.12) dumps fields that
# 3.11 does not have (``type_params=[]``), so its records looked stale here though no file had changed.
HASH_SCHEME = "code"


def _tree_text(node) -> str:
    """A syntax tree as text, the same under every Python 3 that parses it: node names and the fields
    that hold something (fields a later Python added are empty where the code does not use them)."""
    if isinstance(node, ast.AST):
        fields = ((name, getattr(node, name, None)) for name in node._fields)
        return type(node).__name__ + "(" + ", ".join(
            f"{name}={_tree_text(value)}" for name, value in fields
            if value is not None and not (isinstance(value, list) and not value)) + ")"
    if isinstance(node, list):
        return "[" + ", ".join(_tree_text(x) for x in node) + "]"
    return repr(node)


def _code_bytes(file: Path) -> bytes:
    """A ``.py`` file as its syntax tree without docstrings (``ast.dump``); any other file, or one that does
    not parse, as its bytes."""
    data = file.read_bytes()
    if file.suffix != ".py":
        return data
    try:
        tree = ast.parse(data)
    except SyntaxError:
        return data
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return b"code\0" + _tree_text(tree).encode()


def _input_bytes(file: Path | None, scheme: str) -> bytes:
    if file is None or not file.exists():
        return b"missing"
    return _code_bytes(file) if scheme == "code" else file.read_bytes()


def source_hash(snippet: Snippet, records_dir: Path | None = None, device: str = DEFAULT_DEVICE,
                modules: list[str] | None = None, scheme: str = HASH_SCHEME) -> str:
    """The hash a record of ``snippet`` must carry: over ``modules`` (``kda/...py`` paths: a run's, or
    those its record lists) where given, else over ``kda_closure`` of the snippet's imports; the Python
    files read as ``scheme`` says (``HASH_SCHEME``: "code" or "raw")."""
    h = hashlib.sha256()
    snippet_text = _code_bytes(snippet.file) if scheme == "code" else snippet.file.read_text(encoding="utf-8").encode()
    h.update(b"snippet\0" + snippet_text)
    if modules is not None:
        h.update(b"\0run modules")
    for rel, file in _module_files(snippet, modules):
        h.update(f"\0{rel}\0".encode() + _input_bytes(file, scheme))
    for used in snippet.uses:
        record = record_path(load(snippet.root, used), records_dir, device)
        h.update(f"\0uses {used}\0".encode() + (record.read_bytes() if record.exists() else b"missing"))
    return h.hexdigest()[:16]


# --- running -------------------------------------------------------------------------------

@dataclass
class Result:
    output: str                 # Markdown; figures as FIGURE(name.png) placeholders
    data: object = None         # JSON-able data the snippet saved (runtime.save_data)
    figures: dict = field(default_factory=dict)   # name -> bytes
    seconds: float = 0.0
    modules: list | None = None  # the kda modules the run had imported (GPU snippets)


PRELOAD = ["torch"]            # imported once by a fork server; every snippet starts from a copy
_server_lock = threading.Lock()
_server = None


def _fork_server():
    """The forkserver context, started once per build with ``PRELOAD`` imported: 45 snippets that
    each import torch anew spent about a minute of a cold build's CPU time on it."""
    global _server
    with _server_lock:
        if _server is None:
            _server = multiprocessing.get_context("forkserver")
            _server.set_forkserver_preload(PRELOAD)
        return _server


EXIT_CODE_FILE = "exit_code.txt"


def _child(file: str, root: str, env: dict, stdout: str, stderr: str) -> None:
    """In a process forked from the server: the snippet as ``python <file>`` from ``root`` runs it,
    stdout and stderr to files (C-level output too), ``kda`` imported afresh from ``root``."""
    import runpy
    import traceback

    for fd, path in ((1, stdout), (2, stderr)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), fd)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(root)
    for name in [m for m in sys.modules if m == "kda" or m.startswith("kda.")]:
        del sys.modules[name]                 # the server's kda may be another checkout's
    sys.path[:0] = [os.path.dirname(file)] + env["PYTHONPATH"].split(os.pathsep)
    sys.argv = [file]
    code = 0
    try:
        runpy.run_path(file, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported like the interpreter would
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # the exit code in a file too: the parent reads a child's status from the fork server, and when
    # that read fails (the server gone) multiprocessing reports 255 for a snippet that succeeded
    with open(os.path.join(os.path.dirname(stdout), EXIT_CODE_FILE), "w") as f:
        f.write(str(code))
    os._exit(code)


# ``python <snippet>`` as runpy does it, which then writes the kda modules it had imported
# (``loaded_kda_modules``) to $KDA_SNIPPET_OUT/modules.json, also when the snippet exits
RUN_AND_LIST_MODULES = """
import json, os, runpy, sys
file = sys.argv[1]
sys.argv = [file]
sys.path[0] = os.path.dirname(os.path.abspath(file))
try:
    runpy.run_path(file, run_name="__main__")
finally:
    loaded = dict(sys.modules)          # before the import below adds kda's own
    from kda.site.snippets import loaded_kda_modules
    with open(os.path.join(os.environ["KDA_SNIPPET_OUT"], "modules.json"), "w") as f:
        json.dump(loaded_kda_modules(loaded), f)
"""


def _run_fresh(snippet: Snippet, timeout: float | None, env: dict) -> tuple[int | None, str, str]:
    """``python <snippet>`` in a new interpreter: (exit code, stdout, stderr); ``None`` on timeout."""
    # a session of its own, so that a timeout also stops what the snippet started (compilers)
    proc = subprocess.Popen([sys.executable, "-c", RUN_AND_LIST_MODULES, str(snippet.file)], cwd=snippet.root,
                            env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, "", ""
    return proc.returncode, stdout, stderr


def _run_forked(snippet: Snippet, timeout: float | None, env: dict, out: Path) -> tuple[int | None, str, str]:
    """The same, forked from the server that has imported torch; output through files in ``out``."""
    stdout, stderr = out / "stdout.txt", out / "stderr.txt"
    proc = _fork_server().Process(target=_child, args=(str(snippet.file), str(snippet.root), env,
                                                       str(stdout), str(stderr)))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return None, "", ""
    read = lambda f: f.read_text(encoding="utf-8") if f.exists() else ""
    written = out / EXIT_CODE_FILE
    if written.exists():                      # what the snippet itself exited with
        return int(written.read_text()), read(stdout), read(stderr)
    if proc.exitcode != 0:                    # it never reached its end (killed, or the server lost): once more, alone
        return _run_fresh(snippet, timeout, env)
    return proc.exitcode, read(stdout), read(stderr)


def run(snippet: Snippet, timeout: float | None = None, env: dict | None = None) -> Result:
    """Run the snippet in a process of its own from the project root: a CPU snippet forked from a
    server that has imported torch (to the snippet it is ``python <snippet>``), a GPU snippet in a
    fresh interpreter, as the records were always made."""
    with tempfile.TemporaryDirectory(prefix="kda-snippet-") as out:
        child_env = dict(os.environ, **(env or {}))
        child_env["KDA_SNIPPET_OUT"] = out
        child_env["PYTHONPATH"] = os.pathsep.join([str(snippet.root)] + [p for p in [child_env.get("PYTHONPATH")] if p])
        child_env.setdefault("MPLBACKEND", "Agg")
        # the GDN snippets time fla's own Triton kernels: with flash_qla importable, fla's
        # chunk_gated_delta_rule would dispatch to FlashQLA (they assert this is set)
        child_env.setdefault("FLA_FLASH_QLA", "0")
        start = time.time()
        if snippet.where == "gpu":
            code, stdout, stderr = _run_fresh(snippet, timeout, child_env)
        else:
            code, stdout, stderr = _run_forked(snippet, timeout, child_env, Path(out))
        seconds = time.time() - start
        if code is None:
            raise SnippetTimeout(f"snippet {snippet.path} did not finish within {timeout} s")
        if code != 0:
            tail = "\n".join((stderr or stdout).strip().splitlines()[-15:])
            raise SnippetError(f"snippet {snippet.path} raised (exit {code}):\n{tail}")
        data_file = Path(out) / "data.json"
        data = json.loads(data_file.read_text()) if data_file.exists() else None
        figures = {p.name: p.read_bytes() for p in Path(out).glob("*.png")}
        modules_file = Path(out) / "modules.json"
        modules = json.loads(modules_file.read_text()) if modules_file.exists() else None
        return Result(without_log_lines(stdout), data, figures, seconds, modules)


# tilelang logs through tqdm.write, that is to stdout, where a snippet's Markdown goes
TILELANG_LOG_LINE = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\s+\[TileLang:[^\]]*\]")


def without_log_lines(stdout: str) -> str:
    """A snippet's output without the lines tilelang's logger printed into it (its cache warnings
    landed in a recorded table of the level-5 page)."""
    return "".join(line for line in stdout.splitlines(keepends=True) if not TILELANG_LOG_LINE.match(line))


# --- CPU cache -----------------------------------------------------------------------------

def cached_run(snippet: Snippet, cache_dir: Path, records_dir: Path | None = None) -> tuple[Result, bool]:
    """Run a CPU snippet unless an output for its current hash is cached. Returns (result, hit)."""
    digest = source_hash(snippet, records_dir)
    entry = Path(cache_dir) / f"{snippet.slug}-{digest}"
    meta = entry / "result.json"
    if meta.exists():
        stored = json.loads(meta.read_text())
        figures = {name: (entry / name).read_bytes() for name in stored["figures"]}
        return Result(stored["output"], stored["data"], figures, stored["seconds"]), True
    result = run(snippet, env={"KDA_RECORDS_DIR": str(records_dir)} if records_dir else None)
    for old in Path(cache_dir).glob(f"{snippet.slug}-*"):
        shutil.rmtree(old, ignore_errors=True)
    entry.mkdir(parents=True, exist_ok=True)
    for name, blob in result.figures.items():
        (entry / name).write_bytes(blob)
    meta.write_text(json.dumps({"output": result.output, "data": result.data, "figures": sorted(result.figures),
                                "seconds": result.seconds}))
    return result, False


# --- GPU records ---------------------------------------------------------------------------

def record_path(snippet: Snippet, records_dir: Path | None = None, device: str = DEFAULT_DEVICE) -> Path:
    records_dir = Path(records_dir) if records_dir else snippet.root / "results" / "gpu"
    return records_dir / f"{snippet.slug}.{device}.json"


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def provenance(commit: str | None = None) -> dict:
    """Where and with what a record was made."""
    import torch

    from kda.bench import versions

    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            info["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, IndexError):
            info["driver"] = None
    else:
        info["device"] = "cpu"
    info.update(versions())
    info["commit"] = commit if commit is not None else git_commit()
    return info


def git_commit(where: Path | None = None) -> str | None:
    """``git rev-parse HEAD`` in ``where`` (default: the current directory), ``None`` without git."""
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30, cwd=where)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() or None


def write_record(snippet: Snippet, result: Result, info: dict, records_dir: Path | None = None,
                 digest: str | None = None) -> Path:
    """The record of a run; its hash over the run's ``modules`` (``digest``: another, for tests)."""
    if result.figures:
        raise SnippetError(f"GPU snippet {snippet.path} made figures; record data and plot in a CPU snippet")
    device = device_slug(info["device"])
    path = record_path(snippet, records_dir, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"snippet": snippet.path, "output": result.output, "data": result.data,
              "seconds": round(result.seconds, 1), "provenance": info}
    if result.modules is not None:
        record["modules"] = result.modules
    _stamp(snippet, record, path, records_dir, device, digest)
    return path


def _stamp(snippet: Snippet, record: dict, path: Path, records_dir: Path | None, device: str,
           digest: str | None = None) -> None:
    """Write ``record`` to ``path`` with its hash (over the modules it lists; ``digest``: another, for tests)
    under ``HASH_SCHEME``, and each input's own hash, so that a stale record can name the files that changed
    since."""
    if digest is None:
        digest = source_hash(snippet, records_dir, device, modules=record.get("modules"))
    record.update(source_hash=digest, hash_scheme=HASH_SCHEME)
    record["files"] = {name: _file_hash(file, HASH_SCHEME)
                       for name, file in record_inputs(snippet, record, records_dir, device)}
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def read_record(snippet: Snippet, records_dir: Path | None = None, device: str = DEFAULT_DEVICE) -> dict | None:
    path = record_path(snippet, records_dir, device)
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def record_status(snippet: Snippet, records_dir: Path | None = None, device: str = DEFAULT_DEVICE):
    """``("ok" | "stale" | "missing", record or None, current hash)``: the hash over the modules the
    record lists, if it lists them."""
    record = read_record(snippet, records_dir, device)
    scheme = record.get("hash_scheme", "raw") if record else HASH_SCHEME
    digest = source_hash(snippet, records_dir, device, modules=record.get("modules") if record else None,
                         scheme=scheme)
    if record is None:
        return "missing", None, digest
    return ("ok" if record["source_hash"] == digest else "stale"), record, digest


def record_inputs(snippet: Snippet, record: dict, records_dir: Path | None = None,
                  device: str = DEFAULT_DEVICE) -> list[tuple[str, Path]]:
    """The files a record's hash covers, as (path from the project root, file): the snippet, the
    ``kda`` modules the record lists (else those its imports reach), and the records it uses."""
    inputs = [(snippet.path, snippet.file)] + _module_files(snippet, record.get("modules"))
    for used in snippet.uses:
        record_file = record_path(load(snippet.root, used), records_dir, device)
        inputs.append((_root_relative(record_file, snippet.root), record_file))
    return inputs


def _root_relative(path: Path, root: Path) -> str:
    """``path`` from the project root where it lies inside, else its file name."""
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return Path(path).name


def _file_hash(file: Path | None, scheme: str = "raw") -> str:
    return hashlib.sha256(_input_bytes(file, scheme)).hexdigest()[:16] if file is not None and file.exists() else "missing"


def changed_since(snippet: Snippet, record: dict, records_dir: Path | None = None,
                  device: str = DEFAULT_DEVICE) -> list[str] | None:
    """The inputs of a record that changed after it was made (paths from the project root), or
    ``None`` where that cannot be told. A record carries each input's hash (``files``); an older
    one is compared with its inputs as they were at its commit, read from git."""
    inputs = record_inputs(snippet, record, records_dir, device)
    if "files" in record:
        scheme = record.get("hash_scheme", "raw")
        return [path for path, file in inputs if record["files"].get(path) != _file_hash(file, scheme)]
    commit = record.get("provenance", {}).get("commit")
    if not commit or not _git(snippet.root, "cat-file", "-e", f"{commit}^{{commit}}")[0]:
        return None
    changed = []
    for path, file in inputs:
        known, old = _git(snippet.root, "show", f"{commit}:{path}")
        now = file.read_bytes() if file is not None and file.exists() else None
        if (old if known else None) != now:
            changed.append(path)
    return changed


def restamp(snippet: Snippet, records_dir: Path | None = None, device: str = DEFAULT_DEVICE) -> bool:
    """Hash a fresh record of an older scheme ("raw": any edit of a comment would stale it) again under
    ``HASH_SCHEME``, where every input (the snippet, the modules it lists, the records it uses) is byte for
    byte as it was at the record's commit, read from git. Returns whether the record was rewritten. A stale
    record is never restamped: a record made on a working tree with edits that were later dropped would
    look, by its commit, like one of the code here. (The five records of run 102, hashed under Python 3.12's
    ``ast.dump``, were restamped once, before this rule, after a check of their inputs against their commit.)"""
    record = read_record(snippet, records_dir, device)
    commit = (record or {}).get("provenance", {}).get("commit")
    if record is None or not commit or record.get("hash_scheme", "raw") == HASH_SCHEME:
        return False
    if record_status(snippet, records_dir, device)[0] != "ok":
        return False
    for path, file in record_inputs(snippet, record, records_dir, device):
        known, old = _git(snippet.root, "show", f"{commit}:{path}")
        if not known or file is None or not file.exists() or file.read_bytes() != old:
            return False
    _stamp(snippet, record, record_path(snippet, records_dir, device), records_dir, device)
    return True


def _git(root: Path, *args: str) -> tuple[bool, bytes]:
    """``git args`` in ``root``: (whether it succeeded, its output)."""
    try:
        res = subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False, b""
    return res.returncode == 0, res.stdout


def stale_description(record: dict, changed: list[str] | None) -> str:
    """One line for the build's log and ``status``: where a stale record was measured and what
    changed since (``changed_since``)."""
    return (f"measured at {(record['provenance'].get('commit') or 'unknown')[:10]}; changed since: "
            f"{', '.join(changed) if changed is not None else 'unknown'}")


def gpu_record_states(root: Path, records_dir: Path | None = None, device: str = DEFAULT_DEVICE) -> dict:
    """``{snippet path: "ok" | "stale" | "missing"}`` for every GPU snippet of the project."""
    return {s.path: record_status(s, records_dir, device)[0] for s in discover(root) if s.where == "gpu"}


def fresh_mode() -> bool:
    """``KDA_SITE_FRESH=1``: the publishing check, in which a stale record fails like a missing one."""
    return os.environ.get("KDA_SITE_FRESH", "") not in ("", "0")


PROVENANCE_WORDS = {"en": {"driver": "driver", "commit": "commit", "unknown": "unknown", "hash": "source hash"},
                    "zh": {"driver": "驱动", "commit": "提交", "unknown": "未知", "hash": "源码哈希"}}


def provenance_line(record: dict, lang: str = "en") -> str:
    """Where a record was made, in one line of ``lang``: device, driver and versions, commit, date, hash."""
    words = PROVENANCE_WORDS[lang]
    p = record["provenance"]
    parts = [p.get("device", "?")]
    if p.get("driver"):
        parts.append(f"{words['driver']} {p['driver']}")
    if p.get("cuda"):
        parts.append(f"CUDA {p['cuda']}")
    for name in ("torch", "triton", "tilelang", "fla-core", "flash-qla"):
        if p.get(name):
            parts.append(f"{name} {p[name]}")
    commit = (p.get("commit") or words["unknown"])[:10]
    return f"{', '.join(parts)}; {words['commit']} {commit}; {p.get('date', '?')}; {words['hash']} {record['source_hash']}"
