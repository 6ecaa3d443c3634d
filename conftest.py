"""Repository-wide pytest set-up: the shared fixtures live in console/testing.py."""

pytest_plugins = ["console.testing"]
