from django.apps import AppConfig


class AgentConfig(AppConfig):
    # No models: an app so Celery finds ``agent.tasks`` and Django its place in the layers.
    name = "agent"
    verbose_name = "Node agent"
