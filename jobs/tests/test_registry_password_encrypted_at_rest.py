"""A registry credential's password (Admin → Registries) is stored encrypted as secret
environment variables are (a key derived from SECRET_KEY), never shown back in the admin, and
decrypted only for the pull's auth file."""

from __future__ import annotations

import base64
import logging

import pytest
from django.db import connection
from django.urls import reverse

from jobs.admin import CredentialForm
from jobs.models import Registry, RegistryCredential, TrainingJob
from jobs.secret_env import SecretUnreadable
from jobs.services.images import auth_for

pytestmark = pytest.mark.django_db

HOST = "registry.example.com"
PASSWORD = "correct horse battery staple"


@pytest.fixture
def credential(project) -> RegistryCredential:
    return RegistryCredential.objects.create(registry=Registry.objects.create(host=HOST), project=project, username="alice", password=PASSWORD)


def stored_password(credential: RegistryCredential) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT password FROM jobs_registrycredential WHERE id = %s", [credential.pk])
        return cursor.fetchone()[0]


def test_a_credentials_password_is_not_in_the_database_in_clear(credential):
    stored = stored_password(credential)
    assert PASSWORD not in stored and "horse" not in stored
    assert base64.b64encode(f"alice:{PASSWORD}".encode()).decode() not in stored
    assert RegistryCredential.objects.get(pk=credential.pk).password == PASSWORD


def test_the_pulls_auth_file_carries_the_password_decrypted(credential, project):
    job = TrainingJob(image=f"{HOST}/team/trainer:v2", project=project)
    token = auth_for(job)["auths"][HOST]["auth"]
    assert base64.b64decode(token).decode() == f"alice:{PASSWORD}"


def test_a_password_the_consoles_key_cannot_decrypt_is_no_credential(credential, project, settings, caplog):
    settings.SECRET_KEY = "another key, its old one lost"
    settings.SECRET_KEY_FALLBACKS = []
    with pytest.raises(SecretUnreadable):
        RegistryCredential.objects.get(pk=credential.pk).password  # noqa: B018
    with caplog.at_level(logging.ERROR):
        assert auth_for(TrainingJob(image=f"{HOST}/team/trainer:v2", project=project)) is None
    assert "cannot be used" in caplog.text and PASSWORD not in caplog.text


def test_the_admin_form_keeps_the_password_when_left_empty_and_replaces_it_when_given(credential):
    registry = credential.registry
    before = stored_password(credential)
    credential = RegistryCredential.objects.get(pk=credential.pk)  # as the admin loads it
    form = CredentialForm(data={"registry": registry.pk, "project": credential.project_id, "username": "bob", "password": ""}, instance=credential)
    assert form.is_valid(), form.errors
    form.save()
    credential.refresh_from_db()
    assert (credential.username, credential.password, stored_password(credential)) == ("bob", PASSWORD, before)

    form = CredentialForm(data={"registry": registry.pk, "project": credential.project_id, "username": "bob", "password": "new token"}, instance=credential)
    assert form.is_valid(), form.errors
    form.save()
    credential.refresh_from_db()
    assert credential.password == "new token" and "new token" not in stored_password(credential)

    new = CredentialForm(data={"registry": Registry.objects.create(host="other.example.com").pk, "username": "carol", "password": ""})
    assert not new.is_valid() and "password" in new.errors  # a new credential needs one


def test_the_admin_never_shows_the_password_back(client, staff, credential):
    client.force_login(staff)
    html = client.get(reverse("admin:jobs_registry_change", args=[credential.registry_id])).content.decode()
    assert "alice" in html
    assert PASSWORD not in html and stored_password(credential) not in html
    assert 'name="credentials-0-password"' in html and 'name="credentials-0-password" value' not in html
