"""Docker build contexts, without Docker: the ARGs a Dockerfile declares, `.dockerignore`
rules as Docker reads them, and the files a context holds. Pure functions over text and the
file tree; `images` streams what they select to `docker build -`.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["IgnoreRule", "context_files", "dockerfile_args", "is_ignored", "parse_dockerignore"]


def dockerfile_args(text: str) -> dict[str, str | None]:
    """The ARG declarations of a Dockerfile, by name, with their defaults (None: no default).

    Handles line continuations, comments and quoting; a name declared twice keeps its first
    default, as the first declaration is the one before FROM that the FROM line sees.
    """
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    args: dict[str, str | None] = {}
    for line in logical:
        instruction, _, rest = line.partition(" ")
        if instruction.upper() != "ARG":
            continue
        for word in shlex.split(rest, comments=False):
            name, sep, default = word.partition("=")
            args.setdefault(name, default if sep else None)
    return args


@dataclass(frozen=True, slots=True)
class IgnoreRule:
    """One line of a .dockerignore: a path pattern, and whether it excludes or re-includes."""

    pattern: re.Pattern[str]
    excludes: bool


def parse_dockerignore(text: str) -> tuple[IgnoreRule, ...]:
    """Docker's .dockerignore rules: `*`, `?` and `[...]` within one path segment, `**` across
    segments, a leading `!` re-includes, the last matching line wins, and a pattern that names a
    directory covers everything below it."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        excludes = not line.startswith("!")
        if not excludes:
            line = line[1:].strip()
        line = posixpath.normpath(line).lstrip("/")
        rules.append(IgnoreRule(re.compile(_pattern_regex(line)), excludes))
    return tuple(rules)


def _pattern_regex(pattern: str) -> str:
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            negate = body[:1] in ("!", "^")
            body = body[1:] if negate else body
            out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "^" + "".join(out) + "(?:/.*)?$"


def is_ignored(path: str, rules: Sequence[IgnoreRule]) -> bool:
    """Whether `path` (relative to the context, `/`-separated) stays out of the build context."""
    ignored = False
    for rule in rules:
        if rule.pattern.match(path):
            ignored = rule.excludes
    return ignored


def context_files(root: Path, rules: Sequence[IgnoreRule]) -> Iterator[tuple[str, Path]]:
    """The files (and symlinks) of a build context rooted at `root`, as (name in context, path),
    in a stable order. Ignored directories are not walked unless a `!` rule could re-include
    something."""
    prune = all(rule.excludes for rule in rules)
    for directory, dirnames, filenames in os.walk(root):
        here = Path(directory)
        relative = here.relative_to(root).as_posix()
        prefix = "" if relative == "." else relative + "/"
        if prune:
            dirnames[:] = [d for d in dirnames if not is_ignored(prefix + d, rules)]
        dirnames.sort()
        # os.walk does not descend into symlinked directories: keep them as links, as Docker does.
        links = [d for d in dirnames if (here / d).is_symlink()]
        for name in sorted(filenames + links):
            if not is_ignored(prefix + name, rules):
                yield prefix + name, here / name
