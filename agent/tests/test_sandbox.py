"""A job is untrusted code: in its container it sees none of the console, the runner's records,
other jobs or other GPUs, and what it forges changes nothing beyond its own job.

Real jobs on the embedded agent, each printing what it could reach.
"""

from __future__ import annotations

import json
import os
import shlex

import pytest
from django.conf import settings

from agent import runfiles
from agent.processes import run_dir
from harness.job_factory import job_output
from harness.sandbox import needs_sandbox
from jobs.models import AttemptNode
from jobs.services.paths import default_output_dir, job_dir
from jobs.statuses import JobStatus
from logs.models import LogLine

pytestmark = [pytest.mark.django_db, pytest.mark.slow, needs_sandbox]

PROBE = """
import glob, os, sys
def reach(path):
    try:
        with open(path, "rb") as fh:
            return "READ " + repr(fh.read(40))
    except Exception as exc:
        return type(exc).__name__
for path in sys.argv[1:]:
    print(path, "->", reach(path), flush=True)
print("devices", sorted(os.path.basename(p) for p in glob.glob("/dev/nvidia*")), flush=True)
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[:5], flush=True)
"""


def probe_command(*paths) -> str:
    return "python -c " + shlex.quote(PROBE) + " " + " ".join(shlex.quote(str(p)) for p in paths)


def printed(job) -> dict[str, str]:
    lines = LogLine.objects.filter(job=job).order_by("seq").values_list("text", flat=True)
    return dict(line.split(" -> ", 1) for line in lines if " -> " in line)


def test_a_job_reads_nothing_of_the_console_the_runner_or_other_jobs(make_job, drive):
    secret = settings.VAR_DIR / "secret_key"
    assert secret.exists()  # the console's own key: the job must not see it
    victim = drive(make_job(name="victim", command="python -c 'import time; print(\"up\", flush=True); time.sleep(60)'"), JobStatus.RUNNING)
    victim_part = AttemptNode.objects.select_related("attempt").get(attempt__job=victim)
    default_output_dir(victim.pk).joinpath("weights.bin").write_bytes(b"victim's weights")
    victim_spec = run_dir(victim_part) / runfiles.SPEC_FILE
    assert victim_spec.exists()
    attacker = make_job(name="attacker", command="PLACEHOLDER")
    own_records = settings.JOB_WORK_ROOT.joinpath(*runfiles.run_dir_parts(attacker.pk, 1, 0), runfiles.OUTPUT_FILE)
    attacker.command = probe_command(
        secret,
        settings.DATABASES["default"]["NAME"] if str(settings.DATABASES["default"]["NAME"]).startswith("/") else settings.VAR_DIR / "console.sqlite3",
        f"/proc/{os.getpid()}/environ",
        victim_spec,
        default_output_dir(victim.pk) / "weights.bin",
        own_records,
    )
    attacker.save(update_fields=["command"])
    attacker = drive(attacker, JobStatus.COMPLETED, timeout=60)
    seen = printed(attacker)
    assert len(seen) == 6, seen
    for path, outcome in seen.items():
        assert outcome in {"FileNotFoundError", "PermissionError"}, f"the job reached {path}: {outcome}"


def test_a_job_sees_only_its_own_gpus_and_no_other_process(make_job, drive):
    job = drive(make_job(command=probe_command(), gpus_per_node=2), JobStatus.COMPLETED, timeout=60)
    gpus = AttemptNode.objects.get(attempt__job=job).gpu_indices
    lines = list(LogLine.objects.filter(job=job).values_list("text", flat=True))
    devices = next(line for line in lines if line.startswith("devices"))
    assert devices == "devices " + str(sorted([f"nvidia{i}" for i in gpus] + ["nvidiactl"]))
    pids = next(line for line in lines if line.startswith("pids"))
    assert max(json.loads(pids.split(" ", 1)[1])) < 20  # its own PID namespace: a handful of processes


def test_a_job_writes_only_its_own_directories(make_job, drive):
    script = (
        "import os\n"
        "for path in [os.environ['OUTPUT_DIR'] + '/ok.txt', os.getcwd() + '/ok.txt', '/tmp/ok.txt', '"
        + str(settings.BASE_DIR / "pwned.txt")
        + "', os.path.expanduser('~') + '/ok.txt']:\n"
        "    try:\n"
        "        open(path, 'w').write('x'); print(path, '-> wrote', flush=True)\n"
        "    except OSError as exc:\n"
        "        print(path, '->', type(exc).__name__, flush=True)\n"
    )
    job = drive(make_job(command="python -c " + shlex.quote(script)), JobStatus.COMPLETED, timeout=60)
    seen = printed(job)
    assert seen.pop(str(settings.BASE_DIR / "pwned.txt")) in {"OSError", "PermissionError", "FileNotFoundError"}
    assert set(seen.values()) == {"wrote"}
    assert (default_output_dir(job.pk) / "ok.txt").exists()
    assert not (settings.BASE_DIR / "pwned.txt").exists()


def test_records_a_job_forges_change_nothing(make_job, drive):
    # The job prints what looks like runner records; the runner's own file is out of its reach.
    forged = json.dumps({"n": 99999999999999999999, "t": 1e300, "s": "forged"})
    script = f"print({forged!r}, flush=True)\nprint('done', flush=True)"
    job = drive(make_job(command="python -c " + shlex.quote(script)), JobStatus.COMPLETED, timeout=60)
    assert job_output(job) == [forged, "done"]


def test_deleting_a_job_deletes_its_files(make_job, drive, client, owner):
    from jobs.services.actions import delete_job

    job = drive(make_job(command="python -c \"import os; open(os.environ['OUTPUT_DIR'] + '/model.pt', 'w').write('w')\""), JobStatus.COMPLETED, timeout=60)
    assert (default_output_dir(job.pk) / "model.pt").exists()
    delete_job(job)
    assert not job_dir(job.pk).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as their project's user only where the agent is root")
def test_where_the_agent_is_root_a_job_runs_as_its_projects_own_user(make_job, drive, project):
    from agent import uids

    script = (
        "import os\nprint('who', os.getuid(), os.getgid(), os.getgroups(), flush=True)\n"
        "try:\n    print(os.listdir('/root'), flush=True)\nexcept OSError as exc:\n    print(type(exc).__name__, flush=True)\n"
        "print('caps', [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0], flush=True)"
    )
    job = drive(make_job(command="python -c " + shlex.quote(script)), JobStatus.COMPLETED, timeout=60)
    uid = uids.uid_for(settings.JOB_UID_REGISTRY, uids.install_id(settings.VAR_DIR), project.pk, settings.JOB_UID_RANGE)
    assert job_output(job) == [f"who {uid} {uid} [{uid}]", "PermissionError", "caps 0000000000000000"]
