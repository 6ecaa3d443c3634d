"""``python -m bench.failover``: Job Failover latency and goodput in the embedded console.

The bench sets up its own embedded console in a temporary directory (SQLite, simulated nodes:
3 × 4 GPUs by default), runs the real ``EmbeddedControlLoop(start_local_agent())`` thread that
``make run`` runs, and measures:

* **latency** (``latency.py``): for each of ``--runs`` jobs, the time from injecting a hardware
  fault (Xid 79 on the job's GPU) to the job ``Running`` on a new node and to its first new log
  line, split into phases read from the database's own timestamps;
* **goodput** (``goodput.py``): the training steps per hour of ``jobs.examples.train_ckpt`` with a
  hardware fault every ``--fault-every`` minutes, against a fault-free run measured at the same time.
"""
