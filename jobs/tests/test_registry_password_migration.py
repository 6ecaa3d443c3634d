"""Migration 0014 encrypts the registry passwords already stored in the clear: after it, each
reads back as it was and none is in the database in clear; going back decrypts them again."""

from __future__ import annotations

import pytest
from django.db import connection

from harness.database import migrated_back

BEFORE = [("jobs", "0013_project_networks_and_storage")]
AFTER = [("jobs", "0014_registry_credential_encrypted")]


def stored_passwords() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT password FROM jobs_registrycredential ORDER BY id")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_clear_passwords_are_encrypted_and_read_back_the_same() -> None:
    with migrated_back(BEFORE) as (migrations, old):
        registry = old.get_model("jobs", "Registry").objects.create(host="registry.example.com")
        Credential = old.get_model("jobs", "RegistryCredential")
        Credential.objects.create(registry=registry, username="alice", password="correct horse")
        assert stored_passwords() == ["correct horse"]

        migrations.migrate(AFTER)
        assert "correct horse" not in stored_passwords()[0]
        from jobs.models import RegistryCredential  # the current model reads the migrated column

        assert [c.password for c in RegistryCredential.objects.all()] == ["correct horse"]

        migrations.migrate(BEFORE)
        assert stored_passwords() == ["correct horse"]
