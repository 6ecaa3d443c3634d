from django.apps import AppConfig


class FailoverConfig(AppConfig):
    name = "failover"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Job Failover plugs into the job lifecycle here; jobs never imports failover.
        from failover.services import health, policy
        from jobs import hooks

        hooks.failed_run_handler = policy.handle_failed_run
        if health.agent_round not in hooks.agent_round_hooks:
            hooks.agent_round_hooks.append(health.agent_round)
        if policy.control_round not in hooks.control_round_hooks:
            hooks.control_round_hooks.append(policy.control_round)
