"""Repository-wide pytest set-up: the shared fixtures, registered once here as plugins (a test
module never imports a fixture by name: ``console/tests/test_architecture.py`` checks it).

* ``console.testing``: the users of every access test, projects, jobs, nodes and a node agent;
* ``console.tests.api_fixtures``: REST API clients;
* ``console.tests.page_fixtures``: signed-in page clients;
* ``console.tests.browser``: one live console server and one Chromium for every browser test;
* ``failover.tests.run_cleanup``: ``no_run_outlives_its_test`` for tests that start real runs;
* ``jobs.tests.slurm_fixtures``: a real Slurm cluster and the console on it (``BACKEND=slurm``).
"""

pytest_plugins = [
    "console.testing",
    "console.tests.api_fixtures",
    "console.tests.page_fixtures",
    "console.tests.browser",
    "failover.tests.run_cleanup",
    "failover.tests.fake_gpus",
    "jobs.tests.slurm_fixtures",
]
