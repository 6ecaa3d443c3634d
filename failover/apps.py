from django.apps import AppConfig


class FailoverConfig(AppConfig):
    name = "failover"
    default_auto_field = "django.db.models.BigAutoField"
