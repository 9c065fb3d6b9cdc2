"""The task line the client writes, read back by the shell a task runs in: no `htc` needed."""

from __future__ import annotations

import pathlib
import subprocess

from slurm_htc._htc import task_line

WORDS = ["a\nb", "\nx\n\n", "it's\n", "\n", "plain", "two words"]


def run_line(line: str) -> str:
    assert "\n" not in line, "a task's command is one line"
    assert line.startswith("[")
    cmd = line.split("] ", 1)[1]
    return subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, check=True).stdout


def test_words_holding_newlines_are_read_back_byte_for_byte() -> None:
    line = task_line(["printf", "[%s]", *WORDS], {"cores": 1})
    assert run_line(line) == "".join(f"[{w}]" for w in WORDS)


def test_a_script_of_several_lines_runs_as_written_with_its_env_and_cwd(tmp_path: pathlib.Path) -> None:
    script = 'printf "%s|" "$V"\ncd sub 2>/dev/null || pwd\necho "it\'s" last'
    line = task_line(script, {}, cwd=str(tmp_path), env={"V": "p\nq"})
    assert run_line(line) == f"p\nq|{tmp_path}\nit's last\n"


def test_a_line_without_newlines_is_as_before() -> None:
    assert task_line(["echo", "two words"], {"mem": "1G"}) == "[mem=1G] echo 'two words'"
    assert task_line("echo $HOME", {}) == "[] echo $HOME"


def test_options_that_grow_from_attempt_to_attempt_go_as_written() -> None:
    line = task_line("x", {"mem": "4G*2", "timeout": "10m+5m", "retry_on": "oom/130-145"})
    assert line == "[mem=4G*2 timeout=10m+5m retry_on=oom/130-145] x"
