"""First-run set-up: migrate, the operator account, the default image and the local nodes."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from agent import default_image
from agent.backend import register_local_nodes
from agent.launch import containers_ready
from console.env import env_str
from jobs.models import Image
from jobs.services.images import qualify


def ensure_default_image() -> Image:
    image, _ = Image.objects.get_or_create(
        reference=settings.DEFAULT_IMAGE,
        defaults={
            "description": "Debian 12, Python 3.11, torch 2.13 (CPU), transformers, accelerate (built locally)",
            "is_default": True,
        },
    )
    return image


def lock_down(var_dir: Path) -> None:
    """The console's state is its own: var/ 0700, the files in it 0600."""
    var_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(var_dir, 0o700)
    for path in var_dir.iterdir():
        if path.is_file():
            os.chmod(path, 0o600)


class Command(BaseCommand):
    help = "Migrate, create the operator account on first run, register the default image and local nodes."

    def add_arguments(self, parser):
        parser.add_argument("--no-nodes", action="store_true", help="do not register this machine's nodes")
        parser.add_argument("--no-image", action="store_true", help="do not start the local registry nor build the default image")

    def build_default_image(self) -> None:
        """The local registry on loopback and the default image in it (built on first use)."""

        name = qualify(settings.DEFAULT_IMAGE).split("/", 1)[1]
        try:
            figures = default_image.ensure(
                Path(settings.CONTAINER_ENGINE_ROOT), settings.LOCAL_REGISTRY_PORT, name, log=lambda line: self.stdout.write(f"  {line}")
            )
        except Exception as exc:  # the console stays usable: say so loudly
            self.stdout.write(self.style.ERROR(f"THE DEFAULT IMAGE COULD NOT BE MADE: {exc}"))
            return
        if figures.get("cached"):
            self.stdout.write(f"Default image: {figures['alias']} (in the local registry already)")
        else:
            phases = ", ".join(f"{k} {v:.0f} s" for k, v in figures.get("seconds", {}).items())
            self.stdout.write(f"Default image built in {figures['seconds_total']:.0f} s ({phases}): {figures['alias']}")

    def handle(self, *args, no_nodes: bool = False, no_image: bool = False, **options):
        call_command("migrate", interactive=False, verbosity=0)
        lock_down(Path(settings.VAR_DIR))
        User = get_user_model()
        if not User.objects.filter(username="admin").exists():
            password = env_str("CONSOLE_ADMIN_PASSWORD", "")
            generated = not password
            if generated:
                password = secrets.token_urlsafe(12)
            if not generated:
                try:
                    validate_password(password, User(username="admin"))
                except ValidationError as exc:
                    raise CommandError(f"CONSOLE_ADMIN_PASSWORD is too weak: {' '.join(exc.messages)}") from None
            User.objects.create_superuser("admin", "", password)
            if generated:
                self.stdout.write(self.style.WARNING(f"Operator account created: admin / {password}  (shown once)"))
            else:
                self.stdout.write("Operator account created: admin (password from CONSOLE_ADMIN_PASSWORD)")
        ensure_default_image()
        ready, why = containers_ready() if settings.JOB_SANDBOX != "off" else (False, "")
        if settings.JOB_SANDBOX != "off" and not ready:
            self.stdout.write(
                self.style.ERROR(
                    f"JOBS CANNOT RUN: {why}. Install podman and runc (as root: apt-get install podman runc docker-registry "
                    "mmdebstrap skopeo), or set JOB_SANDBOX=off to run jobs on the host, unconfined."
                )
            )
        elif settings.JOB_SANDBOX == "off":
            self.stdout.write(self.style.WARNING("JOB_SANDBOX=off: jobs run on the host with the console's own privileges."))
        elif settings.EMBEDDED_AGENT and not no_image:
            self.build_default_image()
        if not no_nodes and settings.EMBEDDED_AGENT:
            nodes = register_local_nodes()
            self.stdout.write(f"Nodes: {', '.join(n.name for n in nodes)}")
