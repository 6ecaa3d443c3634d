"""What differs between engines in how their runs are started, watched and ended, as the agent's
loop asks it (issue 44): the agent composes a ``RunPort`` instead of an engine overriding the
agent's methods. ``LocalRuns`` is the console's own agents' (runs are this machine's processes:
nothing to add); ``agent.slurm.SlurmRuns`` is Slurm's.

Its methods, called by ``agent.node_agent.NodeAgent``:

* ``forget(part_id)``: the rank's end was reported (or it is no longer the agent's): drop what
  the port keeps of it;
* ``delay_hint()``: seconds until the port has something due (``None``: nothing), so the agent's
  idle loop wakes for it.
"""

from __future__ import annotations

from typing import Protocol


class RunPort(Protocol):
    def forget(self, part_id: int) -> None: ...

    def delay_hint(self) -> float | None: ...


class LocalRuns:
    """The agents' own runs: what the agent keeps of them is all there is."""

    def forget(self, part_id: int) -> None:
        pass

    def delay_hint(self) -> float | None:
        return None
