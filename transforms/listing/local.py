"""The local walk: every file below a folder, as the listing sees it (pure).

In: a local root. Out: ImageFile (and, when asked, ArchiveFile) in a deterministic depth-first
order. Hidden entries are never listed; folder links are followed with loop protection; any
depth (iterative, no recursion limit).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from transforms.failures import USER_ERROR_MARKER
from transforms.listing.archives import ArchiveFile, archive_kind
from transforms.listing.skips import SkipCounts
from transforms.paths import IMAGE_EXTENSIONS, has_image_extension, relative_path
from transforms.records import ImageFile


def _unlistable(error: OSError) -> None:
    # A folder that cannot be listed would drop its whole subtree without a trace.
    raise ValueError(f"{USER_ERROR_MARKER} cannot list {error.filename}: {error.strerror}")


# Folders that macOS archives add beside the real ones (they hold `._*` AppleDouble files).
HIDDEN_FOLDERS = frozenset({"__MACOSX"})


def is_hidden(name: str) -> bool:
    """True for a file or folder name that is never listed: a dot name (`.ipynb_checkpoints`,
    `.DS_Store`, `._photo.jpg`, `.git`) or a folder of HIDDEN_FOLDERS.

    The one rule of what is not data: a hidden folder is no class (it never shifts the class
    ids of labels.txt or the TFDS ClassLabel), and nothing below it is listed or counted, as
    Keras' `image_dataset_from_directory` skips dot folders.
    """
    return name.startswith(".") or name in HIDDEN_FOLDERS


def hidden_entry(relpath: str) -> str | None:
    """`relpath` up to its first hidden part (`a/.git` of `a/.git/x/y`), or None if no part is."""
    parts = relpath.split("/")
    for i, part in enumerate(parts):
        if is_hidden(part):
            return "/".join(parts[: i + 1])
    return None


def is_listed(relpath: str) -> bool:
    """False when any part of the '/'-separated `relpath` is hidden (see is_hidden)."""
    return hidden_entry(relpath) is None


def _ids(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def walk_folders(
    root: str,
    onerror: Callable[[OSError], None] = _unlistable,
    on_hidden: Callable[[str], None] | None = None,
) -> Iterable[tuple[str, list[str]]]:
    """(folder, sorted names of its entries that are not folders) for `root` and every folder
    below it, depth first, hidden entries (is_hidden) left out.

    Iterative (no recursion limit); holds one folder's entries plus the folders still to
    visit. Links to folders are followed (as `os.walk(followlinks=True)`), but not a link to
    a folder it is inside of (a loop). Entries that are neither folders nor links to folders
    (files, FIFOs, devices, broken links) are returned as names; the reader decides.

    Args:
      onerror: called with the OSError of a folder that cannot be listed (it may raise).
      on_hidden: called with the path of each hidden entry left out (not what is below it).
    """
    try:
        stack = [(root, (_ids(os.stat(root)),))]  # (folder, (device, inode) of it and those above)
    except OSError as e:
        onerror(e)
        return
    while stack:
        path, above = stack.pop()
        try:
            with os.scandir(path) as entries:
                listed = sorted((e.name, e) for e in entries)
        except OSError as e:
            onerror(e)
            continue
        if on_hidden is not None:
            for name, entry in listed:
                if is_hidden(name):
                    on_hidden(entry.path)
        listed = [(name, entry) for name, entry in listed if not is_hidden(name)]
        names, below = [], []
        for name, entry in listed:
            try:
                if entry.is_dir(follow_symlinks=False):
                    below.append((entry.path, (*above, _ids(entry.stat(follow_symlinks=False)))))
                    continue
                if entry.is_symlink() and entry.is_dir(follow_symlinks=True):
                    ids = _ids(entry.stat(follow_symlinks=True))
                    if ids not in above:  # not a link to a folder it is inside of (a loop)
                        below.append((entry.path, (*above, ids)))
                    continue
            except OSError:
                pass  # vanished or unreadable: listed as a name, and fails when read
            names.append(name)
        yield path, names
        stack.extend(reversed(below))


def walk_local(
    root: str,
    extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
    archives: bool = False,
    skips: SkipCounts | None = None,
) -> Iterable[ImageFile | ArchiveFile]:
    """Every file below local `root` with an image extension, whatever it turns out to be
    (with `archives`, also every tar archive as an ArchiveFile), in walk order; `skips`
    counts the rest (hidden entries, other extensions: skips.py).

    Unlike Beam's local match (which silently skips the files it cannot stat), nothing is
    dropped: broken links, FIFOs and vanished files are listed with size 0 and fail by name
    when read. The root is never a pattern: `[`, `*` and `?` in it are plain characters.
    """
    on_hidden = None if skips is None else (lambda path: skips.hidden(relative_path(path, root)))
    for dirpath, names in walk_folders(root, on_hidden=on_hidden):
        for name in names:
            archive = archives and archive_kind(name) is not None
            if not archive and not has_image_extension(name, extensions):
                if skips is not None:
                    skips.other(name)
                continue
            path = os.path.join(dirpath, name)
            try:
                size = os.stat(path).st_size
            except OSError:
                size = 0
            yield (
                archive_in(path, root, size) if archive else ImageFile(path, relative_path(path, root), size)
            )


def archive_in(path: str, root: str, size: int) -> ArchiveFile:
    """The ArchiveFile of an archive found at `path` below the listing's `root`."""
    rel = relative_path(path, root)
    return ArchiveFile(path, rel.rsplit("/", 1)[0] + "/" if "/" in rel else "", size)


def is_archive_input(root: str) -> bool:
    """True if `root` names archives itself (a tar file or a glob of them), not a folder/prefix."""
    return archive_kind(root) is not None and ("://" in root or not os.path.isdir(root))
