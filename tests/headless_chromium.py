"""What the browser tests (chat_page_test.py, report_page_test.py) share: Debian's headless
Chromium and its driver through selenium, or exit 77 (skipped) saying what is missing."""
import os
import shutil
import sys


def skip(why):
    print(f"SKIPPED: {why}")
    sys.exit(77)


CHROMIUM = next((p for p in map(shutil.which, ["chromium", "chromium-browser", "google-chrome"]) if p), None)
DRIVER = shutil.which("chromedriver")
if not CHROMIUM or not DRIVER:
    skip("headless Chromium and its driver are needed (Debian: apt install chromium chromium-driver)")
os.environ.setdefault("SE_OFFLINE", "true")  # selenium must not look for a driver online
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
except ImportError:
    skip("the selenium package is missing from the test environment")


def chrome(width, window_height, capabilities=None):
    """A headless Chromium window of width x window_height (the frame included)."""
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--window-size={width},{window_height}", "--hide-scrollbars"]:
        opts.add_argument(a)
    for k, v in (capabilities or {}).items():
        opts.set_capability(k, v)
    return webdriver.Chrome(service=Service(DRIVER), options=opts)
