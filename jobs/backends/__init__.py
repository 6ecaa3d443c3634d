"""Where attempts run: the console's own node agents, or a cluster's scheduler (``slurm``)."""
