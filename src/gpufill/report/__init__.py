"""Campaign reports: `write_report(workdir, out=None)` writes one self-contained HTML file."""

from gpufill.report.html import write_report

__all__ = ["write_report"]
