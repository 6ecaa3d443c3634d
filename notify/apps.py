from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "notify"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Notifications"

    def ready(self) -> None:
        # Notifications hear of status changes through the hook the jobs app owns.
        from jobs import extensions
        from notify import handoff

        extensions.on_status_change(handoff.status_changed)
