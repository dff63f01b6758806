"""An archive member's address and the pin that ties it to what was listed (pure).

In: a path `<archive>#<member>@<offset>+<size>` (what the listing emits for a tar member in
place of a file path), optionally followed by its pin. Out: its MemberAddress. The member's
bytes are read by one positioned read (transforms/images/read.py).

The pin rides after the address behind a NUL (`transforms.paths.PIN`: no path or member name
holds one), so the printed name stays the address alone (`transforms.paths.listed_name`, used
for every Failure and `image/filename`), the same every run. It holds:

- `h<digest>`: a 64-bit BLAKE2 digest of the member's own 512-byte header (the block before
  its data: name, size, mtime, mode, owner, checksum). A read takes that block with the data
  and checks it, so a rewritten archive fails the member ("archive changed since it was
  listed") instead of giving it another member's bytes. (The stored checksum alone is a plain
  sum: `c1/004.jpg` and `c2/035.jpg` of nearly equal sizes share it.)
- `g<generation>` (gs://): the object's generation when indexed; the read asks for it, so an
  object overwritten since is not read (Cloud Storage answers 404);
- `r<path>`: the file the bytes are read from when it is not the archive (the uncompressed
  copy of a `.tar.gz` in the run's temp folder), so failures name the `.tar.gz`, not its copy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

from transforms.paths import PIN

# <archive>#<member>@<offset>+<size>: the archive is everything up to the first `.tar#`
# (or `.tgz#`, `.tar.gz#`); the offset and size are the last `@<digits>+<digits>`.
_ADDRESS = re.compile(
    r"(?P<archive>.+?\.(?:tar|tgz|tar\.gz))#(?P<member>.*)@(?P<offset>\d+)\+(?P<size>\d+)", re.I | re.S
)
BLOCK = 512  # a tar block; a member's own header is the block before its data


@dataclasses.dataclass(frozen=True)
class MemberAddress:
    """Where a member's bytes are: `size` bytes at `offset` of the file `archive`; `header`,
    `generation` and `read_from` are its pin (module docstring), None when it has none."""

    archive: str
    member: str
    offset: int
    size: int
    header: str | None = None
    generation: int | None = None
    read_from: str | None = None

    @property
    def source(self) -> str:
        """The file holding the member's bytes: the archive, or its uncompressed copy."""
        return self.read_from or self.archive


def member_address(archive: str, member: str, offset: int, size: int) -> str:
    """The printed address of a member (what failures and `image/filename` show)."""
    return f"{archive}#{member}@{offset}+{size}"


def pinned_address(
    archive: str,
    member: str,
    offset: int,
    size: int,
    header: str,
    generation: int | None = None,
    read_from: str | None = None,
) -> str:
    """The address of a member with its pin, as it travels in ImageFile.path / ImageRecord.path."""
    pin = f"{PIN}h{header}"
    if generation is not None:
        pin += f"{PIN}g{generation}"
    if read_from is not None:
        pin += f"{PIN}r{read_from}"
    return member_address(archive, member, offset, size) + pin


def parse_address(path: str) -> MemberAddress | None:
    """The MemberAddress that `path` spells, or None for an ordinary file path (which never
    parses: it ends in an image extension, an address in `+<digits>` and its pin)."""
    if "#" not in path:
        return None
    address, *pin = path.split(PIN)
    m = _ADDRESS.fullmatch(address)
    if m is None:
        return None
    fields = {part[0]: part[1:] for part in pin if part}
    return MemberAddress(
        m["archive"],
        m["member"],
        int(m["offset"]),
        int(m["size"]),
        fields.get("h"),
        int(fields["g"]) if "g" in fields else None,
        fields.get("r"),
    )


def header_digest(block: bytes) -> str:
    """What pins a member's own header (module docstring): 16 hex digits."""
    return hashlib.blake2b(block, digest_size=8).hexdigest()


def header_holds(block: bytes, address: MemberAddress) -> bool:
    """True if `block`, read just before the member's data, is still the header it was listed with."""
    return len(block) == BLOCK and header_digest(block) == address.header
