"""Helpers for code running inside a snippet: figures, data for later plots, records of others."""

from __future__ import annotations

import json
import os
from pathlib import Path


def _out() -> Path | None:
    out = os.environ.get("KDA_SNIPPET_OUT")
    return Path(out) if out else None


def figure(fig, name: str, alt: str | None = None) -> None:
    """Save a matplotlib figure and print the Markdown that shows it on the page."""
    out = _out()
    if out is None:                       # run by hand: just save next to the working directory
        fig.savefig(f"{name}.png", dpi=120, bbox_inches="tight")
        print(f"(figure saved to {name}.png)")
        return
    fig.savefig(out / f"{name}.png", dpi=120, bbox_inches="tight")
    print(f"\n![{alt or name}](FIGURE({name}.png))\n")


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
