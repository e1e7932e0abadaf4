"""Open MLflow's UI in a real browser (Playwright driving Chromium) as a person would, and find CIC's chart of
coverage against α with every model, counting clicks from the experiment list; screenshot it.

    python infra/scripts/mlflow_ui_check.py                          # builds a store: both committed real tables
    python infra/scripts/mlflow_ui_check.py --tracking-uri sqlite:///mlflow.db --experiment cic-trivia_qa

Needs Chromium (`apt-get install chromium`) and Playwright (`pip install playwright`; its own browser download is
not needed). Exit 0 when the chart is found within two clicks, 1 with what was missing otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TABLES = [ROOT / "infra/examples/real/smollm2-135m.parquet", ROOT / "infra/examples/real/qwen2.5-coder-1.5b.parquet"]
SECTION = "CIC: every model against α"
LINK = "open the chart view"
ONBOARDING = "Got it"  # MLflow's one-time pop-up on a GenAI overview, shown once per browser


def build_store(tmp: Path, tables: list[Path], n_splits: int) -> str:
    """A local store holding each table, logged by the installed `cic log` (the product's own path)."""
    uri = f"sqlite:///{tmp}/mlflow.db"
    cic = Path(sys.executable).with_name("cic")
    for table in tables:
        subprocess.run([str(cic), "log", str(table), "--tracking-uri", uri, "--n-splits", str(n_splits),
                        "--report-dir", str(tmp / "reports")], cwd=tmp, check=True, capture_output=True)
    return uri


def start_ui(uri: str, port: int) -> subprocess.Popen:
    """`mlflow ui` on the store (a server URI is used as it is, no process started)."""
    proc = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "ui", "--backend-store-uri", uri,
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(f"mlflow ui on port {port} did not answer within 120 s")


def find_chart(address: str, experiment: str, models: list[str], out: Path, chromium: str) -> list[str]:
    """Click from the experiment list to the α chart; returns what was found, clicks counted (raises on a miss)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1600, "height": 1100})
        page = context.new_page()
        page.goto(f"{address}/#/experiments", wait_until="networkidle")  # the list loaded, as a person sees it
        try:
            return _click_through(context, page, experiment, models, out)
        except Exception:
            page.screenshot(path=str(out.with_suffix(".failed.png")))
            print(f"stopped at {page.url} (screenshot {out.with_suffix('.failed.png')})", file=sys.stderr)
            raise
        finally:
            browser.close()


def _click_through(context: Any, page: Any, experiment: str, models: list[str], out: Path) -> list[str]:
    """The two clicks and what each showed."""
    said = []
    page.get_by_role("link", name=experiment, exact=True).click(timeout=60_000)  # click 1
    said.append(f"click 1: experiment {experiment} → {page.url.split('#', 1)[1]}")
    link = page.get_by_role("link", name=LINK)
    link.wait_for(timeout=60_000)
    if page.get_by_text(ONBOARDING).is_visible():
        page.get_by_text(ONBOARDING).click()
        said.append(f"MLflow's one-time pop-up dismissed ({ONBOARDING!r}: once per browser, not CIC's)")
    with context.expect_page(timeout=60_000) as opened:
        link.click()  # click 2 (the link opens the view in a new tab)
    view = opened.value
    view.get_by_text(SECTION).wait_for(timeout=90_000)
    said.append(f"click 2: {LINK!r} → {view.url.split('#', 1)[1]}")
    view.locator(".js-plotly-plot .scatterlayer .trace").first.wait_for(timeout=120_000)  # lines drawn
    axes = view.locator(".js-plotly-plot .xtitle").all_text_contents()  # SVG text: no innerText
    if not axes or any(title != "alpha_by_alpha_pct" for title in axes[:4]):  # the view's charts: x is α
        raise SystemExit(f"the first charts' x axes read {axes[:4]}, not alpha_by_alpha_pct")
    body = view.inner_text("body")
    missing = [m for m in models if m not in body]
    if missing:
        raise SystemExit(f"the view shows no run of {missing}")
    time.sleep(5)  # every chart draws its lines once its runs' histories arrive
    view.screenshot(path=str(out))
    said.append(f"found: section {SECTION!r}, x axis alpha_by_alpha_pct, runs of {', '.join(models)}; "
                f"screenshot {out}")
    return said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", help="the store to open (default: a new one holding both real tables)")
    parser.add_argument("--experiment", default="cic-commonsense_qa")
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-1.5b", help="runs the chart must show")
    parser.add_argument("--table", action="append", type=Path, help="tables to log into a new store")
    parser.add_argument("--n-splits", type=int, default=5)
    parser.add_argument("--port", type=int, default=5097)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/figures/mlflow_alpha_view.png")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args()
    if not args.chromium:
        raise SystemExit("--chromium: no Chromium found (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="cic-ui-") as tmp:
        uri = args.tracking_uri or build_store(Path(tmp), args.table or TABLES, args.n_splits)
        server = None if uri.startswith("http") else start_ui(uri, args.port)
        try:
            address = uri.rstrip("/") if server is None else f"http://127.0.0.1:{args.port}"
            for line in find_chart(address, args.experiment, args.models.split(","), args.out, args.chromium):
                print(line)
        finally:
            if server is not None:
                os.killpg(server.pid, signal.SIGKILL)  # `mlflow ui` and the uvicorn workers it started


if __name__ == "__main__":
    main()
