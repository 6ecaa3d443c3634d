"""Settings for the Simple AI Training console.

Every setting comes from an environment variable with an embedded default that runs on one
machine: SQLite (WAL), the in-memory channel layer, a local node agent and simulated GPUs where
NVML is unavailable. ``DATABASE_URL`` and ``REDIS_URL`` switch to PostgreSQL and Redis.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from console.env import env_bool, env_float, env_int, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("CONSOLE_VAR_DIR", str(BASE_DIR / "var")))

SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    # A per-install key kept beside the database, so sessions survive restarts.
    _key_file = VAR_DIR / "secret_key"
    try:
        SECRET_KEY = _key_file.read_text().strip()
    except OSError:
        import secrets

        SECRET_KEY = secrets.token_urlsafe(50)
        try:
            VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
            with os.fdopen(os.open(_key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as _fh:
                _fh.write(SECRET_KEY)
        except OSError:
            pass

DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = [h for h in env_str("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver,[::1]").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in env_str("CSRF_TRUSTED_ORIGINS", "").split(",") if o]
# Where users reach the console. Behind an https proxy (CONSOLE_PUBLIC_URL=https://…) cookies are
# secure, HSTS is on and the proxy's X-Forwarded-Proto is trusted, so `manage.py check --deploy`
# is clean; the embedded default serves plain http on 127.0.0.1 for one machine.
CONSOLE_PUBLIC_URL = env_str("CONSOLE_PUBLIC_URL", "")
if CONSOLE_PUBLIC_URL.startswith("https://"):
    from urllib.parse import urlsplit

    _public_host = urlsplit(CONSOLE_PUBLIC_URL).hostname or ""
    if _public_host and _public_host not in ALLOWED_HOSTS:
        ALLOWED_HOSTS.append(_public_host)
    if CONSOLE_PUBLIC_URL.rstrip("/") not in CSRF_TRUSTED_ORIGINS:
        CSRF_TRUSTED_ORIGINS.append(CONSOLE_PUBLIC_URL.rstrip("/"))
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    # Submitting a domain to the browsers' preload list is the operator's decision, not ours.
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        SILENCED_SYSTEM_CHECKS = ["security.W021"]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    # The apps, bottom floor first: each imports only the ones above it in this list.
    "jobs",
    "logs",
    "agent",
    "failover",
    "notify",
    "console",
]

MIDDLEWARE = [
    # Request latency and counts for /metrics (first and last of the chain).
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"
WSGI_APPLICATION = "console.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL", "")
if DATABASE_URL:
    import dj_database_url

    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
    # The test runner's database: a name no deployment uses (``satrain_test_…``, not Django's
    # ``test_<name>``), created and dropped beside the one DATABASE_URL names.
    DATABASES["default"]["TEST"] = {"NAME": f"satrain_test_{DATABASES['default'].get('NAME') or 'console'}"}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("SQLITE_PATH", str(VAR_DIR / "console.sqlite3")),
            "OPTIONS": {
                # WAL lets the pages read while the node agent writes; IMMEDIATE takes the write
                # lock at BEGIN so two writers never deadlock on a lock upgrade, and the timeout
                # makes a writer wait its turn for the lock (ARCHITECTURE.md, "One database file").
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
            },
            # Unset: the suite makes a file of its own per test process (conftest.py).
            "TEST": {"NAME": env_str("SQLITE_TEST_PATH", "") or None},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py 8 reads with a 5 s socket timeout by default, which breaks the layer's
            # blocking receive (django/channels_redis#422): wait as long as it takes.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": None}]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Scale-out: Celery on Redis carries placement (queue "control") and launches (queue
# "node.<name>", one per GPU node, consumed by that node's agent). Embedded: no broker at all.
SCALE_OUT = bool(REDIS_URL)
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_TASK_ALWAYS_EAGER = False
CELERY_TASK_ACKS_LATE = False  # tasks are short; a run is never a task, so nothing is redelivered
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 12 * 3600}
# Notifications have their own queue and worker: a slow endpoint never holds up a control round.
CELERY_TASK_ROUTES = {"notify.*": {"queue": "notify"}}
CELERY_BEAT_SCHEDULE = {"control-round": {"task": "jobs.place_jobs", "schedule": 1.0, "options": {"queue": "control", "expires": 5}}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = env_str("STATIC_ROOT", "") or None  # the embedded console serves from the finders
STATICFILES_DIRS = [BASE_DIR / "console" / "static"]
# The embedded console serves its own static files (no collectstatic, no network).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "jobs:list"
LOGOUT_REDIRECT_URL = "login"

REST_FRAMEWORK = {
    # Token first: its challenge makes an anonymous call 401 with "WWW-Authenticate: Token".
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "knox.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_THROTTLE_RATES": {"token": env_str("TOKEN_THROTTLE_RATE", "10/min")},
    # Proxies in front of the console that append to X-Forwarded-For: the client is the address
    # that many hops back. 0 (the console is reached directly) ignores the header, which a client
    # could otherwise rotate to escape the throttle and the sign-in lock-out.
    "NUM_PROXIES": env_int("NUM_PROXIES", 0),
    # Bodies that hold a lone surrogate ("\ud800") are refused with a 400 naming the field.
    "DEFAULT_PARSER_CLASSES": [
        "jobs.rest.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_RENDERER_CLASSES": ["jobs.rest.JSONRenderer", "rest_framework.renderers.BrowsableAPIRenderer"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "console.api.errors.exception_handler",
}

# API tokens (django-rest-knox): stored as SHA-512 digests, sent as "Authorization: Token <key>",
# valid for API_TOKEN_TTL_DAYS, revocable on the account's Tokens page.
REST_KNOX = {"TOKEN_TTL": timedelta(days=env_float("API_TOKEN_TTL_DAYS", 30.0)), "AUTH_HEADER_PREFIX": "Token"}
# Counters shared by every console process (sign-in lock-out): Redis in scale-out.
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
# Sign-in lock-out (console.lockout): this many failures for one username within the window lock
# it for the rest of the window; LOGIN_ADDRESS_FAILURE_LIMIT failures from one client address (any
# usernames: password spraying) lock that address.
LOGIN_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 10)
LOGIN_ADDRESS_FAILURE_LIMIT = env_int("LOGIN_ADDRESS_FAILURE_LIMIT", 30)
LOGIN_FAILURE_WINDOW = env_int("LOGIN_FAILURE_WINDOW", 900)

SPECTACULAR_SETTINGS = {
    "TITLE": "Simple AI Training console API",
    "DESCRIPTION": "Training Jobs, their attempts, events and logs; GPU nodes for operators.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Tags by resource (training-jobs, nodes, auth), not by the version segment.
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "ENUM_NAME_OVERRIDES": {"NotificationKindEnum": "notify.models.Kind.choices"},
}

# --- Training platform -------------------------------------------------------------------------
# Where the node agent keeps each job's working directory, run logs and exit files.
JOB_WORK_ROOT = Path(env_str("JOB_WORK_ROOT", str(VAR_DIR / "jobs")))
# Code bundles (a user's directory a job runs in: jobs.services.bundles): at most this many bytes
# unpacked and this many files and directories each; kept in the database.
CODE_BUNDLE_MAX_BYTES = env_int("CODE_BUNDLE_MAX_BYTES", 100 * 2**20)
CODE_BUNDLE_MAX_FILES = env_int("CODE_BUNDLE_MAX_FILES", 10000)
# Checkpointless failover (agent.checkpointless, docs/failover.md): each run of a job that has it
# on snapshots its state into a memory-backed directory below SNAPSHOT_ROOT (tmpfs: counted in
# the run's memory cgroup); its agent ships each rank's newest snapshot to another node's agent,
# which keeps REPLICAS_KEPT per rank in memory and serves them on REPLICA_ADDRESS (host:port;
# port 0: any free one) to the job's next attempt only. CHECKPOINTLESS=0 turns it off everywhere.
CHECKPOINTLESS = env_bool("CHECKPOINTLESS", True)
SNAPSHOT_ROOT = Path(env_str("SNAPSHOT_ROOT", "/dev/shm/satrain-snapshots" if Path("/dev/shm").is_dir() else str(VAR_DIR / "snapshots")))
REPLICA_ADDRESS = env_str("REPLICA_ADDRESS", "127.0.0.1:0")
REPLICAS_KEPT = env_int("REPLICAS_KEPT", 2)
# How often an agent looks for a newer snapshot of its runs (seconds).
REPLICA_POLL_INTERVAL = env_float("REPLICA_POLL_INTERVAL", 0.01)
# Run the embedded node agent inside the console process (the embedded default).
EMBEDDED_AGENT = env_bool("EMBEDDED_AGENT", not REDIS_URL)
# Simulated nodes × GPUs where NVML is unavailable (or when forced with SIMULATED_GPUS=1).
SIMULATED_GPUS = env_str("SIMULATED_GPUS", "auto")  # auto | 1 | 0
SIMULATED_NODES = env_int("SIMULATED_NODES", 3)
SIMULATED_GPUS_PER_NODE = env_int("SIMULATED_GPUS_PER_NODE", 4)
SIMULATED_GPU_MODEL = env_str("SIMULATED_GPU_MODEL", "Simulated H100 80GB")
# Where attempts run: "agents" (this console's node agents: embedded or scale-out) or "slurm" (a
# Slurm cluster: each attempt one batch job, its nodes mirrored; docs/slurm.md). SLURM_CONF names
# the cluster's slurm.conf (empty: Slurm's default); Spot jobs go to SLURM_SPOT_PARTITION (and/or
# SLURM_SPOT_QOS), On-Demand ones to SLURM_PARTITION (empty: the cluster's default).
BACKEND = env_str("BACKEND", "agents")
SLURM_CONF = env_str("SLURM_CONF", "")
SLURM_PARTITION = env_str("SLURM_PARTITION", "")
SLURM_SPOT_PARTITION = env_str("SLURM_SPOT_PARTITION", "spot")
SLURM_SPOT_QOS = env_str("SLURM_SPOT_QOS", "")
# Each project is a Slurm account, SLURM_ACCOUNT_PREFIX + its name, with its GPU quota plus borrow
# limit as the account's GrpTRES=gres/gpu=N: "auto" where the cluster keeps accounts (slurmdbd),
# "on", or "off" (jobs go to the submitting user's default account). Only accounts with the prefix
# are ever created or changed.
SLURM_ACCOUNTS = env_str("SLURM_ACCOUNTS", "auto")
SLURM_ACCOUNT_PREFIX = env_str("SLURM_ACCOUNT_PREFIX", "satrain-")
# Where each Slurm node's health check (HealthCheckProgram: python -m failover.nodecheck) hands its
# kernel log's fault lines to the console (empty: VAR_DIR/slurm-health); on a real cluster a
# directory every node mounts, written by root only.
SLURM_HEALTH_DIR = env_str("SLURM_HEALTH_DIR", "")
# How often the Slurm agent reads the cluster's nodes and jobs (seconds): one scontrol call each.
SLURM_POLL_INTERVAL = env_float("SLURM_POLL_INTERVAL", 1.0)
# The Unix account every Slurm job runs as (a site with DisableRootJobs=YES; docs/slurm-site.md):
# a console run as root submits for it (sbatch --uid); empty: the console's own user. Its ranks'
# containers are rootless, their images pulled on each node into SLURM_NODE_STORAGE (node-local).
SLURM_USER = env_str("SLURM_USER", "")
SLURM_NODE_STORAGE = env_str("SLURM_NODE_STORAGE", "/var/tmp/satrain")
# The Python (3.11 or later, standard library only) each node runs a rank's supervisor with
# (agent.runner, from the console's checkout on a shared filesystem): the node's own, found on
# /usr/bin:/bin where it is a bare name.
SLURM_RUNNER_PYTHON = env_str("SLURM_RUNNER_PYTHON", "/usr/bin/python3")
# How often the embedded control loop places jobs and polls runs (seconds).
AGENT_POLL_INTERVAL = env_float("AGENT_POLL_INTERVAL", 0.5)
# How often the node agent samples each run's GPU and host usage (seconds; 0 turns sampling off).
RESOURCE_SAMPLE_INTERVAL = env_float("RESOURCE_SAMPLE_INTERVAL", 5.0)
# How often an agent reads its live runs' output and exits (seconds; files only, no query; an idle
# agent sleeps until a message wakes it).
OUTPUT_POLL_INTERVAL = env_float("OUTPUT_POLL_INTERVAL", 0.1)
# How long an agent reads and stores one run's output per round (seconds, in slices of at most
# 256 KiB and 2,000 lines): a run that prints faster waits for the next round, and between two such
# runs' turns the others' new lines are stored, so a flood never holds up the other runs' lines for
# more than one turn; while any run is behind, the next round starts at once.
OUTPUT_TURN_SECONDS = env_float("OUTPUT_TURN_SECONDS", 0.05)
# How much nicer than the agent every run starts (its supervisor and all it starts: niceness is
# inherited): on a node whose CPUs the runs fill, the agent still reads, stores and streams every
# run's lines at once (as Kubernetes reserves CPU for the kubelet). Runs share the CPU among
# themselves as before; 0 turns it off.
RUN_NICENESS = env_int("RUN_NICENESS", 5)
# How often a node agent re-reads its runs from the database in one read-only transaction (seconds);
# launches and stops reach it at once by message, this only catches what a message missed.
AGENT_RECONCILE_INTERVAL = env_float("AGENT_RECONCILE_INTERVAL", 30.0)
# The embedded control round runs when something changes its answer (jobs.services.wakeups) and at
# its next timed work (a retry time, a heartbeat going stale); this safety sweep catches the rest
# (seconds). CONTROL_WAKEUPS=0 brings back a round every AGENT_POLL_INTERVAL with an agent
# reconcile after each (what bench.idle compares against).
CONTROL_SWEEP_INTERVAL = env_float("CONTROL_SWEEP_INTERVAL", 30.0)
CONTROL_WAKEUPS = env_bool("CONTROL_WAKEUPS", True)
# Other processes (manage.py inject_fault, reclaim_spot, job stop) append to this file after a
# change; the embedded loop stats it this often (seconds; a stat, not a query).
CONTROL_WAKE_FILE = Path(env_str("CONTROL_WAKE_FILE", str(VAR_DIR / "control-wanted")))
CONTROL_WAKE_FILE_CHECK = env_float("CONTROL_WAKE_FILE_CHECK", 0.25)
# SIGTERM → SIGKILL grace period when a job is stopped (seconds).
STOP_GRACE_PERIOD = env_float("STOP_GRACE_PERIOD", 30.0)
# Image pull retry backoff: base and cap (seconds).
IMAGE_PULL_BACKOFF_BASE = env_float("IMAGE_PULL_BACKOFF_BASE", 10.0)
IMAGE_PULL_BACKOFF_MAX = env_float("IMAGE_PULL_BACKOFF_MAX", 300.0)
# Every run is an OCI container run by Podman (agent.sandbox). Images are OCI references; a name
# without a registry (e.g. "pytorch:2.13-py3.11") is looked up in DEFAULT_REGISTRY, the local
# registry the embedded default starts on loopback (Debian's docker-registry, storage in var/).
LOCAL_REGISTRY_PORT = env_int("LOCAL_REGISTRY_PORT", 5000)
DEFAULT_REGISTRY = env_str("DEFAULT_REGISTRY", f"127.0.0.1:{LOCAL_REGISTRY_PORT}")
# The image every install knows, built on first use from Debian packages and the pinned CPU torch.
DEFAULT_IMAGE = env_str("DEFAULT_IMAGE", "pytorch:2.13-py3.11")
# Podman's configuration and storage (containers.conf, storage.conf, registries.conf).
CONTAINER_ENGINE_ROOT = Path(env_str("CONTAINER_ENGINE_ROOT", str(VAR_DIR / "podman")))
# How long one image pull may take (seconds).
IMAGE_PULL_TIMEOUT = env_float("IMAGE_PULL_TIMEOUT", 900.0)
# "on": every run is a container. "off" runs jobs on the host with the agent's own privileges and
# the console's Python environment: only for a machine that cannot run containers and runs
# nobody else's code.
JOB_SANDBOX = env_str("JOB_SANDBOX", "on")  # on | off
# Each project's runs get their own unprivileged uid, from JOB_UID_RANGE, recorded node-wide in
# JOB_UID_REGISTRY so that two consoles on one node never share one.
JOB_UID_RANGE = env_str("JOB_UID_RANGE", "200000-299999")
JOB_UID_REGISTRY = Path(env_str("JOB_UID_REGISTRY", "/var/lib/simple-ai-training/uids.json"))
# Processes (and threads) a run may have; a run that sits at the limit is ended.
JOB_PIDS_LIMIT = env_int("JOB_PIDS_LIMIT", 4096)
# Host directories every project's jobs see, e.g. "/data:ro,/srv/code:ro" (default read-only;
# ":rw" makes one writable). Operators add per-project volumes in the admin.
JOB_VOLUMES = env_str("JOB_VOLUMES", "")
# Output directories a job may choose lie under <PROJECT_DATA_ROOT>/<project name>/.
PROJECT_DATA_ROOT = Path(env_str("PROJECT_DATA_ROOT", str(VAR_DIR / "projects")))
# Stand-ins for simulated GPUs' device nodes (<dir>/<node>/nvidia<N>): a run sees only its own.
SIMULATED_DEVICE_DIR = Path(env_str("SIMULATED_DEVICE_DIR", str(VAR_DIR / "sim-devices")))
# CPU cores and memory (MiB) per node a job gets when it asks for none (empty or 0: no limit),
# enforced with a cgroup per run where the node allows it (agent.cgroups). JOB_CGROUP_PARENT: the
# cgroup runs' cgroups go below (empty: the agent's own; cgroup v2 usually needs a prepared one).
JOB_DEFAULT_CPUS = env_float("JOB_DEFAULT_CPUS", 0.0)
JOB_DEFAULT_MEMORY_MB = env_int("JOB_DEFAULT_MEMORY_MB", 16384)
JOB_CGROUP_PARENT = env_str("JOB_CGROUP_PARENT", "")
# Every job has a network of its own, shared by its ranks on one host (agent.netns): it reaches
# its own ranks and, where its project's egress (or this default) is "outbound", the outside
# world; never the node's own addresses or services. JOB_EGRESS_DENY: ranges an "outbound" job
# never reaches (the private and link-local ranges by default: the cluster, a cloud's metadata
# service); the console's and the node's own addresses are refused whatever this says.
JOB_EGRESS = env_str("JOB_EGRESS", "outbound")  # none | outbound
JOB_EGRESS_DENY = env_str("JOB_EGRESS_DENY", "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,100.64.0.0/10,169.254.0.0/16,fc00::/7,fe80::/10")
# The addresses jobs' networks are carved from (a /26 per job network: 61 ranks on one host).
JOB_NETWORK_POOL = env_str("JOB_NETWORK_POOL", "10.213.0.0/16")
# Disk a run may use (its work and output directories and its container's own layer, GiB; 0: no
# limit), measured as the kubelet measures ephemeral storage; a run over it is stopped.
JOB_STORAGE_LIMIT_GIB = env_float("JOB_STORAGE_LIMIT_GIB", 10.0)
JOB_STORAGE_CHECK_INTERVAL = env_float("JOB_STORAGE_CHECK_INTERVAL", 10.0)
# Longest log line kept; longer lines are cut with a visible marker.
LOG_MAX_LINE_CHARS = env_int("LOG_MAX_LINE_CHARS", 16384)
MAX_FAILOVERS = 3

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "filters": {"client_errors_without_traceback": {"()": "console.log_filters.ClientErrorsWithoutTraceback"}},
    "loggers": {
        "daphne": {"level": "WARNING"},
        "django.channels.server": {"level": "WARNING"},
        "django.request": {"filters": ["client_errors_without_traceback"]},
    },
}

# --- Job Failover ------------------------------------------------------------------------------
# How often the node agent checks GPU health (seconds; it also checks at every run exit).
HEALTH_CHECK_INTERVAL = env_float("HEALTH_CHECK_INTERVAL", 5.0)
# How often each agent's health monitor thread drains NVML events, injected faults and the kernel
# log (seconds): a fatal GPU event stops the runs on that GPU within about this long.
HEALTH_MONITOR_INTERVAL = env_float("HEALTH_MONITOR_INTERVAL", 0.5)
# Health events older than this are deleted (seconds; default 7 days).
HEALTH_EVENT_RETENTION = env_float("HEALTH_EVENT_RETENTION", 7 * 24 * 3600.0)
# The kernel log the health monitor reads with a cursor (falls back to journalctl -k, then dmesg).
KERNEL_LOG_PATH = env_str("KERNEL_LOG_PATH", "/dev/kmsg")
# A node whose agent has not reported for this long is lost; its running jobs fail over (seconds).
# Scale-out on PostgreSQL: agents beat into Redis every NODE_HEARTBEAT_TIMEOUT / 6 (2 s at the
# default 12 s, with jitter), a write that takes no database lock, so the lease can be short (the
# beat runs in the agent's loop, though: a database wait there longer than the lease, which a
# healthy PostgreSQL does not make, would make the node look lost). With
# SQLite (embedded, or Redis beside SQLite) an agent's loop may wait out SQLite's 30 s busy timeout
# between two beats, so the default stays 90 s.
# A system check in failover (failover/checks.py) keeps each mode's value safe.
NODE_HEARTBEAT_TIMEOUT = env_float("NODE_HEARTBEAT_TIMEOUT", 12.0 if SCALE_OUT and "sqlite" not in DATABASES["default"]["ENGINE"] else 90.0)
# Scale-out: agents also write Node.last_heartbeat to the database this often (and on a state
# change), so the admin stays roughly true and a Redis flush is survivable: a node with no beat in
# Redis at all is judged by this beat, against NODE_HEARTBEAT_DB_INTERVAL + NODE_HEARTBEAT_TIMEOUT.
NODE_HEARTBEAT_DB_INTERVAL = env_float("NODE_HEARTBEAT_DB_INTERVAL", 60.0)
# When more than this fraction of the Ready nodes (and more than 3) look lost in one sweep, none is
# marked: a mass heartbeat loss is taken as a control-plane or broker outage, and nodes get a fresh
# full timeout once beats resume (the Kubernetes node controller's unhealthy-zone threshold).
NODE_LOST_MAX_FRACTION = env_float("NODE_LOST_MAX_FRACTION", 0.5)
# What a hardware fault excludes from a job's next placements: "node" (as the service does) or
# "gpu" (a single machine with real GPUs: the job may move to the machine's healthy GPUs).
FAILOVER_EXCLUDE = env_str("FAILOVER_EXCLUDE", "node")
# A job waiting to fail over whose every node that could hold it is excluded (it faulted on each)
# waits this long for an operator to repair one (which lifts the exclusion), then ends
# Pending - maxretriesexceeded (seconds).
FAILOVER_REPAIR_WAIT = env_float("FAILOVER_REPAIR_WAIT", 600.0)
# After a spot reclaim, no Spot job is placed on that node for this long (seconds).
SPOT_RECLAIM_HOLD = env_float("SPOT_RECLAIM_HOLD", 300.0)

# --- Sharing the cluster (docs/quotas.md) -------------------------------------------------------
# Fair share: a project's past GPU use counts half as much after this long (seconds; Slurm's
# PriorityDecayHalfLife).
QUEUE_USAGE_HALF_LIFE = env_float("QUEUE_USAGE_HALF_LIFE", 7200.0)
# A placement round looks at each project's first N waiting jobs of each shape (GPUs × nodes).
QUEUE_WINDOW = env_int("QUEUE_WINDOW", 20)
# A round that placed such a window whole goes on placing at once, for up to this long (seconds).
QUEUE_ROUND_BUDGET = env_float("QUEUE_ROUND_BUDGET", 1.0)
# A job waiting longer than this (seconds) reserves capacity; at most QUEUE_RESERVATIONS at once.
QUEUE_RESERVE_AFTER = env_float("QUEUE_RESERVE_AFTER", 900.0)
QUEUE_RESERVATIONS = env_int("QUEUE_RESERVATIONS", 1)
# A job Spot runs were preempted for goes first while they stop and for this long after (seconds).
QUEUE_YIELD_HOLD = env_float("QUEUE_YIELD_HOLD", 120.0)
# Concurrent CPU-only jobs per project, unless the project sets its own limit.
QUEUE_CPU_JOBS_PER_PROJECT = env_int("QUEUE_CPU_JOBS_PER_PROJECT", 8)
# Jobs one user may have waiting (Pending, image back-off) at once; creating more is refused.
QUEUE_MAX_WAITING_PER_USER = env_int("QUEUE_MAX_WAITING_PER_USER", 200)
# Log lines stored per job (every stream and attempt; the platform's own lines not counted); past
# it each stream keeps its last LOG_TAIL_LINES lines (a rolling window, after a marker that says
# how many were dropped), so a run's end (its traceback, last checkpoint, a fatal GPU error) is
# always in its log and in what the failover verdict reads. See docs/quotas.md.
LOG_MAX_LINES_PER_JOB = env_int("LOG_MAX_LINES_PER_JOB", 200000)
LOG_TAIL_LINES = env_int("LOG_TAIL_LINES", 10000)
# Bytes of a run's output file on its node (output.jsonl, one per rank and attempt) past which its
# lines are held back: its last lines are written when the run ends, progress and checkpoint lines
# before (up to twice it); see docs/security.md. Default 128 MiB: 200,000 lines of about 670 bytes.
LOG_MAX_BYTES_PER_JOB = env_int("LOG_MAX_BYTES_PER_JOB", 128 << 20)

# How often an open socket asks again whether its user may still see what it follows (seconds).
SOCKET_ACCESS_RECHECK = env_float("SOCKET_ACCESS_RECHECK", 5.0)

# --- Logs --------------------------------------------------------------------------------------
# Log lines are kept until their job is deleted; operators may set a maximum age (days; 0 keeps all).
LOG_MAX_AGE_DAYS = env_float("LOG_MAX_AGE_DAYS", 0.0)

# --- Notifications (notify) and metrics ---------------------------------------------------------
# E-mail goes through Django's mail; the console backend (printed to the log) unless configured.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "satrain@localhost")
# Links in notifications point at CONSOLE_PUBLIC_URL (else the embedded default's address).
NOTIFY_LINK_BASE = (CONSOLE_PUBLIC_URL or f"http://127.0.0.1:{env_int('PORT', 8000)}").rstrip("/")
# A webhook or mail server gets this long per try (seconds); failed tries are retried after
# NOTIFY_RETRY_BASE × 2^(n-1) seconds, NOTIFY_MAX_ATTEMPTS tries in all.
NOTIFY_TIMEOUT = env_float("NOTIFY_TIMEOUT", 5.0)
EMAIL_TIMEOUT = NOTIFY_TIMEOUT
NOTIFY_RETRY_BASE = env_float("NOTIFY_RETRY_BASE", 2.0)
NOTIFY_MAX_ATTEMPTS = env_int("NOTIFY_MAX_ATTEMPTS", 6)
# Webhooks to loopback, private and other non-global addresses, at subscription and at each try
# (link-local ones, e.g. cloud metadata, multicast and reserved ones are always refused). Off: a
# webhook is no probe of the console's own host or network; an operator may allow it.
NOTIFY_WEBHOOK_ALLOW_PRIVATE = env_bool("NOTIFY_WEBHOOK_ALLOW_PRIVATE", False)
# Subscriptions one user may hold; confirmation e-mails one user may ask for in a day, and how
# long a confirmation link works (days).
NOTIFY_MAX_SUBSCRIPTIONS_PER_USER = env_int("NOTIFY_MAX_SUBSCRIPTIONS_PER_USER", 20)
NOTIFY_VERIFICATION_EMAILS_PER_DAY = env_int("NOTIFY_VERIFICATION_EMAILS_PER_DAY", 20)
NOTIFY_EMAIL_VERIFY_DAYS = env_float("NOTIFY_EMAIL_VERIFY_DAYS", 3.0)
# Deliveries sent at once by the embedded worker (scale-out: Celery's workers).
NOTIFY_WORKERS = env_int("NOTIFY_WORKERS", 4)
# /metrics answers staff, or a scraper sending Authorization: Bearer <METRICS_TOKEN> (empty: staff only).
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
# The database-derived metrics are read at most this often (seconds).
METRICS_CACHE_SECONDS = env_float("METRICS_CACHE_SECONDS", 5.0)
# Node agents and Celery workers serve their own process metrics here (0: not at all).
METRICS_PORT = env_int("METRICS_PORT", 0)
METRICS_ADDR = env_str("METRICS_ADDR", "127.0.0.1")
