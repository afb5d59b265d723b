"""Makes docs/ui.png, the viewer's picture in docs/ui.md: the embedded
default model's daemon on a free port of 127.0.0.1, a linked view drawn in
Debian's headless Chromium (as tests/blackbox/test_ui.py drives it), then a
screenshot of the page's top, made small (a palette PNG, see small()).

    .venv/bin/python tests/ui_screenshot.py [out.png]
"""
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "blackbox"))
import support  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

VIEW = "/ui?len=20&seed=4&causal=1&attention=heads&scale=each&run=1&labels=" + \
    ",".join("the quick brown fox jumps over the lazy dog and then it runs far away "
             "into the woods".split())


def main(out):
    with tempfile.TemporaryDirectory() as tmp:
        d = support.Daemon(Path(tmp) / "d").start()
        o = webdriver.ChromeOptions()
        o.binary_location = "/usr/bin/chromium"
        for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--user-data-dir=" + str(Path(tmp) / "profile"), "--window-size=1100,1250"):
            o.add_argument(a)
        drv = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)
        try:
            drv.get(d.url + VIEW)
            deadline = time.monotonic() + 60
            while drv.execute_script("return document.body.dataset.state") != "done":
                assert time.monotonic() < deadline, "the page did not draw"
                time.sleep(0.1)
            drv.execute_script("document.querySelector(\"canvas[data-head='3']\").click()")
            time.sleep(2.5)  # let the load panel show two readings
            png = drv.get_screenshot_as_png()
        finally:
            drv.quit()
            d.check_clean_exit()
    Path(out).write_bytes(small(png))


def small(png):
    """The screenshot in 64 colors through Debian's pngquant when it is
    installed (apt-get install pngquant), else as Chromium wrote it."""
    if not shutil.which("pngquant"):
        return png
    p = subprocess.run(["pngquant", "64", "--speed", "1", "-"], input=png, capture_output=True,
                       check=True)
    return p.stdout


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(support.REPO / "docs" / "ui.png"))
