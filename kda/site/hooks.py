"""MkDocs hooks of the site (``hooks:`` in mkdocs.yml).

* ``<!-- snippet: snippets/x/y.py -->`` on a line of its own becomes the snippet's code and,
  under it, its output: run now (CPU, cached by source hash) or read from its GPU record
  (with a one-line provenance note). A snippet that raises and a missing GPU record are logged
  as warnings, which ``mkdocs build --strict`` turns into a failure. A stale GPU record (the
  code changed after it was measured) keeps its output under a notice that names its commit
  and the files changed since; it is logged at INFO, and fails only the publishing check
  (``KDA_SITE_FRESH=1``). The page says so visibly either way. ``code=hide`` shows the output only.
* ``<!-- gpu-records: line -->`` and ``<!-- gpu-records: list -->`` become how many GPU records
  were measured on the current code, in a sentence or with the stale and missing ones linked
  to the pages that show them (the home and benchmarks pages).
* ``docs/assets`` is shared by both languages; notebooks are executed here (cached by
  source hash) so that mkdocs-jupyter only renders them.
* The Chinese build (the original, ``docs/zh``) builds the English edition (``docs/en``)
  into ``<site>/en`` when it is done, with the overrides in ``extra.kda.english``: one
  ``mkdocs build`` gives both, each with its own search index and sitemap (which the
  language switcher reads to stay on the same page).
"""

from __future__ import annotations

import copy
import hashlib
import html
import logging
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mkdocs.structure.files import File
from mkdocs.utils import get_relative_url

from kda.site import search_text
from kda.site.runtime import in_language
from kda.site.toolkit import cuda_tools_on_path
from kda.site import snippets as sn

log = logging.getLogger("mkdocs.plugins.kda_site")

MARKER = re.compile(r"^<!--\s*snippet:\s*(\S+)([^>]*?)-->[ \t]*$", re.MULTILINE)
RECORDS_MARKER = re.compile(r"^<!--\s*gpu-records:\s*(line|list)\s*-->[ \t]*$", re.MULTILINE)
FIGURE = re.compile(r"FIGURE\(([^)]+)\)")

TEXT = {
    "zh": {"missing": "尚未测量（not measured yet）", "stale": "记录已过期（stale）", "error": "代码段运行失败",
           "recorded": "GPU 记录", "missing_body": "这一段需要 GPU，还没有与当前代码相符的记录。",
           "stale_body": "这份记录测于 {date}，提交 `{commit}`；之后改过的文件：{files}。"
                         "下面仍是那次运行的输出（记录的源码哈希 {old}，现在是 {new}）。",
           "unknown_files": "无法判断（记录没有逐文件哈希，本仓库里也没有它的提交）",
           "rerun": "在 GPU 机器上运行 `python -m kda.site run --gpu` 重新测量。",
           "records_line": "GPU 记录：{fresh} / {total} 份是在当前代码上测得的{rest}。",
           "records_rest": "（过期 {stale} 份，缺失 {missing} 份，见[基准测试]({link})）",
           "stale_list": "过期（代码在测量之后改过，页面上仍显示旧输出）：",
           "missing_list": "缺失（页面上写着「尚未测量」）：",
           "on_page": "见",
           "code": "这段输出的代码：{path}"},
    "en": {"missing": "Not measured yet", "stale": "Stale record", "error": "Snippet failed",
           "recorded": "GPU record", "missing_body": "This snippet needs a GPU and has no record that matches the current code.",
           "stale_body": "This record was measured on {date} at commit `{commit}`; changed since: {files}. "
                         "The output below is still that run's (recorded source hash {old}, now {new}).",
           "unknown_files": "unknown (the record has no per-file hashes and this checkout lacks its commit)",
           "rerun": "Run `python -m kda.site run --gpu` on a GPU machine to measure again.",
           "records_line": "GPU records: {fresh} of {total} measured on the current code{rest}.",
           "records_rest": " ({stale} stale, {missing} missing; see [Benchmarks]({link}))",
           "stale_list": "Stale (the code changed after the measurement; the page still shows the old output):",
           "missing_list": "Missing (the page says \"not measured yet\"):",
           "on_page": "on",
           "code": "The code of this output: {path}"},
}

_state: dict = {}
_lock = threading.Lock()            # _prepare runs in a thread per core


def _lang(config) -> str:
    return config["extra"].get("kda", {}).get("language", "en")


def _quiet_jieba() -> None:
    """The search's Chinese word splitter announces loading its dictionary on every build."""
    try:
        import jieba
    except ImportError:
        return
    jieba.setLogLevel(logging.WARNING)


def on_config(config):
    cuda_tools_on_path()                         # ptxas for the register tables, also from pip
    _quiet_jieba()
    root = Path(config.config_file_path).resolve().parent
    kda_extra = config["extra"].get("kda", {})
    _state.clear()
    _state.update(root=root, cache=root / ".cache" / "kda-site", records=root / "results" / "gpu",
                  device=kda_extra.get("gpu_device", sn.DEFAULT_DEVICE), figures={}, lang=_lang(config),
                  results={}, ran=[], hits=0)
    return config


def on_files(files, config):
    root = _state["root"]
    assets = root / "docs" / "assets"
    docs_dir = Path(config["docs_dir"]).resolve()
    if assets.is_dir() and assets.resolve().parent != docs_dir:
        for path in sorted(assets.rglob("*")):
            if path.is_file():
                files.append(File(path.relative_to(root / "docs").as_posix(), str(root / "docs"),
                                  config["site_dir"], config["use_directory_urls"]))
    for file in list(files):
        if file.src_uri.endswith(".ipynb"):
            executed = _executed_notebook(Path(file.abs_src_path))
            if executed is not None:
                file.abs_src_path = str(executed)
            # the notebook itself beside its page, outputs included, for the page's download link
            stem = Path(file.src_uri).stem
            files.append(File.generated(config, f"{stem}/{stem}.ipynb", abs_src_path=file.abs_src_path))
    # run (or load) every snippet the pages name now, so that their figures are files of
    # the build and links to them are checked like any other; each CPU snippet runs in its own
    # process, so they run side by side, one per core
    pages: dict = {}                  # snippet -> (the page that shows it, that page's title)
    for file in files.documentation_pages():
        source = Path(file.abs_src_path).read_text(encoding="utf-8")
        title = next((line[2:].strip() for line in source.splitlines() if line.startswith("# ")), file.src_uri)
        for match in MARKER.finditer(source):
            pages.setdefault(match.group(1), (file.src_uri, title))
    _state["pages"] = pages
    paths = list(pages)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(_prepare, sorted(paths, key=_compiles_kernels, reverse=True)))
    for dest, blob in _state["figures"].items():
        files.append(File.generated(config, dest, content=blob))
    return files


def _compiles_kernels(path: str) -> bool:
    """Whether a snippet compiles TileLang kernels (the long ones, 10 to 30 s cold): these start
    first, so that none of them is left to run alone at the end of a cold build."""
    file = _state["root"] / path
    return file.is_file() and re.search(r"compile_program|kda import export", file.read_text(encoding="utf-8")) is not None


def _prepare(path: str) -> None:
    """Run or load one snippet once per build; the outcome waits in ``_state["results"]``."""
    if path in _state["results"]:
        return
    outcome: dict = {}
    try:
        snippet = sn.load(_state["root"], path)
        outcome["snippet"] = snippet
        if snippet.where == "cpu":
            result, hit = sn.cached_run(snippet, _state["cache"], _state["records"])
            outcome["result"] = result
            with _lock:
                if hit:
                    _state["hits"] += 1
                else:
                    _state["ran"].append(path)
                    log.info(f"kda snippets: ran {path} in {result.seconds:.1f} s ({len(_state['ran'])} run so far)")
            for name, blob in result.figures.items():
                _state["figures"][f"figures/{snippet.slug}/{name}"] = blob
        else:
            outcome["status"] = sn.record_status(snippet, _state["records"], _state["device"])
    except sn.SnippetError as e:
        outcome["error"] = e
    _state["results"][path] = outcome


def run_notebook(nb, cwd: Path) -> None:
    """Execute ``nb`` in place with a python3 kernel started in ``cwd``. The kernel talks over
    unix sockets in a temporary folder: over TCP, ipykernel 7 prints a warning about unencrypted
    traffic into the build's output; and it is shut down here, since the client does not own it.
    The kernel process writes its own stdout and stderr to a log there, not into the build's
    output: at shutdown ipykernel 7 can race its I/O thread and print a ZMQ traceback (seen once
    in CI, a failed build over nothing). The log is added to the error when a cell raises."""
    import tempfile

    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    with tempfile.TemporaryDirectory() as tmp:
        km = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(tmp) / "kernel"))
        log_path = Path(tmp) / "kernel.log"
        with open(log_path, "w") as kernel_log:
            try:
                NotebookClient(nb, timeout=600, km=km, resources={"metadata": {"path": str(cwd)}}).execute(
                    stdout=kernel_log, stderr=kernel_log)
            except Exception as e:
                e.add_note(f"kernel output:\n{log_path.read_text()[-3000:]}")
                raise
            finally:
                if km.has_kernel:
                    km.shutdown_kernel(now=False)


def _executed_notebook(path: Path) -> Path | None:
    """Run the notebook top to bottom (cached by its source and the kda modules it imports)."""
    import nbformat
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    h = hashlib.sha256(path.read_bytes())
    for file in sn.kda_closure(code):
        h.update(file.read_bytes())
    out = _state["cache"] / "notebooks" / f"{path.stem}-{path.parent.name}-{h.hexdigest()[:16]}.ipynb"
    if out.exists():
        return out
    try:
        run_notebook(nb, _state["root"])
    except CellExecutionError as e:
        log.warning(f"notebook {path.relative_to(_state['root'])} raised while executing: {str(e).splitlines()[-1]}")
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    for old in out.parent.glob(f"{path.stem}-{path.parent.name}-*.ipynb"):
        old.unlink()
    nbformat.write(nb, out)
    return out


def _notice(kind: str, title: str, body: str) -> str:
    return f'!!! {kind} "{title}"\n\n' + "\n".join("    " + line for line in body.splitlines()) + "\n"


def _code_block(snippet: sn.Snippet) -> str:
    source = snippet.file.read_text(encoding="utf-8").rstrip("\n")
    return f'```python title="{snippet.path}"\n{source}\n```\n'


# tilelang logs its kernel-cache notices to stdout ("2026-01-01 00:00:00  [TileLang:..."): they
# stay in the records and caches but are not part of what a snippet shows
LIBRARY_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d +\[TileLang:.*\n?", re.MULTILINE)


def _place_figures(output: str, snippet: sn.Snippet, page) -> str:
    """``FIGURE(name.png)`` -> the image in the page's language (``name.<lang>.png``, else the one
    image) by a path relative to the page's source, which MkDocs checks; words in the page's language
    (``runtime.text``); and library log lines dropped."""
    lang = _state["lang"]
    output = in_language(LIBRARY_LOG.sub("", output), lang)

    def image(m):
        name = m.group(1)
        own = f"{name.removesuffix('.png')}.{lang}.png"
        if f"figures/{snippet.slug}/{own}" in _state["figures"]:
            name = own
        return get_relative_url(f"figures/{snippet.slug}/{name}", page.file.src_uri)

    return FIGURE.sub(image, output)


def _expand(match, page) -> str:
    t = TEXT[_state["lang"]]
    path, options = match.group(1), match.group(2)
    where = f"(page {page.file.src_uri})"
    outcome = _state["results"][path]
    if "error" in outcome and "snippet" not in outcome:
        log.warning(f"{outcome['error']} {where}")
        return _notice("failure", t["error"], str(outcome["error"]))
    snippet = outcome["snippet"]
    if "error" in outcome:
        log.warning(f"{outcome['error']} {where}")
        return "\n".join([_code_block(snippet), _notice("failure", t["error"], f"```text\n{outcome['error']}\n```")])
    return _with_code(snippet, options, _shown_output(snippet, outcome, page, t, where))


FOLD_LINES = 40


def _code_folded(snippet: sn.Snippet, options: str) -> bool:
    """Results before code where the code is plumbing: a recording (GPU) snippet, one that reads
    records to plot or tabulate them, or a long one shows its output first and its code folded
    below; a short example keeps its code open above its output (``code=fold`` / ``code=open``
    decide by hand)."""
    if "code=fold" in options or "code=open" in options:
        return "code=fold" in options
    lines = snippet.file.read_text(encoding="utf-8").count("\n")
    return snippet.where == "gpu" or bool(snippet.uses) or lines > FOLD_LINES


def _with_code(snippet: sn.Snippet, options: str, shown: str) -> str:
    if "code=hide" in options:
        return shown
    if _code_folded(snippet, options):
        title = TEXT[_state["lang"]]["code"].format(path=snippet.path)
        folded = f'??? abstract "{title}"\n\n' + "\n".join("    " + line if line else "" for line in
                                                           _code_block(snippet).splitlines()) + "\n"
        return shown + "\n" + folded
    return _code_block(snippet) + "\n" + shown


def _shown_output(snippet: sn.Snippet, outcome: dict, page, t: dict, where: str) -> str:
    """The output block of a snippet that ran (or its record), with its notices."""
    if snippet.where == "cpu":
        output = _place_figures(outcome["result"].output, snippet, page)
        return '<div class="kda-output" markdown>\n\n' + output + "\n\n</div>\n"
    path, parts = snippet.path, []

    status, record, digest = outcome["status"]
    if status == "missing":
        log.warning(f"GPU record missing for snippet {path} {where}: run python -m kda.site run --gpu")
        return "\n".join(parts + [_notice("failure", t["missing"], t["missing_body"] + "\n\n" + t["rerun"])])
    body = '<div class="kda-output" markdown>\n\n' + _place_figures(record["output"], snippet, page) + "\n\n</div>\n"
    note = f'<p class="kda-provenance">{t["recorded"]}: {html.escape(sn.provenance_line(record, _state["lang"]))}</p>\n'
    if status == "stale":
        changed = sn.changed_since(snippet, record, _state["records"], _state["device"])
        message = (f"GPU record stale for snippet {path} {where}: "
                   f"{sn.stale_description(record, changed)}; "
                   f"run python -m kda.site run --gpu")
        # shown, not fatal: only the publishing check (KDA_SITE_FRESH=1) fails on it
        (log.warning if sn.fresh_mode() else log.info)(message)
        files = ", ".join(f"`{f}`" for f in changed) if changed is not None else t["unknown_files"]
        p = record["provenance"]
        parts.append(_notice("warning", t["stale"], t["stale_body"].format(
            date=p.get("date", "?"), commit=(p.get("commit") or "unknown")[:10], files=files,
            old=record["source_hash"], new=digest) + "\n\n" + t["rerun"]))
    return "\n".join(parts + [body, note])


def _records_summary(kind: str, page) -> str:
    """How many GPU records match the current code: one sentence (``line``), or that sentence
    with the stale and missing records listed and linked to the pages showing them (``list``)."""
    t = TEXT[_state["lang"]]
    states = sn.gpu_record_states(_state["root"], _state["records"], _state["device"])
    count = {k: sum(v == k for v in states.values()) for k in ("ok", "stale", "missing")}
    link = get_relative_url("benchmarks.md", page.file.src_uri)
    rest = (t["records_rest"].format(stale=count["stale"], missing=count["missing"], link=link)
            if count["ok"] < len(states) and kind == "line" else "")
    line = t["records_line"].format(fresh=count["ok"], total=len(states), rest=rest)
    if kind == "line":
        return line
    out = [f'<p class="kda-records" markdown>{line}</p>\n']
    for state, title in (("stale", t["stale_list"]), ("missing", t["missing_list"])):
        names = [p for p, v in states.items() if v == state]
        if names:
            out.append(title + "\n")
            for name in names:
                shown, shown_title = _state.get("pages", {}).get(name, (None, None))
                where = f" ({t['on_page']} [{shown_title}]({get_relative_url(shown, page.file.src_uri)}))" if shown else ""
                out.append(f"* `{name}`{where}")
            out.append("")
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):
    markdown = RECORDS_MARKER.sub(lambda m: _records_summary(m.group(1), page), markdown)
    return MARKER.sub(lambda m: _expand(m, page), markdown)


def on_post_build(config):
    log.info(f"kda snippets: {len(_state['ran'])} run, {_state['hits']} from cache")
    search_text.clean_search_index(config["site_dir"])     # search results without raw LaTeX
    english = config["extra"].get("kda", {}).get("english")
    if _lang(config) == "zh" and english:
        _build_english(config, english)


def _build_english(config, overrides: dict):
    """Build the English edition into ``<site_dir>/en`` from the same mkdocs.yml."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    import yaml

    with open(config.config_file_path, encoding="utf-8") as f:
        user = yaml.safe_load(f)                         # mkdocs.yml as written
    theme = dict(user.get("theme", {}), **overrides.get("theme", {}))
    plugins = copy.deepcopy(user.get("plugins", []))
    for i, plugin in enumerate(plugins):
        name = plugin if isinstance(plugin, str) else next(iter(plugin))
        if name in overrides.get("plugins", {}):
            plugins[i] = {name: overrides["plugins"][name]}
    extra = copy.deepcopy(user.get("extra", {}))
    extra["kda"] = dict(extra["kda"], language="en", english=None)
    if "alternate" in overrides:
        extra["alternate"] = overrides["alternate"]
    en = load_config(config_file=config.config_file_path, strict=config["strict"],
                     docs_dir=str(_state["root"] / overrides["docs_dir"]),
                     site_dir=str(Path(config["site_dir"]) / "en"),
                     site_name=overrides.get("site_name", config["site_name"]),
                     site_url=config["site_url"] + "en/" if config["site_url"] else None,
                     nav=overrides.get("nav"), theme=theme, plugins=plugins, extra=extra)
    build(en)
