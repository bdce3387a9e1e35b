"""Fitting output into the terminal: compact tables and shell commands wrapped with ` \\`.

Every table the CLI prints is built by `table()`: no vertical rules, two spaces between columns, so
that 8-10 columns fit in 80. Numeric and name columns never wrap (rich would cut them with `…`);
free-text columns wrap at spaces instead. Cells are plain text: a name with `[brackets]` (a model,
cluster, pool or GPU name, a path) is printed as written, never read as Rich markup.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["PlainTable", "table", "add_columns", "wrap_command", "shell_words", "print_command"]


class PlainTable(Table):
    """A rich Table whose string cells are plain text, not markup."""

    def add_row(self, *renderables, **kwargs) -> None:  # type: ignore[override]
        super().add_row(*(Text(r) if isinstance(r, str) else r for r in renderables), **kwargs)


def table(title: str | None = None, *, caption: str | None = None) -> Table:
    """A compact table: a rule under the header, no vertical lines, no outer edge."""
    return PlainTable(title=title, caption=caption, box=box.SIMPLE_HEAD, show_edge=False, header_style="bold",
                 padding=(0, 1, 0, 1), collapse_padding=True, pad_edge=False, title_justify="left",
                 caption_justify="left")


def add_columns(t: Table, spec: str) -> Table:
    """Columns from a compact spec: `name:r` right-aligned, `name:w` free text that may wrap; the
    rest are left-aligned; only `:w` columns may wrap."""
    for item in spec.split("|"):
        name, _, flags = item.partition(":")
        t.add_column(name, justify="right" if "r" in flags else "left", no_wrap="w" not in flags,
                     overflow="fold" if "w" in flags else "ellipsis")
    return t


def shell_words(line: str) -> list[str]:
    """Split a shell line at unquoted blanks, keeping quotes and backslash escapes inside words
    (the words re-joined with single spaces are the same command)."""
    words: list[str] = []
    cur: list[str] = []
    quote = ""
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            cur.append(c)
            if c == "\\" and quote == '"' and i + 1 < len(line):
                cur.append(line[i + 1])
                i += 1
            elif c == quote:
                quote = ""
        elif c == "\\" and i + 1 < len(line):
            cur += [c, line[i + 1]]
            i += 1
        elif c in "'\"":
            quote = c
            cur.append(c)
        elif c in " \t":
            if cur:
                words.append("".join(cur))
                cur = []
        else:
            cur.append(c)
        i += 1
    if cur:
        words.append("".join(cur))
    return words


def wrap_command(text: str, width: int) -> str:
    """Break every line longer than `width` between shell words, ending the broken lines with ` \\`
    and indenting the continuations by four more spaces: the result runs exactly like the input.
    A flag stays on the line of its value when the two fit. Comment lines are re-wrapped as
    comments. A single word too long for an indented continuation (a long quoted value) is indented
    less, down to none (indentation means nothing to the shell); one longer than the width stays whole."""
    out: list[str] = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        body = line.lstrip()
        indent = line[: len(line) - len(body)]
        if body.startswith("#"):
            out += _wrap_comment(body, indent, width)
            continue
        words = shell_words(body)
        tail = ""
        if words and words[-1] == "\\":  # already a continuation line
            words.pop()
            tail = " \\"
        groups: list[str] = []
        for word in words:  # a flag keeps its value on its line (`--tp-size 8`) unless the pair is too long
            pair = f"{groups[-1]} {word}" if groups else ""
            if (groups and groups[-1].startswith("-") and " " not in groups[-1] and not word.startswith("-")
                    and len(indent) + 4 + len(pair) + 2 <= width):
                groups[-1] = pair
            else:
                groups.append(word)
        cur = indent + groups[0]
        for word in groups[1:]:
            if len(cur) + 1 + len(word) + 2 <= width:
                cur += " " + word
            else:
                out.append(cur + " \\")
                pad = min(len(indent) + 4, max(width - 2 - len(word), 0))
                cur = " " * pad + word
        out.append(cur + tail)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _wrap_comment(body: str, indent: str, width: int) -> list[str]:
    words = body.lstrip("#").split()
    lines, cur = [], indent + "#"
    for word in words:
        if len(cur) + 1 + len(word) > width and cur != indent + "#":
            lines.append(cur)
            cur = indent + "#"
        cur += " " + word
    lines.append(cur)
    return lines


def print_command(console: Console, text: str) -> None:
    """A copy-pasteable command block at the console's width."""
    console.print(wrap_command(text.rstrip("\n"), console.width), markup=False, highlight=False, soft_wrap=True)
