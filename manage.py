#!/usr/bin/env python
"""Django's command-line utility for the Simple AI Training console."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    from console.envfile import prepare_or_exit

    prepare_or_exit()  # a scale-out host's env file, or a refusal to run on the embedded SQLite
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
