"""Timing, repetition and the one results table of ``benchmarks/run.py``.

Every figure is a list of samples, one per repetition, shown as its median
with min–max. A ratio is never a ratio of two medians: both sides run in the
same repetition, back to back (the order rotates from one repetition to the
next so neither side always runs on a warmer or a busier machine), and the
ratio is taken per repetition; the table shows the median of those ratios
with their min–max.
"""

import dataclasses
import json
import math
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path


@dataclasses.dataclass
class Figure:
    """One measured quantity: ``samples`` (one per repetition) in ``unit``."""

    samples: list[float]
    unit: str  # "/s", "s", "x", "MB", "" (a plain number)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def text(self, value: float, unit: bool = True) -> str:
        return _number(value, self.unit, unit)

    def spread(self) -> str:
        """'min–max' in the median's unit (ms or s, as the median is shown)."""
        low, high = min(self.samples), max(self.samples)
        if self.unit == "s":  # both ends in the median's unit
            scale, digits = (1000, 1) if self.median < 1 else (1, 2)
            return f"{low * scale:,.{digits}f}–{high * scale:,.{digits}f}"
        return f"{_number(low, self.unit, False)}–{_number(high, self.unit, False)}"


def _number(value: float, unit: str, suffix: bool = True) -> str:
    if unit == "/s":
        text, unit = (f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"), " /s"
    elif unit == "s" and value < 1:
        text, unit = f"{value * 1000:,.1f}", " ms"
    elif unit == "s":
        text, unit = f"{value:,.2f}", " s"
    elif unit == "x":
        text = f"{value:.2f}" if value < 100 else f"{value:,.0f}"
    elif unit == "MB":
        text, unit = f"{value:,.0f}", " MB"
    elif unit == "us":
        text, unit = f"{value:,.1f}", " µs"
    else:
        text = f"{value:.2f}"
    return text + unit if suffix else text


@dataclasses.dataclass
class Row:
    section: str
    label: str
    figure: Figure | None = None
    target: str = ""  # e.g. ">= 0.8"
    verdict: str = ""  # "met", "MISSED" or ""
    note: str = ""


def check(figure: Figure, op: str, bound: float) -> tuple[str, str]:
    """(target text, verdict) of the median against ``op bound``."""
    ok = figure.median >= bound if op == ">=" else figure.median <= bound
    return f"{op} {_number(bound, figure.unit)}", "met" if ok else "MISSED"


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else math.inf


def timed(run) -> float:
    """Seconds taken by ``run()`` (wall clock, ``perf_counter``)."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def interleave(reps: int, runs: dict) -> dict[str, list]:
    """Call each of ``runs`` (name -> callable returning a sample) once per repetition.

    The order rotates by one position per repetition; returns name -> samples.
    """
    names = list(runs)
    samples = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(runs[name]())
    return samples


def paired(reps: int, blocks: int, items: int, factories: dict, per_item: int,
           scale: dict | None = None) -> dict[str, list]:
    """Rates (operations/s) of subjects that alternate block by block.

    Each repetition opens every subject fresh (``factories[name]()``), then
    ``blocks`` times lets each do ``step(items)`` in turn (the order rotating
    per block), and closes them. A subject's sample is its operations
    (``blocks * items * per_item``) over the sum of its own block times, so a
    burst of disk latency from a neighbour lands on both sides of a ratio.
    ``scale[name]`` multiplies ``items`` for fast subjects (no fsync).
    """
    names = list(factories)
    scale = {name: (scale or {}).get(name, 1) for name in names}
    rates = {name: [] for name in names}
    for _ in range(reps):
        subjects = {name: factories[name]() for name in names}
        spent = dict.fromkeys(names, 0.0)
        try:
            subjects[names[0]].step(1)  # warm up outside the clock: caches, first pages
            for name in names[1:]:
                subjects[name].step(1)
            for block in range(blocks):
                shift = block % len(names)
                for name in names[shift:] + names[:shift]:
                    spent[name] += subjects[name].step(items * scale[name])
        finally:
            for subject in subjects.values():
                subject.close()
        for name in names:
            rates[name].append(rate(blocks * items * scale[name] * per_item, spent[name]))
    return rates


def ratio(top: list[float], bottom: list[float]) -> Figure:
    """Per-repetition ratio ``top[i] / bottom[i]``."""
    return Figure([a / b for a, b in zip(top, bottom)], "x")


def exponent(sizes: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(size): t ~ n**k."""
    xs, ys = [math.log(n) for n in sizes], [math.log(t) for t in seconds]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def exponent_figure(sizes: list[int], samples: list[list[float]]) -> Figure:
    """The fitted exponent per repetition (samples[size_index][rep])."""
    reps = min(len(per_size) for per_size in samples)
    return Figure([exponent(sizes, [per_size[rep] for per_size in samples])
                   for rep in range(reps)], "")


def in_child(task: str, *args) -> dict:
    """Run ``benchmarks/child.py TASK ARGS`` in a fresh interpreter; return its JSON.

    A fresh process per sample gives an honest peak RSS (``ru_maxrss``) and no
    state carried over between repetitions.
    """
    script = Path(__file__).with_name("child.py")
    done = subprocess.run([sys.executable, str(script), task, *map(str, args)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        why = done.stderr.strip()[-2000:]
        raise RuntimeError(f"child {task} failed ({done.returncode}): {why}")
    return json.loads(done.stdout)


def filesystem(path) -> str:
    """'<fstype> on <mount point> (<device>)' for the mount holding ``path``."""
    path, best = os.path.realpath(path), ("?", "/", "?")
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                device, point, fstype = line.split()[:3]
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best[1]):
                    best = (device, point, fstype)
    except OSError:
        return "unknown file system"
    return f"{best[2]} on {best[1]} ({best[0]})"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def header(workdir, mode: str, reps: str) -> list[str]:
    import pandas

    return [
        f"resume-toolkit benchmarks ({mode}, {reps} repetitions), "
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}",
        f"machine: {cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}",
        f"versions: Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"pandas {pandas.__version__}, "
        + ", ".join(f"{name} {_version(name)}" for name in ("pyarrow", "msgspec", "orjson",
                                                            "pymupdf-lite", "psycopg")),
        f"files: {workdir} ({filesystem(workdir)})",
    ]


def render(rows: list[Row]) -> str:
    """The one table: section, measurement, median, min–max, target, verdict."""
    head = ("#", "measurement", "median", "min–max", "target", "")
    lines = [head]
    for row in rows:
        if row.figure is None:
            lines.append((row.section, row.label, "—", "", row.target, row.note))
            continue
        fig = row.figure
        spread = fig.spread()
        verdict = " ".join(part for part in (row.verdict, row.note) if part)
        lines.append((row.section, row.label, fig.text(fig.median), spread, row.target, verdict))
    widths = [max(len(line[col]) for line in lines) for col in range(len(head))]
    out = []
    for number, line in enumerate(lines):
        cells = [line[0].rjust(widths[0]), line[1].ljust(widths[1]), line[2].rjust(widths[2]),
                 line[3].ljust(widths[3]), line[4].ljust(widths[4]), line[5]]
        out.append("  ".join(cells).rstrip())
        if number == 0:
            out.append("  ".join("-" * width for width in widths[:5]) + "  " + "-" * 6)
    return "\n".join(out)


def markdown(rows: list[Row]) -> str:
    """The same table for README: measurement, median (min–max), target, verdict."""
    out = ["| # | measurement | median (min–max) | target | |", "| --- | --- | --- | --- | --- |"]
    for row in rows:
        if row.figure is None:
            value = "—"
        else:
            spread = row.figure.spread()
            value = row.figure.text(row.figure.median) + (f" ({spread})" if spread else "")
        verdict = " ".join(part for part in (row.verdict, row.note) if part)
        cells = (row.section, row.label, value, row.target, verdict)
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(out)


BEGIN, END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"


def replace_block(text: str, block: str) -> str:
    """``text`` with what lies between README's two benchmark markers replaced by ``block``."""
    head, found, rest = text.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise SystemExit(f"README has no {BEGIN} ... {END} block")
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"
