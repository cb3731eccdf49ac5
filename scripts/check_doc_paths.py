#!/usr/bin/env python3
"""Every path README.md and docs/ARCHITECTURE.md name must exist in the repository.

    python3 scripts/check_doc_paths.py [FILE.md ...]

Paths are taken from the prose (fenced code blocks hold examples: user code, commands
and their output, and are skipped):
- inline code that looks like a repository path: `core/src/buffer.rs`, `conformance/`,
  `.ci/run`, `README.md`; `{a,b}` alternatives are expanded and `*` is a glob that must
  match something; paths inside inline code are resolved from the repository root;
- markdown links to local files: [SAFETY.md](SAFETY.md), resolved from the page's folder
  (an `#anchor` is dropped).
Not paths: URLs, absolute paths (`/proc`), crate and item names (`cudabuf::Context`),
commands and anything else with a space (`cargo test`), environment settings (`A=b`),
and words with a slash that are not file names (`H2D/D2H`: no component is a file or
folder name of the repository's shape, see `looks_like_path`).

Exits 1 and lists each missing path with the file and line that names it.
Standard library only.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILES = ["README.md", "docs/ARCHITECTURE.md"]

# Being created right now by other changes; remove each entry once it exists.
NOT_YET_CREATED = {
    "tests/out-of-tree-backend/",
}

INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FILE_SUFFIX = re.compile(r"\.(rs|md|py|sh|toml|png|json|lock|yml|yaml|txt|cfg|pyi)$")


def looks_like_path(text: str) -> bool:
    """Inline code that names a repository path rather than code or a command."""
    if not text or any(c.isspace() for c in text):
        return False
    if "://" in text or "::" in text or "=" in text or text.startswith(("/", "-", "$", "~")):
        return False
    if not re.fullmatch(r"[A-Za-z0-9_.*{},/-]+", text):
        return False
    if "/" not in text:
        # A bare name: only a file at the root (README.md, CHANGELOG.md, Cargo.toml).
        return bool(FILE_SUFFIX.search(text)) and text[0].isupper()
    first = text.split("/", 1)[0]
    # The first component is a folder of the repository's shape (lowercase words with
    # dashes or underscores, or a dot folder such as .ci), or the path ends in a file
    # name with a known suffix: `H2D/D2H` and `sim|cuda` are not paths.
    return bool(re.fullmatch(r"\.?[a-z][a-z0-9_-]*", first)) or bool(FILE_SUFFIX.search(text))


def expand_braces(text: str) -> list[str]:
    """`a/{b,c}.rs` -> [`a/b.rs`, `a/c.rs`] (any number of brace groups, not nested)."""
    parts = re.split(r"\{([^{}]*)\}", text)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def exists(rel: str, base: Path) -> bool:
    target = base / rel
    try:
        from_root = Path(os.path.normpath(target)).relative_to(ROOT).as_posix()
    except ValueError:
        from_root = rel  # outside the repository: checked as it is
    if from_root in NOT_YET_CREATED or from_root + "/" in NOT_YET_CREATED:
        return True
    if "*" in rel:
        return bool(glob.glob(str(target)))
    if rel.endswith("/"):
        return target.is_dir()
    return target.exists()


def prose_lines(path: Path):
    """(line number, text) of each line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if marker:
            if fence is None:
                fence = marker.group(1)[0] * 3
            elif stripped.startswith(fence):
                fence = None
            continue
        if fence is None:
            yield number, line


def named_paths(path: Path):
    """(line number, path as written, path to check, folder it is relative to)."""
    for number, line in prose_lines(path):
        for code in INLINE_CODE.findall(line):
            if looks_like_path(code):
                for rel in expand_braces(code):
                    yield number, code, rel, ROOT
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, mailto:, or an anchor on the same page
            rel = target.split("#", 1)[0]
            if rel:
                yield number, target, rel, path.parent


def missing_paths(files: list[str]) -> list[str]:
    problems = []
    for name in files:
        path = ROOT / name
        if not path.is_file():
            problems.append(f"{name}: the file itself is missing")
            continue
        for number, written, rel, base in named_paths(path):
            if not exists(rel, base):
                shown = written if written == rel else f"{written} ({rel})"
                problems.append(f"{name}:{number}: {shown}")
    return problems


def main(argv: list[str]) -> int:
    files = argv or DEFAULT_FILES
    problems = missing_paths(files)
    if problems:
        print(f"paths named in {', '.join(files)} that do not exist:")
        for problem in problems:
            print(f"  {problem}")
        return 1
    print(f"every path named in {', '.join(files)} exists")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
