"""Which engine runs the jobs is read in one place (``agent.backend``); ``manage.py nodeagent``, the
agent of the machine it runs on, refuses to start on ``BACKEND=slurm`` before it beats or registers
anything, and says which command drives Slurm instead."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError

from agent import backend
from jobs.models import Node


@pytest.mark.django_db
def test_nodeagent_refuses_on_slurm_and_names_the_command_that_drives_it(settings):
    settings.BACKEND = "slurm"
    before = Node.objects.count()
    with pytest.raises(CommandError, match=r"BACKEND=slurm.*manage.py runconsole"):
        call_command("nodeagent", "--name", "gpu-01", "--simulated")
    assert Node.objects.count() == before


def test_the_backend_is_one_of_two_and_says_where_jobs_run(settings):
    settings.BACKEND = "agents"
    assert (backend.backend_kind(), backend.describe(), backend.node_agent_refusal()) == ("agents", "", "")
    settings.BACKEND, settings.SLURM_CONF = "slurm", "/etc/slurm/slurm.conf"
    assert backend.backend_kind() == "slurm"
    assert backend.describe() == "Jobs run as Slurm batch jobs on the cluster of /etc/slurm/slurm.conf"
    settings.BACKEND = "kubernetes"
    with pytest.raises(ImproperlyConfigured, match="'kubernetes'"):
        backend.backend_kind()
