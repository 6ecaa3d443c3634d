from __future__ import annotations

import pytest

from jobs.job_fields import CommandError, logical_lines, validate_command


def test_continued_lines_and_quoted_newlines_read_as_the_shell_reads_them():
    command = 'PYTHONPATH=$CHECKPOINT_VENDOR \\\n  python train.py\npython -c "import os\nprint(1)"\n# a comment\n\ntorchrun --nproc_per_node 2 x.py'
    assert logical_lines(command) == [
        "PYTHONPATH=$CHECKPOINT_VENDOR    python train.py",
        'python -c "import os\nprint(1)"',
        "torchrun --nproc_per_node 2 x.py",
    ]
    validate_command(command)


@pytest.mark.parametrize(
    "command",
    [
        "python train.py",
        'HF_DATASETS_OFFLINE="1" python train.py',
        "A=1 B=2 deepspeed --num_gpus=2 train.py",
        "accelerate launch --num_processes 4 train.py",
        "/opt/env/bin/python3 -m mypkg.train",
        # The command runs as the service runs it, with bash in the job's container.
        "bash run.sh",
        "cd /data/code && ./train.sh --epochs 3",
    ],
)
def test_the_services_launchers_are_accepted(command):
    validate_command(command)


@pytest.mark.parametrize(
    "command, message",
    [
        ("", "Enter a command"),
        ("   \n# only a comment", "Enter a command"),
        ("A=1 B=2", "only variable assignments"),
        ('python -c "unclosed', "No closing quotation"),
        ("python x.py\x00", "NUL character"),
    ],
)
def test_bad_commands_get_a_clear_message(command, message):
    with pytest.raises(CommandError, match=message):
        validate_command(command)
