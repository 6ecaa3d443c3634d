from django.apps import AppConfig


class JobsConfig(AppConfig):
    verbose_name = "Training"
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"
