"""A bounded reader for the tar archive the remote script streams.

Not `tarfile`: in stream mode it allocates a pax or GNU long-name record of any declared size
before looking at it (CVE-2024-6232 made a 400 KB pax header cost minutes in 3.11.7), and skips
a member of any declared size byte by byte. Here every size is checked before anything is read:
name records are capped at 64 KiB, a member over the per-file limit is counted against the
stream cap before it is skipped, and only regular files, hard links and symlinks are kept.
Formats: ustar/GNU headers, GNU long names and links (`L`/`K`), pax `x`/`g` records
(path, linkpath, size), base-256 sizes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kvtrace.errors import LimitExceeded, RemoteError
from kvtrace.fetch.ssh.stream import ChannelStream

BLOCK = 512
MAX_NAME_RECORD = 64 * 1024  # no real path or pax header comes near this


@dataclass
class Member:
    name: str
    kind: str  # "file", "hardlink", "symlink", "other"
    size: int
    linkname: str = ""


def _octal(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256: big-endian, top bit marks it
        value = field[0] & 0x3F
        for byte in field[1:]:
            value = (value << 8) | byte
        return -value if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip()
    if not text:
        return 0
    return int(text, 8)


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


class TarReader:
    def __init__(self, stream: ChannelStream, max_file_bytes: int, where: str) -> None:
        self.stream = stream
        self.max_file_bytes = max_file_bytes
        self.where = where

    def _broken(self, why: str) -> RemoteError:
        return RemoteError(f"{self.where}: the remote tar stream is malformed ({why})")

    def _header(self) -> bytes | None:
        block = self.stream.read_exact(BLOCK, "a tar header")
        if block == bytes(BLOCK):
            return None  # end of archive
        try:
            stored = _octal(block[148:156])
        except ValueError:
            raise self._broken("bad header checksum field") from None
        computed = sum(block[:148]) + 32 * 8 + sum(block[156:])
        if stored != computed:
            raise self._broken("header checksum mismatch")
        return block

    def _record(self, size: int, what: str) -> bytes:
        if size < 0 or size > MAX_NAME_RECORD:
            raise RemoteError(
                f"{self.where}: the remote tar stream has a {what} record of {size} bytes "
                f"(over the {MAX_NAME_RECORD}-byte bound); refusing it"
            )
        data = self.stream.read_exact(size, f"a {what} record")
        self.stream.skip(-size % BLOCK, f"a {what} record")
        return data

    def skip_data(self, member: Member) -> None:
        self.stream.skip(member.size + (-member.size % BLOCK), f"the data of {member.name!r}")

    def read_data(self, member: Member) -> bytes:
        assert 0 <= member.size <= self.max_file_bytes, "checked by the caller"
        data = self.stream.read_exact(member.size, f"the data of {member.name!r}")
        self.stream.skip(-member.size % BLOCK, f"the data of {member.name!r}")
        return data

    def members(self) -> Iterator[Member]:
        """Members in order; the caller must read_data or skip_data each before the next."""
        long_name: str | None = None
        long_link: str | None = None
        pax: dict[str, str] = {}
        while True:
            block = self._header()
            if block is None:
                return
            try:
                size = _octal(block[124:136])
            except ValueError:
                raise self._broken("bad size field") from None
            flag = block[156:157]
            if flag in (b"L", b"K"):
                value = self._record(size, "long-name").split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                if flag == b"L":
                    long_name = value
                else:
                    long_link = value
                continue
            if flag in (b"x", b"g"):
                record = self._parse_pax(self._record(size, "pax"))
                if flag == b"x":
                    pax = record
                continue
            name = _text(block[0:100])
            if block[257:262] == b"ustar" and block[345:500].strip(b"\0"):
                name = _text(block[345:500]) + "/" + name
            name = pax.get("path", long_name if long_name is not None else name)
            linkname = pax.get("linkpath", long_link if long_link is not None else _text(block[157:257]))
            if "size" in pax:
                try:
                    size = int(pax["size"])
                except ValueError:
                    raise self._broken("bad pax size") from None
            if size < 0:
                raise self._broken("negative size")
            long_name = long_link = None
            pax = {}
            kind = {b"0": "file", b"\0": "file", b"7": "file", b"1": "hardlink", b"2": "symlink"}.get(flag, "other")
            if kind in ("hardlink", "symlink"):
                size = 0  # links carry no data
            member = Member(name, kind, size, linkname)
            yield member

    def _parse_pax(self, data: bytes) -> dict[str, str]:
        out: dict[str, str] = {}
        pos = 0
        while pos < len(data) and data[pos:pos + 1] != b"\0":
            space = data.find(b" ", pos)
            try:
                length = int(data[pos:space])
            except ValueError:
                raise self._broken("bad pax record") from None
            if space == -1 or length <= 0 or pos + length > len(data):
                raise self._broken("bad pax record")
            key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
            pos += length
        return out


def member_over_limit(member: Member, stream: ChannelStream, limit_message: str) -> None:
    """A member bigger than the per-file limit is skipped only if the stream cap allows
    reading past it; otherwise the fetch stops here, saying which limit stopped it."""
    if member.size > stream.cap - stream.count + stream.available():
        raise LimitExceeded(limit_message)
