"""The benchmark command runs end to end and prints its one table (no timing asserted)."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "benchmarks" / "run.py"


def _measure():
    path = ROOT / "benchmarks" / "measure.py"
    spec = importlib.util.spec_from_file_location("bench_measure", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_prints_one_table_with_every_section(tmp_path):
    """`run.py --quick` exits 0 and prints the header and one table covering sections 1-10.

    Every data row shows a median and a min–max, or says why it was not measured.
    ``--readme`` rewrites only README's benchmark block, from this run's rows.
    """
    readme = tmp_path.parent / f"{tmp_path.name}-README.md"
    original = (ROOT / "README.md").read_text()
    readme.write_text(original)
    done = subprocess.run([sys.executable, str(RUN), "--quick", "--dir", str(tmp_path),
                           "--readme", str(readme)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("resume-toolkit benchmarks (quick"), out[:300]
    lines = out.splitlines()
    heads = [number for number, line in enumerate(lines)
             if line.lstrip().startswith("#  measurement")]
    assert len(heads) == 1, out  # exactly one table
    rows = []
    for line in lines[heads[0] + 2:]:
        if not line.strip():
            break
        rows.append(line)
    sections = {line.split()[0] for line in rows}
    assert sections == {"1", "2", "3", "4", "5", "6", "7", "8", "9", "10"}, out
    for line in rows:
        measured = re.search(r"\d[\d,.]*–\d[\d,.]*", line)
        assert measured or "not " in line, f"row without median and min–max: {line!r}"
    assert not list(tmp_path.iterdir()), "the run leaves no files behind"
    written = readme.read_text()
    begin, end = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"
    assert written.split(begin)[0] == original.split(begin)[0]
    assert written.split(end)[1] == original.split(end)[1]
    block = written.split(begin)[1].split(end)[0]
    assert "resume-toolkit benchmarks (quick" in block
    assert {line.split("|")[1].strip() for line in block.splitlines()
            if re.match(r"\| \d+ \|", line)} == sections


def test_readme_without_the_benchmark_block_is_refused_before_the_run(tmp_path):
    """Fault: a README without the markers; property: refused at once (exit non-zero),
    the file untouched, no benchmark run first."""
    readme = tmp_path / "README.md"
    readme.write_text("# no block here\n")
    done = subprocess.run([sys.executable, str(RUN), "--quick", "--only", "3",
                           "--dir", str(tmp_path), "--readme", str(readme)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode != 0 and "benchmarks:begin" in done.stderr
    assert readme.read_text() == "# no block here\n"
    assert "resume-toolkit benchmarks" not in done.stdout


def test_ratios_pair_samples_and_the_exponent_fits_a_power_law():
    """Ratios are per repetition (never of medians); t = c*n^2 fits k = 2."""
    measure = _measure()
    assert measure.ratio([2.0, 9.0], [1.0, 3.0]).samples == [2.0, 3.0]
    assert abs(measure.exponent([1_000, 2_000, 4_000], [1.0, 4.0, 16.0]) - 2.0) < 1e-9
    calls = []
    samples = measure.interleave(2, {"a": lambda: calls.append("a") or 1.0,
                                     "b": lambda: calls.append("b") or 2.0})
    assert samples == {"a": [1.0, 1.0], "b": [2.0, 2.0]}
    assert calls == ["a", "b", "b", "a"]  # the order rotates between repetitions
