from django.apps import AppConfig


class FailoverConfig(AppConfig):
    name = "failover"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Job Failover plugs into the job lifecycle and the node agent through the interfaces
        # they own; neither imports failover.
        from agent import plugins
        from failover import checks  # noqa: F401  (registers the system checks)
        from failover.services import health, policy
        from jobs import extensions

        extensions.handle_failed_runs_with(policy.handle_failed_run)
        extensions.name_faults_with(policy.fault_of)
        extensions.on_control_round(policy.control_round)
        plugins.register(health.HealthChecker)
