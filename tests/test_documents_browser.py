"""A real page translated by `seqtool translate` and shown in a real browser beside its source: the
layout is unchanged (the same blocks, at the same places and widths; code blocks the same size; nothing
wider than the window). Screenshots of both are written, to SEQTOOL_SCREENSHOTS when it names a folder
(the README's pictures: SEQTOOL_SCREENSHOTS=docs SEQTOOL_SCREENSHOTS_CHECKPOINT=runs/demo/best.pt)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

PAGE = Path(__file__).parent / "data" / "documents" / "rust-by-example-es" / "index.html"
BLOCKS = "main h1, main h2, main p, main pre, main li, main table, main ul, main ol"
LAYOUT = f"""return Array.from(document.querySelectorAll({BLOCKS!r})).map(e => {{
    const r = e.getBoundingClientRect(); return [e.tagName, Math.round(r.left), Math.round(r.width), Math.round(r.height)]; }})"""


def browser():
    chromium, driver_path = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        pytest.skip("needs Chromium and its driver: apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1600",
                 "--hide-scrollbars", "--allow-file-access-from-files"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver_path), options=options)


def test_a_translated_page_keeps_its_layout_in_a_real_browser(tiny_checkpoint, tmp_path):
    checkpoint = os.environ.get("SEQTOOL_SCREENSHOTS_CHECKPOINT") or tiny_checkpoint
    shutil.copytree(PAGE.parent / "css", tmp_path / "css")
    shutil.copy(PAGE, tmp_path / "source.html")
    out = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(checkpoint), "--device", "cpu", "--threads", "2",
                          "-i", str(tmp_path / "source.html"), "-o", str(tmp_path / "translated.html")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    driver = browser()
    try:
        layouts, widths = {}, {}
        for name in ("source", "translated"):
            driver.get((tmp_path / f"{name}.html").as_uri())
            layouts[name] = driver.execute_script(LAYOUT)
            widths[name] = driver.execute_script("return document.documentElement.scrollWidth")
            driver.save_screenshot(str(tmp_path / f"{name}.png"))
    finally:
        driver.quit()
    source, translated = layouts["source"], layouts["translated"]
    assert len(source) > 20 and [b[0] for b in translated] == [b[0] for b in source]  # the same blocks, in order
    assert [b[1:3] for b in translated] == [b[1:3] for b in source]  # each where it was, as wide as it was
    assert [b[3] for b in translated if b[0] == "PRE"] == [b[3] for b in source if b[0] == "PRE"]  # code blocks unchanged
    assert widths["translated"] <= 1280 and widths["source"] <= 1280
    if os.environ.get("SEQTOOL_SCREENSHOTS"):
        target = Path(os.environ["SEQTOOL_SCREENSHOTS"])
        target.mkdir(parents=True, exist_ok=True)
        for name in ("source", "translated"):
            shutil.copy(tmp_path / f"{name}.png", target / f"documents-{name}.png")
