"""Markdown tables, PNG plots and the JSON files of a run."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.harness import Result, ScenarioReport

RESULTS_DIR = Path(__file__).resolve().parent / "results"
_plot_dir: Path = RESULTS_DIR
_prefix: str = ""


def configure(directory: Path, prefix: str) -> None:
    """Where plots of this run go, and the ``<date>[-quick]`` prefix of every file name."""
    global _plot_dir, _prefix
    _plot_dir, _prefix = directory, prefix


def _fmt(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def cell(result: Result, digits: int = 0) -> str:
    """``median [min–max]``."""
    return (f"{_fmt(result.median, digits)} [{_fmt(result.low, digits)}–"
            f"{_fmt(result.high, digits)}]")


def _columns(results: Sequence[Result], column: str) -> list[Any]:
    seen: list[Any] = []
    for r in results:
        if r.params.get(column) not in seen:
            seen.append(r.params.get(column))
    return seen


def _systems(results: Sequence[Result]) -> list[str]:
    seen: list[str] = []
    for r in results:
        if r.system not in seen:
            seen.append(r.system)
    return seen


def grid(results: Sequence[Result], *, column: str, digits: int = 0) -> str:
    """One row per system, one column per value of ``column``: median [min–max]."""
    columns = _columns(results, column)
    unit = results[0].unit if results else ""
    head = f"| system ({unit}) | " + " | ".join(f"{column} {c}" for c in columns) + " |"
    lines = [head, "|---" * (len(columns) + 1) + "|"]
    for system in _systems(results):
        cells = []
        for c in columns:
            found = [r for r in results if r.system == system and r.params.get(column) == c]
            cells.append(cell(found[0], digits) if found else "—")
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_grid(results: Sequence[Result], ours: str, *, column: str,
               pick_best: Sequence[str] = ()) -> str:
    """Median of ``ours`` divided by the median of every other system, per column; systems
    whose name starts with a ``pick_best`` prefix are folded into their best configuration."""
    columns = _columns(results, column)
    others: list[str] = []
    for system in _systems(results):
        name = next((p + " (best)" for p in pick_best if system.startswith(p)), system)
        if system != ours and name not in others:
            others.append(name)
    head = f"| {ours} ÷ | " + " | ".join(f"{column} {c}" for c in columns) + " |"
    lines = [head, "|---" * (len(columns) + 1) + "|"]
    for other in others:
        prefix = other.removesuffix(" (best)")
        cells = []
        for c in columns:
            mine = [r for r in results if r.system == ours and r.params.get(column) == c]
            theirs = [r for r in results if (r.system.startswith(prefix) if other != prefix
                                             else r.system == prefix)
                      and r.params.get(column) == c]
            if mine and theirs:
                top = max(theirs, key=lambda r: r.median)
                label = f" ({top.system.removeprefix(prefix).strip()})" if other != prefix else ""
                cells.append(f"{mine[0].median / top.median:.2f}×{label}")
            else:
                cells.append("—")
        lines.append(f"| {other} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pyplot() -> Any:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, name: str) -> str:
    _plot_dir.mkdir(parents=True, exist_ok=True)
    path = _plot_dir / f"{_prefix}-{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    _pyplot().close(fig)
    return str(path)


def scaling_plot(rep: ScenarioReport, column: str, unit: str, *, log_x: bool) -> str:
    """Median per system against ``column``, min–max as error bars."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for system in _systems(rep.results):
        points = sorted(((r.params[column], r) for r in rep.results if r.system == system),
                        key=lambda p: p[0])
        xs = [x for x, _ in points]
        medians = [r.median for _, r in points]
        errors = [[r.median - r.low for _, r in points], [r.high - r.median for _, r in points]]
        ax.errorbar(xs, medians, yerr=errors, marker="o", capsize=3, label=system)
    if log_x:
        ax.set_xscale("log")
        ax.set_xticks(_columns(rep.results, column), labels=[str(c) for c in _columns(
            rep.results, column)])
    ax.set_yscale("log")
    ax.set_xlabel(column.replace("_", " "))
    ax.set_ylabel(unit + " (log)")
    ax.set_title(rep.title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, rep.name)


def sustained_plot(rep: ScenarioReport, samples: Sequence[dict[str, float]]) -> str:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    t = [s["t"] for s in samples]
    axes[0].plot(t, [s["table_mb"] for s in samples], label="runs table")
    axes[0].plot(t, [s["indexes_mb"] for s in samples], label="all indexes")
    axes[0].plot(t, [s["claim_index_kb"] / 1024 for s in samples], label="claim index")
    axes[0].set_ylabel("MB")
    axes[0].legend(fontsize=7)
    axes[1].plot(t, [s["dead"] for s in samples], color="tab:red")
    axes[1].set_ylabel("dead tuples")
    axes[2].plot(t, [s["hot_pct"] for s in samples], color="tab:green")
    axes[2].set_ylabel("HOT % of updates")
    axes[2].set_ylim(0, 100)
    for ax in axes:
        ax.set_xlabel("seconds")
        ax.grid(True, alpha=0.3)
    fig.suptitle(rep.title, fontsize=9)
    return _save(fig, rep.name)


def write(rep: ScenarioReport, meta: dict[str, Any], directory: Path, prefix: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{prefix}-{rep.name}.json"
    data = {
        "scenario": rep.name, "title": rep.title, "seconds": rep.seconds, **meta,
        "results": [r.as_json() for r in rep.results],
        "targets": [{"goal": t.goal, "measured": t.measured, "met": t.met} for t in rep.targets],
        "tables": rep.tables, "plots": rep.plots, "notes": rep.notes,
    }
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


def markdown(reports: Sequence[ScenarioReport], meta: dict[str, Any]) -> str:
    """The run as one markdown document: machine, server, targets, then each scenario."""
    settings = meta["server"]
    lines = [f"# zeroth_pg benchmark — {meta['started']}{' (quick)' if meta['quick'] else ''}",
             "",
             f"Machine: {meta['machine']}.  ",
             f"Server: {settings.get('version', '?')} ({settings.get('server_kind')}); "
             + ", ".join(f"{k}={v}" for k, v in settings.items()
                         if k not in ("version", "server_kind", "server_version")) + ".  ",
             f"Profile: {meta.get('profile', 'fast')}; WAL flushes the machine allows "
             f"(8 kB write + fdatasync in the data directory): "
             + (f"{meta['wal_flushes_per_second']:,.0f}/s" if meta.get("wal_flushes_per_second")
                else "not measured") + ".  ",
             f"Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}.  ",
             f"Command: `python -m bench {' '.join(meta['argv'][1:])}`.",
             "", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for rep in reports:
        for t in rep.targets:
            mark = {True: "yes", False: "**no**", None: "not measured"}[t.met]
            lines.append(f"| {t.goal} | {t.measured} | {mark} |")
    for rep in reports:
        lines += ["", f"## {rep.title}", "", f"({rep.seconds:.0f} s)", ""]
        for table in rep.tables:
            lines += [table, ""]
        for plot in rep.plots:
            lines += [f"![{rep.name}]({Path(plot).name})", ""]
        lines += rep.notes
    return "\n".join(lines) + "\n"
