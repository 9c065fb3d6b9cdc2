"""docs/snakemake.md's example runs as written: its Snakefile, its command, what it says it prints."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
HTC = os.environ.get("HTC") or str(ROOT / "target" / "release" / "htc")
BIN = pathlib.Path(sys.executable).parent


def test_the_snakemake_doc_s_example_runs_as_written(tmp_path: pathlib.Path) -> None:
    doc = (ROOT / "docs" / "snakemake.md").read_text()
    snakefile = re.findall(r"```snakemake\n(.*?)```", doc, re.S)[0]
    commands = re.findall(r"```sh\n(.*?)```", doc, re.S)[0]
    (tmp_path / "Snakefile").write_text(snakefile)
    # `htc` as the doc has it: on the PATH.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "htc").symlink_to(HTC)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{BIN}:{os.environ['PATH']}")
    env.pop("HTC", None)
    p = subprocess.run(["sh", "-e", "-c", commands], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout == "4 s00\n4 s01\n", p.stdout
    assert "62 of 62 steps (100%) done" in p.stderr, p.stderr[-2000:]
