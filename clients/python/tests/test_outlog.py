"""The warm workers' outcome logs and a call's word, without a run: records appended as a worker
appends them, read as the client reads them (what is new since the last look, a record still
being written, damage, a new log past the size), and a call's bytes inline or in a file. No
`htc` binary is needed."""

from __future__ import annotations

import os
import pathlib
import pickle
import subprocess
import sys

import cloudpickle  # type: ignore[import-untyped]
import pytest

from slurm_htc import _call, _outlog, functions
from slurm_htc._call import RAISED, RETURNED


class Everything:
    def __contains__(self, name: object) -> bool:
        return True


def logs(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if _outlog.is_log(p.name))


def test_a_look_reads_what_was_appended_since_the_last_and_only_the_calls_wanted(tmp_path: pathlib.Path) -> None:
    w, r = _outlog.Writer(), _outlog.Reader()
    for name in ("a", "b", "c"):
        assert w.append(str(tmp_path), name, name.encode() * 3)
    [log] = logs(tmp_path)
    assert r.read(str(tmp_path), [log], {"a", "c"}) == [("a", b"aaa"), ("c", b"ccc")]
    assert r.read(str(tmp_path), [log], Everything()) == [], "what was read is not read again"
    assert w.append(str(tmp_path), "d", b"")
    assert r.read(str(tmp_path), [log, "x.out", "o-gone.log"], Everything()) == [("d", b"")]
    assert not r.damage


def test_a_record_still_being_written_is_read_once_it_is_whole(tmp_path: pathlib.Path) -> None:
    record = _outlog.encode("call", b"value" * 100)
    log = tmp_path / "o-h-1-x.log"
    r = _outlog.Reader()
    for cut in (3, _outlog.HEAD.size, _outlog.HEAD.size + 2, len(record) - 1):
        log.write_bytes(_outlog.encode("first", b"1") + record[:cut])
        assert r.read(str(tmp_path), [log.name], Everything()) in ([("first", b"1")], []), cut
    log.write_bytes(_outlog.encode("first", b"1") + record)
    assert r.read(str(tmp_path), [log.name], Everything()) == [("call", b"value" * 100)]
    assert not r.damage


@pytest.mark.parametrize("where", ["mark", "payload"])
def test_damage_stops_a_log_s_reading_there_and_is_told(tmp_path: pathlib.Path, where: str) -> None:
    first, second, third = (_outlog.encode(n, n.encode() * 10) for n in ("one", "two", "six"))
    spoilt = bytearray(second)
    spoilt[0 if where == "mark" else len(spoilt) - 1] ^= 0xFF
    log = tmp_path / "o-h-1-x.log"
    log.write_bytes(first + bytes(spoilt) + third)
    r = _outlog.Reader()
    assert r.read(str(tmp_path), [log.name], Everything()) == [("one", b"one" * 10)]
    assert f"at byte {len(first)}" in r.damage[log.name]
    with log.open("ab") as f:
        f.write(_outlog.encode("late", b"x"))
    assert r.read(str(tmp_path), [log.name], Everything()) == [], "a damaged log is read no further"


def test_a_worker_starts_a_new_log_past_its_size_and_the_reader_reads_both(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_outlog, "ROTATE_BYTES", 200)
    w, r = _outlog.Writer(), _outlog.Reader()
    for i in range(6):
        assert w.append(str(tmp_path), f"c{i}", b"v" * 60)
    names = logs(tmp_path)
    assert len(names) == 3 and all(os.path.getsize(tmp_path / n) <= 200 for n in names)
    assert sorted(n for n, _ in r.read(str(tmp_path), names, Everything())) == [f"c{i}" for i in range(6)]


def test_what_a_log_cannot_take_is_left_to_a_file_of_its_own(tmp_path: pathlib.Path) -> None:
    w = _outlog.Writer()
    assert not w.append(str(tmp_path), "big", b"x" * (_outlog.RECORD_MAX + 1))
    assert not w.append(str(tmp_path / "gone"), "a", b"x"), "a folder that is not there"
    assert w.append(str(tmp_path), "a", b"x"), "the next append opens a log again"


def test_the_filesystem_type_is_read_from_the_mount_table() -> None:
    assert _outlog.fs_type("/proc/self") == "proc"


def test_a_small_call_travels_in_its_word_a_large_one_in_its_file(tmp_path: pathlib.Path) -> None:
    base = str(tmp_path / "my@dir" / "calls" / "c")
    word, filed = functions.call_word(base, b"small")
    assert not filed and functions.LITERAL.fullmatch(word) and not os.path.exists(base + ".in")
    assert _call.split_word(word) == (base, b"small") and _call.call_bytes(word) == (base, b"small")
    big = os.urandom(functions.INLINE_MAX + 1)
    word, filed = functions.call_word(base, big)
    assert filed and word == base + "@" and _call.call_bytes(word) == (base, big)
    # A word of a base alone (as from a client before words carried bytes) names its file; the
    # client always ends a base with `@`, so that a path with one in it is read right.
    assert _call.split_word("/r/calls/c") == ("/r/calls/c", None)


def identity(x: object) -> object:
    return x


def test_a_worker_logs_a_value_a_keyed_call_and_a_failure_get_their_own_files(tmp_path: pathlib.Path) -> None:
    calls = tmp_path / "calls"
    calls.mkdir()
    w, r = _outlog.Writer(), _outlog.Reader()

    def run(name: str, fn: object, *args: object) -> int:
        word, _ = functions.call_word(str(calls / name), functions.encode([(fn, args, {})]))
        return _call.run(word, w)

    assert run("plain", identity, 5) == 0 and not (calls / "plain.out").exists()
    [(name, payload)] = r.read(str(calls), logs(calls), Everything())
    assert (name, cloudpickle.loads(payload)) == ("plain", (RETURNED, [5]))
    assert run("k-abc", identity, 6) == 0 and functions.read_outcome(str(calls / "k-abc")) == (RETURNED, [6])
    assert run("fails", int, "x") == 1 and functions.read_outcome(str(calls / "fails"))[0] == RAISED  # type: ignore[index]
    assert r.read(str(calls), logs(calls), Everything()) == []


def test_a_call_in_its_word_runs_cold_and_leaves_no_call_file(tmp_path: pathlib.Path) -> None:
    base = str(tmp_path / "calls" / "c")
    word, filed = functions.call_word(base, functions.encode([(identity, ({"a": [1]},), {})]))
    p = subprocess.run(functions.command(sys.executable, word)[0], shell=True, capture_output=True, timeout=60)
    assert (p.returncode, filed) == (0, False), p.stderr
    assert functions.read_outcome(base) == (RETURNED, [{"a": [1]}]) and not os.path.exists(base + ".in")
    assert pickle.loads(_call.call_bytes(word)[1])["python"] == sys.executable


def test_a_log_descriptor_a_call_closed_and_reused_is_not_written_to(tmp_path: pathlib.Path) -> None:
    w, r = _outlog.Writer(), _outlog.Reader()
    assert w.append(str(tmp_path), "a", b"1")
    os.close(w.fd)  # as a call that closes every descriptor, then opens a file of its own
    theirs = os.open(tmp_path / "theirs.txt", os.O_WRONLY | os.O_CREAT)
    try:
        assert w.append(str(tmp_path), "b", b"2")
        assert (tmp_path / "theirs.txt").read_bytes() == b""
        assert sorted(r.read(str(tmp_path), logs(tmp_path), Everything())) == [("a", b"1"), ("b", b"2")]
    finally:
        os.close(theirs)


def test_an_outcome_that_cannot_be_written_is_a_failure_that_says_why(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = str(tmp_path / "gone" / "c")  # the run's directory removed under the call
    word, _ = functions.call_word(str(tmp_path / "calls" / "c"), functions.encode([(identity, (1,), {})]))
    word = base + word[word.rindex("@") :]
    assert _call.run(word, _outlog.Writer()) == 1
    assert f"the outcome of {base} could not be written" in capsys.readouterr().err
