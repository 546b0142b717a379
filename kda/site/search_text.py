"""Search results without raw LaTeX: the search index holds the pages' text with the math still
as TeX between ``\\(`` and ``\\)`` (KaTeX renders it in the browser, the index never sees that).
``plain_math`` turns each formula into readable text (``d_k×d_v``, ``S' = MS + B``), and
``clean_search_index`` rewrites a built site's index with it."""

from __future__ import annotations

import json
import re
from pathlib import Path

MATH = re.compile(r"\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
SYMBOLS = {
    "times": "×", "cdot": "·", "odot": "⊙", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠",
    "approx": "≈", "sim": "~", "sum": "Σ", "prod": "Π", "infty": "∞", "top": "ᵀ", "to": "→", "in": "∈",
    "dots": "…", "ldots": "…", "cdots": "…", "alpha": "α", "beta": "β", "gamma": "γ", "Gamma": "Γ",
    "delta": "δ", "Delta": "Δ", "lambda": "λ", "mu": "μ", "sigma": "σ", "epsilon": "ε",
    "varepsilon": "ε", "theta": "θ", "pi": "π", "ell": "ℓ", "partial": "∂", "Longleftrightarrow": "⟺",
    "Leftrightarrow": "⇔", "Rightarrow": "⇒", "leftarrow": "←", "gets": "←", "mid": "|", "lceil": "⌈",
    "rceil": "⌉", "lfloor": "⌊", "rfloor": "⌋", "log": "log", "exp": "exp", "min": "min", "max": "max",
}
DROPPED = {"quad", "qquad", "left", "right", "big", "Big", "bigl", "bigr", "Bigl", "Bigr", "displaystyle",
           "limits", "nonumber", "tilde", "hat", "bar", "vec"}


def plain_math(tex: str) -> str:
    """A formula as readable text: commands to symbols, wrappers and braces dropped."""
    tex = re.sub(r"\\(?:begin|end)\{[^{}]*\}", " ", tex)
    tex = re.sub(r"\\(?:operatorname|mathrm|mathbf|mathbb|mathcal|text|tilde|hat|bar|boldsymbol)\s*\{([^{}]*)\}",
                 r"\1", tex)
    tex = re.sub(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"(\1)/(\2)", tex)
    tex = tex.replace("\\\\", " ").replace("&", " ")
    tex = re.sub(r"\\[,;:! ]", " ", tex)
    tex = re.sub(r"\\([A-Za-z]+)", lambda m: SYMBOLS.get(m.group(1), "" if m.group(1) in DROPPED else m.group(1)), tex)
    tex = tex.replace("{", "").replace("}", "")
    return re.sub(r"\s+", " ", tex).strip()


def plain_text(text: str) -> str:
    """``text`` with every ``\\( ... \\)`` and ``\\[ ... \\]`` made plain."""
    return MATH.sub(lambda m: plain_math(m.group(1) if m.group(1) is not None else m.group(2)), text)


def clean_search_index(site_dir: str | Path) -> int:
    """Rewrite ``<site_dir>/search/search_index.json`` with plain math; returns the entries changed."""
    path = Path(site_dir) / "search" / "search_index.json"
    if not path.is_file():
        return 0
    index = json.loads(path.read_text(encoding="utf-8"))
    changed = 0
    for doc in index.get("docs", []):
        for key in ("title", "text"):
            if key in doc and ("\\(" in doc[key] or "\\[" in doc[key]):
                doc[key] = plain_text(doc[key])
                changed += 1
    if changed:
        path.write_text(json.dumps(index, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    return changed
