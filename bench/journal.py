"""The agents' results journals of a run (`out/agent-N/results*`, 40-byte entries: task id u64,
attempt u32, kind u8 (1: a start), ...), as the re-run benchmarks read them."""
import glob
import struct


def open_attempts(run):
    """How many (task, attempt) the journals say started and did not end."""
    started, ended = set(), set()
    for path in glob.glob(f"{run}/out/agent-*/results*"):
        b = open(path, "rb").read()
        for i in range(0, len(b) - len(b) % 40, 40):
            tid, att, kind = struct.unpack_from("<QIB", b, i)
            (started if kind == 1 else ended).add((tid, att))
    return len(started - ended)
