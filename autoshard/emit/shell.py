"""Find the launch command in a shell command line or script, without running a shell.

What is read: `\\`-continued lines are joined, `# comments` dropped, words split as a POSIX shell
would. Launch scripts (Megatron-LM's own examples among them) keep their flags in bash arrays
(`ARGS=(--num-layers 32 ...)`, `ARGS+=(...)`, expanded as `${ARGS[@]}`) and their sizes in plain
assignments (`GPUS_PER_NODE=8`, `NNODES=${NNODES:-2}`, `WORLD=$((GPUS_PER_NODE*NNODES))`), so exactly
those are resolved: `$NAME` / `${NAME}` become the literal value a script assigned to NAME (or the
`${NAME:-default}` default; integer `$((...))` arithmetic over such values is evaluated). Nothing
else is expanded: no environment lookups, command substitution or other expansions;
such words stay as written (`"$DATA_PATH"` is kept as the text `$DATA_PATH`). Of an
`if ... elif/else ... fi` block only the first branch is read.

And the other way, for the emitters: `shell_word` quotes one word of a generated command so that the
shell reads it back as exactly that text (never running anything in it), and `comment` makes any text
safe for a one-line `# ...` comment.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass, field

__all__ = ["Launch", "read_launch", "shell_word", "shell_join", "comment", "path_component"]

_SAFE_WORD = re.compile(r"^[\w@%+=:,./-]+$")
_VARIABLE_WORD = re.compile(r"^(?:\$[A-Za-z_]\w*|\$\{[A-Za-z_]\w*\})[\w@%+=:,./-]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]+")


def shell_word(value: str) -> str:
    """`value` as one shell word. A reference to a script variable (`$DATA_PATH`, `$HEAD_IP:5000`) is
    double-quoted so the shell expands that variable and nothing else; every other word is left bare
    only when it holds no shell syntax at all, else single-quoted (shlex.quote): `$(...)`, backticks,
    `;`, quotes, spaces and newlines in a name are then text, never commands."""
    if _VARIABLE_WORD.match(value):
        return f'"{value}"'
    return value if _SAFE_WORD.match(value) else shlex.quote(value)


def shell_join(words: list[str]) -> str:
    """A command line whose words the shell splits back into exactly `words`."""
    return " ".join(shell_word(w) for w in words)


def comment(text: str) -> str:
    """Text for a one-line `# ...` comment: control characters (a newline would end the comment and
    start a command), Unicode line separators and bidirectional overrides become single spaces."""
    return _CONTROL.sub(" ", text)


def path_component(name: str) -> str:
    """A file-name-safe form of a model name for default directories: letters, digits, `.`, `_` and
    `-` kept, every other run of characters one `_`."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
    return cleaned[:100]

_ASSIGN = re.compile(
    r"^\s*(?:export\s+|readonly\s+|local\s+|declare\s+(?:-\w+\s+)*)?([A-Za-z_]\w*)(\+?)=(.*)$"
)
_ARRAY_REF = re.compile(r"^\$\{([A-Za-z_]\w*)\[[@*]\]\}$")
_VAR_REF = re.compile(r"\$\{([A-Za-z_]\w*|\d+)(?::?[-=]([^}]*))?\}|\$([A-Za-z_]\w*)")
_ARITH = re.compile(r"^\$\(\((.*)\)\)\s*(?:#.*)?$")
_ENV_WORD = re.compile(r"^[A-Za-z_]\w*=")
_LAUNCHERS = {"torchrun", "srun", "mpirun", "deepspeed", "uv"}
_PY = re.compile(r"^python(\d+(\.\d+)?)?$")


@dataclass
class Launch:
    """The launch command: launcher words before the entry point, the entry point, and its arguments."""

    prefix: list[str]
    entry: str
    args: list[str]
    world_size: int | None
    warnings: list[str] = field(default_factory=list)


class _Script:
    def __init__(self) -> None:
        self.scalars: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}
        self.warnings: list[str] = []

    # ------------------------------------------------------------------ expansion
    def substitute(self, word: str) -> str:
        """Replace `$NAME`, `${NAME}` and `${NAME:-default}` inside a word by literal values."""

        def one(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(3)
            value = self.scalars.get(name)
            if value is not None and "$" not in value:
                return value
            if m.group(2) is not None and "$" not in m.group(2):
                return m.group(2).strip("\"'")
            return m.group(0)

        return _VAR_REF.sub(one, word)

    def arithmetic(self, expr: str) -> str:
        """`$(( expr ))` over integers and variables holding integers; the text itself when it is anything
        else (it then stays unresolved)."""
        text = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", r"\1", expr)
        text = re.sub(r"[A-Za-z_]\w*", lambda m: self.scalars.get(m.group(0), "?"), text)
        if not re.fullmatch(r"[\d\s+*/()-]+", text):
            return f"$(({expr}))"
        try:
            return str(_int_expr(ast.parse(text.replace("/", "//"), mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
            return f"$(({expr}))"

    def expand(self, words: list[str]) -> list[str]:
        out: list[str] = []
        for w in words:
            m = _ARRAY_REF.match(w)
            if m:
                out += self.arrays.get(m.group(1), [w])
                continue
            plain = re.match(r"^\$\{?([A-Za-z_]\w*)\}?$", w)
            if plain and plain.group(1) in self.arrays:
                out += self.arrays[plain.group(1)][:1]
                continue
            value = self.substitute(w)
            # an unquoted whole-word variable holding several words splits, as in bash ("uv run")
            out += value.split() if plain and value != w and " " in value.strip() else [value]
        return out

    def array_elements(self, words: list[str]) -> list[str]:
        """Array elements after expansion; an element written as one quoted "--flag value" string
        is split the way an unquoted `${ARR[@]}` splits it."""
        out: list[str] = []
        for w in self.expand(words):
            if w.startswith("-") and any(c.isspace() for c in w):
                out += [p.strip("\"'") for p in w.split()]
            else:
                out.append(w)
        return out


def _int_expr(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_int_expr(node.operand)
    if isinstance(node, ast.BinOp):
        left, right = _int_expr(node.left), _int_expr(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.FloorDiv):
            return left // right
    raise ValueError(type(node).__name__)


def _split(text: str) -> list[str] | None:
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return None


def _array_body(lines: list[str], i: int, rest: str) -> tuple[str, int]:
    """Text of an array literal from `rest` (after the opening parenthesis) to its closing one,
    with comments removed; returns it and the index of the line after it."""
    body: list[str] = []
    quote: str | None = None
    depth = 0
    text = rest
    while True:
        j = 0
        while j < len(text):
            c = text[j]
            if quote:
                if c == quote:
                    quote = None
                elif c == "\\" and quote == '"':
                    body.append(c)
                    j += 1
                    c = text[j] if j < len(text) else ""
                body.append(c)
            elif c in "'\"":
                quote = c
                body.append(c)
            elif c == "#" and (j == 0 or text[j - 1].isspace()):
                break
            elif c == "(":
                depth += 1
                body.append(c)
            elif c == ")":
                if depth == 0:
                    return "".join(body), i + 1
                depth -= 1
                body.append(c)
            else:
                body.append(c)
            j += 1
        body.append("\n")
        i += 1
        if i >= len(lines):
            return "".join(body), i
        text = lines[i]


def _is_launch(words: list[str]) -> int | None:
    """Index of the pretrain_*.py entry point when `words` is a command that runs it."""
    k = 0
    while k < len(words) and _ENV_WORD.match(words[k]):
        k += 1
    if k >= len(words):
        return None
    for idx in range(k, len(words)):
        if re.match(r"^pretrain_\w+\.py$", words[idx].rsplit("/", 1)[-1]):
            # run directly, or through a Python interpreter or launcher (`echo pretrain_gpt.py` is not a run)
            names = [w.rsplit("/", 1)[-1] for w in words[k:idx]]
            if idx == k or any(n in _LAUNCHERS or _PY.match(n) for n in names):
                return idx
            return None
    return None


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.split(":")[-1]  # torchrun --nnodes MIN:MAX
    return int(value) if value.isdigit() else None


def _world_size(prefix: list[str]) -> int | None:
    opts: dict[str, str] = {}
    env: dict[str, str] = {}
    for i, w in enumerate(prefix):
        if _ENV_WORD.match(w) and not w.startswith("-"):
            name, _, value = w.partition("=")
            env[name] = value
            continue
        name, eq, inline = w.partition("=")
        if not name.startswith("-"):
            continue
        following = prefix[i + 1] if i + 1 < len(prefix) else ""
        opts[name.lstrip("-").replace("_", "-")] = inline if eq else following
    nproc = _int_or_none(opts.get("nproc-per-node"))
    if nproc is not None:
        nnodes = 1 if "standalone" in opts else _int_or_none(opts.get("nnodes", "1"))
        return nproc * nnodes if nnodes is not None else None
    ntasks = _int_or_none(opts.get("ntasks") or opts.get("n") or opts.get("np"))
    if ntasks is not None:
        return ntasks
    per_node, nodes = (
        _int_or_none(opts.get("ntasks-per-node")),
        _int_or_none(opts.get("nodes") or opts.get("N")),
    )
    if per_node is not None and nodes is not None:
        return per_node * nodes
    return _int_or_none(env.get("WORLD_SIZE"))


def read_launch(text: str) -> Launch | None:
    """The first command in `text` that runs a `pretrain_*.py` entry point, or None."""
    lines = text.replace("\\\r\n", " ").replace("\\\n", " ").splitlines()
    script = _Script()
    branch: list[bool] = []  # per open `if`: still in its first branch
    found: Launch | None = None
    skipped_branch = False
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        head = line.split(None, 1)[0].rstrip(";")
        if head == "if":
            if re.search(r"(^|[;\s])fi\s*;?\s*$", line):
                continue  # a one-line conditional: nothing in it is read
            branch.append(True)
            continue
        if head in ("elif", "else"):
            if branch:
                branch[-1] = False
                skipped_branch = True
            continue
        if head == "fi":
            if branch:
                branch.pop()
            continue
        if not all(branch):
            continue
        m = _ASSIGN.match(line)
        if m and m.group(3).startswith("("):
            body, i = _array_body(lines, i - 1, m.group(3)[1:])
            words = _split(body)
            if words is None:
                script.warnings.append(f"could not read the array {m.group(1)} (unbalanced quotes); ignored")
                continue
            elements = script.array_elements(words)
            if m.group(2):
                script.arrays.setdefault(m.group(1), []).extend(elements)
            else:
                script.arrays[m.group(1)] = elements
            continue
        arithmetic = _ARITH.match(m.group(3).strip()) if m else None
        if m and arithmetic:  # NAME=$(( ... )) is one word to bash, whatever its spaces
            script.scalars[m.group(1)] = script.arithmetic(arithmetic.group(1))
            continue
        words = _split(line)
        if words is None:
            script.warnings.append(f"could not split a line (unbalanced quotes): {line[:60]}")
            continue
        if m and len(words) == 1:
            parsed = _split(m.group(3))
            script.scalars[m.group(1)] = script.substitute(parsed[0] if parsed else "")
            continue
        words = script.expand(words)
        entry = _is_launch(words)
        if entry is None:
            continue
        launch = Launch(
            prefix=words[:entry],
            entry=words[entry],
            args=words[entry + 1 :],
            world_size=_world_size(words[:entry]),
        )
        if found is None:
            found = launch
        else:
            script.warnings.append(f"more than one pretrain_*.py launch; read the first ({found.entry})")
            break
    if found is not None:
        if skipped_branch:
            script.warnings.append("the script has if/else blocks: only the first branch of each was read")
        found.warnings = script.warnings + found.warnings
    return found
