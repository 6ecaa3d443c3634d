"""The test harness: fixtures and helpers that more than one app's tests share. It is no product
package (``pyproject.toml`` installs only the apps), so no product module can import it; the root
``conftest.py`` registers its fixture modules once as pytest plugins, and a test module imports
only helpers (functions, constants) from it, never a fixture by name.

* ``harness.sandbox``: whether jobs run in containers here, ``needs_sandbox``, the default image;
* ``harness.isolation``: what each test gets afresh (work directories, caches, the progress
  throttle) and what it leaves behind (its node agents, the notification worker's queue);
* ``harness.lanes``: which fixtures start real processes, so their tests are marked ``slow``;
* ``harness.accounts``: the users of every access test (owner, teammate, outsider, staff), projects;
* ``harness.job_factory``: the default image, ``make_job`` and what a job printed (``job_output``);
* ``harness.node_agent``: simulated nodes, a node agent on them, ``drive``;
* ``harness.database``: a database that refuses one write (``refuse_once``), the migrated
  template each test process's SQLite file is copied from;
* ``harness.sources``: the house's Python files parsed once per test process;
* ``harness.sockets``: the in-memory WebSocket test client, its waits bounded by a minute;
* ``harness.processes``: the checkout, free ports and polling for the tests that start processes;
* ``harness.api``: REST API clients and URLs; ``harness.pages``: signed-in page clients;
* ``harness.browser``: one live console server and one Chromium for every browser test;
* ``harness.scaleout``: a scale-out cluster on loopback (PostgreSQL, Redis, Daphne, Celery, agents);
* ``harness.slurm``: a real Slurm cluster and the console on it (``BACKEND=slurm``);
* ``harness.spot``: the guide's Spot script as the resume tests submit it.
"""
