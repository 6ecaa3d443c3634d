"""The operators' admin: nodes and GPUs, images, projects, and Training Jobs with their history.

A job's status never changes here: status moves only through ``jobs.services.lifecycle``, so the
status fields are read-only and the job actions go through the same services as the console.
"""

from __future__ import annotations

from collections.abc import Callable

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobs.models import GPU, Image, JobAttempt, JobEvent, Node, Project, ProjectVolume, Registry, RegistryCredential, TrainingJob
from jobs.services.actions import JobActionRefused, delete_job, request_stop
from jobs.statuses import DELETABLE


def console_url(job: TrainingJob) -> str:
    return reverse("jobs:detail", args=[job.pk])


def console_link(job: TrainingJob | None, text: str | None = None) -> SafeString | str:
    """A link to the job's page in the console (where its logs, charts and actions are)."""
    if job is None:
        return "—"
    return format_html('<a href="{}">{}</a>', console_url(job), text or job.name)


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0
    fields = ("index", "model", "memory_mb", "uuid", "healthy", "health_reason", "allocated_to")
    readonly_fields = ("allocated_to",)
    show_change_link = True


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "gpu_model_name", "state", "healthy", "cordoned", "simulated", "last_heartbeat")
    list_filter = ("state", "healthy", "cordoned", "simulated")
    search_fields = ("name", "gpu_model", "agent")
    readonly_fields = ("last_heartbeat", "created_at")
    actions: tuple[str, ...] = ("cordon", "uncordon")
    inlines = (GPUInline,)

    @admin.display(description="GPU model", ordering="gpu_model")
    def gpu_model_name(self, node: Node) -> str:
        return node.gpu_model

    @admin.action(description="Cordon selected nodes (no new jobs are placed on them)")
    def cordon(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        count = queryset.update(cordoned=True)
        self.message_user(request, f"Cordoned {count} node{'s' if count != 1 else ''}.", messages.SUCCESS)

    @admin.action(description="Uncordon selected nodes")
    def uncordon(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        count = queryset.update(cordoned=False)
        self.message_user(request, f"Uncordoned {count} node{'s' if count != 1 else ''}.", messages.SUCCESS)


@admin.register(GPU)
class GPUAdmin(admin.ModelAdmin):
    list_display = ("__str__", "node", "index", "model", "memory_mb", "healthy", "held_by")
    list_filter = ("healthy", "node")
    search_fields = ("node__name", "uuid", "model")
    list_select_related = ("node", "allocated_to__attempt__job")
    readonly_fields = ("allocated_to",)

    @admin.display(description="Held by")
    def held_by(self, gpu: GPU) -> SafeString | str:
        if gpu.allocated_to is None:
            return "—"
        attempt = gpu.allocated_to.attempt
        return console_link(attempt.job, f"{attempt.job.name} (attempt {attempt.number})")


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ("reference", "is_default", "description", "created_at")
    list_filter = ("is_default",)
    search_fields = ("reference", "description")


class CredentialForm(forms.ModelForm):
    """The password is written, never shown back: left empty on a change, the stored one stays
    (and is not even decrypted). It is stored encrypted (``RegistryCredential.password``)."""

    password = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        required=False,
        help_text="Password or token; stored encrypted, never shown back (leave empty to keep it)",
    )

    class Meta:
        model = RegistryCredential
        fields = ("registry", "project", "username", "password")

    def clean_password(self) -> str:
        value = self.cleaned_data.get("password") or ""
        if not value and not self.instance.pk:
            raise forms.ValidationError("Give the password or token.")
        return value

    def save(self, commit: bool = True) -> RegistryCredential:
        if self.cleaned_data.get("password"):
            self.instance.password = self.cleaned_data["password"]
        return super().save(commit)


class RegistryCredentialInline(admin.TabularInline):
    model = RegistryCredential
    form = CredentialForm
    extra = 0
    verbose_name = "credential (for one project's pulls, or every project's)"


@admin.register(Registry)
class RegistryAdmin(admin.ModelAdmin):
    list_display = ("host", "description")
    search_fields = ("host", "description")
    inlines = (RegistryCredentialInline,)


class ProjectVolumeInline(admin.TabularInline):
    model = ProjectVolume
    extra = 0
    verbose_name = "volume (a host directory its jobs see at the same path)"


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "description", "personal_for", "gpu_quota", "gpu_borrow_limit", "cpu_job_limit", "multi_node_host_network", "created_at")
    list_editable = ("gpu_quota", "gpu_borrow_limit", "cpu_job_limit", "multi_node_host_network")
    search_fields = ("name", "description")
    filter_horizontal = ("members",)
    list_select_related = ("personal_for",)
    inlines = (ProjectVolumeInline,)


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class JobAttemptInline(ReadOnlyInline):
    model = JobAttempt
    fk_name = "job"
    fields = ("number", "state", "started_at", "ended_at", "exit_code", "exit_signal", "cause")
    readonly_fields = fields


class JobEventInline(ReadOnlyInline):
    model = JobEvent
    fields = ("created_at", "from_status", "to_status", "reason", "attempt", "actor")
    readonly_fields = fields


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "status",
        "owner",
        "project",
        "job_type",
        "image",
        "gpus_per_node",
        "node_count",
        "failover_count",
        "created_at",
        "in_console",
    )
    list_filter = ("status", "job_type", "failover_enabled", "project")
    search_fields = ("name", "owner__username", "project__name", "image")
    list_select_related = ("owner", "project")
    date_hierarchy = "created_at"
    readonly_fields = (
        "status",
        "status_reason",
        "started_at",
        "finished_at",
        "failover_count",
        "pull_attempts",
        "next_retry_at",
        "created_at",
        "in_console",
        "secret_variables",
    )
    autocomplete_fields = ("project",)
    inlines = (JobAttemptInline, JobEventInline)
    actions = ("stop_jobs", "delete_finished_jobs")

    def has_add_permission(self, request: HttpRequest) -> bool:
        # New jobs come from the console or the API, which record the creation event.
        return False

    def view_on_site(self, obj: TrainingJob) -> str:
        return console_url(obj)

    @admin.display(description="console")
    def in_console(self, job: TrainingJob) -> SafeString | str:
        return console_link(job, "open in the console")

    @admin.display(description="secret environment variables")
    def secret_variables(self, job: TrainingJob) -> str:
        # Names only: the values are never shown, here either.
        return ", ".join(f"{name}=••••" for name in job.secret_env.names) or "—"

    def save_model(self, request: HttpRequest, obj: TrainingJob, form, change: bool) -> None:
        # Only what the operator edited: a full save would write the status, its reason and the
        # failover count back as they were when the form loaded, over the one writer's changes since.
        editable = {f.name for f in obj._meta.concrete_fields} - set(self.readonly_fields)
        fields = [name for name in form.changed_data if name in editable]
        if fields:
            obj.save(update_fields=fields)

    def has_delete_permission(self, request: HttpRequest, obj: TrainingJob | None = None) -> bool:
        # A job that may still run on a node is stopped first; the bulk action below checks each job.
        if obj is not None and obj.status not in DELETABLE:
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request: HttpRequest) -> dict:
        actions = super().get_actions(request)
        # Django's bulk delete would skip the status check; delete_finished_jobs replaces it.
        actions.pop("delete_selected", None)
        return actions

    @admin.action(description="Stop selected jobs")
    def stop_jobs(self, request: HttpRequest, queryset: QuerySet[TrainingJob]) -> None:
        actor = request.user.get_username()
        self.run_for_each(request, queryset, ("Stop requested for", "Not stopped"), lambda job: request_stop(job, actor=actor))

    @admin.action(description="Delete selected finished jobs", permissions=["delete"])
    def delete_finished_jobs(self, request: HttpRequest, queryset: QuerySet[TrainingJob]) -> None:
        self.run_for_each(request, queryset, ("Deleted", "Not deleted"), delete_job)

    def run_for_each(self, request: HttpRequest, queryset: QuerySet[TrainingJob], verbs: tuple[str, str], action: Callable[[TrainingJob], object]) -> None:
        """Apply a lifecycle command to each job; a refusal is a message, the others go on."""
        verb, refused = verbs
        done = []
        for job in queryset:
            try:
                action(job)
            except JobActionRefused as exc:
                self.message_user(request, f"{refused} {job.name}: {exc}", messages.ERROR)
            else:
                done.append(job.name)
        if done:
            self.message_user(request, f"{verb} {len(done)} job{'s' if len(done) != 1 else ''}: {', '.join(done)}.", messages.SUCCESS)


@admin.register(JobAttempt)
class JobAttemptAdmin(admin.ModelAdmin):
    list_display = ("__str__", "job_in_console", "number", "state", "started_at", "ended_at", "exit_code", "exit_signal", "cause")
    list_filter = ("state",)
    search_fields = ("job__name", "cause")
    list_select_related = ("job",)

    @admin.display(description="job", ordering="job__name")
    def job_in_console(self, attempt: JobAttempt) -> SafeString | str:
        return console_link(attempt.job)

    def view_on_site(self, obj: JobAttempt) -> str:
        return console_url(obj.job) + "?tab=failover"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = ("created_at", "job_in_console", "from_status", "to_status", "reason", "attempt", "actor")
    list_filter = ("to_status", "actor")
    search_fields = ("job__name", "reason", "actor")
    list_select_related = ("job",)
    date_hierarchy = "created_at"

    @admin.display(description="job", ordering="job__name")
    def job_in_console(self, event: JobEvent) -> SafeString | str:
        return console_link(event.job)

    def view_on_site(self, obj: JobEvent) -> str:
        return console_url(obj.job) + "?tab=events"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        # The events are the audit log: they go only with their job.
        return False
