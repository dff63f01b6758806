"""A labels table's bytes as checked UTF-8 text (pure): its encoding, its lines and their cap.

In: a table file opened as bytes. Out: UTF-8 bytes for pyarrow.csv (Utf8Stream: checked, or
transcoded from --labels_encoding), a line at a time for JSON Lines (bounded_lines, under
LINE_CAP: a table without line breaks is refused at bounded memory), or a TableError naming
the file, the first line that is not text, what it looks like (CP949, Latin-1, UTF-16...) and
the fix."""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from typing import BinaryIO

from transforms.labels.rows import TableError

# Bytes of one record (CSV: pyarrow's block, which a record must fit in) or line (JSON Lines).
LINE_CAP = 4 << 20
# Bytes read at a time.
_CHUNK = 1 << 20

# What a table that is not UTF-8 may be: the name said to the user, the codec that reads it,
# and what its decoded text must hold to count as that (None: any text).
_LOOKS_LIKE = (
    ("CP949/EUC-KR (Korean Windows)", "cp949", re.compile("[\uac00-\ud7a3]")),
    ("Shift_JIS (Japanese Windows)", "shift_jis", re.compile("[\u3040-\u30ff]")),
    ("GB18030/GBK (Chinese Windows)", "gb18030", re.compile("[\u4e00-\u9fff]")),
    ("Windows-1252/Latin-1 (Western European Windows)", "cp1252", None),
    ("Latin-1", "latin-1", None),
)
_BOMS = {
    "utf-32": (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE),
    "utf-16": (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE),
}


def guess_encoding(head: bytes, line: bytes) -> tuple[str, str, str] | None:
    """(what it looks like, the --labels_encoding that reads it, the line as read in it) for a
    table that is not UTF-8, from its first bytes and its first bad line; None if no guess."""
    for codec, boms in _BOMS.items():
        if head.startswith(boms):
            return f"{codec.upper()} (it starts with a {codec.upper()} byte order mark)", codec, ""
    if line.count(b"\x00") * 4 >= len(line) > 0:
        return "UTF-16 without a byte order mark", "utf-16-le" if line[1:2] == b"\x00" else "utf-16-be", ""
    for name, codec, holds in _LOOKS_LIKE:
        try:
            text = line.decode(codec)
        except UnicodeDecodeError:
            continue
        if holds is None or holds.search(text):
            return name, codec, text.strip()
    return None


def not_text_message(source: str, line: int, encoding: str, head: bytes, bad: bytes) -> str:
    """The one line that refuses a table whose line `line` (bytes `bad`) is not `encoding`."""
    if codecs.lookup(encoding).name != "utf-8":
        return (
            f"labels table {source} line {line} is not {encoding} text: check --labels_encoding "
            "(Python's codec names: cp949, latin-1, utf-16, ...)"
        )
    guess = guess_encoding(head, bad)
    if guess is None:
        return f"labels table {source} line {line} is not UTF-8 text: re-save the table as UTF-8"
    name, codec, text = guess
    shown = f", where it reads {text[:60]!r}" if text else ""
    return (
        f"labels table {source} line {line} is not UTF-8: it looks like {name}{shown}; re-save it "
        f"as UTF-8 (Excel: Save As > CSV UTF-8; or iconv -f {codec} -t utf-8), or pass "
        f"--labels_encoding {codec}"
    )


class Utf8Stream:
    """The bytes of a table file as UTF-8, read as pyarrow reads a file (`read(size)`): checked
    as they pass (or transcoded from `encoding`), a leading byte order mark dropped; `peek(n)`
    reads ahead. Counts the line breaks, '"' and carriage returns read (`lines`, `quotes`,
    `returns`). Raises TableError at the first line that is not text in `encoding`."""

    closed = False

    def __init__(self, f: BinaryIO, source: str, encoding: str = "utf-8"):
        self._f, self._source, self._encoding = f, source, encoding
        self._utf8 = codecs.lookup(encoding).name == "utf-8"
        self._decoder = codecs.getincrementaldecoder("utf-8-sig" if self._utf8 else encoding)()
        self._head = self._held = b""  # the first bytes (for the encoding guess); read ahead by peek
        self._done = False
        self.lines = self.quotes = self.returns = 0

    def read(self, size: int = -1) -> bytes:
        out = self.peek(size if size and size > 0 else _CHUNK)
        self._held = self._held[len(out) :] if len(self._held) > len(out) else b""
        return out

    def peek(self, size: int) -> bytes:
        if len(self._held) < size and not self._done:
            parts = [self._held]
            have = len(self._held)
            while have < size and not self._done:
                parts.append(self._next(size - have))
                have += len(parts[-1])
            self._held = b"".join(parts)
        return self._held[:size] if len(self._held) > size else self._held

    def _next(self, size: int) -> bytes:
        data = self._f.read(max(size, _CHUNK))
        try:
            text = self._decoder.decode(data, final=not data)
        except UnicodeDecodeError as e:
            raise self._not_text(e.object, e.start, data) from None
        out = data if self._utf8 else text.encode("utf-8")
        if not self._head and data:
            self._head = data[:64]
            out = out.removeprefix(codecs.BOM_UTF8)
        self._done = not data
        self.lines += out.count(b"\n")
        self.quotes += out.count(b'"')
        self.returns += out.count(b"\r")
        return out

    def _not_text(self, data: bytes, at: int, chunk: bytes) -> TableError:
        """The error for an undecodable byte at `at` of `data` (which follows self.lines lines)."""
        start = data.rfind(b"\n", 0, at) + 1
        end = data.find(b"\n", at)
        line = self.lines + data.count(b"\n", 0, at) + 1
        bad = data[start : end if end >= 0 else len(data)][:1000]
        head = self._head or chunk[:64]
        return TableError(not_text_message(self._source, line, self._encoding, head, bad))


def bounded_lines(stream: Utf8Stream, source: str, cap: int = LINE_CAP) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, its bytes without the line break) of each line of `stream`.
    TableError for a line over `cap` bytes, raised once that many are read (bounded memory)."""
    number, rest = 0, b""
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        rest += chunk
        lines = rest.split(b"\n")
        rest = lines.pop()
        for line in lines:
            number += 1
            yield number, line
        if len(rest) > cap:
            raise TableError(
                f"labels table {source} line {number + 1} is over {cap >> 20} MiB (every line of a "
                "table must be under that): is it really a table, with one row a line?"
            )
    if rest:
        yield number + 1, rest
