"""The users of every access test (owner, teammate, outsider), staff, and the owner's project."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from jobs.services.creation import personal_project_for


@pytest.fixture
def owner(db):

    return User.objects.create_user("owner", password="owner-pass-1")


@pytest.fixture
def teammate(db, owner):

    user = User.objects.create_user("teammate", password="teammate-pass-1")
    personal_project_for(owner).members.add(user)
    return user


@pytest.fixture
def outsider(db):

    return User.objects.create_user("outsider", password="outsider-pass-1")


@pytest.fixture
def staff(db):

    return User.objects.create_user("operator", password="operator-pass-1", is_staff=True, is_superuser=True)


@pytest.fixture
def project(owner):

    return personal_project_for(owner)
