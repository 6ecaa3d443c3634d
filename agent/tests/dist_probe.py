"""Run by the sandbox's network test with ``python -m torch.distributed.run``: the workers of
one run meet on localhost inside the run's own network namespace and sum their ranks."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
# One write per line: the two workers share the run's output pipe.
os.write(1, f"worker {dist.get_rank()} of {dist.get_world_size()} sum {total.item():g} on {os.environ['MASTER_ADDR']}\n".encode())
dist.destroy_process_group()
