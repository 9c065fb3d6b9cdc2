"""Outcome logs: where a warm worker puts the values its calls return, so that a call makes no
file of its own. Creating a file costs far more than the call it carries (on this project's
test machine's ext4, creation was a fifth of all CPU time at 350 calls/s; on a parallel
filesystem it is a metadata server's round trip), so each worker appends to one log of its own,
`calls/o-HOST-PID-TOKEN.log`, and the client reads what was appended since it last looked.

Only a call without a key goes here: its value lives as long as its client does, so the log is
not synced (a keyed call's outcome is a file of its own, synced, which a restarted client
finds). On NFS, which keeps no cache coherent between nodes, each record is flushed, or the
client on another node would not see it until the kernel wrote it back on its own.

A record: `MAGIC`, the name's length (u16), the payload's (u32), the CRC-32 of name and payload
(u32), the call's base name, the payload (the outcome as `_call.py` pickles it). A record cut
short (a worker killed mid-write, a full disk) ends its log: the worker starts another, and the
call's outcome goes to its own file instead.

Run by path inside the worker's interpreter as well as imported by the client: the standard
library only.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import zlib
from typing import Container, Dict, List, Optional, Tuple

MAGIC = b"HTo1"
HEAD = struct.Struct("<4sHII")
# A log is left for a new one past this size: a reader's look reads only what is new, but a
# log that grows for ever is one no one can remove while the run lasts.
ROTATE_BYTES = 64 << 20
# A larger outcome goes to a file of its own: a record is written in one piece.
RECORD_MAX = 1 << 20


def is_log(name: str) -> bool:
    return name.startswith("o-") and name.endswith(".log")


def encode(name: str, payload: bytes) -> bytes:
    n = name.encode()
    body = n + payload
    return HEAD.pack(MAGIC, len(n), len(payload), zlib.crc32(body)) + body


def fs_type(path: str) -> str:
    """The type of the filesystem holding PATH (its longest mount point in `/proc/self/mounts`)."""
    real, best, kind = os.path.realpath(path), "", ""
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) > len(best):
                    best, kind = point, fields[2]
    except OSError:
        pass
    return kind


class Writer:
    """A worker's log: records appended in one write each, a new log past `ROTATE_BYTES` or
    after a write that failed."""

    def __init__(self) -> None:
        self.folder, self.fd, self.size, self.flush = "", -1, 0, False
        self.inode = (0, 0)

    def append(self, folder: str, name: str, payload: bytes) -> bool:
        """The outcome of call NAME appended to this worker's log in FOLDER; false where it could
        not be (too large, the disk full, ...): the caller writes it a file of its own."""
        if len(payload) > RECORD_MAX:
            return False
        record = encode(name, payload)
        try:
            if self.fd < 0 or folder != self.folder or self.size + len(record) > ROTATE_BYTES or not self.still_ours():
                self.open(folder)
            if os.write(self.fd, record) != len(record):
                raise OSError("a record cut short")
            if self.flush:
                os.fsync(self.fd)
        except OSError:
            self.close()
            return False
        self.size += len(record)
        return True

    def open(self, folder: str) -> None:
        self.close()
        name = f"o-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}.log"
        self.fd = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        st = os.fstat(self.fd)
        self.folder, self.size, self.inode = folder, 0, (st.st_dev, st.st_ino)
        self.flush = fs_type(folder).startswith("nfs")

    def still_ours(self) -> bool:
        """Whether the descriptor is still this log's: a call runs in the worker's own process,
        and one that closed it and opened a file of its own must not get the next record."""
        try:
            st = os.fstat(self.fd)
        except OSError:
            self.fd = -1
            return False
        return (st.st_dev, st.st_ino) == self.inode

    def close(self) -> None:
        if self.fd >= 0 and self.still_ours():
            os.close(self.fd)
        self.fd = -1


class Reader:
    """What the logs of a folder gained since the last look. A log's damage (a record whose
    checksum or mark does not hold) stops its reading there, and is kept in `damage` to be told."""

    def __init__(self) -> None:
        self.at: Dict[str, int] = {}
        self.damage: Dict[str, str] = {}

    def read(self, folder: str, names: List[str], wanted: Container[str]) -> List[Tuple[str, bytes]]:
        """The records new in the logs among NAMES (a listing of FOLDER) whose call is WANTED."""
        found: List[Tuple[str, bytes]] = []
        for log in names:
            if is_log(log) and log not in self.damage:
                data = self.new_bytes(os.path.join(folder, log), self.at.get(log, 0))
                if data:
                    self.at[log] = self.at.get(log, 0) + self.parse(log, data, wanted, found)
        return found

    @staticmethod
    def new_bytes(path: str, at: int) -> Optional[bytes]:
        # Opened at each look: on NFS an open is what makes another node's writes visible.
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            size = os.fstat(fd).st_size
            return os.pread(fd, size - at, at) if size > at else None
        finally:
            os.close(fd)

    def parse(self, log: str, data: bytes, wanted: Container[str], found: List[Tuple[str, bytes]]) -> int:
        """Appends DATA's whole records to FOUND; how many bytes they took."""
        pos = 0
        while len(data) - pos >= HEAD.size:
            magic, name_len, payload_len, crc = HEAD.unpack_from(data, pos)
            end = pos + HEAD.size + name_len + payload_len
            if magic != MAGIC:
                self.damage[log] = f"no record mark at byte {self.at.get(log, 0) + pos}"
                break
            if end > len(data):
                break  # still being written
            body = data[pos + HEAD.size : end]
            if zlib.crc32(body) != crc:
                self.damage[log] = f"a record whose checksum does not match at byte {self.at.get(log, 0) + pos}"
                break
            name = body[:name_len].decode(errors="replace")
            if name in wanted:
                found.append((name, body[name_len:]))
            pos = end
        return pos
