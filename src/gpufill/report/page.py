"""The page every gpufill HTML report is built on: inline CSS, base64 images, sections and tables,
and a small script that tells a headless browser test how many plots decoded.

Self-contained on purpose: a report opens without network access and can be mailed or
attached to a paper's supplement.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from gpufill import files
from gpufill.report import plots

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .8em 0; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .3em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.scroll { overflow-x: auto; } .note { color: #666; font-style: italic; }
img.plot { display: block; max-width: 100%; margin: .8em 0; border: 1px solid #eee; }
small.reason { color: #666; display: block; } pre { white-space: pre-wrap; font-size: .85em; background: #f8f8f8; padding: .5em; }
"""

# Runs last: reports how many plots decoded (a headless browser test reads body[data-plots]).
CHECK_SCRIPT = """
<script>
function gpufillCheckPlots() {
  var imgs = document.querySelectorAll("img.plot"), ok = 0;
  for (var i = 0; i < imgs.length; i++) { if (imgs[i].complete && imgs[i].naturalWidth > 0) { ok++; } }
  document.body.dataset.plots = ok + "/" + imgs.length;
}
if (document.readyState === "complete") { gpufillCheckPlots(); } else { window.addEventListener("load", gpufillCheckPlots); }
</script>
"""


def page(title: str, sections: list[str]) -> str:
    """A whole HTML document: the title, then the sections (HTML already) in order."""
    body = "\n".join([f"<h1>{escape(title)}</h1>", *sections])
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{CSS}</style></head>\n"
        f"<body>\n{body}\n{CHECK_SCRIPT}</body></html>\n"
    )


def write_atomically(path: Path, text: str, *, field: str = "--out") -> Path:
    """Write through a new temporary file (gpufill/files.py): a reader never sees half a report, a link at
    `path` is refused and never followed, and a full or read-only disk is one line naming `field`."""
    return files.write_atomically(path, text, field=field)


def section(title: str, content: str) -> str:
    anchor = title.lower().replace(" ", "-")
    return f"<section id='{anchor}-section'><h2>{escape(title)}</h2>\n{content}\n</section>"


def table(header: list[str], rows: list[list[str]], *, table_id: str, numeric: set[int] = frozenset()) -> str:
    """Cells are HTML already (escaped by the caller); header cells are escaped here."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "\n".join("<tr>" + "".join(f"<td class='num'>{c}</td>" if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table id='{table_id}'><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>"


def img(plot: plots.Plot) -> str:
    return f"<img class='plot' alt='{escape(plot.alt, quote=True)}' src='data:image/png;base64,{plot.png_base64}'>"


def plot_or_note(plot: plots.Plot | None, note: str) -> str:
    return img(plot) if plot is not None else f"<p class='note'>{escape(note)}</p>"
