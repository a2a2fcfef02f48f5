"""A real click in a real JupyterLab: the lost-reply notebook's stepper, in headless Chromium.

JupyterLab runs on 127.0.0.1 over a temporary copy of the notebook (the
committed one is never touched); Playwright drives Debian's chromium
(``apt-get install chromium``; never ``playwright install``). Skipped, with
the reason, when either is missing.
"""

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
NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "01-Done-Failed-Unknown.ipynb"
TOKEN = "resume-toolkit-browser-test"
TIMEOUT_MS = 240_000  # the whole notebook runs in the browser's kernel, on a loaded CI box

if not CHROMIUM.exists():
    pytest.skip(f"no chromium at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install playwright; the browser is Debian's chromium)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """JupyterLab serving a copy of the lost-reply notebook; yields its base URL."""
    root, home = tmp_path / "root", tmp_path / "home"
    root.mkdir()
    home.mkdir()
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    port = free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "lab.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
         f"--LabApp.workspaces_dir={home / 'workspaces'}", "--LabApp.expose_app_in_browser=True",
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
                    pytest.fail(f"JupyterLab did not start:\n{(tmp_path / 'lab.log').read_text()}")
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


COMMAND = "() => { window.jupyterapp.commands.execute('%s'); }"
KERNEL_IDLE = """() => {
    const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const kernel = panel && panel.sessionContext && panel.sessionContext.session
        && panel.sessionContext.session.kernel;
    return kernel && kernel.status === "idle";
}"""


def test_stepper_next_and_last_buttons_change_the_shown_step_and_counters_in_jupyterlab(
        lab, tmp_path):
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                             args=["--no-sandbox", "--disable-dev-shm-usage"])
        sync_api.expect.set_options(timeout=TIMEOUT_MS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(f"{lab}/lab/tree/{NOTEBOOK.name}?token={TOKEN}")
            page.wait_for_function(KERNEL_IDLE)
            # The committed outputs hold a static copy of the widgets: clear them, then run
            # every cell in this page's own kernel, as a reader pressing "Run All" would.
            # Fire and forget: page.evaluate would wait without a timeout for a promise.
            page.evaluate(COMMAND % "notebook:clear-all-cell-outputs")
            sync_api.expect(page.locator(".jp-OutputArea-output")).to_have_count(0)
            page.evaluate(COMMAND % "notebook:run-all-cells")
            stepper = page.locator(".widget-vbox", has=page.get_by_role("button", name="Next"))
            stepper = stepper.filter(has_text="lost-reply").last
            headline = stepper.locator(".toolkit-step-headline")
            sync_api.expect(headline).to_contain_text("step 1/")
            counters = stepper.locator(".toolkit-step-counters")
            sync_api.expect(counters).to_contain_text("submit calls 0 · executions 0")

            stepper.get_by_role("button", name="Next").click()
            sync_api.expect(headline).to_contain_text("step 2/")
            stepper.get_by_role("button", name="Last").click()
            sync_api.expect(headline).not_to_contain_text("step 2/")
            sync_api.expect(counters).not_to_contain_text("submit calls 0 ")
            final = headline.inner_text()
            total = final.split("step ", 1)[1].split("/", 1)[1].split(" ", 1)[0]
            assert final.startswith(f"step {total}/{total}")
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            print(f"screenshot: {tmp_path / 'failure.png'}; server log: {tmp_path / 'lab.log'}")
            raise
        finally:
            browser.close()
