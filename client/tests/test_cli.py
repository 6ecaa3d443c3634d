"""The ``satrain`` command-line client (client/) against a real console with its embedded agent:
log in, create from a YAML spec, follow a log to the end across a failover and a dropped
connection (every line exactly once), ``jobs wait``'s exit codes, the API's own messages."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from harness.job_factory import PLATFORM_LINE_PREFIXES
from harness.processes import wait

pytestmark = pytest.mark.slow
pytest.importorskip("satrain", reason="the client is not installed: pip install -e ./client")

OWNER = ("cli-owner", "owner-pass-1")
ADMIN = ("cli-admin", "admin-pass-2")


def counter(lines: int, pause: float) -> str:
    return (
        'python -c "import os, time\n'
        "print('Starting dataset initialization', flush=True)\n"
        f"for i in range({lines}):\n"
        f"    print('attempt', os.environ['JOB_ATTEMPT'], 'step', i, flush=True); time.sleep({pause})\""
    )


class Proxy:
    """A TCP relay on 127.0.0.1 in front of the console, whose connections the test can cut."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            with self.lock:
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

    @staticmethod
    def pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> int:
        """Drop every open connection (as a network would); returns how many were open."""
        with self.lock:
            open_now, self.sockets = self.sockets, []
        for s in open_now:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        return len(open_now) // 2

    def close(self) -> None:
        self.server.close()
        self.cut()


class Cli:
    def __init__(self, config_dir: Path) -> None:
        self.env = {**os.environ, "SATRAIN_CONFIG_DIR": str(config_dir), "COLUMNS": "200", "NO_COLOR": "1"}
        self.env.pop("SATRAIN_URL", None)
        self.env.pop("SATRAIN_TOKEN", None)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "satrain.cli", *args]

    def __call__(self, *args: str, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), check=False, env=self.env, capture_output=True, text=True, timeout=timeout, input=stdin)

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*args), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def proxy(users):
    relay = Proxy(users.port)
    yield relay
    relay.close()


@pytest.fixture
def owner_cli(users, tmp_path):
    cli = Cli(tmp_path / "owner")
    done = cli("login", "--url", users.base_url, "-u", OWNER[0], "-p", OWNER[1])
    assert done.returncode == 0, done.stderr
    return cli


@pytest.fixture
def admin_cli(users, tmp_path):
    cli = Cli(tmp_path / "admin")
    done = cli("login", "--url", users.base_url, "-u", ADMIN[0], "-p", ADMIN[1])
    assert done.returncode == 0, done.stderr
    return cli


def rest_lines(console, job_id: int) -> list[str]:
    status, body = console.api("GET", f"/api/v1/training-jobs/{job_id}/logs/?after=0&limit=5000", user=OWNER[0])
    assert status == 200 and not body["has_more"]
    return [line["text"] for line in body["lines"]]


def test_login_keeps_the_token_readable_by_its_owner_only(users, tmp_path):
    cli = Cli(tmp_path / "cfg")
    wrong = cli("login", "--url", users.base_url, "-u", OWNER[0], "-p", "not-the-password")
    assert wrong.returncode == 1
    assert "Unable to log in with the provided credentials." in wrong.stderr
    done = cli("login", "--url", users.base_url, "-u", OWNER[0], "-p", OWNER[1])
    assert done.returncode == 0, done.stderr
    path = tmp_path / "cfg" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    saved = json.loads(path.read_text())
    assert saved["url"] == users.base_url and saved["username"] == OWNER[0] and len(saved["token"]) > 20
    listed = cli("jobs", "list", "-o", "json")
    assert listed.returncode == 0 and isinstance(json.loads(listed.stdout), list)


def test_a_job_followed_across_a_failover_and_a_dropped_connection_prints_every_line_once(users, proxy, owner_cli, admin_cli, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "cli-failover", "gpus_per_node": 1, "failover_enabled": True, "command": counter(80, 0.1)}))
    # A copy of the owner's config pointed at the relay, so the test can cut the socket.
    relay_cli = Cli(tmp_path / "relay")
    settings = json.loads((tmp_path / "owner" / "config.json").read_text())
    (tmp_path / "relay").mkdir()
    (tmp_path / "relay" / "config.json").write_text(json.dumps({**settings, "url": f"http://127.0.0.1:{proxy.port}"}))

    created = owner_cli("jobs", "create", "-f", str(spec), "-o", "json")
    assert created.returncode == 0, created.stderr
    job_id = json.loads(created.stdout)["id"]
    follower = relay_cli.popen("jobs", "logs", str(job_id), "-f")
    faulty: list[str] = []
    try:
        users.wait_for_job(job_id, "Running")
        wait(lambda: "attempt 1 step 5" in rest_lines(users, job_id), "attempt 1 step 5")
        assert proxy.cut() >= 1, "the follower had a connection to cut"
        placement = users.attempts(job_id)[0]["placements"][0]
        faulty.append(placement["node"])
        injected = admin_cli("nodes", "inject-fault", placement["node"], "--gpu", str(placement["gpu_indices"][0]), "--xid", "79")
        assert injected.returncode == 0, injected.stderr
        wait(lambda: "attempt 2 step 5" in rest_lines(users, job_id), "attempt 2 step 5", timeout=90)
        proxy.cut()
        stdout, stderr = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
        for node in faulty:  # the console is shared with the other test modules
            assert admin_cli("nodes", "clear", node).returncode == 0

    assert follower.returncode == 0, stderr
    assert "reconnecting" in stderr
    assert f"job {job_id}: Completed" in stderr
    printed = stdout.splitlines()
    assert printed == rest_lines(users, job_id)
    assert printed.count("Starting dataset initialization") == 2  # once per attempt
    own = [line for line in printed if not line.startswith(PLATFORM_LINE_PREFIXES)]  # each attempt's preparation aside
    assert "attempt 2 step 79" in own and len(own) == len(set(own)) + 1
    events = owner_cli("jobs", "events", str(job_id), "-o", "json")
    assert "Pending - failoverinprogress" in [e["to_status"] for e in json.loads(events.stdout)]
    assert owner_cli("jobs", "wait", str(job_id)).returncode == 0


def test_jobs_wait_exit_codes_follow_the_final_status(users, owner_cli):
    def create(name: str, command: str, *flags: str) -> int:
        done = owner_cli("jobs", "create", "--name", name, "--gpus", "1", "--command", command, *flags, "-o", "json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["id"]

    ok = create("cli-wait-ok", "python -c \"print('fine')\"")
    failed = create("cli-wait-fails", 'python -c "import sys; sys.exit(3)"', "--no-failover")
    sleeper = create("cli-wait-sleeps", 'python -c "import time; time.sleep(300)"')

    done = owner_cli("jobs", "wait", str(ok), "--interval", "0.3")
    assert (done.returncode, done.stdout.strip()) == (0, "Completed")
    done = owner_cli("jobs", "wait", str(failed), "--interval", "0.3")
    assert (done.returncode, done.stdout.strip()) == (3, "Failed")
    done = owner_cli("jobs", "wait", str(sleeper), "--timeout", "1", "--interval", "0.3")
    assert done.returncode == 124 and "after 1 s" in done.stderr
    assert owner_cli("jobs", "stop", str(sleeper)).returncode == 0
    done = owner_cli("jobs", "wait", str(sleeper), "--interval", "0.3")
    assert (done.returncode, done.stdout.strip()) == (4, "Stopped")
    done = owner_cli("jobs", "wait", "999999999")
    assert done.returncode == 1 and "No such training job, or you may not see it." in done.stderr


def test_a_yaml_spec_with_a_bad_field_shows_the_apis_message(users, owner_cli, tmp_path):
    body = {"name": "Not_A_Label", "gpus_per_node": 65, "command": "python -c 'print(1)'"}
    status, answer = users.api("POST", "/api/v1/training-jobs/", user=OWNER[0], body=body)
    assert status == 400
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: Not_A_Label\ngpus_per_node: 65\ngpu: 2\ncommand: python -c 'print(1)'\n")
    done = owner_cli("jobs", "create", "-f", str(spec))
    assert done.returncode == 1
    message = " ".join(done.stderr.split())
    for field in ("name", "gpus_per_node"):
        assert f"{field}: {answer[field][0]}" in message
    assert "Traceback" not in done.stderr
    assert "field gpu not known to this client" in message  # a typo is pointed out, not silently dropped

    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    done = owner_cli("jobs", "create", "-f", str(broken))
    assert done.returncode == 2 and "is not valid YAML" in done.stderr


def test_list_get_tail_and_staff_only_nodes(users, owner_cli, admin_cli):
    done = owner_cli("jobs", "create", "--name", "cli-tail", "--gpus", "1", "--command", counter(30, 0), "-o", "json")
    job_id = json.loads(done.stdout)["id"]
    assert owner_cli("jobs", "wait", str(job_id), "--interval", "0.3").returncode == 0
    tail = owner_cli("jobs", "logs", str(job_id), "--tail", "5")
    assert tail.stdout.splitlines() == [f"attempt 1 step {i}" for i in range(25, 30)]
    listed = json.loads(owner_cli("jobs", "list", "--status", "Completed", "--search", "cli-tail", "-o", "json").stdout)
    assert [job["id"] for job in listed] == [job_id]
    table = owner_cli("jobs", "list", "--search", "cli-tail")
    assert "cli-tail" in table.stdout and "Completed" in table.stdout
    got = json.loads(owner_cli("jobs", "get", str(job_id), "-o", "json").stdout)
    assert got["status"] == "Completed"
    refused = owner_cli("nodes", "list")
    assert refused.returncode == 1 and "permission" in refused.stderr.lower()
    nodes = admin_cli("nodes", "list")
    assert nodes.returncode == 0 and "node-a" in nodes.stdout
    assert "cordoned" in admin_cli("nodes", "cordon", "node-c").stdout
    assert "schedulable" in admin_cli("nodes", "cordon", "node-c", "--undo").stdout


def test_resume_of_a_completed_job_says_why_it_cannot(users, owner_cli):
    done = owner_cli("jobs", "create", "--name", "cli-resume", "--gpus", "1", "--command", 'python -c "print(1)"', "-o", "json")
    job_id = json.loads(done.stdout)["id"]
    owner_cli("jobs", "wait", str(job_id), "--interval", "0.3")
    resumed = owner_cli("jobs", "resume", str(job_id))
    # A Completed job has nothing to resume: the console's 409 message, exit 1, no traceback.
    assert resumed.returncode == 1 and "Traceback" not in resumed.stderr
    assert "no resume endpoint" not in resumed.stderr
    assert "cannot be resumed" in resumed.stderr or "no committed checkpoint" in resumed.stderr


def test_logs_show_a_jobs_escape_sequences_as_text_unless_raw(users, owner_cli):
    # A hyperlink (ESC]8;;url ESC\), a window title (ESC]0;… BEL), a screen clear (ESC[2J).
    printed = "E=chr(27); S=E+chr(92); print(E+']8;;http://evil.example/'+S+'link'+E+']8;;'+S+' '+E+']0;title'+chr(7)+' '+E+'[2Jend')"
    done = owner_cli("jobs", "create", "--name", "cli-escapes", "--gpus", "1", "--command", f'python -c "{printed}"', "-o", "json")
    job_id = json.loads(done.stdout)["id"]
    assert owner_cli("jobs", "wait", str(job_id), "--interval", "0.3").returncode == 0
    stored = "\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\ \x1b]0;title\x07 \x1b[2Jend"
    shown = "\\x1b]8;;http://evil.example/\\x1b\\link\\x1b]8;;\\x1b\\ \\x1b]0;title\\x07 \\x1b[2Jend"
    assert owner_cli("jobs", "logs", str(job_id), "--tail", "1").stdout == shown + "\n"
    followed = owner_cli("jobs", "logs", str(job_id), "-f")
    assert followed.returncode == 0 and followed.stdout.splitlines()[-1] == shown
    assert "\x1b" not in followed.stdout and "\x07" not in followed.stdout
    assert owner_cli("jobs", "logs", str(job_id), "--tail", "1", "--raw").stdout == stored + "\n"


def test_code_in_results_out_and_a_warm_start_from_the_terminal(users, owner_cli, tmp_path):
    code = tmp_path / "my-code"
    (code / "data").mkdir(parents=True)
    (code / "train.py").write_text(
        "import os, pathlib\n"
        "step = int(os.environ.get('CKPT_LAST_STEP', '0'))\n"
        "out = pathlib.Path(os.environ['OUTPUT_DIR'])\n"
        "(out / 'model.bin').write_bytes(bytes(range(256)) * 64)\n"
        "print('trained from step', step, flush=True)\n"
    )
    (code / "data" / "big.bin").write_bytes(b"\0" * 1000)
    (code / ".satrainignore").write_text("data/\n")
    (code / "shortcut").symlink_to("/etc/passwd")
    done = owner_cli("jobs", "create", "--name", "cli-code", "--gpus", "0", "--code", str(code), "--command", "python train.py", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert "left out: shortcut (a link)" in done.stderr and "2 files" in done.stderr  # train.py, .satrainignore
    job_id = json.loads(done.stdout)["id"]
    assert owner_cli("jobs", "wait", str(job_id), "--interval", "0.3").returncode == 0
    assert "trained from step 0" in "\n".join(rest_lines(users, job_id))

    # The output directory, unpacked; one file; byte-identical to what the job wrote.
    target = tmp_path / "results"
    done = owner_cli("jobs", "download", str(job_id), "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert (target / "model.bin").read_bytes() == bytes(range(256)) * 64
    done = owner_cli("jobs", "download", str(job_id), "--work", "--path", "train.py", "-o", str(tmp_path / "train-copy.py"))
    assert done.returncode == 0 and (tmp_path / "train-copy.py").read_text() == (code / "train.py").read_text()
    done = owner_cli("jobs", "download", str(job_id), "--path", "../work/train.py", "-o", str(tmp_path / "x"))
    assert done.returncode == 1 and "'..' is not allowed" in done.stderr
    done = owner_cli("jobs", "download", str(job_id), "--checkpoint", "5")
    assert done.returncode == 1 and "no committed checkpoint at step 5" in done.stderr
    done = owner_cli("jobs", "create", "--name", "cli-warm", "--warm-start", f"{job_id}:5", "--command", "true")
    assert done.returncode == 1 and f"Job {job_id} (cli-code) has no committed checkpoint" in done.stderr
    done = owner_cli("jobs", "create", "--name", "cli-warm", "--warm-start", "abc", "--command", "true")
    assert done.returncode == 2 and "--warm-start takes JOB or JOB:STEP" in done.stderr
