"""satrain: the Simple AI Training console from a terminal (REST over httpx, logs over WebSockets)."""

__version__ = "0.1.0"
