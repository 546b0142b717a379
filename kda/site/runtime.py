"""Helpers for code running inside a snippet: figures, data for later plots, records of others."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path


def _out() -> Path | None:
    out = os.environ.get("KDA_SNIPPET_OUT")
    return Path(out) if out else None


LANGS = ("zh", "en")
# Chinese glyphs for the figures of the Chinese pages: the first of these that is installed
# (Debian: fonts-wqy-microhei, which .ci/run installs; the README says so)
CJK_FONTS = ("WenQuanYi Micro Hei", "Noto Sans CJK SC", "Noto Sans CJK JP", "Source Han Sans SC", "SimHei")


def figure(fig, name: str, alt: str | None = None) -> None:
    """Save a matplotlib figure once per language and print the Markdown that shows it: words in
    the figure (titles, axis labels, legends, annotations) given as ``text(zh, en)`` are resolved
    for each language's image, ``name.zh.png`` and ``name.en.png``; the page takes its own."""
    out = _out()
    target = Path(out) if out is not None else Path(".")
    for lang in LANGS:
        _in_language(fig, lang)
        fig.savefig(target / f"{name}.{lang}.png", dpi=120, bbox_inches="tight")
    if out is None:                       # run by hand: the images are next to the working directory
        print(f"(figure saved to {name}.zh.png and {name}.en.png)")
        return
    print(f"\n![{alt or name}](FIGURE({name}.png))\n")


def _matplotlib_family() -> list[str]:
    import matplotlib

    family = matplotlib.rcParams["font.family"]
    return list(family) if isinstance(family, (list, tuple)) else [family]


def _cjk_font() -> str | None:
    from matplotlib import font_manager

    names = {f.name for f in font_manager.fontManager.ttflist}
    if not names & set(CJK_FONTS):                # installed after matplotlib cached its font list
        for path in font_manager.findSystemFonts():
            if any(key in path.lower() for key in ("wqy", "cjk", "sourcehan", "simhei")):
                font_manager.fontManager.addfont(path)
        names = {f.name for f in font_manager.fontManager.ttflist}
    return next((f for f in CJK_FONTS if f in names), None)


def _in_language(fig, lang: str) -> None:
    """Every text of ``fig`` in ``lang`` (the original words are kept on the artist, so the same
    figure can be saved again in the other language). Without a Chinese font the Chinese image
    keeps the English words rather than showing empty boxes."""
    from matplotlib.text import Text
    from matplotlib.ticker import FixedFormatter, FuncFormatter

    cjk = _cjk_font()
    shown = lang if cjk is not None or lang == "en" else "en"
    for artist in fig.findobj(Text):
        original = getattr(artist, "_kda_words", None)
        if original is None:
            original = artist._kda_words = artist.get_text()
        words = in_language(original, shown)
        if words != artist.get_text():
            artist.set_text(words)
        if cjk is not None and shown == "zh" and words != original:
            artist.set_fontfamily([*artist.get_fontfamily(), cjk])
    for axis in (a for ax in fig.axes for a in (ax.xaxis, ax.yaxis)):
        formatter = axis.get_major_formatter()     # tick labels given as words are made anew at each draw
        if isinstance(formatter, FixedFormatter):
            original = getattr(formatter, "_kda_words", None)
            if original is None:
                original = formatter._kda_words = list(formatter.seq)
            formatter.seq = [in_language(str(label), shown) for label in original]
        elif isinstance(formatter, FuncFormatter):
            original = getattr(formatter, "_kda_words", None)
            if original is None:
                original = formatter._kda_words = formatter.func
            formatter.func = lambda x, pos, words=original: in_language(str(words(x, pos)), shown)
        else:
            continue
        if cjk is not None and shown == "zh":
            axis.set_tick_params(labelfontfamily=[*_matplotlib_family(), cjk])


BILINGUAL = re.compile(r"⟦zh:(.*?)¦en:(.*?)⟧", re.DOTALL)


def in_language(words: str, lang: str) -> str:
    """``words`` with each ``text(zh, en)`` pair resolved to ``lang``."""
    return BILINGUAL.sub(lambda m: m.group(1) if lang == "zh" else m.group(2), words)


def text(zh: str, en: str) -> str:
    """Words in both languages in a snippet's output (a caption, a table header, a cell): the
    Chinese page shows ``zh``, the English page ``en``; run by hand, the marker prints as is."""
    return f"⟦zh:{zh}¦en:{en}⟧"


def save_data(data) -> None:
    """Keep JSON-able data with the record (GPU snippets: what a CPU plot reads back)."""
    out = _out()
    if out is not None:
        (out / "data.json").write_text(json.dumps(data))


def recorded_data(snippet_path: str, device: str = "nvidia-h200"):
    """The data a GPU snippet saved in its committed record (``uses=`` it in the header)."""
    from kda.site import snippets

    records = os.environ.get("KDA_RECORDS_DIR")      # snippets run from the project root
    record = snippets.read_record(snippets.load(Path.cwd(), snippet_path), Path(records) if records else None, device)
    if record is None:
        raise FileNotFoundError(f"no GPU record for {snippet_path} on {device}: run python -m kda.site run --gpu")
    return record["data"]
