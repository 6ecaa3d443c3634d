"""Fixtures shared by failover's tests: ``gpus`` (fake_gpus)."""
from failover.tests.fake_gpus import gpus  # noqa: F401  (a fixture)
