"""Migration 0014 encrypts the registry passwords already stored in the clear: after it, each
reads back as it was and none is in the database in clear; going back decrypts them again."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("jobs", "0013_project_networks_and_storage")]
AFTER = [("jobs", "0014_registry_credential_encrypted")]


def stored_passwords() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT password FROM jobs_registrycredential ORDER BY id")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_clear_passwords_are_encrypted_and_read_back_the_same() -> None:
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    executor.migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps
        registry = old.get_model("jobs", "Registry").objects.create(host="registry.example.com")
        Credential = old.get_model("jobs", "RegistryCredential")
        Credential.objects.create(registry=registry, username="alice", password="correct horse")
        assert stored_passwords() == ["correct horse"]

        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        assert "correct horse" not in stored_passwords()[0]
        from jobs.models import RegistryCredential  # the current model reads the migrated column

        assert [c.password for c in RegistryCredential.objects.all()] == ["correct horse"]

        executor = MigrationExecutor(connection)
        executor.migrate(BEFORE)
        assert stored_passwords() == ["correct horse"]
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
