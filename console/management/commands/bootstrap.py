"""First-run set-up: migrate, the operator account, the default image and the local nodes."""
from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from console.env import env_str
from agent.inventory import discover_nodes, register_nodes
from jobs.models import Image


def ensure_default_image() -> Image:
    image, _ = Image.objects.get_or_create(
        reference=settings.DEFAULT_IMAGE,
        defaults={
            "runtime": settings.DEFAULT_IMAGE_RUNTIME,
            "description": "The console's own Python environment (torch, transformers, ckptlib)",
            "is_default": True,
        },
    )
    return image


class Command(BaseCommand):
    help = "Migrate, create the operator account on first run, register the default image and local nodes."

    def add_arguments(self, parser):
        parser.add_argument("--no-nodes", action="store_true", help="do not register this machine's nodes")

    def handle(self, *args, no_nodes: bool = False, **options):
        call_command("migrate", interactive=False, verbosity=0)
        User = get_user_model()
        if not User.objects.filter(username="admin").exists():
            password = env_str("CONSOLE_ADMIN_PASSWORD", "")
            generated = not password
            if generated:
                password = secrets.token_urlsafe(12)
            User.objects.create_superuser("admin", "", password)
            if generated:
                self.stdout.write(self.style.WARNING(f"Operator account created: admin / {password}  (shown once)"))
            else:
                self.stdout.write("Operator account created: admin (password from CONSOLE_ADMIN_PASSWORD)")
        ensure_default_image()
        if not no_nodes and settings.EMBEDDED_AGENT:
            nodes = register_nodes(discover_nodes(), agent="embedded")
            self.stdout.write(f"Nodes: {', '.join(n.name for n in nodes)}")
