"""The HTML report of `gpufill watch -- COMMAND`: one self-contained file (report/page.py) with the
run's summary, the verdict and fixes, the step breakdown, the training's and the machine's
timelines, the alerts, what the training is, and its host-device syncs."""

from __future__ import annotations

import time
from html import escape
from pathlib import Path
from typing import Any

import pandas as pd

from gpufill.monitor.sampler import SAMPLE_COLUMNS
from gpufill.report import plots
from gpufill.report.page import img, page, section, table, write_atomically
from gpufill.script.diagnose import gain_text, loader_text

TIMELINE_COLUMNS = ("t0", "t1", "steps", "step_s", "data_s", "copy_s", "backward_s", "optimizer_s", "forward_s")


def write_watch_report(path: Path, record: dict[str, Any], samples: list[dict[str, Any]], timeline: list[dict[str, Any]]) -> Path:
    return write_atomically(path, render_watch_report(record, samples, timeline))


def render_watch_report(record: dict[str, Any], samples: list[dict[str, Any]], timeline: list[dict[str, Any]]) -> str:
    command = " ".join(record["command"])
    t0 = record["started_at"]
    sample_frame = pd.DataFrame.from_records(samples, columns=list(SAMPLE_COLUMNS))
    step_frame = pd.DataFrame.from_records(timeline, columns=list(TIMELINE_COLUMNS))
    sections = [
        f"<p class='note'>Written {escape(time.strftime('%Y-%m-%d %H:%M:%S'))} from {escape(record['folder'])}.</p>",
        section("Run summary", table(["quantity", "value"], _summary_rows(record), table_id="summary")),
        section("Verdict", _verdict(record)),
        section("Where a step's time goes", _breakdown(record)),
        section("Training timeline", "\n".join(img(p) for p in plots.step_timelines(step_frame, t0))
                or "<p class='note'>no step timeline: the command made fewer than two optimizer steps</p>"),
        section("Machine timelines", _machine(sample_frame, t0)),
        section("Alerts", _alerts(record)),
        section("The training", _training(record)),
        section("Host-device syncs", _syncs(record)),
    ]
    return page(f"gpufill watch: {command}", sections)


def _summary_rows(record: dict[str, Any]) -> list[list[str]]:
    slurm = record["slurm"]
    job = ""
    if slurm:
        job = f"{slurm.get('job_id', '?')}" + (f" ({escape(slurm['job_name'])})" if "job_name" in slurm else "")
        job += f", task {slurm['task']} of {slurm.get('tasks', '1')}" if "task" in slurm else ""
    rows = [
        ["command", f"<code>{escape(' '.join(record['command']))}</code>"],
        ["exit code", str(record["exit_code"])],
        ["what ended it", escape(record["stop_reason"] or "no Python process of the command was instrumented")],
        ["started", escape(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["started_at"])))],
        ["duration", f"{record['duration_s']:.1f} s"],
        ["host", escape(record["host"])],
        ["Slurm job", escape(job) or "not in a Slurm job"],
        ["optimizer steps", str(record["optimizer_steps"])],
        ["mean step", "n/a" if record["step_ms"] is None else f"{record['step_ms']:.3g} ms"],
        ["samples per second", "n/a (batch size not seen: no DataLoader)" if record["samples_per_s"] is None else f"{record['samples_per_s']:.4g}"],
    ]
    for source, figures in record["machine"].items():
        rows.append([escape(source), escape(", ".join(f"{k.replace('_', ' ')} {v}" for k, v in figures.items() if v is not None))])
    return rows


def _verdict(record: dict[str, Any]) -> str:
    verdict = record["verdict"]
    parts = [f"<p id='verdict'><b>{escape(verdict['kind'])}</b>: {escape(verdict['reason'])}</p>" if verdict
             else "<p id='verdict' class='note'>no verdict: too few optimizer steps were measured</p>"]
    if record["findings"]:
        items = []
        for finding in record["findings"]:
            gain = f"expected {gain_text(finding)}: " if finding["expected_gain"] else ""
            items.append(f"<li>{escape(finding['what'])}<small class='reason'>{escape(gain + finding['why'])}</small></li>")
        parts.append("<ol id='findings'>" + "".join(items) + "</ol>")
    if record["not_measured"]:
        parts.append("<ul class='note'>" + "".join(f"<li>not measured: {escape(item)}</li>" for item in record["not_measured"]) + "</ul>")
    return "\n".join(parts)


def _breakdown(record: dict[str, Any]) -> str:
    shares = record["shares"]
    if not shares:
        return "<p class='note'>no measured steps</p>"
    step_ms = record["step_ms"]
    rows = [[escape(name.replace("_", " ")), f"{share * step_ms:.3g}", f"{share:.1%}"] for name, share in shares.items()]
    return img(plots.step_breakdown(shares, step_ms)) + table(["phase", "ms per step (mean)", "share"], rows, table_id="breakdown", numeric={1, 2})


def _machine(samples: pd.DataFrame, t0: float) -> str:
    if samples.empty:
        return "<p class='note'>no samples</p>"
    gpu = [img(p) for p in plots.gpu_timelines(samples, t0, since="the command started")]
    host = [img(p) for p in plots.host_timelines(samples, t0, since="the command started")]
    return "\n".join(gpu or ["<p class='note' id='no-gpu'>no GPU samples: no NVIDIA GPU (or NVML) on this machine</p>"]) + "\n" + "\n".join(host)


def _alerts(record: dict[str, Any]) -> str:
    if not record["alerts"]:
        return "<p class='note'>no alerts</p>"
    rows = [[f"{a['at_s']:.1f}", f"{a['duration_s']:.0f}", escape(a["kind"]), escape(a["message"])] for a in record["alerts"]]
    return table(["time since start (s)", "lasted (s)", "alert", "message"], rows, table_id="alerts", numeric={0, 1})


def _training(record: dict[str, Any]) -> str:
    training = record["training"]
    if not training:
        return "<p class='note'>nothing seen from inside the command</p>"
    rows = [[escape(key.replace("_", " ")), escape("-" if training.get(key) is None else str(training[key]))]
            for key in ("device", "parameters", "optimizer", "batch_size", "precision", "flops_per_step", "tf32", "cudnn_benchmark", "compiled", "world_size")]
    for loader in training.get("loaders", []):
        rows.append(["DataLoader", escape(loader_text(loader))])
    return table(["setting", "value"], rows, table_id="training")


def _syncs(record: dict[str, Any]) -> str:
    syncs, steps = record["syncs"], max(1, record["measured_steps"])
    if not syncs:
        return "<p class='note'>none seen in the script's own lines</p>"
    rows = [[escape(site), str(count), f"{count / steps:.3g}"] for site, count in sorted(syncs.items(), key=lambda item: -item[1])]
    return table(["where", "count", "per step"], rows, table_id="syncs", numeric={1, 2})
