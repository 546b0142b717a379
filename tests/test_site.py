"""The site: the strict build of both languages, language parity, and the three ways a page
can lose its numbers (a snippet that raises, a missing GPU record, a stale one)."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kda.site import snippets as sn

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!--\s*snippet:.*-->\s*$", re.MULTILINE)
INCLUDE = re.compile(r'^--8<-- ".*"\s*$', re.MULTILINE)


def mkdocs_build(config: Path, site_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site_dir)],
                          cwd=config.parent, capture_output=True, text=True, env=env)


CHAPTERS = ["math", "level1", "level2", "level3", "level4", "level5", "cp", "inference", "backward", "api",
            "benchmarks"]


@pytest.mark.parametrize("lang", ["", "en/"])
def test_the_playground_can_be_downloaded(built_site, lang):
    """The notebook sits beside its page, executed (outputs included), and the page links to it."""
    page = (built_site / lang / "level1-playground" / "index.html").read_text(encoding="utf-8")
    assert 'href="level1-playground.ipynb"' in page
    nb = json.loads((built_site / lang / "level1-playground" / "level1-playground.ipynb").read_text(encoding="utf-8"))
    assert nb["nbformat"] == 4 and any(cell.get("outputs") for cell in nb["cells"])


@pytest.mark.parametrize("lang", ["", "en/"])
def test_search_index_has_no_raw_latex(built_site, lang):
    index = json.loads((built_site / lang / "search" / "search_index.json").read_text(encoding="utf-8"))
    texts = [doc["title"] + " " + doc["text"] for doc in index["docs"]]
    assert texts and not [t for t in texts if "\\(" in t or "\\operatorname" in t]


def test_strict_build_of_both_languages(built_site):
    for page in ["index.html", "level1-playground/index.html"] + [f"{c}/index.html" for c in CHAPTERS]:
        assert (built_site / page).is_file() and (built_site / "en" / page).is_file()
    assert (built_site / "sitemap.xml").is_file() and (built_site / "en" / "sitemap.xml").is_file()


@pytest.mark.parametrize("chapter", CHAPTERS)
@pytest.mark.parametrize("lang", ["zh", "en"])
def test_pages_show_outputs_and_provenance(built_site, chapter, lang):
    """One output block per snippet marker, one provenance line per GPU snippet, no notice."""
    source = (ROOT / "docs" / lang / f"{chapter}.md").read_text(encoding="utf-8")
    paths = re.findall(r"<!--\s*snippet:\s*(\S+)", source)
    gpu = [p for p in paths if sn.load(ROOT, p).where == "gpu"]
    page = (built_site / ("" if lang == "zh" else "en") / chapter / "index.html").read_text(encoding="utf-8")
    assert page.count('class="kda-output"') == len(paths)
    assert page.count('class="kda-provenance"') == len(gpu)
    assert "NVIDIA H200" in page or not gpu
    for notice in ("not measured yet", "尚未测量", "snippet failed", "代码段运行失败"):
        assert notice not in page.lower()
    stale = [p for p in gpu if sn.record_status(sn.load(ROOT, p))[0] == "stale"]
    assert page.lower().count("stale record" if lang == "en" else "记录已过期") == len(stale)
    assert "[TileLang:" not in page                  # the library's log lines are not the program's output


def test_library_log_lines_are_left_out_of_an_output():
    from kda.site.hooks import LIBRARY_LOG

    text = ("| a |\n2026-11-30 17:36:21  [TileLang:tilelang.cache.kernel_cache:WARNING] (kernel_cache.py:379): "
            "Found kernel 'main' in memory cache.\nEach stage alone:\n")
    assert LIBRARY_LOG.sub("", text) == "| a |\nEach stage alone:\n"
    assert LIBRARY_LOG.sub("", "2026 TileLang and [TileLang: in prose stay\n") == "2026 TileLang and [TileLang: in prose stay\n"


def twins():
    zh = ROOT / "docs" / "zh"
    return [(p, ROOT / "docs" / "en" / p.relative_to(zh)) for p in sorted(zh.rglob("*")) if p.suffix in (".md", ".ipynb")]


@pytest.mark.parametrize("zh,en", twins(), ids=[p.name for p, _ in twins()])
def test_every_page_has_an_english_twin_with_the_same_code_and_outputs(zh, en):
    assert en.is_file(), f"{en} is missing"
    if zh.suffix == ".ipynb":
        code = [[c["source"] for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "code"] for p in (zh, en)]
        assert code[0] == code[1]
        return
    a, b = zh.read_text(encoding="utf-8"), en.read_text(encoding="utf-8")
    assert MARKER.findall(a) == MARKER.findall(b), "snippet markers differ"
    assert INCLUDE.findall(a) == INCLUDE.findall(b), "included code differs"
    fences = re.compile(r"^```.*$", re.MULTILINE)
    assert fences.findall(a) == fences.findall(b), "code fences differ"
    assert a.count("\n|") == b.count("\n|"), "table rows differ"


def test_every_gpu_snippet_has_a_record_with_its_provenance():
    """Every GPU snippet has a committed record (stale is allowed: its page says so), every record
    belongs to a snippet, and its provenance names the machine, the versions and the commit."""
    gpu = [s for s in sn.discover(ROOT) if s.where == "gpu"]
    for snippet in gpu:
        state, record, digest = sn.record_status(snippet)
        assert state != "missing", f"{snippet.path}: no record; run python -m kda.site run --gpu"
        for key in ("device", "driver", "cuda", "torch", "triton", "tilelang", "fla-core", "commit", "date"):
            assert record["provenance"].get(key), f"{snippet.path}: provenance lacks {key}"
    recorded = {p.name for p in (ROOT / "results" / "gpu").glob("*.json")}
    assert recorded == {sn.record_path(s).name for s in gpu}, "a record without its snippet"


def test_the_benchmarks_page_counts_the_records_like_status(built_site):
    """The count on the benchmarks page (both languages) and the home page is the one that
    ``python -m kda.site status`` prints."""
    res = subprocess.run([sys.executable, "-m", "kda.site", "status"], cwd=ROOT, capture_output=True, text=True)
    fresh, total, stale, missing = map(int, re.search(
        r"GPU records: (\d+) of (\d+) fresh, (\d+) stale, (\d+) missing", res.stdout).groups())
    assert res.returncode == (1 if missing else 0)
    for lang, pattern in (("en/", r"GPU records: (\d+) of (\d+) measured on the current code"),
                          ("", r"GPU 记录：(\d+) / (\d+) 份是在当前代码上测得的")):
        for page in ("benchmarks/index.html", "index.html"):
            html = (built_site / lang / page).read_text(encoding="utf-8")
            assert tuple(map(int, re.search(pattern, html).groups())) == (fresh, total), (lang, page)


# --- the failure modes, on a small site of their own ------------------------------------------

MINI_CONFIG = """\
site_name: t
docs_dir: docs/zh
theme: {{name: material, language: zh, font: false}}
hooks: [{hooks}]
markdown_extensions: [admonition, md_in_html, tables, pymdownx.details, pymdownx.superfences]
extra: {{kda: {{language: zh}}}}
"""


@pytest.fixture
def mini_site(tmp_path):
    (tmp_path / "docs" / "zh").mkdir(parents=True)
    (tmp_path / "snippets").mkdir()
    (tmp_path / "mkdocs.yml").write_text(MINI_CONFIG.format(hooks=ROOT / "kda" / "site" / "hooks.py"))

    def make(snippet_source: str, name: str = "probe.py"):
        (tmp_path / "snippets" / name).write_text(textwrap.dedent(snippet_source))
        (tmp_path / "docs" / "zh" / "index.md").write_text(f"# t\n\n<!-- snippet: snippets/{name} -->\n")
        return sn.load(tmp_path, f"snippets/{name}")

    make.root = tmp_path
    return make


def test_a_snippet_that_raises_fails_the_strict_build(mini_site, tmp_path):
    mini_site("# snippet: cpu\nraise RuntimeError('boom')\n")
    res = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert res.returncode != 0
    assert "snippets/probe.py raised" in res.stderr and "RuntimeError: boom" in res.stderr
    assert "(page index.md)" in res.stderr


def test_a_missing_gpu_record_fails_the_strict_build(mini_site, tmp_path):
    mini_site("# snippet: gpu\nprint('| a |\\n|---|\\n| 1 |')\n")
    res = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert res.returncode != 0
    assert "GPU record missing for snippet snippets/probe.py (page index.md)" in res.stderr


def _record(snippet, digest):
    result = sn.Result(output="| a |\n|---|\n| 1 |\n", data=None, seconds=1.0)
    info = {"device": "NVIDIA H200", "date": "2026-01-01 00:00 UTC", "commit": "abc1234567" + "0" * 30, "torch": "x"}
    return sn.write_record(snippet, result, info, snippet.root / "results" / "gpu", digest=digest)


def test_a_stale_gpu_record_is_shown_and_fails_only_the_fresh_build(mini_site, tmp_path):
    """A record made before its snippet changed: the strict build passes and the page keeps the old
    output under a notice naming the commit and the changed file; ``KDA_SITE_FRESH=1`` and
    ``status --fresh`` fail on it."""
    snippet = mini_site("# snippet: gpu\nprint('| a |\\n|---|\\n| 1 |')\n")
    _record(snippet, None)
    assert sn.record_status(snippet)[0] == "ok"
    snippet.file.write_text(snippet.file.read_text() + "changed = 'after the measurement'\n")
    assert sn.record_status(snippet)[0] == "stale"
    assert sn.changed_since(snippet, sn.read_record(snippet)) == ["snippets/probe.py"]
    res = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "记录已过期" in page and "abc1234567" in page and "snippets/probe.py" in page
    assert "<table>" in page and "kda-provenance" in page          # the old output is still there
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml"),
                          "-d", str(tmp_path / "site2")], cwd=tmp_path, capture_output=True, text=True,
                         env=dict(os.environ, NO_MKDOCS_2_WARNING="1", KDA_SITE_FRESH="1"))
    assert res.returncode != 0
    assert "GPU record stale for snippet snippets/probe.py (page index.md)" in res.stderr


def test_status_exits_non_zero_on_missing_and_with_fresh_on_stale(mini_site, tmp_path, monkeypatch, capsys):
    from kda.site import __main__ as cli

    monkeypatch.setattr(cli, "ROOT", tmp_path)
    snippet = mini_site("# snippet: gpu\nprint(1)\n")
    assert cli.main(["status"]) == 1 and cli.main(["status", "--fresh"]) == 1      # missing
    _record(snippet, None)
    assert cli.main(["status"]) == 0 and cli.main(["status", "--fresh"]) == 0      # ok
    snippet.file.write_text("# snippet: gpu\nprint(2)\n")
    assert cli.main(["status"]) == 0 and cli.main(["status", "--fresh"]) == 1      # stale
    assert "changed since: snippets/probe.py" in capsys.readouterr().out


def test_an_older_record_names_its_changed_files_from_git(mini_site, tmp_path):
    """A record without per-file hashes (made before they existed) is compared with its inputs as
    they were at its commit; without that commit the changed files are unknown."""
    snippet = mini_site("# snippet: gpu\nprint(1)\n")
    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True, text=True).stdout
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "base")
    git("add", "snippets")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "probe")
    record = {"source_hash": "0", "provenance": {"commit": git("rev-parse", "HEAD").strip()}}
    assert sn.changed_since(snippet, record) == []
    snippet.file.write_text("# snippet: gpu\nprint(2)\n")
    assert sn.changed_since(snippet, record) == ["snippets/probe.py"]
    assert sn.changed_since(snippet, {"source_hash": "0", "provenance": {"commit": "f" * 40}}) is None


def test_the_code_hash_does_not_depend_on_the_python_version():
    """The "code" scheme's text of a tree leaves out empty fields, so that a field a later Python added
    (3.12's ``type_params``) does not change the hash of code that does not use it: records made on the GPU
    machine's Python stay fresh under CI's."""
    import ast

    text = sn._tree_text(ast.parse("def f(x, *a):\n    return [x, None, 'a']\n"))
    assert "type_params" not in text and "kind" not in text and "decorator_list" not in text
    assert text.startswith("Module(body=[FunctionDef(name='f', args=arguments(args=[arg(arg='x')], vararg=arg(arg='a'))")
    assert "Constant(), Constant(value='a')" in text       # None written by the code: a Constant with nothing in
    assert sn._tree_text(ast.parse("return")) != sn._tree_text(ast.parse("return None"))


def test_restamp_only_where_the_inputs_are_those_of_the_commit(mini_site, tmp_path):
    """``restamp`` hashes a fresh record of the byte scheme again under the current one where every input is
    byte for byte what the record's commit holds; then a comment no longer stales it. A stale record, or
    one whose inputs differ from its commit, is left as it is."""
    snippet = mini_site("# snippet: gpu\nprint(1)\n")
    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True, text=True).stdout
    git("init", "-q")
    git("add", "snippets")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "probe")
    records = tmp_path / "results" / "gpu"
    info = {"device": "NVIDIA H200", "date": "2026-01-01 00:00 UTC", "commit": git("rev-parse", "HEAD").strip()}

    def byte_record(digest=None):
        sn.write_record(snippet, sn.Result("| a |\n|---|\n| 1 |\n", None, {}, 1.0), info, records)
        record = sn.read_record(snippet)
        record.update(hash_scheme="raw", source_hash=digest or sn.source_hash(snippet, scheme="raw"))
        sn.record_path(snippet).write_text(json.dumps(record))

    byte_record("0" * 16)                                          # stale: never restamped
    assert sn.record_status(snippet)[0] == "stale" and not sn.restamp(snippet)
    byte_record()
    assert sn.record_status(snippet)[0] == "ok" and sn.restamp(snippet)
    assert sn.read_record(snippet)["hash_scheme"] == "code" and sn.record_status(snippet)[0] == "ok"
    assert not sn.restamp(snippet)                                 # already of the current scheme
    snippet.file.write_text("# snippet: gpu\n# a comment: the code scheme keeps it fresh\nprint(1)\n")
    assert sn.record_status(snippet)[0] == "ok"
    byte_record()                                                  # fresh, but not what the commit holds
    assert not sn.restamp(snippet) and sn.read_record(snippet)["hash_scheme"] == "raw"


def test_a_current_gpu_record_is_injected_with_its_provenance(mini_site, tmp_path):
    snippet = mini_site("# snippet: gpu\nprint('| a |\\n|---|\\n| 1 |')\n")
    _record(snippet, sn.source_hash(snippet))
    res = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "kda-provenance" in page and "NVIDIA H200" in page and "<table>" in page


def test_hash_follows_the_package_imports(mini_site):
    snippet = mini_site("# snippet: gpu\nfrom kda.reference import level1\n")
    files = {p.relative_to(ROOT / "kda").as_posix() for p in sn.kda_closure(snippet.file.read_text())}
    assert {"reference/level1.py", "reference/common.py"} <= files
    assert "ops.py" not in files and not any(f.startswith("site/") for f in files)


def test_a_gpu_run_lists_the_kda_modules_it_loaded(mini_site):
    """A GPU snippet's run returns the kda modules imported when it ended: the kernel modules it
    never loaded are not among them, nor the runner's own ``kda.site``."""
    snippet = mini_site("# snippet: gpu\nfrom kda.reference import level1\nprint(level1.__name__)\n")
    result = sn.run(snippet, timeout=300)
    assert result.output.strip() == "kda.reference.level1"
    assert {"kda/__init__.py", "kda/reference/level1.py", "kda/reference/common.py"} <= set(result.modules)
    assert "kda/kernels/chapters/constant_decay.py" not in result.modules
    assert not any(m.startswith("kda/site/") for m in result.modules)
    bare = mini_site("# snippet: gpu\nimport sys\nsys.exit(0)\n", name="bare.py")
    assert sn.run(bare, timeout=300).modules == []          # the runner's own import of kda is not counted


def test_a_record_with_its_run_modules_goes_stale_only_with_them(mini_site, tmp_path, monkeypatch):
    """A record that lists its run's modules is stale when one of those files changes or goes,
    and not when another kda file changes; a record without a list keeps the import rule."""
    fake = tmp_path / "fake_kda"
    (fake / "kernels").mkdir(parents=True)
    (fake / "ops.py").write_text("X = 1\n")
    (fake / "kernels" / "level2.py").write_text("Y = 1\n")
    monkeypatch.setattr(sn, "_kda_dir", lambda: fake)
    snippet = mini_site("# snippet: gpu\nprint(1)\n")
    result = sn.Result("| a |\n|---|\n| 1 |\n", None, {}, 1.0, ["kda/ops.py"])
    info = {"device": "NVIDIA H200", "date": "2026-01-01 00:00 UTC", "commit": "0" * 40, "torch": "x"}
    sn.write_record(snippet, result, info, snippet.root / "results" / "gpu")
    assert sn.read_record(snippet)["modules"] == ["kda/ops.py"]
    assert sn.record_status(snippet)[0] == "ok"
    (fake / "kernels" / "level2.py").write_text("Y = 2\n")
    assert sn.record_status(snippet)[0] == "ok"
    (fake / "ops.py").write_text("X = 2\n")
    assert sn.record_status(snippet)[0] == "stale"
    (fake / "ops.py").write_text("X = 1\n")
    assert sn.record_status(snippet)[0] == "ok"
    (fake / "ops.py").unlink()
    assert sn.record_status(snippet)[0] == "stale"
    legacy = mini_site("# snippet: gpu\nprint(2)\n", name="legacy.py")
    _record(legacy, sn.source_hash(legacy))
    assert "modules" not in sn.read_record(legacy) and sn.record_status(legacy)[0] == "ok"


def test_a_new_record_stays_fresh_through_comments_and_docstrings(mini_site, tmp_path, monkeypatch):
    """A record made now hashes its Python inputs as code (``HASH_SCHEME``: the syntax tree without
    docstrings): an edit of comments, docstrings or layout leaves it fresh, one of code makes it stale and
    names the file. A record without a scheme (made before it) still hashes bytes: any edit stales it."""
    fake = tmp_path / "fake_kda"
    fake.mkdir()
    ops = fake / "ops.py"
    ops.write_text('"""Ops."""\nX = 1  # one\n\n\ndef f():\n    """Doc."""\n    return X\n')
    monkeypatch.setattr(sn, "_kda_dir", lambda: fake)
    snippet = mini_site("# snippet: gpu\nprint(1)\n")
    info = {"device": "NVIDIA H200", "date": "2026-01-01 00:00 UTC", "commit": "0" * 40, "torch": "x"}
    sn.write_record(snippet, sn.Result("| a |\n|---|\n| 1 |\n", None, {}, 1.0, ["kda/ops.py"]), info,
                    snippet.root / "results" / "gpu")
    assert sn.read_record(snippet)["hash_scheme"] == sn.HASH_SCHEME == "code"
    legacy = mini_site("# snippet: gpu\nprint(2)\n", name="legacy.py")
    _record(legacy, sn.source_hash(legacy, modules=["kda/ops.py"], scheme="raw"))   # the old scheme: bytes
    record = sn.read_record(legacy)
    del record["hash_scheme"], record["files"]
    record["modules"] = ["kda/ops.py"]
    sn.record_path(legacy).write_text(json.dumps(record))
    assert sn.record_status(snippet)[0] == sn.record_status(legacy)[0] == "ok"
    ops.write_text('"""Ops, reworded."""\nX = 1   # one, reworded\n\ndef f():\n    """Other doc."""\n\n    return X\n')
    assert sn.record_status(snippet)[0] == "ok" and sn.changed_since(snippet, sn.read_record(snippet)) == []
    assert sn.record_status(legacy)[0] == "stale"
    ops.write_text('"""Ops."""\nX = 2  # one\n\n\ndef f():\n    """Doc."""\n    return X\n')
    assert sn.record_status(snippet)[0] == "stale"
    assert sn.changed_since(snippet, sn.read_record(snippet)) == ["kda/ops.py"]
    snippet.file.write_text("# snippet: gpu\n# a comment\nprint(1)\n")
    ops.write_text('"""Ops."""\nX = 1\n\n\ndef f():\n    return X\n')
    assert sn.record_status(snippet)[0] == "ok"                            # code as recorded, comments aside


def test_uses_may_continue_on_the_comment_lines_below_the_header(mini_site):
    snippet = mini_site("# snippet: cpu uses=snippets/a.py\n#   uses=snippets/b.py uses=snippets/c.py\n"
                        "# uses=snippets/d.py\n\n# uses=snippets/not_header.py\nprint(1)\n")
    assert snippet.uses == ["snippets/a.py", "snippets/b.py", "snippets/c.py", "snippets/d.py"]


def _path_without(*tools: str) -> str:
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not any((Path(d) / tool).exists() for tool in tools))


@pytest.mark.tilelang
def test_a_kernel_snippet_builds_with_the_system_toolkit_hidden(mini_site, tmp_path):
    """The CPU build with no nvcc or ptxas on PATH and no CUDA_HOME: tilelang compiles with the
    pip toolkit of the ``cuda`` extra (in a fresh tilelang cache, so nvcc really runs) and the
    register tables' ptxas is found beside it."""
    from kda.site.toolkit import pip_toolkit_bin

    bin_dir = pip_toolkit_bin()
    if bin_dir is None:
        pytest.skip("needs the cuda extra: pip install -e '.[cuda]'")
    mini_site("""\
        # snippet: cpu
        import shutil

        import tilelang

        from kda.kernels.chapters.linear_attention import seq_in_loop
        from kda.kernels.build import SM90A, compile_program, ptxas_report

        kernel = compile_program(seq_in_loop, (), target=SM90A, DK=64, DV=64, dtype="bfloat16")
        print(f"toolkit {tilelang.env.CUDA_HOME} ptxas {shutil.which('ptxas')} registers {ptxas_report(kernel)['registers']}")
        """)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env.update(PATH=_path_without("nvcc", "ptxas"), TILELANG_CACHE_DIR=str(tmp_path / "tilelang-cache"),
               NO_MKDOCS_2_WARNING="1")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=tmp_path, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    page = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert f"toolkit {bin_dir.parent} ptxas {bin_dir / 'ptxas'} registers" in page


def test_a_cpu_snippet_runs_as_a_script_of_its_own(mini_site, tmp_path):
    """CPU snippets are forked from a server that imported torch; to the snippet that is
    ``python <file>`` from the project root: ``__main__``, its argv, the root as cwd, UTF-8 out."""
    snippet = mini_site("""\
        # snippet: cpu
        import os, sys
        print(__name__, os.path.basename(sys.argv[0]), os.getcwd(), "门控 ≤ 0")
        """)
    assert sn.run(snippet, timeout=60).output.strip() == f"__main__ probe.py {tmp_path} 门控 ≤ 0"
    failing = mini_site("# snippet: cpu\nimport sys\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n", "fails.py")
    with pytest.raises(sn.SnippetError, match=r"(?s)raised \(exit 3\).*to stderr"):
        sn.run(failing, timeout=60)
    slow = mini_site("# snippet: cpu\nimport time\ntime.sleep(30)\n", "slow.py")
    with pytest.raises(sn.SnippetTimeout, match="did not finish within 1 s"):
        sn.run(slow, timeout=1)



def test_a_cpu_snippet_is_judged_by_its_own_exit_code(mini_site, monkeypatch):
    """A forked child's status comes back through the fork server; when that read fails,
    multiprocessing reports 255 for a snippet that succeeded (seen in CI). The child's own exit code,
    written beside its output, decides; a child that wrote none (killed, server lost) runs once more
    in a fresh interpreter."""
    from multiprocessing import process

    snippet = mini_site("# snippet: cpu\nprint('| ok |')\n")
    monkeypatch.setattr(process.BaseProcess, "exitcode", property(lambda self: 255))    # the failed read
    assert sn.run(snippet, timeout=60).output == "| ok |\n"
    failing = mini_site("# snippet: cpu\nimport sys\nsys.exit(3)\n", "fails.py")
    with pytest.raises(sn.SnippetError, match=r"raised \(exit 3\)"):
        sn.run(failing, timeout=60)
    killed = mini_site("# snippet: cpu\nimport os\nos._exit(255)\n", "killed.py")          # no code written
    fresh = []
    monkeypatch.setattr(sn, "_run_fresh", lambda snippet, timeout, env: fresh.append(snippet) or (0, "| again |\n", ""))
    assert sn.run(killed, timeout=60).output == "| again |\n" and fresh == [killed]

def test_tilelang_log_lines_stay_out_of_a_snippet_output(mini_site):
    """tilelang's logger writes to stdout; its lines are not part of the Markdown a snippet prints."""
    snippet = mini_site("""\
        # snippet: cpu
        import logging, sys
        log = logging.getLogger("TileLang")
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(asctime)s  [TileLang:%(name)s:%(levelname)s]: %(message)s",
                                               datefmt="%Y-%m-%d %H:%M:%S"))
        log.addHandler(handler)
        print("| a |")
        log.warning("Found kernel 'main' in memory cache")
        print("|---|")
        """)
    assert sn.run(snippet, timeout=60).output == "| a |\n|---|\n"


def test_a_notebook_runs_without_a_word_on_the_build_output(tmp_path, capfd):
    """The playground is executed during the build; its kernel must not print into the build's
    output (ipykernel 7 warns about unencrypted TCP, about an orphaned kernel at exit, and can
    print a ZMQ traceback while it shuts down: whatever the kernel process itself writes to its
    stdout and stderr stays out of the build's output)."""
    import nbformat

    from kda.site.hooks import run_notebook

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import os\nprint(6 * 7, os.getcwd())"),
        nbformat.v4.new_code_cell("import sys\nprint('to the process', file=sys.__stderr__, flush=True)")])
    run_notebook(nb, tmp_path)
    assert nb.cells[0].outputs[0]["text"] == f"42 {tmp_path}\n"
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)


INCLUDE = re.compile(r'--8<-- "([^":]+)(?::([^"]+))?"')


def test_included_code_lines_fit_the_page_column():
    """Every line a page includes from a file is at most 122 characters: the widest the browser
    test has seen fit the code column at 1280 px (level 5's chunk_intra). A docstring line of 173
    in kda/gated_delta.py once made the level-5 pages show ``run_kernels`` as line ranges."""
    wide = []
    for page in sorted((ROOT / "docs").glob("*/*.md")):
        for match in INCLUDE.finditer(page.read_text(encoding="utf-8")):
            file, section = ROOT / match.group(1), match.group(2)
            if not file.exists():
                continue
            lines = file.read_text(encoding="utf-8").splitlines()
            if section and not section[0].isdigit():
                starts = [i for i, line in enumerate(lines) if line.strip() == f"# --8<-- [start:{section}]"]
                ends = [i for i, line in enumerate(lines) if line.strip() == f"# --8<-- [end:{section}]"]
                assert starts and ends, f"{page.name}: no section {section} in {match.group(1)}"
                lines = lines[starts[0] + 1:ends[0]]
            wide += [f"{page.relative_to(ROOT)}: {match.group(1)}:{section} {len(line)}" for line in lines if len(line) > 122]
    assert wide == []


# --- rendering: what Markdown leaves as raw text ---------------------------------------------

RUN_ON_ITEM = re.compile(r"(?:^|\n)[ \t]*(?:[*+-]|\d+\.)[ \t]+\S")
RAW_TABLE_ROW = re.compile(r"(?:^|\n)[ \t]*\|.*\|[ \t]*(?:\n|$)")


def rendering_faults(html: str) -> list[str]:
    """Paragraphs that hold a list item (a list run into its paragraph for lack of a blank line) and
    Markdown table rows left as text (a row whose cells do not match its header, or a bare ``|``)."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for skip in soup.select("pre, code, script, style, .arithmatex"):
        skip.decompose()
    faults = []
    for p in soup.find_all(["p", "li", "td", "th"]):
        text = p.get_text()
        if p.name == "p" and RUN_ON_ITEM.search(text) and not RUN_ON_ITEM.match(text):
            faults.append("list run into a paragraph: " + text.strip()[:120])
        if RAW_TABLE_ROW.search(text):
            faults.append("table left as text: " + text.strip()[:120])
    return faults


def test_rendering_faults_are_found():
    assert rendering_faults("<p>Four points:\n* one\n* two</p>")
    assert rendering_faults("<p>Steps\n1. first</p>")
    assert rendering_faults("<p>| a | b |\n|---|---|\n| 1 | 2 | 3 |</p>")
    assert not rendering_faults("<p>a - b and 3. c</p><ul><li>one</li></ul><table><tr><td>1</td></tr></table>")
    assert not rendering_faults("<pre><code>* not a list\n| not | a table |</code></pre>")


@pytest.mark.parametrize("lang", ["", "en/"])
def test_no_page_shows_raw_lists_or_tables(built_site, lang):
    faults = {}
    for page in sorted((built_site / lang).glob("*/index.html")) + [built_site / lang / "index.html"]:
        if lang == "" and page.parent.name == "en":
            continue
        found = rendering_faults(page.read_text(encoding="utf-8"))
        if found:
            faults[page.parent.name] = found
    assert not faults, faults


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_home_ladder_links_every_chapter(lang):
    """The ladder on the home page has a row for every chapter (decode and the backward too), and the
    README's ladder a row for each level, decode and the backward."""
    home = (ROOT / "docs" / lang / "index.md").read_text(encoding="utf-8")
    ladder = home.split("\n## ")[1]
    chapters = [p.stem for p in (ROOT / "docs" / lang).glob("*.md") if p.stem not in ("index", "api", "benchmarks")]
    assert sorted(c for c in chapters if f"]({c}.md)" not in ladder) == []
    readme_rows = [line.split("|")[1].strip() for line in (ROOT / "README.md").read_text().splitlines()
                   if line.startswith("| ") and not line.startswith("| level")]
    assert {"0", "1", "2", "3", "4", "5", "decode", "backward", "CP"} <= set(readme_rows)
