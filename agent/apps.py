from django.apps import AppConfig


class AgentConfig(AppConfig):
    # An app so Celery finds ``agent.tasks`` and Django its place in the layers.
    name = "agent"
    verbose_name = "Node agent"

    def ready(self) -> None:
        # Imported here, not at the top: the app registry is ready only now (Django's rule for ready()).
        from agent import local_agents
        from agent.checkpointless import Replicator
        from agent.plugins import register
        from agent.sampling import ResourceSampler
        from agent.storage import StorageWatch
        from jobs.extensions import wake_agents_with

        register(ResourceSampler)
        register(StorageWatch)
        register(Replicator)
        wake_agents_with(local_agents.wake)
