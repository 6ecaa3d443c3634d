"""Registry passwords encrypted at rest, as secret environment variables are (jobs.secret_env).

The column keeps its name (``password``), becomes text (a token is longer than the password), and
each row's clear password is encrypted in place; the model then reads it as the SecretEnvField
``password_encrypted`` (state only: the column is already what that field stores)."""

from django.db import migrations, models

import jobs.secret_env


def encrypt_passwords(apps, schema_editor):
    RegistryCredential = apps.get_model("jobs", "RegistryCredential")
    for pk, password in RegistryCredential.objects.values_list("pk", "password").iterator():
        sealed = jobs.secret_env.SecretEnv.of({"password": password or ""}).stored()
        RegistryCredential.objects.filter(pk=pk).update(password=sealed)


def decrypt_passwords(apps, schema_editor):
    RegistryCredential = apps.get_model("jobs", "RegistryCredential")
    for pk, stored in RegistryCredential.objects.values_list("pk", "password").iterator():
        try:
            password = jobs.secret_env.SecretEnv.from_stored(stored).reveal().get("password", "")
        except jobs.secret_env.SecretUnreadable as exc:
            raise RuntimeError(f"registry credential {pk}: {exc}") from None
        RegistryCredential.objects.filter(pk=pk).update(password=password)


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0013_project_networks_and_storage'),
    ]

    operations = [
        migrations.AlterField(
            model_name='registrycredential',
            name='password',
            field=models.TextField(help_text='Password or token'),
        ),
        migrations.RunPython(encrypt_passwords, decrypt_passwords),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name='registrycredential',
                    name='password',
                ),
                migrations.AddField(
                    model_name='registrycredential',
                    name='password_encrypted',
                    field=jobs.secret_env.SecretEnvField(blank=True, db_column='password', default=jobs.secret_env.no_secrets, editable=False),
                ),
            ],
        ),
    ]
