"""``python -m bench.ui``: status change → badge updated in a real browser.

The real console (``manage.py runconsole``, embedded: SQLite, in-memory channel layer, node
agent) on a temporary install; Chromium opens the job list with 100 jobs on the page. The jobs
change status one after another (``Pending → Stopped`` through the REST API, so the change is made
and published by the console process itself, as every change is in the embedded deployment) and a
MutationObserver in the page stamps each badge's change. Latency = badge change in the browser −
the change's commit (its ``JobEvent.created_at``, taken inside the transaction: never later than the
commit). Baseline in the same run: the same measure with 1 job on the page.
"""
