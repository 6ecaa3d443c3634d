"""Slurm as a place attempts run: its commands (``client``) and a one-host cluster for tests and
development (``cluster``)."""
