"""Markup stripping for the default corpus: reStructuredText and POD to plain prose.

The goal is language-model text, not a faithful rendering: keep headings and prose paragraphs
(including the bodies of admonitions and API descriptions), drop code, tables, tables of contents,
comments and directive arguments, and unwrap hard-wrapped lines into one line per paragraph (list
items keep their own line). Pure Python, no third-party dependencies.
"""

from __future__ import annotations

import html.entities
import re

# --- reStructuredText -----------------------------------------------------------------------

# Directives whose whole body is code, tables, navigation or metadata: dropped with the body.
_RST_DROP = frozenset(
    """
    code code-block sourcecode literalinclude highlight parsed-literal doctest testcode testoutput
    testsetup testcleanup productionlist toctree contents sectnum include raw math image figure
    table csv-table list-table flat-table tabularcolumns index meta moduleauthor sectionauthor
    module currentmodule default-role role audit-event audit-event-table kernel-doc kernel-abi
    kernel-feat kernel-include kernel-figure kernel-image kernel-render graphviz cssclass
    rst-class class c:namespace c:namespace-push c:namespace-pop cpp:namespace maintainers-include
    literal-block ifconfig digraph pycon opcode-table availability spelling
    """.split()
)
# Directives whose argument is readable text (a title or the first sentence): kept.
_RST_TITLE_ARGS = frozenset(
    """
    note warning tip hint important attention caution danger error admonition seealso topic
    sidebar rubric impl-detail
    """.split()
)
_RST_VERSION = {
    "versionadded": "New in version {}.",
    "versionchanged": "Changed in version {}.",
    "deprecated": "Deprecated since version {}.",
    "deprecated-removed": "Deprecated since version {}.",
}

_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([A-Za-z][\w:.+-]*)::(?:\s+(.*))?$")
_COMMENT = re.compile(r"^(\s*)(?:[-*+]\s+)?\.\.(?:\s|$)")
_ADORNMENT = re.compile(r"^\s*([!-/:-@\[-`{-~])\1+\s*$")
_SIMPLE_TABLE_BORDER = re.compile(r"^\s*=+(?:\s+=+)+\s*$")
_GRID_TABLE = re.compile(r"^\s*\+[-=+]+\+?\s*$")
_OPTION = re.compile(r"^\s*:[\w -]+:(\s.*)?$")
_FIELD = re.compile(r"^:([^:`]+):(?:\s+(.*))?$")
_BULLET = re.compile(r"^(?:[-*+•]|\d+[.)]|#\.|[a-zA-Z][.)]|\(\d+\))\s+")

_ROLE = re.compile(r":([A-Za-z][\w:.+-]*):`([^`]+)`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]*>`__?")
_REF = re.compile(r"`([^`]+)`__?")
_LITERAL = re.compile(r"``(.+?)``")
_INTERPRETED = re.compile(r"`([^`]+)`")
_STRONG = re.compile(r"\*\*(\S(?:.*?\S)?)\*\*")
_EMPH = re.compile(r"(?<![\w*\\])\*(\S(?:[^*]*?\S)?)\*(?![\w*])")
_NAMED_REF = re.compile(r"\b([A-Za-z][A-Za-z0-9-]*)__?(?=[\s.,;:!?)]|$)")
_SUBST = re.compile(r"\|([A-Za-z][\w -]*?[\w])\|(?:_)?")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _role_text(content: str) -> str:
    """`Title <target>` -> Title; `~a.b.c` -> c; `!name` -> name."""
    m = re.match(r"^(.*?)\s*<[^<>]*>$", content, re.S)
    if m and m.group(1):
        return m.group(1)
    if content.startswith("~"):
        return content[1:].rsplit(".", 1)[-1]
    return content.lstrip("!")


def _role_sub(m: re.Match) -> str:
    role, content = m.group(1).lower(), _role_text(m.group(2))
    if role in ("pep", "rfc") and content[:1].isdigit():
        return f"{role.upper()} {content}"
    return content


def rst_inline(text: str) -> str:
    """Replace reST inline markup by its text (``literals`` are kept verbatim)."""
    parts = _LITERAL.split(text)  # odd items: literal contents, where backslashes are literal
    for i in range(0, len(parts), 2):
        t = _ROLE.sub(_role_sub, parts[i])
        t = _LINK.sub(r"\1", t)
        t = _REF.sub(lambda m: _role_text(m.group(1)), t)
        t = _INTERPRETED.sub(r"\1", t)
        t = _STRONG.sub(r"\1", t)
        t = _EMPH.sub(r"\1", t)
        t = _NAMED_REF.sub(r"\1", t)
        t = _SUBST.sub(r"\1", t)
        parts[i] = re.sub(r"\\(.)", r"\1", t.replace("\\ ", ""))
    return "".join(parts)


def _skip_block(lines: list[str], start: int, base: int) -> int:
    """Index of the first non-blank line at indent <= base after `start`."""
    j, n = start, len(lines)
    while j < n and (not lines[j].strip() or _indent(lines[j]) > base):
        j += 1
    return j


def _rst_directive(lines: list[str], i: int, m: re.Match, kept: list[str]) -> int:
    """Keep what a directive at line `i` says in prose (a version note, a title argument; a
    dropped directive: nothing) into `kept`; the index of the line to read next."""
    n, ind = len(lines), _indent(lines[i])
    name = m.group(2).lower()
    arg = (m.group(3) or "").strip()
    short = name.split(":")[-1]
    j = i + 1
    while j < n and lines[j].strip() and _OPTION.match(lines[j]):
        j += 1  # directive options
    if name in _RST_DROP or short in _RST_DROP:
        kept.append("")
        return _skip_block(lines, j, ind)
    kept.append("")
    if short in _RST_VERSION and arg:
        version, _, rest = arg.partition(" ")
        kept.append(_RST_VERSION[short].format(version))
        if rest.strip():
            kept.append(rest.strip())
    elif short in _RST_TITLE_ARGS and arg:
        kept.append(arg)
    kept.append("")
    return j  # body lines are kept (they are indented prose)


def _skip_simple_table(lines: list[str], i: int) -> int:
    """The index after a simple table whose first border is at line `i`."""
    borders, n = 0, len(lines)
    while i < n:
        if _SIMPLE_TABLE_BORDER.match(lines[i]):
            borders += 1
            if borders >= 2 and (i + 1 >= n or not lines[i + 1].strip()):
                return i + 1
        i += 1
    return i


def rst_to_text(src: str) -> str:
    """Strip reStructuredText markup; return prose paragraphs separated by blank lines."""
    lines = src.expandtabs(8).replace("\r\n", "\n").split("\n")
    kept: list[str] = []  # stripped lines; "" separates paragraphs
    i, n = 0, len(lines)

    while i < n:
        line = lines[i]
        s = line.strip()
        if not s:
            kept.append("")
            i += 1
            continue
        ind = _indent(line)
        m = _DIRECTIVE.match(line)
        if m:
            i = _rst_directive(lines, i, m, kept)
            continue
        if _COMMENT.match(line):  # comment, hyperlink target, substitution definition
            i = _skip_block(lines, i + 1, ind)
            kept.append("")
            continue
        if _ADORNMENT.match(line) and len(s) >= 2:  # section over/underline or transition
            i += 1
            continue
        if _GRID_TABLE.match(line):
            while i < n and lines[i].strip():
                i += 1
            continue
        if _SIMPLE_TABLE_BORDER.match(line):
            i = _skip_simple_table(lines, i)
            continue
        if s.startswith(">>>"):  # doctest block runs to the next blank line
            while i < n and lines[i].strip():
                i += 1
            continue
        if s.endswith("::"):  # paragraph introducing a literal (code) block
            text = s[:-2].rstrip()
            if text:
                colon = not (text.endswith(":") or s[:-2].endswith(" "))
                kept.append(text + (":" if colon else ""))
            j = i + 1
            while j < n and not lines[j].strip():
                j += 1
            i = _skip_block(lines, j, ind) if j < n and _indent(lines[j]) > ind else i + 1
            kept.append("")
            continue
        fm = _FIELD.match(s)
        if fm:  # field list entry (":Author: name"): its own line
            kept.extend(["", f"{fm.group(1)}: {fm.group(2) or ''}".rstrip(), ""])
        else:
            kept.append(s)
        i += 1
    return _assemble(kept, rst_inline)


# --- POD -------------------------------------------------------------------------------------

_POD_CODE = re.compile(r"([A-Z])(<+)")


def _pod_entity(name: str) -> str:
    fixed = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/"}
    if name in fixed:
        return fixed[name]
    try:
        if name.lower().startswith("0x"):
            return chr(int(name, 16))
        if name.isdigit():
            return chr(int(name))
    except (ValueError, OverflowError):
        return ""
    cp = html.entities.name2codepoint.get(name)
    return chr(cp) if cp is not None else ""


def _pod_apply(letter: str, content: str) -> str:
    if letter in "XZ":
        return ""
    if letter == "E":
        return _pod_entity(content.strip())
    if letter == "L":
        if "|" in content:
            return content.split("|", 1)[0]
        if "://" in content:
            return content
        name, sep, section = content.partition("/")
        if sep:
            section = section.strip('"')
            return f"{section} in {name}" if name else section
        return content
    return content  # I B C F S and unknown codes: keep the text


def _pod_parse(s: str, i: int, closer: str | None) -> tuple[str, int]:
    """Parse formatting codes from s[i:] until `closer` ('>' or ' >>..'); return (text, end)."""
    out: list[str] = []
    while i < len(s):
        if closer == ">" and s[i] == ">":
            return "".join(out), i + 1
        if closer and closer != ">":
            m = re.match(r"\s+" + re.escape(closer.strip()), s[i:])
            if m and (i + m.end() >= len(s) or s[i + m.end()] != ">"):
                return "".join(out), i + m.end()
        m = _POD_CODE.match(s, i)
        if m:
            letter, brackets = m.group(1), m.group(2)
            j = m.end()
            if len(brackets) == 1:
                inner, j = _pod_parse(s, j, ">")
            else:
                if j < len(s) and s[j] in " \t\n":
                    inner, j = _pod_parse(s, j + 1, " " + ">" * len(brackets))
                else:  # not a valid multi-bracket code: literal text
                    out.append(s[i:j])
                    i = j
                    continue
            out.append(_pod_apply(letter, inner))
            i = j
            continue
        out.append(s[i])
        i += 1
    return "".join(out), i


def pod_inline(text: str) -> str:
    """Replace POD formatting codes (B<>, C<< >>, L<text|target>, E<gt>, ...) by their text."""
    return _pod_parse(text, 0, None)[0]


def pod_to_text(src: str) -> str:
    """Strip POD markup; return headings and prose paragraphs separated by blank lines."""
    paragraphs = re.split(r"\n[ \t]*\n", src.expandtabs(8).replace("\r\n", "\n"))
    kept: list[str] = []
    in_pod = True  # a .pod file starts in POD; text after =cut is code until the next command
    skip_until: str | None = None  # =begin FORMAT ... =end FORMAT
    bullet = ""
    for para in paragraphs:
        if not para.strip():
            continue
        if para.startswith("="):
            parts = para[1:].split(None, 1)
            cmd = parts[0] if parts else ""
            rest = " ".join(parts[1].split()) if len(parts) > 1 else ""
            if skip_until is not None:
                if cmd == "end" and rest.split()[:1] == [skip_until]:
                    skip_until = None
                continue
            in_pod = cmd != "cut"
            if cmd == "begin":
                skip_until = rest.split()[0] if rest else ""
            elif cmd.startswith("head") and rest:
                kept.extend(["", rest, ""])
            elif cmd == "item":
                if rest in ("*", "•", "") or re.fullmatch(r"\d+\.?", rest):
                    bullet = "- " if not rest[:1].isdigit() else rest.rstrip(".") + ". "
                elif rest.startswith(("* ", "• ")):
                    kept.extend(["", "- " + rest[2:], ""])
                else:
                    kept.extend(["", rest, ""])
            continue  # =pod =cut =over =back =encoding =for =index and unknown commands
        if not in_pod or skip_until is not None:
            continue
        if para[:1] in (" ", "\t"):  # verbatim paragraph (code)
            continue
        kept.extend(["", bullet + " ".join(para.split()), ""])
        bullet = ""
    return _assemble(kept, pod_inline)


# --- shared ----------------------------------------------------------------------------------


def _prose_like(paragraph: str) -> bool:
    """Letters and spaces make up most of it (drops ASCII art, leftover tables, hex dumps)."""
    if len(paragraph) < 2:
        return False
    good = sum(c.isalpha() or c == " " for c in paragraph)
    return good >= 0.6 * len(paragraph)


def _assemble(kept: list[str], inline) -> str:
    """Join stripped lines into paragraphs (list items start a new line) and apply inline()."""
    paragraphs: list[str] = []
    current: list[str] = []

    def flush() -> None:
        if current:
            text = "\n".join(" ".join(inline(part).split()) for part in current)
            text = "\n".join(line for line in text.split("\n") if line)
            if _prose_like(text):
                paragraphs.append(text)
            current.clear()

    for line in kept:
        if not line:
            flush()
        elif current and not _BULLET.match(line):
            current[-1] += " " + line
        else:
            current.append(line)
    flush()
    return "\n\n".join(paragraphs)
