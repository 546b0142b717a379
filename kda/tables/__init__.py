"""The articles' tables, computed from the package (the site calls these; nothing is typed in).

Each function returns a ``Table``: raw values in ``rows`` (tests read them) and one format
per column for the Markdown the site shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def sci(x: float, digits: int = 2) -> str:
    """``1.23e-04`` style; NaN and inf spelled out, as the articles print them."""
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}e}"


@dataclass
class Table:
    columns: list[str]
    rows: list[list] = field(default_factory=list)
    formats: list = field(default_factory=list)   # per column: None (str()), a format string or a callable

    def column(self, name: str) -> list:
        """The values of the column headed ``name``: its English words where the header is in both
        languages (``kda.site.runtime.text``)."""
        from kda.site.runtime import in_language

        i = [in_language(c, "en") for c in self.columns].index(name)
        return [row[i] for row in self.rows]

    def _cell(self, value, fmt) -> str:
        if fmt is None:
            return str(value)
        if callable(fmt):
            return fmt(value)
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return sci(value)
        return fmt.format(value)

    def markdown(self) -> str:
        formats = self.formats or [None] * len(self.columns)
        lines = ["| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        for row in self.rows:
            lines.append("| " + " | ".join(self._cell(v, f) for v, f in zip(row, formats)) + " |")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.markdown()
