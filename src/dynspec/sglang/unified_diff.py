"""Unified diffs: parsed, and applied (or reversed) in memory, hunk by hunk, with their context
checked; what `dynspec patch` applies to an installed SGLang."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class PatchFormatError(ValueError):
    """A patch file that is not a well-formed unified diff."""


class PatchApplyError(ValueError):
    """A hunk whose context does not match the file."""


# --- unified diffs ---------------------------------------------------------------------

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[tuple[str, str]] = field(default_factory=list)  # (tag ' '|'-'|'+', text with newline)

    def side(self, reverse: bool) -> tuple[int, int, list[str], list[str]]:
        """(start, length, lines expected in the source, lines to write) for one direction."""
        src_tags, dst_tags = (" +", " -") if reverse else (" -", " +")
        src = [t for tag, t in self.lines if tag in src_tags]
        dst = [t for tag, t in self.lines if tag in dst_tags]
        start, length = (self.new_start, self.new_len) if reverse else (self.old_start, self.old_len)
        return start, length, src, dst


@dataclass
class FilePatch:
    path: str  # relative to the site-packages root (after stripping a/ or b/: -p1)
    hunks: list[Hunk]


def _strip_path(token: str) -> str:
    token = token.split("\t", 1)[0].strip()
    if token == "/dev/null":
        return token
    parts = token.split("/", 1)
    if len(parts) != 2 or not parts[1]:
        raise PatchFormatError(f"path {token!r} has no a/ or b/ prefix to strip (-p1)")
    return parts[1]


def parse_unified(text: str) -> list[FilePatch]:
    """Parse a unified diff (one or more files) into FilePatch objects."""
    lines = text.splitlines(keepends=True)
    out: list[FilePatch] = []
    i, n = 0, len(lines)
    while i < n:
        if not (lines[i].startswith("--- ") and i + 1 < n and lines[i + 1].startswith("+++ ")):
            if lines[i].startswith("@@"):
                raise PatchFormatError(f"line {i + 1}: hunk outside a file header")
            i += 1  # preamble: 'diff ...', 'Index:', comments
            continue
        old, new = _strip_path(lines[i][4:]), _strip_path(lines[i + 1][4:])
        if old == "/dev/null" or new == "/dev/null" or old != new:
            raise PatchFormatError(f"line {i + 1}: only in-place edits of one file are supported ({old} -> {new})")
        i += 2
        hunks: list[Hunk] = []
        while i < n and lines[i].startswith("@@"):
            m = _HUNK.match(lines[i])
            if not m:
                raise PatchFormatError(f"line {i + 1}: malformed hunk header {lines[i].rstrip()!r}")
            h = Hunk(int(m[1]), int(m[2] or 1), int(m[3]), int(m[4] or 1))
            i += 1
            need_old, need_new = h.old_len, h.new_len
            while need_old > 0 or need_new > 0:
                if i >= n:
                    raise PatchFormatError(f"{new}: hunk @@ -{h.old_start} ends early (truncated patch?)")
                line = lines[i]
                tag, body = line[:1], line[1:]
                if line in ("\n", "\r\n"):  # a context line whose leading space was stripped
                    tag, body = " ", line
                if tag == "\\":
                    raise PatchFormatError(f"line {i + 1}: misplaced '\\ No newline' marker")
                if tag not in " -+":
                    raise PatchFormatError(f"line {i + 1}: unexpected {line[:20]!r} inside a hunk of {new}")
                if tag in " -":
                    need_old -= 1
                if tag in " +":
                    need_new -= 1
                if need_old < 0 or need_new < 0:
                    raise PatchFormatError(f"line {i + 1}: hunk of {new} longer than its header says")
                h.lines.append((tag, body))
                i += 1
                if i < n and lines[i].startswith("\\"):  # '\ No newline at end of file'
                    h.lines[-1] = (tag, body.rstrip("\r\n"))
                    i += 1
            hunks.append(h)
        if not hunks:
            raise PatchFormatError(f"{new}: file header with no hunks")
        out.append(FilePatch(new, hunks))
    if not out:
        raise PatchFormatError("no file diffs found")
    return out


def apply_hunks(text: str, hunks: list[Hunk], *, reverse: bool = False, name: str = "file") -> str:
    """Apply (or reverse) hunks to text; every context and removed line must match exactly."""
    old = text.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    for h in hunks:
        start, length, src, dst = h.side(reverse)
        begin = start - 1 if length > 0 else start  # a pure insertion names the line before it
        if begin < pos or begin + len(src) > len(old) or old[begin:begin + len(src)] != src:
            raise PatchApplyError(f"{name}: hunk at line {start} does not match")
        out.extend(old[pos:begin])
        out.extend(dst)
        pos = begin + len(src)
    out.extend(old[pos:])
    return "".join(out)
