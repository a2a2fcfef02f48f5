"""A real click in a real JupyterLab: every notebook of the course, in headless Chromium.

JupyterLab runs on 127.0.0.1 over a temporary copy of the notebooks (the
committed ones are never touched; ``fixtures/`` is linked beside them, as in
the repository); Playwright drives Debian's chromium (``apt-get install
chromium``; never ``playwright install``). Skipped, with the reason, when
either is missing.

Every notebook is opened and must render with no error output except in the
cells tagged ``raises-exception``. A notebook with widgets is then run in the
page's own kernel ("Run All", as a reader would) and each of its controls is
used, one after another: every enabled button is clicked, every slider moved,
every dropdown set to another choice; each must change what the widget shows
(its text or its images) without an error. Notebooks without widgets are not
run a second time here: nbval runs every one of them, strict, and a browser
adds nothing to a static output but its rendering, which is checked.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("TOOLKIT_CHROMIUM", "/usr/bin/chromium"))
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TOKEN = "resume-toolkit-browser-test"
TIMEOUT_MS = 240_000  # a whole notebook runs in the browser's kernel, on a loaded CI box
CLICK_MS = 15_000  # an enabled control takes a click at once; a disabled one never does
WIDGET = "application/vnd.jupyter.widget-view+json"
TRACEBACK = "Traceback (most recent call last)"

if not CHROMIUM.exists():
    pytest.skip(f"no chromium at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install playwright; the browser is Debian's chromium)")


def committed(path: Path) -> dict:
    cells = json.loads(path.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    return {"widgets": sum(WIDGET in o.get("data", {}) for c in code for o in c["outputs"]),
            "raises": sum("raises-exception" in c["metadata"].get("tags", ()) for c in code)}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab serving a copy of notebooks/ (with fixtures/ beside it); yields its URL."""
    tmp = tmp_path_factory.mktemp("lab")
    root, home = tmp / "root", tmp / "home"
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    (root / "fixtures").symlink_to(ROOT / "fixtures")
    # Every cell in the DOM: JupyterLab 4 detaches cells scrolled out of view by default,
    # and a widget the test looks for must be there.
    settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    port = free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "PYTHONUNBUFFERED": "1"}
    log = open(tmp / "lab.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
         f"--LabApp.workspaces_dir={home / 'workspaces'}",
         f"--LabApp.user_settings_dir={home / 'settings'}", "--LabApp.expose_app_in_browser=True",
         "--ServerApp.port_retries=0", "--allow-root"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start:\n{(tmp / 'lab.log').read_text()}")
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                              args=["--no-sandbox", "--disable-dev-shm-usage"])
        sync_api.expect.set_options(timeout=TIMEOUT_MS)
        try:
            yield chromium
        finally:
            chromium.close()


COMMAND = "() => { window.jupyterapp.commands.execute('%s'); }"
KERNEL_IDLE = """() => {
    const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const kernel = panel && panel.sessionContext && panel.sessionContext.session
        && panel.sessionContext.session.kernel;
    return kernel && kernel.status === "idle";
}"""
# Every code cell has run (an execution count, no "[*]") and the kernel rests.
ALL_RUN = """() => {
    const panel = window.jupyterapp.shell.currentWidget;
    const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
    const cells = panel.content.widgets.filter(c => c.model.type === "code");
    return kernel && kernel.status === "idle" && cells.length > 0
        && cells.every(c => c.model.executionCount !== null);
}"""
SHUTDOWN = "() => { window.jupyterapp.shell.currentWidget.sessionContext.shutdown(); }"
# What a widget shows: its text and its images (a new image is a new blob URL).
LOOK = """el => el.innerText + "|" + Array.from(el.querySelectorAll("img"))
    .map(img => img.src).join(",")"""
# Buttons (not toggles: a setting shows only on itself until Run), Play, sliders, dropdowns.
CONTROLS = ("button:not(.widget-play button):not(.widget-toggle-button), .widget-play, "
            ".widget-slider .noUi-target, .widget-dropdown select")


def use(control, kind: str) -> str:
    """Use one control as a student would; returns what was done (for the failure message)."""
    if kind == "play":  # ipywidgets Play: play for a moment, then pause (it would run on)
        buttons = control.locator("button")
        buttons.nth(0).click()
        control.page.wait_for_timeout(1500)
        # A short drill may play to its end (pause disabled) between any check and the
        # click: try the pause briefly, and accept a timeout only if play really ended.
        try:
            buttons.nth(1).click(timeout=CLICK_MS)
        except sync_api.TimeoutError:
            assert not buttons.nth(1).is_enabled(), "Play's pause never became clickable"
        return "play, then pause"
    if kind == "slider":
        box = control.bounding_box()
        control.click(position={"x": box["width"] * 0.7, "y": box["height"] / 2},
                      timeout=CLICK_MS)
        return "slider moved to 70 %"
    if kind == "select":
        options = control.locator("option")
        current = control.input_value()
        values = [options.nth(i).get_attribute("value") for i in range(options.count())]
        others = [value for value in values if value != current]
        if not others:
            return ""
        # The last other choice: the first is often what an unset dropdown already shows.
        control.select_option(others[-1], timeout=CLICK_MS)
        return f"dropdown set to option {others[-1]}"
    control.click(timeout=CLICK_MS)
    return f"button {control.inner_text().strip()!r}"


def kind_of(control) -> str:
    classes = control.get_attribute("class") or ""
    tag = control.evaluate("el => el.tagName").lower()
    return "play" if "widget-play" in classes else "slider" if "noUi-target" in classes else \
        "select" if tag == "select" else "button"


def click_every_control(page, output, name: str) -> int:
    """Use each enabled control of one widget output; each must change what it shows."""
    used = 0
    count = output.locator(CONTROLS).count()
    for i in range(count):
        control = output.locator(CONTROLS).nth(i)
        if not control.is_visible() or not control.is_enabled():
            continue
        kind = kind_of(control)
        before = output.evaluate(LOOK)
        try:
            what = use(control, kind)
        except sync_api.TimeoutError:
            # Enabled when looked at, disabled when clicked: the kernel's update for the
            # previous control (a ◀ Prev at the first step) arrived in between. Skip it
            # only if it really is disabled now.
            if control.is_enabled():
                raise
            continue
        if not what:
            continue
        try:
            page.wait_for_function(f"([el, before]) => ({LOOK})(el) !== before",
                                   arg=[output.element_handle(), before], timeout=TIMEOUT_MS)
        except sync_api.TimeoutError:
            pytest.fail(f"{name}: {what} changed nothing in its widget")
        assert TRACEBACK not in output.inner_text(), f"{name}: {what} raised"
        # The frame changed with the first message; let the kernel finish the rest (the
        # buttons' enabled states) before the next control is looked at.
        page.wait_for_function(KERNEL_IDLE)
        used += 1
    return used


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_renders_runs_and_every_widget_control_changes_its_frame_in_jupyterlab(
        lab, browser, path, tmp_path):
    """Fault: none; what must hold for a reader: the notebook opens with no error output
    (beyond its ``raises-exception`` cells); with widgets, Run All finishes and each
    button, slider and dropdown changes what its widget shows, without an error."""
    expected = committed(path)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    try:
        # A workspace of its own, reset: JupyterLab would otherwise restore the notebooks
        # opened before, and the commands below act on the current one.
        page.goto(f"{lab}/lab/workspaces/{path.stem}/tree/notebooks/{path.name}"
                  f"?token={TOKEN}&reset")
        page.wait_for_function(f"""() => window.jupyterapp && window.jupyterapp.shell.currentWidget
            && window.jupyterapp.shell.currentWidget.title.label === "{path.name}" """)
        page.wait_for_function(KERNEL_IDLE)
        outputs = page.locator(".jp-OutputArea-output")
        sync_api.expect(outputs.first).to_be_attached()
        if expected["widgets"]:
            # The committed outputs hold a static copy of the widgets: clear them, then run
            # every cell in this page's own kernel. Fire and forget: page.evaluate would wait
            # without a timeout for a promise.
            page.evaluate(COMMAND % "notebook:clear-all-cell-outputs")
            sync_api.expect(outputs).to_have_count(0)
            page.evaluate(COMMAND % "notebook:run-all-cells")
            page.wait_for_function(ALL_RUN, polling=500)
        errors = page.locator(".jp-OutputArea-output", has_text=TRACEBACK).count()
        assert errors == expected["raises"], f"{path.name}: {errors} error output(s)"
        if expected["widgets"]:
            # One display output per widget view, whatever its root box is.
            views = page.locator(".jp-OutputArea-output").filter(
                has=page.locator(".jupyter-widgets"))
            assert views.count() == expected["widgets"], f"{path.name}: widgets did not render"
            used = sum(click_every_control(page, views.nth(i), path.name)
                       for i in range(views.count()))
            assert used > 0, f"{path.name}: no control of its widgets could be used"
    except Exception:
        page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
        print(f"screenshot: {tmp_path / 'failure.png'}")
        raise
    finally:
        try:
            page.evaluate(SHUTDOWN)  # free the kernel before the next notebook
        finally:
            page.close()
