"""Table: a list of row dicts that prints as text and renders as HTML in Jupyter.

Every tabular result of ggviz.viz (``arena_map``, ``tensor_header_table``, ``strides_table`` ...) is a ``Table``:
plain data first (index it, filter it, compare it in tests), readable second (``print(t)`` or let Jupyter show it).
"""
from __future__ import annotations

import html


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_cell(x) for x in v) + "]"
    return str(v)


_TD = "text-align:left;font-family:monospace"


class Table(list):
    """A list of dicts with a column order; ``str()`` is an aligned text table, ``_repr_html_`` an HTML one."""

    def __init__(self, rows=(), columns=None, title=None, formats=None):
        super().__init__(rows)
        self.columns = list(columns) if columns else (list(self[0].keys()) if self else [])
        self.title = title
        self.formats = dict(formats or {})    # column -> callable(value) -> str

    def _fmt(self, col, v) -> str:
        f = self.formats.get(col)
        return f(v) if (f is not None and v is not None) else _cell(v)

    def _like(self, rows):
        return Table(rows, self.columns, self.title, self.formats)

    def __getitem__(self, i):
        r = super().__getitem__(i)
        return self._like(r) if isinstance(i, slice) else r

    def filter(self, pred) -> "Table":
        """The rows for which ``pred(row)`` is true, as a Table with the same columns and formats."""
        return self._like([r for r in self if pred(r)])

    def column(self, name):
        return [r.get(name) for r in self]

    def text(self, max_width: int = 60) -> str:
        cols = self.columns
        cells = [[self._fmt(c, r.get(c)) for c in cols] for r in self]
        cells = [[s if len(s) <= max_width else s[:max_width - 1] + "…" for s in row] for row in cells]
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
        num = [all(isinstance(r.get(c), int) and not isinstance(r.get(c), bool) for r in self if r.get(c) is not None)
               for c in cols]

        def line(vals):
            return "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(vals, widths, num)).rstrip()

        out = [self.title] if self.title else []
        out.append(line(cols))
        out.append("  ".join("-" * w for w in widths))
        out.extend(line(row) for row in cells)
        return "\n".join(out)

    def __str__(self):
        return self.text()

    def _repr_pretty_(self, p, cycle):     # IPython's plain-text display
        p.text(self.text())

    def _repr_html_(self):
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td style='{_TD}'>{html.escape(self._fmt(c, r.get(c)))}</td>" for c in self.columns)
            + "</tr>"
            for r in self)
        cap = f"<caption style='text-align:left'><b>{html.escape(self.title)}</b></caption>" if self.title else ""
        return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
