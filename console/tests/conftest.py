"""The browser harness's fixtures, defined once here so every browser test module shares one
console server and one Chromium (a second sync Playwright cannot start in the same thread)."""
from console.tests.browser import browser, live_console, page  # noqa: F401
