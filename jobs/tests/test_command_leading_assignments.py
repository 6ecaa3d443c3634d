"""The command's leading ``NAME=value`` assignments, read as bash reads them: what each line
starts with (not what a quoted string, a comment or a here-document holds), the value bash
assigns, whether it is literal, and the command with some of them taken out."""

from __future__ import annotations

import pytest

from jobs.job_fields import leading_assignments, validate_command, without_assignments


def named(command: str) -> dict[str, tuple[str, bool]]:
    return {a.name: (a.value, a.literal) for a in leading_assignments(command)}


def taken_out(command: str, *names: str) -> str:
    return without_assignments(command, [a for a in leading_assignments(command) if a.name in names]).strip()


def test_each_lines_leading_assignments_are_read_with_their_quotes_removed():
    command = "A=1 HF_TOKEN='a b' \\\n  python train.py\nDB_PASSWORD=\"p w\" torchrun x.py # C_TOKEN=no"
    assert named(command) == {"A": ("1", True), "HF_TOKEN": ("a b", True), "DB_PASSWORD": ("p w", True)}


@pytest.mark.parametrize(
    "command",
    [
        'python -c "x\nHF_TOKEN=1" a.py',
        "# don't\n# HF_TOKEN=1\npython a.py",
        "cat <<EOF > f\nHF_TOKEN=1\nEOF\npython a.py",
        "cd /x && HF_TOKEN=1 python a.py",
        "python a.py HF_TOKEN=1",
    ],
)
def test_words_that_are_not_at_a_lines_start_are_not_assignments(command):
    assert "HF_TOKEN" not in named(command)


@pytest.mark.parametrize("value", ["$HOME", "$(cat /run/token)", "`cat f`", "~/t", '"a$b"', "$'\\x41'", '"it\'s $X"'])
def test_a_value_the_shell_expands_is_not_literal(value):
    assert named(f"HF_TOKEN={value} python a.py")["HF_TOKEN"][1] is False


def test_single_quotes_and_an_escape_keep_a_dollar_literal():
    assert named("HF_TOKEN='p$w' python a.py")["HF_TOKEN"] == ("p$w", True)
    assert named("HF_TOKEN=p\\$w python a.py")["HF_TOKEN"] == ("p$w", True)


@pytest.mark.parametrize(
    "command, left",
    [
        ("HF_TOKEN=x WANDB_API_KEY=y python -m x", "python -m x"),
        ("A=1 HF_TOKEN=x python -m x", "A=1 python -m x"),
        ("HF_TOKEN=x A=1 python -m x", "A=1 python -m x"),
        ('PYTHONPATH=$V HF_TOKEN="a b" \\\n  python train.py', "PYTHONPATH=$V python train.py"),
        ("HF_TOKEN=x\npython a.py", "python a.py"),
        ("HF_TOKEN=x >log python a.py", ">log python a.py"),
    ],
)
def test_taking_assignments_out_leaves_a_command_that_runs_the_rest(command, left):
    assert taken_out(command, "HF_TOKEN", "WANDB_API_KEY") == left
    validate_command(left)


def test_what_ends_the_assignments_is_recorded():
    assert [a.then for a in leading_assignments("HF_TOKEN=x; python a.py")] == [";"]
    assert [a.then for a in leading_assignments("A=1 HF_TOKEN=x && python a.py")] == ["&", "&"]
    assert [a.then for a in leading_assignments("HF_TOKEN=x python a.py")] == [""]
