"""docs/python.md's example runs as written, against the real `htc`, and prints what it says."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
HTC = os.environ.get("HTC") or str(ROOT / "target" / "release" / "htc")


def test_the_python_doc_s_example_runs_as_written(tmp_path: pathlib.Path) -> None:
    doc = (ROOT / "docs" / "python.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", doc, re.S)
    script = tmp_path / "example.py"
    script.write_text(example)
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, HTC=HTC), timeout=300)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "total: 190", p.stdout
    assert lines[1] == "task 22: exit 3" and lines[2] == "task 23: cancelled: task 22 did not succeed (after=)", p.stdout
    assert lines[3] == "[0, 1, 4, 9]", p.stdout
    assert lines[4] == "raised: invalid literal for int() with base 10: 'twelve'", p.stdout


def test_the_parsl_doc_s_example_runs_as_written(tmp_path: pathlib.Path) -> None:
    doc = (ROOT / "docs" / "parsl.md").read_text()
    example = re.findall(r"```python\n(.*?)```", doc, re.S)[0]
    printed = re.findall(r"prints\n\n```\n(.*?)```", doc, re.S)[0]
    script = tmp_path / "example.py"
    script.write_text(example)
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, HTC=HTC), timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout == printed, p.stdout
