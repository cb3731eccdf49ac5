#!/usr/bin/env python3
"""Every public method of cudabuf's front-door types has a doc example and `# Errors`.

Scans core/src/**/*.rs for inherent `impl` blocks (generic ones too, as in
`impl<H: GiveBack> Transfer<H>`) of the front-door types (`TYPES` below: Context,
DeviceBuffer, HostBuffer, Stream, Event, Transfer, IpcMemHandle, Backend, and HostRange). For each `pub fn` / `pub unsafe fn`
(not `pub(crate)`, `pub(super)`, ...) in them, its doc comment must hold

- an example: a fenced code block that rustdoc runs or compiles (``` or ```rust,
  no_run, should_panic, ...; not ```text or ```ignore);
- a `# Errors` heading, when the return type is a `Result` (`Result<..>`,
  `std::result::Result<..>`, `crate::Result<..>`, ...).

Each offender is printed as `path:line Type::method: missing example|# Errors` and the
exit status is 1 if there is any. Docs may be separated from the `fn` by attributes
(`#[track_caller]`, `#[must_use]`, multi-line ones too) and signatures may span lines.

    python3 scripts/check_method_docs.py            # check core/src (from the repo root)
    python3 scripts/check_method_docs.py --stats    # also: methods with an example per type
    python3 scripts/check_method_docs.py --self-test
    python3 scripts/check_method_docs.py PATH...    # check other files or folders

The parser is a small lexer, not Rust's: it knows comments, strings (raw and byte ones),
char literals and lifetimes well enough to count braces, brackets and parentheses.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

TYPES = (
    "Context",
    "DeviceBuffer",
    "HostBuffer",
    "Stream",
    "Event",
    "Transfer",
    "IpcMemHandle",
    "Backend",
    "HostRange",  # HostBuffer's owned ranges, what asynchronous copies take
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PATHS = [ROOT / "core" / "src"]

# Fence info words that make rustdoc skip a block or treat it as not Rust.
NOT_AN_EXAMPLE = {"ignore", "text", "console", "sh", "bash", "python", "toml", "json", "c"}


@dataclass
class Method:
    path: str
    line: int  # 1-based line of the `fn` keyword's line
    type_name: str
    name: str
    docs: List[str]
    returns: str  # the return type as written ("" for none)

    def returns_result(self) -> bool:
        ret = strip_generics(self.returns).strip()
        return bool(ret) and ret.split("::")[-1].strip() == "Result"

    def has_example(self) -> bool:
        in_fence = False
        for line in self.docs:
            text = line.strip()
            if text.startswith("```"):
                if not in_fence:
                    info = {w.strip() for w in text[3:].split(",") if w.strip()}
                    if not (info & NOT_AN_EXAMPLE):
                        return True
                in_fence = not in_fence
        return False

    def has_heading(self, heading: str) -> bool:
        in_fence = False
        for line in self.docs:
            text = line.strip()
            if text.startswith("```"):
                in_fence = not in_fence
            elif not in_fence and re.fullmatch(r"#\s+" + re.escape(heading) + r"\s*", text):
                return True
        return False

    def problems(self) -> List[str]:
        missing = []
        if not self.has_example():
            missing.append("example")
        if self.returns_result() and not self.has_heading("Errors"):
            missing.append("# Errors")
        return missing


def strip_generics(text: str) -> str:
    """`a::Result<X<Y>, Z>` -> `a::Result`: drop every `<...>` group."""
    out, depth = [], 0
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


@dataclass
class Line:
    """One source line, with what the lexer knew at its start."""

    text: str  # the line with comments and literal contents blanked out
    raw: str
    brace: int  # `{` depth at the line's start
    group: int  # `(` + `[` depth at the line's start
    in_block_comment: bool


def lex(source: str) -> List[Line]:
    """Blank out comments and the insides of literals, and record the nesting per line.

    Doc comments (`///`) are blanked like any comment in `text`; `raw` keeps them.
    """
    lines: List[Line] = []
    out: List[str] = []
    brace = group = 0
    i, n = 0, len(source)
    block = 0  # nested /* */ depth
    line_start = True
    start_state = (0, 0, False)
    raw_lines = source.split("\n")

    def end_line() -> None:
        nonlocal start_state
        lines.append(Line("".join(out), raw_lines[len(lines)], *start_state))
        out.clear()
        start_state = (brace, group, block > 0)

    while i < n:
        ch = source[i]
        if ch == "\n":
            end_line()
            i += 1
            continue
        if block:
            if source.startswith("/*", i):
                block += 1
                i += 2
            elif source.startswith("*/", i):
                block -= 1
                i += 2
            else:
                i += 1
            out.append(" ")
            continue
        if source.startswith("//", i):
            j = source.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if source.startswith("/*", i):
            block = 1
            out.append("  ")
            i += 2
            continue
        m = re.compile(r'b?r(#*)"').match(source, i)
        if m and (i == 0 or not (source[i - 1].isalnum() or source[i - 1] == "_")):
            close = '"' + m.group(1)
            j = source.find(close, m.end())
            j = n if j < 0 else j + len(close)
            out.append('""')
            for _ in range(source.count("\n", i, j)):  # lines stay lines
                end_line()
            i = j
            continue
        if ch == '"' or (ch == "b" and source.startswith('b"', i)) or (ch == "c" and source.startswith('c"', i)):
            j = i + (1 if ch == '"' else 2)
            newlines = 0
            while j < n and source[j] != '"':
                if source[j] == "\\":
                    j += 1
                if j < n and source[j] == "\n":
                    newlines += 1
                j += 1
            out.append('""')
            for _ in range(newlines):
                end_line()
            i = j + 1
            continue
        if ch == "'":
            # A char literal ('x', '\n', '\u{7f}', '{') or a lifetime ('a).
            m = re.compile(r"'(\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'").match(source, i)
            if m:
                out.append("' '")
                i = m.end()
                continue
            out.append(ch)
            i += 1
            continue
        if ch == "{":
            brace += 1
        elif ch == "}":
            brace -= 1
        elif ch in "([":
            group += 1
        elif ch in ")]":
            group -= 1
        out.append(ch)
        i += 1
    end_line()
    return lines


IMPL_RE = re.compile(r"^\s*(?:unsafe\s+)?impl\b")
FN_RE = re.compile(
    r"^\s*pub\s+(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+(?:\"[^\"]*\"\s+)?)?fn\s+(\w+)"
)
DOC_RE = re.compile(r"^\s*///(?!/)(.*)$")


def skip_generics(text: str, start: int) -> int:
    """Index after a `<...>` group beginning at `start` (or `start` if none)."""
    j = start
    while j < len(text) and text[j].isspace():
        j += 1
    if j >= len(text) or text[j] != "<":
        return start
    depth = 0
    while j < len(text):
        if text[j] == "<":
            depth += 1
        elif text[j] == ">" and text[j - 1] != "-":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return j


def impl_type(header: str) -> Optional[str]:
    """The type of an inherent impl header (`impl<T> a::Type<T> where ... {`), or None for
    a trait impl or a type not checked."""
    m = IMPL_RE.match(header)
    if not m:
        return None
    rest = header[skip_generics(header, m.end()) :]
    rest = rest.split("{", 1)[0]
    rest = re.split(r"\bwhere\b", rest, 1)[0]
    if re.search(r"\bfor\b", strip_generics(rest)):
        return None  # `impl Trait for Type`
    path = strip_generics(rest).strip()
    name = path.split("::")[-1].strip()
    return name if name in TYPES else None


def item_text(lines: List[Line], start: int) -> Tuple[str, int]:
    """The text of the item header starting at `lines[start]`, up to the `{` or `;` that
    ends it at its own nesting (joined across lines), and the index of that line."""
    depth0 = lines[start].brace
    parts: List[str] = []
    k = start
    while k < len(lines):
        text = lines[k].text
        brace, group = lines[k].brace, lines[k].group
        for pos, ch in enumerate(text):
            if ch in "([":
                group += 1
            elif ch in ")]":
                group -= 1
            elif group == 0 and brace == depth0 and ch in "{;":
                parts.append(text[: pos + 1])
                return " ".join(parts), k
            if ch == "{":
                brace += 1
            elif ch == "}":
                brace -= 1
        parts.append(text)
        k += 1
    return " ".join(parts), k


def return_type(signature: str) -> str:
    """What follows the parameter list's `->`, up to `where` or the body."""
    open_paren = signature.find("(")
    if open_paren < 0:
        return ""
    depth = 0
    for j in range(open_paren, len(signature)):
        if signature[j] == "(":
            depth += 1
        elif signature[j] == ")":
            depth -= 1
            if depth == 0:
                tail = signature[j + 1 :]
                m = re.match(r"\s*->(.*)", tail, re.S)
                if not m:
                    return ""
                ret = m.group(1)
                ret = re.split(r"\bwhere\b", ret, 1)[0]
                return ret.rstrip().rstrip("{;").strip()
    return ""


def scan_source(path: str, source: str) -> List[Method]:
    lines = lex(source)
    methods: List[Method] = []
    # Open inherent impls of checked types: (type, brace depth of their body).
    impls: List[Tuple[str, int]] = []
    docs: List[str] = []
    k = 0
    while k < len(lines):
        line = lines[k]
        while impls and line.brace < impls[-1][1]:
            impls.pop()
        at_item_level = line.group == 0 and not line.in_block_comment
        doc = DOC_RE.match(line.raw) if at_item_level else None
        if doc:
            docs.append(doc.group(1))
            k += 1
            continue
        stripped = line.text.strip()
        if not at_item_level or not stripped:
            k += 1
            continue
        if stripped.startswith("#"):
            # An attribute (perhaps over several lines): docs stay attached across it.
            _, k = attribute_end(lines, k)
            k += 1
            continue
        in_impl = bool(impls) and line.brace == impls[-1][1]
        if IMPL_RE.match(line.text):
            header, end = item_text(lines, k)
            name = impl_type(header)
            if name:
                impls.append((name, line.brace + 1))
            docs = []
            k = end + 1
            continue
        fn = FN_RE.match(line.text)
        if in_impl and fn:
            signature, end = item_text(lines, k)
            methods.append(
                Method(path, k + 1, impls[-1][0], fn.group(1), docs, return_type(signature))
            )
            docs = []
            k = end + 1
            continue
        docs = []
        k += 1
    return methods


def attribute_end(lines: List[Line], k: int) -> Tuple[str, int]:
    """The attribute starting on line `k` and the index of the line it ends on."""
    group = lines[k].group
    parts: List[str] = []
    j = k
    while j < len(lines):
        text = lines[j].text
        for ch in text:
            if ch in "([":
                group += 1
            elif ch in ")]":
                group -= 1
        parts.append(text)
        if group <= 0:
            break
        j += 1
    return " ".join(parts), j


def rust_files(paths: Sequence[Path]) -> Iterator[Path]:
    for p in paths:
        if p.is_dir():
            yield from sorted(p.rglob("*.rs"))
        else:
            yield p


def display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def check(methods: Sequence[Method]) -> List[str]:
    out = []
    for m in methods:
        missing = m.problems()
        if missing:
            out.append(f"{m.path}:{m.line} {m.type_name}::{m.name}: missing {' and '.join(missing)}")
    return out


def stats(methods: Sequence[Method]) -> Dict[str, Tuple[int, int]]:
    counts: Dict[str, List[int]] = {t: [0, 0] for t in TYPES}
    for m in methods:
        counts[m.type_name][1] += 1
        if m.has_example():
            counts[m.type_name][0] += 1
    return {t: (c[0], c[1]) for t, c in counts.items()}


SAMPLE = r'''
use std::fmt;

/// A type.
pub struct Context;

impl Context {
    /// Documented, with an example and errors.
    ///
    /// # Errors
    /// Never.
    ///
    /// ```
    /// assert_eq!(1, 1);
    /// ```
    pub fn good(&self) -> Result<()> {
        let brace = '{';
        let s = "} { unbalanced in a string";
        let r = r#"} "quoted" {"#;
        Ok(())
    }

    /// No example here; and `# Errors` is missing too.
    pub fn bare(&self) -> crate::Result<u8> {
        Ok(1)
    }

    /// ```ignore
    /// not run
    /// ```
    pub fn ignored_only(&self) -> usize { 0 }

    /// Docs, then attributes between them and the fn.
    ///
    /// # Errors
    /// When `f` says so.
    ///
    /// ```
    /// assert!(true);
    /// ```
    #[must_use]
    #[cfg_attr(
        feature = "never",
        deprecated = "a multi-line attribute"
    )]
    #[track_caller]
    pub fn attributed<'a>(
        &'a self,
        f: impl Fn(&'a str) -> usize,
    ) -> std::result::Result<
        usize,
        String,
    > {
        Ok(f("x"))
    }

    /// ```
    /// assert!(true);
    /// ```
    pub unsafe fn unsafe_no_result(&self) -> Option<Result<u8>> { None }

    pub(crate) fn crate_only(&self) -> Result<()> { Ok(()) }
    pub(super) fn super_only(&self) {}
    fn private(&self) {}
}

impl<H: GiveBack> Transfer<H>
where
    H: Send,
{
    /// Not an example:
    /// ```text
    /// # Errors
    /// ```
    pub fn wait(self) -> Result<H> { todo!() }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { Ok(()) }
}

impl Other {
    pub fn unchecked(&self) -> Result<()> { Ok(()) }
}

mod inner {
    impl crate::Event {
        /// # Errors
        /// Sometimes.
        pub fn nested(&self) -> Result<()> { Ok(()) }
    }
}
'''

SAMPLE_EXPECTED = [
    "sample.rs:24 Context::bare: missing example and # Errors",
    "sample.rs:31 Context::ignored_only: missing example",
    "sample.rs:75 Transfer::wait: missing example and # Errors",
    "sample.rs:90 Event::nested: missing example",
]


def self_test() -> int:
    methods = scan_source("sample.rs", SAMPLE)
    found = [(m.type_name, m.name) for m in methods]
    expected_methods = [
        ("Context", "good"),
        ("Context", "bare"),
        ("Context", "ignored_only"),
        ("Context", "attributed"),
        ("Context", "unsafe_no_result"),
        ("Transfer", "wait"),
        ("Event", "nested"),
    ]
    ok = True
    if found != expected_methods:
        print(f"self-test: methods found {found}\n  expected {expected_methods}")
        ok = False
    attributed = next(m for m in methods if m.name == "attributed")
    if not attributed.returns_result() or not attributed.has_example():
        print(f"self-test: attributed: returns {attributed.returns!r}, docs {attributed.docs!r}")
        ok = False
    got = check(methods)
    if got != SAMPLE_EXPECTED:
        print("self-test: offenders\n  " + "\n  ".join(got))
        print("  expected\n  " + "\n  ".join(SAMPLE_EXPECTED))
        ok = False
    print("self-test: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if "--self-test" in args:
        return self_test()
    show_stats = "--stats" in args
    args = [a for a in args if a != "--stats"]
    if any(a.startswith("-") for a in args):
        print(__doc__)
        return 2
    paths = [Path(a) for a in args] or DEFAULT_PATHS
    methods: List[Method] = []
    for f in rust_files(paths):
        methods.extend(scan_source(display(f), f.read_text(encoding="utf-8")))
    if not methods:
        print("check_method_docs: no public method of " + ", ".join(TYPES) + " found")
        return 1
    offenders = check(methods)
    for line in offenders:
        print(line)
    if show_stats or offenders:
        for t, (with_example, total) in stats(methods).items():
            if total:
                print(f"{t}: {with_example}/{total} public methods with an example")
    print(
        f"check_method_docs: {len(methods)} public methods of the front-door types, "
        f"{len(offenders)} missing an example or # Errors"
    )
    return 1 if offenders else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
