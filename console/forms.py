"""Forms of the console pages: the Training Job form and the list's filters."""

from __future__ import annotations

import contextlib
from typing import Any, cast

from django import forms
from django.conf import settings
from django.db.models import QuerySet
from django.forms.utils import flatatt
from django.utils.html import conditional_escape, escape
from django.utils.safestring import SafeString, mark_safe

from agent.resume import warm_start_step
from jobs.job_fields import (
    EXAMPLE_COMMAND,
    CommandError,
    EnvRefused,
    format_env_text,
    normalize_newlines,
    parse_env_text,
    text_refusal,
    validate_command,
    without_assignments,
)
from jobs.models import CodeBundle, Project, TrainingJob, validate_job_name
from jobs.secret_env import MASK, SecretEnv, SecretUnreadable, is_secret_name, seal, split_secrets, unseal
from jobs.services.bundles import BundleRefused, human, store_upload, usable_by
from jobs.services.creation import JOB_SETTINGS, JobSettingsRefused, check_settings, command_secrets
from jobs.services.images import validate_reference
from jobs.services.limits import default_limits, format_cpus, format_memory, parse_memory
from jobs.services.paths import volumes_of
from jobs.statuses import ACTIVE, BADGE_GROUPS, TERMINAL, JobStatus
from logs.progress import last_value


def normalized_form_data(data: Any) -> Any:
    """A copy of submitted form data with CRLF line endings (every textarea sends them) made LF."""
    if not hasattr(data, "lists"):
        return {key: normalize_newlines(value) if isinstance(value, str) else value for key, value in data.items()}
    copy = data.copy()
    for key, values in data.lists():
        copy.setlist(key, [normalize_newlines(value) if isinstance(value, str) else value for value in values])
    return copy


class TextField(forms.CharField):
    """A CharField whose text can be stored and handed to a run: no NUL, no lone surrogate (the
    API's ``TextField`` refuses the same)."""

    def to_python(self, value: Any) -> str:
        text = super().to_python(value) or ""
        why = text_refusal(text)
        if why:
            raise forms.ValidationError(f"This field {why}.", code="text")
        return text


# The form's fields that ``check_settings`` judges, and the job field each one is.
CHECKED_FIELDS = ("project", "command", "env_text", "secret_env_text", "gpus_per_node", "node_count", "output_dir", "cpu_limit", "memory_limit_mb", "code")
FORM_FIELD = {"env_text": "env", "secret_env_text": "secret_env"}
FIELD_OF = {job_field: form_field for form_field, job_field in FORM_FIELD.items()}


class TrainingJobForm(forms.Form):
    """What a user sets on a new job; ``cleaned_job_fields`` feeds ``creation.create_job``."""

    # No max_length: its maxlength attribute makes the browser cut a longer paste silently; the
    # validator says how long it is and which characters are wrong instead.
    name = TextField(
        validators=[validate_job_name],
        help_text="Lowercase letters, digits and '-'; unique among your jobs.",
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false", "autofocus": True}),
    )
    project = forms.ModelChoiceField(
        queryset=Project.objects.none(),
        empty_label=None,
        error_messages={"invalid_choice": "Choose one of your projects."},
        help_text="Members of the project can see and manage the job.",
    )
    job_type = forms.ChoiceField(
        label="Job type",
        choices=TrainingJob.JobType.choices,
        initial=TrainingJob.JobType.ON_DEMAND,
        widget=forms.RadioSelect,
        help_text="Spot jobs use spare capacity and may be interrupted.",
    )
    image = TextField(
        max_length=255,
        validators=[validate_reference],
        help_text="An OCI image reference, [registry/]repository[:tag][@sha256:…]: one offered here, or your team's own "
        "(a name without a registry comes from the platform's local registry).",
        widget=forms.TextInput(attrs={"list": "image-choices", "autocomplete": "off", "spellcheck": "false"}),
    )
    command = TextField(
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false", "class": "mono"}),
        help_text="Runs as written with bash in the job's container (its work directory is the current one): e.g. python train.py, torchrun …, accelerate launch ….",
    )
    env_text = TextField(
        label="Environment variables",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "class": "mono", "placeholder": "NAME=value"}),
        help_text="One NAME=value per line. Names ending in _TOKEN, _KEY, _PASSWORD or _SECRET are kept secret.",
    )
    secret_env_text = TextField(
        label="Secret environment variables",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false", "class": "mono", "placeholder": "HF_TOKEN=hf_…", "autocomplete": "off"}),
        help_text=f"One NAME=value per line: stored encrypted, given to the run, shown as {MASK} everywhere (pages, API, clones), never logged.",
    )
    # The secrets typed into a form shown again with an error: sealed, not echoed (see resolve_secrets).
    secret_env_kept = forms.CharField(required=False, widget=forms.HiddenInput)
    gpus_per_node = forms.IntegerField(
        label="GPUs per node",
        min_value=0,
        max_value=64,
        initial=1,
        help_text="0 makes a CPU job: it runs on a node without any GPU of its own (CUDA_VISIBLE_DEVICES is empty).",
    )
    node_count = forms.IntegerField(
        label="Nodes",
        min_value=1,
        max_value=64,
        initial=1,
        help_text="1: the job's container has a network of its own, loopback only. More: one rank per node, and the ranks "
        "run on their nodes' network to meet (an operator allows it per project).",
    )
    failover_enabled = forms.BooleanField(
        label="Job Failover",
        required=False,
        initial=True,
        help_text=f"On a hardware fault, re-place the job on healthy nodes and resume from its last checkpoint (at most {settings.MAX_FAILOVERS} times).",
    )
    checkpointless = forms.BooleanField(
        label="Checkpointless failover",
        required=False,
        initial=True,
        help_text="Keep every step's state in memory on another node, so a failover resumes from the last step, not the last checkpoint. "
        "Costs about twice the saved state's size in memory per rank, on its node and on the one holding the copy.",
    )
    output_dir = TextField(
        label="Output directory",
        required=False,
        max_length=500,
        help_text="Optional: a folder in your project's data directory (a relative path is placed there) "
        "or a writable project volume; empty keeps the job's own. Checkpoints go to its concurrent_checkpoint/ folder.",
        widget=forms.TextInput(attrs={"spellcheck": "false", "placeholder": "runs/my-job"}),
    )
    max_run_minutes = forms.IntegerField(
        label="Maximum run time (minutes)",
        required=False,
        min_value=1,
        help_text="Optional; the job is stopped when it has run this long.",
    )
    cpu_limit = forms.FloatField(
        label="CPU limit (cores per node)",
        required=False,
        widget=forms.NumberInput(attrs={"step": "0.01", "min": "0.01", "placeholder": "default", "inputmode": "decimal"}),
        help_text="Optional, e.g. 0.5 or 4; empty: the node's default.",
    )
    memory_limit_mb = TextField(
        label="Memory limit (per node)",
        required=False,
        max_length=20,
        widget=forms.TextInput(attrs={"placeholder": "default", "spellcheck": "false"}),
        help_text="Optional, e.g. 512M or 8G (a plain number is MiB); a run that needs more is killed: out of memory.",
    )
    description = TextField(required=False, max_length=500, widget=forms.Textarea(attrs={"rows": 2}))
    code_archive = forms.FileField(
        label="Code",
        required=False,
        widget=forms.ClearableFileInput(attrs={"accept": ".zip,.tar,.tar.gz,.tgz"}),
        help_text="Optional: a .zip or .tar.gz of your code directory. The run finds its files in its work directory "
        "(/job/work), so python train.py runs as written; a failover and a clone use the same code.",
    )
    # The bundle the job runs (a clone's, or one uploaded with a form shown again): kept, not re-uploaded.
    code = forms.ModelChoiceField(
        queryset=CodeBundle.objects.none(),
        required=False,
        widget=forms.HiddenInput,
        error_messages={"invalid_choice": "That code bundle does not exist or you may not use it: upload the archive again."},
    )
    warm_start = TextField(
        label="Warm start",
        required=False,
        max_length=40,
        widget=forms.TextInput(attrs={"placeholder": "JOB-ID or JOB-ID:STEP", "spellcheck": "false", "autocomplete": "off"}),
        help_text="Optional: start from a committed checkpoint of a job you can see (its newest without :STEP). "
        "The run finds it where that job's run saved it, with $CKPT_LAST_STEP set to its step.",
    )

    def __init__(self, *args: Any, owner, kept_secrets: SecretEnv | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        self.owner = owner
        # A clone's source's secrets: a value written as •••• keeps the source's.
        self.kept_secrets = kept_secrets or SecretEnv()
        if self.kept_secrets:
            self.fields["secret_env_text"].help_text += f" {MASK} keeps the value of the job you clone."
        if self.is_bound:
            self.data = normalized_form_data(self.data)
        self.projects = Project.objects.filter(members=owner).order_by("name")
        cast(forms.ModelChoiceField, self.fields["project"]).queryset = self.projects
        cast(forms.ModelChoiceField, self.fields["code"]).queryset = usable_by(owner)
        self.fields["code_archive"].help_text += f" At most {human(settings.CODE_BUNDLE_MAX_BYTES)} unpacked."
        self.fields["output_dir"].help_text += " " + visible_volumes_text(self.projects)
        if "command" not in self.initial:
            self.fields["command"].initial = EXAMPLE_COMMAND
        if "image" not in self.initial:
            self.fields["image"].initial = settings.DEFAULT_IMAGE
        cpus, memory = default_limits()
        self.fields["cpu_limit"].help_text += f" Default: {format_cpus(cpus) if cpus else 'no limit'}."
        self.fields["memory_limit_mb"].help_text += f" Default: {format_memory(memory) if memory else 'no limit'}."

    @classmethod
    def initial_from(cls, source: TrainingJob, *, name: str, project: Project) -> dict[str, Any]:
        """The form's initial values that copy ``source`` (Clone)."""
        initial: dict[str, Any] = {field: getattr(source, field) for field in JOB_SETTINGS if field not in ("env", "secret_env", "code")}
        initial["code"] = source.code_id
        initial.update(
            name=name,
            project=project,
            warm_start=f"{source.warm_start_job_id}:{source.warm_start_step}" if source.warm_start_job_id else "",
            env_text=format_env_text(source.env or {}),
            secret_env_text=format_env_text(source.secret_env.masked()),
        )
        return initial

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        if TrainingJob.objects.filter(owner=self.owner, name=name).exists():
            raise forms.ValidationError(f"You already have a job named “{name}”. Choose another name.", code="taken")
        return name

    def clean_command(self) -> str:
        command = self.cleaned_data["command"]
        try:
            validate_command(command)
        except CommandError as exc:
            raise forms.ValidationError(str(exc), code="command") from None
        return command.strip()

    def clean_env_text(self) -> dict[str, str]:
        try:
            return parse_env_text(self.cleaned_data["env_text"])
        except EnvRefused as exc:
            raise forms.ValidationError(exc.problems, code="env") from None

    def clean_secret_env_text(self) -> dict[str, str]:
        try:
            return parse_env_text(self.cleaned_data["secret_env_text"])
        except EnvRefused as exc:
            raise forms.ValidationError(exc.problems, code="env") from None

    def resolve_secrets(self, data: dict[str, Any]) -> None:
        """Move secret-named plain variables to the secret ones; a •••• value keeps the clone
        source's value, or the one typed before this form was shown again (else it is an error:
        a value never shown must be given)."""
        kept: dict[str, str] = {}
        with contextlib.suppress(SecretUnreadable):
            kept.update(self.kept_secrets.reveal() if self.kept_secrets else {})
        kept.update(unseal(data.get("secret_env_kept") or "", owner_pk=self.owner.pk))
        if self.is_bound:
            self.mask_typed_secrets(kept)
        if "env_text" not in data or "secret_env_text" not in data:
            return
        plain, secrets = split_secrets(data["env_text"], data["secret_env_text"])
        masked = [name for name, value in secrets.items() if value == MASK]
        missing = [name for name in masked if name not in kept]
        if missing:
            self.add_error(
                "secret_env_text",
                forms.ValidationError(
                    f"Enter the value of {', '.join(missing)}: {MASK} keeps a value only when cloning a job that has it.",
                    code="secret",
                ),
            )
            return
        secrets.update({name: kept[name] for name in masked})
        data["env_text"], data["secret_env_text"] = plain, secrets

    def mask_typed_secrets(self, kept: dict[str, str]) -> None:
        """The submitted text as the form shows it again: every secret value as ••••, the values
        sealed in a hidden field (so nothing typed is lost and none is echoed into the page)."""
        sealed = dict(kept)
        lines: dict[str, list[str]] = {"env_text": [], "secret_env_text": []}
        for field in lines:
            for raw in str(self.data.get(field) or "").splitlines():
                name, sep, value = raw.partition("=")
                secret = field == "secret_env_text" or is_secret_name(name.strip())
                if sep and secret and value.strip() != MASK:
                    sealed[name.strip()] = value.strip()
                lines[field].append(f"{name.strip()}={MASK}" if sep and secret else raw)
        shown = cast(Any, self.data).copy()
        # The command's secret assignments as the job will have them: out of the command, ••••
        # among the secret variables (left as typed where the form refuses them).
        command = str(self.data.get("command") or "")
        taken, values, refusals = command_secrets(command)
        typed = {raw.partition("=")[0].strip() for field in lines for raw in lines[field]}
        if taken and not refusals and not typed & set(values):
            sealed.update(values)
            lines["secret_env_text"] += [f"{name}={MASK}" for name in values]
            shown["command"] = without_assignments(command, taken).strip()
        shown["env_text"] = "\n".join(lines["env_text"])
        shown["secret_env_text"] = "\n".join(lines["secret_env_text"])
        shown["secret_env_kept"] = seal(sealed, owner_pk=self.owner.pk) if sealed else ""
        self.data = shown

    def clean_memory_limit_mb(self) -> int | None:
        text = self.cleaned_data["memory_limit_mb"].strip()
        try:
            return parse_memory(text) if text else None
        except ValueError as exc:
            raise forms.ValidationError(str(exc), code="memory") from None

    def clean_warm_start(self) -> tuple[TrainingJob, int] | None:
        text = self.cleaned_data["warm_start"].strip()
        if not text:
            return None
        job_id, _, step = text.partition(":")
        if not job_id.isdigit() or (step and not step.isdigit()) or len(text) > 30:
            raise forms.ValidationError("Write the job's id, or id:step, e.g. 12 or 12:80.", code="warm_start")
        source = TrainingJob.objects.visible_to(self.owner).filter(pk=int(job_id)).first()
        if source is None:
            raise forms.ValidationError(f"Job {job_id} does not exist or you may not see it.", code="warm_start")
        try:
            return source, warm_start_step(source, int(step) if step else None)
        except ValueError as exc:
            raise forms.ValidationError(str(exc), code="warm_start") from None

    def keep_upload(self, data: dict[str, Any]) -> None:
        """An uploaded archive becomes a bundle now, so a form shown again keeps it (as ``code``)."""
        archive = data.get("code_archive")
        if not archive or "project" not in data:
            return
        try:
            bundle = store_upload(archive, owner=self.owner, project=data["project"])
        except BundleRefused as exc:
            self.add_error("code_archive", forms.ValidationError(str(exc), code="code"))
            return
        data["code"] = bundle
        shown = cast(Any, self.data).copy()
        shown["code"] = str(bundle.pk)
        self.data = shown

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        self.keep_upload(data)
        self.resolve_secrets(data)
        # The settings a job may have are the creation service's to judge (every route's).
        given = {FORM_FIELD.get(name, name): data[name] for name in CHECKED_FIELDS if name in data}
        try:
            data.update({FIELD_OF.get(name, name): value for name, value in check_settings(given, owner=self.owner).items()})
        except JobSettingsRefused as exc:
            for field, reasons in exc.problems.items():
                name = FIELD_OF.get(field, field)
                self.add_error(name if name in self.fields else None, [forms.ValidationError(r, code="settings") for r in reasons])
        return data

    def cleaned_job_fields(self) -> dict[str, Any]:
        data = dict(self.cleaned_data)
        data["env"] = data.pop("env_text")
        data["secret_env"] = SecretEnv.of(data.pop("secret_env_text"))
        data.pop("secret_env_kept", None)
        data.pop("code_archive", None)
        warm = data.pop("warm_start", None)
        data["warm_start_job"], data["warm_start_step"] = warm if warm else (None, None)
        return data

    def name_taken(self) -> None:
        """Report a name another request took between validation and the insert."""
        self.add_error("name", forms.ValidationError("You already have a job with this name. Choose another name."))


def visible_volumes_text(projects) -> str:
    """What host directories the jobs of these projects see, for the form to say."""
    shared = volumes_of(None)
    parts = [f"{v.path} ({'read-only' if v.read_only else 'read-write'})" for v in shared]
    for project in projects.prefetch_related("volumes"):
        parts += [f"{v.path} ({'read-only' if v.read_only else 'read-write'}, {project.name} only)" for v in project.volumes.all()]
    return ("Jobs also see: " + ", ".join(parts) + ".") if parts else "Jobs see no other host directories."


# The list's status groups: the badge groups, plus every active and every finished status.
GROUP_LABELS: dict[str, str] = {
    "active": "Active",
    "finished": "Finished",
    "pending": "Pending",
    "running": "Running",
    "failover": "Failover in progress",
    "warning": "Image pull back-off",
    "stopping": "Stopping",
    "error": "Error",
    "success": "Completed",
    "stopped": "Stopped",
}


def statuses_of_group(group: str) -> frozenset[str]:
    if group == "active":
        return ACTIVE
    if group == "finished":
        return TERMINAL
    return frozenset(status for status, (badge, _icon) in BADGE_GROUPS.items() if badge == group)


SORTS: dict[str, tuple[str, ...]] = {
    "-created": ("-created_at", "-id"),
    "created": ("created_at", "id"),
    "name": ("name", "id"),
    "-name": ("-name", "-id"),
    "status": ("status", "-created_at", "-id"),
    "-status": ("-status", "-created_at", "-id"),
}
PAGE_SIZES = (20, 50, 100)


# console.js submits the filter form when one of these changes; the Apply button does it without JavaScript.
class QuickSelect(forms.Select):
    """A Select written in Python: through the form renderer's templates (one per option) the
    list's filter selects cost 3-5 ms a page, the status select alone 2 ms (bench.list)."""

    def render(self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None) -> SafeString:
        chosen = set(self.format_value(value))
        final = self.build_attrs(self.attrs, attrs)

        def option(option_value: Any, label: Any) -> str:
            text = "" if option_value is None else str(option_value)
            picked = " selected" if text in chosen else ""
            chosen.discard(text)  # a single select marks its first match only, as Django's does
            return f'<option value="{escape(text)}"{picked}>{conditional_escape(label)}</option>'

        parts = [f'<select name="{escape(name)}"{flatatt(final)}>']
        for option_value, label in self.choices:
            if isinstance(label, (list, tuple)):
                parts.append(f'<optgroup label="{escape(option_value)}">')
                parts += [option(v, text) for v, text in label]
                parts.append("</optgroup>")
            else:
                parts.append(option(option_value, label))
        parts.append("</select>")
        return mark_safe("\n".join(parts))


AUTOSUBMIT = QuickSelect(attrs={"data-autosubmit": ""})


class JobListFilterForm(forms.Form):
    """The list's querystring: filters, search, sort and page size. Bad values fall back to defaults."""

    q = forms.CharField(label="Search by name", required=False, max_length=63)
    # One Status select: a group ("group:<name>") or one exact status. ``?group=<name>`` (older
    # links) is read as the same group.
    status = forms.ChoiceField(
        label="Status",
        required=False,
        choices=[
            ("", "Any status"),
            ("Groups", [(f"group:{name}", label) for name, label in GROUP_LABELS.items()]),
            ("Exact status", JobStatus.choices),
        ],
        widget=AUTOSUBMIT,
    )
    group = forms.ChoiceField(required=False, choices=[("", ""), *GROUP_LABELS.items()], widget=forms.HiddenInput)

    def __init__(self, data: Any = None, *args: Any, **kwargs: Any) -> None:
        if data is not None and data.get("group") and not data.get("status"):
            data = data.copy()
            data["status"] = f"group:{data.get('group')}"
            del data["group"]
        super().__init__(data, *args, **kwargs)

    type = forms.ChoiceField(label="Type", required=False, choices=[("", "Any type"), *TrainingJob.JobType.choices], widget=AUTOSUBMIT)
    sort = forms.ChoiceField(
        label="Sort by",
        required=False,
        choices=[
            ("-created", "Newest first"),
            ("created", "Oldest first"),
            ("name", "Name A–Z"),
            ("-name", "Name Z–A"),
            ("status", "Status A–Z"),
            ("-status", "Status Z–A"),
        ],
        widget=AUTOSUBMIT,
    )
    metric = forms.RegexField(
        label="Metric",
        required=False,
        max_length=64,
        regex=r"^[A-Za-z][A-Za-z0-9_./-]*$",
        widget=forms.TextInput(attrs={"placeholder": "eval_loss", "spellcheck": "false", "size": "10"}),
    )
    below = forms.FloatField(label="Last below", required=False, widget=forms.NumberInput(attrs={"step": "any", "size": "6"}))
    above = forms.FloatField(label="Last above", required=False, widget=forms.NumberInput(attrs={"step": "any", "size": "6"}))
    page_size = forms.TypedChoiceField(
        label="Per page",
        required=False,
        coerce=int,
        empty_value=PAGE_SIZES[0],  # type: ignore[arg-type]  # an int: the coerced value (the stubs say str)
        choices=[(n, str(n)) for n in PAGE_SIZES],
        widget=AUTOSUBMIT,
    )

    def value(self, name: str) -> Any:
        """The cleaned value of a filter; None when absent or invalid (an invalid one is ignored)."""
        self.is_valid()  # cleans once; invalid fields are simply missing from cleaned_data
        return self.cleaned_data.get(name) or None

    @property
    def per_page(self) -> int:
        return self.value("page_size") or PAGE_SIZES[0]

    @property
    def sort_key(self) -> str:
        return self.value("sort") or "-created"

    @property
    def rows_follow_status(self) -> bool:
        """Which rows the page holds depends on job statuses (a status filter or sort)."""
        return bool(self.value("status") or self.value("group")) or self.sort_key in ("status", "-status")

    @property
    def is_filtered(self) -> bool:
        return any(self.value(name) for name in ("q", "status", "group", "type")) or self.metric_bounds() is not None

    def metric_bounds(self) -> tuple[str, float | None, float | None] | None:
        """The metric filter: its name and bounds (the last value it logged below / above them)."""
        self.is_valid()
        metric = self.cleaned_data.get("metric")
        below, above = self.cleaned_data.get("below"), self.cleaned_data.get("above")
        if not metric or (below is None and above is None):
            return None
        return metric, below, above

    def apply(self, jobs: QuerySet[TrainingJob]) -> QuerySet[TrainingJob]:
        if query := (self.value("q") or "").strip():
            jobs = jobs.filter(name__icontains=query)
        if status := self.value("status"):
            if status.startswith("group:"):
                jobs = jobs.filter(status__in=statuses_of_group(status.removeprefix("group:")))
            else:
                jobs = jobs.filter(status=status)
        if group := self.value("group"):
            jobs = jobs.filter(status__in=statuses_of_group(group))
        if bounds := self.metric_bounds():
            metric, below, above = bounds
            jobs = jobs.annotate(metric_last=last_value(metric))
            if below is not None:
                jobs = jobs.filter(metric_last__lt=below)
            if above is not None:
                jobs = jobs.filter(metric_last__gt=above)
        if job_type := self.value("type"):
            jobs = jobs.filter(job_type=job_type)
        return jobs.order_by(*SORTS[self.sort_key])
