#!/usr/bin/env python3
"""Writes an initrd (an uncompressed newc cpio archive, as the kernel reads it) that is the
same bytes for the same files: entries sorted by path, owner 0:0, every mtime
SOURCE_DATE_EPOCH, inode numbers by position. No cpio tool is needed.

    initrd.py OUT.cpio DEST=SRC [DEST=SRC ...]   (DEST is the path inside, SRC a file here)

Parent folders are added (mode 0755); a file keeps its executable bit (0755 or 0644).
"""
import os
import sys


def header(ino, mode, nlink, mtime, size, name):
    fields = [ino, mode, 0, 0, nlink, mtime, size, 0, 0, 0, 0, len(name) + 1, 0]
    return b"070701" + b"".join(b"%08X" % f for f in fields)


def pad(n):
    return b"\0" * ((4 - n % 4) % 4)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    files = {}
    for arg in sys.argv[2:]:
        dest, _, src = arg.partition("=")
        dest = dest.strip("/")
        if not dest or not src:
            sys.exit(f"bad entry {arg!r}: want DEST=SRC")
        files[dest] = src
    entries = {}
    for dest, src in files.items():
        parts = dest.split("/")
        for i in range(1, len(parts)):
            entries.setdefault("/".join(parts[:i]), None)
        entries[dest] = src
    out = bytearray()
    for ino, name in enumerate(sorted(entries), start=1):
        src = entries[name]
        raw = name.encode()
        if src is None:
            out += header(ino, 0o040755, 2, mtime, 0, raw) + raw + b"\0"
            out += pad(110 + len(raw) + 1)
            continue
        with open(src, "rb") as f:
            data = f.read()
        mode = 0o100755 if os.stat(src).st_mode & 0o111 else 0o100644
        out += header(ino, mode, 1, mtime, len(data), raw) + raw + b"\0"
        out += pad(110 + len(raw) + 1)
        out += data + pad(len(data))
    trailer = b"TRAILER!!!"
    out += header(0, 0, 1, 0, 0, trailer) + trailer + b"\0" + pad(110 + len(trailer) + 1)
    with open(sys.argv[1], "wb") as f:
        f.write(out)


if __name__ == "__main__":
    main()
