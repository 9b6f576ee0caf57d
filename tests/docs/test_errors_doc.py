"""docs/reference/errors.md lists every error and warning the extension
raises, each with its SQLSTATE and its message as the code has it, and no
message the code no longer raises. No server: the sources are parsed.

What the code raises:

* Rust (src/**/*.rs): the message of every ``raise(code, message, ...)``
  and ``ErrorReport::new(code, message, ...)`` (src/errors/), of every
  ``Refusal::new(SqlState::.., message)`` of the registry's rules
  (core/src/registry/, raised by ``errors::registry_refusal``), of every
  check hook failure (``guc_check_failure(message, ...)``: 22023, as
  PostgreSQL reports it), of ``errors::internal(message)`` (XX000), and of
  pgrx's ``error!`` (XX000), ``warning!`` (01000) and
  ``ereport!(level, code, message)``. A message or SQLSTATE held in a
  variable is followed to the ``let`` that binds it, through a ``match``
  or ``if`` whose arms are tuples and a called function's tail tuple
  (``key_file_parts``), each arm's SQLSTATE staying with its message.
* SQL (src/sql/*.sql): ``RAISE EXCEPTION`` (P0001 unless ``USING
  ERRCODE``; a variable ERRCODE takes every value the function assigns it)
  and ``RAISE WARNING`` (01000). ``NOTICE`` and ``LOG`` are not errors or
  warnings and are not listed.

The doc's convention (said at the top of errors.md): in every table whose
first column is the SQLSTATE (one code span), the second column holds only
messages, each a code span, several separated by ``;``, with ``{name}``
where the code fills in a value. A code message is a pattern: each of its
placeholders (``{...}`` in Rust, ``%`` in SQL) matches any text of the
doc's message, so the doc may write a placeholder or a value the code puts
there (``could not open {file}: {err}`` matches ``could not open public key
file "{path}": {error}``).

The test fails when the code raises a (SQLSTATE, message) that no row of
errors.md has, or when a row's (SQLSTATE, message) matches nothing the code
raises: a message changed on one side only fails it both ways.

errors.md also promises that every error has a detail or a hint, except
where its row says *no hint*: an error raised without either (``raise()``
with ``None, None``, an ``ErrorReport`` without ``set_detail``/``set_hint``,
pgrx's ``error!`` and ``ereport!``, a ``RAISE EXCEPTION`` without ``DETAIL``
or ``HINT``) fails the test unless every row it matches says so.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest

from harness import pg_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
ERRORS_MD = ROOT / "docs" / "reference" / "errors.md"


# --- Rust: a small lexer, enough for the shapes src/ uses --------------------

@dataclasses.dataclass
class Tok:
    kind: str  # str, ident, num, char, punct
    value: str
    line: int


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}


def _unescape(body: str) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        n = body[i + 1]
        if n == "\n":  # a line continuation skips the newline and the indentation
            i += 2
            while i < len(body) and body[i] in " \t\n":
                i += 1
        elif n == "x":
            out.append(chr(int(body[i + 2:i + 4], 16)))
            i += 4
        elif n == "u":
            end = body.index("}", i)
            out.append(chr(int(body[i + 3:end], 16)))
            i = end + 1
        else:
            out.append(_ESCAPES[n])
            i += 2
    return "".join(out)


_RUST_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<raw>[bc]?r(?P<hashes>\#*)"(?P<rawbody>.*?)"(?P=hashes))
  | (?P<str>[bc]?"(?P<body>(?:[^"\\]|\\.)*)")
  | (?P<char>'(?:[^'\\]|\\.[^']*)')
  | (?P<lifetime>'[A-Za-z_]\w*)
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<num>\d[\w.]*)
  | (?P<punct>::|=>|->|.)
""", re.S | re.X)


def rust_tokens(text: str) -> list[Tok]:
    toks, pos = [], 0
    while pos < len(text):
        m = _RUST_TOKEN.match(text, pos)
        line = text.count("\n", 0, pos) + 1
        kind = m.lastgroup if m.lastgroup not in ("hashes", "rawbody", "body") else None
        if m.group("raw") is not None:
            toks.append(Tok("str", m.group("rawbody"), line))
        elif m.group("str") is not None:
            toks.append(Tok("str", _unescape(m.group("body")), line))
        elif kind in ("ident", "num", "char", "punct"):
            toks.append(Tok(kind, m.group(kind), line))
        pos = m.end()
    return toks


_OPEN, _CLOSE = "([{", ")]}"


def close_of(toks: list[Tok], i: int) -> int:
    """The index of the bracket closing the one at i."""
    depth = 0
    for j in range(i, len(toks)):
        if toks[j].kind == "punct" and toks[j].value in _OPEN:
            depth += 1
        elif toks[j].kind == "punct" and toks[j].value in _CLOSE:
            depth -= 1
            if depth == 0:
                return j
    raise AssertionError(f"unbalanced bracket at line {toks[i].line}")


def split_top(toks: list[Tok], sep: str = ",") -> list[list[Tok]]:
    """toks split at the separators outside any bracket (no empty tail)."""
    parts, cur, depth = [], [], 0
    for t in toks:
        if t.kind == "punct" and t.value in _OPEN:
            depth += 1
        elif t.kind == "punct" and t.value in _CLOSE:
            depth -= 1
        if depth == 0 and t.kind == "punct" and t.value == sep:
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        parts.append(cur)
    return parts


def is_p(t: Tok, v: str) -> bool:
    return t.kind == "punct" and t.value == v


def is_i(t: Tok, v: str) -> bool:
    return t.kind == "ident" and t.value == v


def is_open(t: Tok) -> bool:
    return t.kind == "punct" and t.value in _OPEN


@dataclasses.dataclass
class Fn:
    name: str
    file: str
    params: set[str]
    body: list[Tok]  # inside the braces


def rust_functions(path: pathlib.Path) -> list[Fn]:
    toks = rust_tokens(path.read_text())
    fns = []
    for i in range(len(toks) - 2):
        if is_i(toks[i], "fn") and toks[i + 1].kind == "ident":
            lp = i + 2
            while not is_p(toks[lp], "("):  # generics
                lp += 1
            rp = close_of(toks, lp)
            params = {p[0].value if p[0].value != "mut" else p[1].value
                      for p in split_top(toks[lp + 1:rp]) if p}
            lb = rp
            while not is_p(toks[lb], "{"):
                if is_p(toks[lb], ";"):  # a declaration without a body
                    break
                lb += 1
            if is_p(toks[lb], "{"):
                rb = close_of(toks, lb)
                fns.append(Fn(toks[i + 1].value, str(path.relative_to(ROOT)), params,
                              toks[lb + 1:rb]))
    return fns


def tail_expr(block: list[Tok]) -> list[Tok]:
    """The value of a block: what follows its last top-level `;`."""
    return split_top(block, ";")[-1]


class Unresolved(AssertionError):
    pass


def single_ident(expr: list[Tok]) -> str | None:
    """The variable expr is (`name`, `&name`, `name.into()`), if it is one."""
    if expr and is_p(expr[0], "&"):
        expr = expr[1:]
    while (len(expr) >= 4 and is_p(expr[-4], ".") and expr[-3].kind == "ident"
           and is_p(expr[-2], "(") and is_p(expr[-1], ")")):
        expr = expr[:-4]
    return expr[0].value if len(expr) == 1 and expr[0].kind == "ident" else None


def binding(fn: Fn, name: str, before: int) -> tuple[int, int, list[Tok]] | None:
    """The last `let` of fn before token `before` binding name: (its index
    in the tuple pattern, or -1 for a plain binding; the let's token index;
    the value)."""
    found = None
    for i in range(before):
        if not is_i(fn.body[i], "let"):
            continue
        j = i + 1
        while not is_p(fn.body[j], "="):
            j = close_of(fn.body, j) + 1 if is_open(fn.body[j]) else j + 1
        end = j + 1
        while end < len(fn.body) and not is_p(fn.body[end], ";"):
            end = close_of(fn.body, end) + 1 if is_open(fn.body[end]) else end + 1
        pattern, value = fn.body[i + 1:j], fn.body[j + 1:end]
        if pattern and is_p(pattern[0], "("):
            names = [[t.value for t in p if t.value != "mut"]
                     for p in split_top(pattern[1:-1])]
            for k, n in enumerate(names):
                if n == [name]:
                    found = (k, i, value)
        elif [t.value for t in pattern if t.value != "mut"][:1] == [name]:
            found = (-1, i, value)
    return found


def tuples_of(fns: dict[str, Fn], fn: Fn, expr: list[Tok]) -> list[tuple[Fn, list[list[Tok]]]]:
    """Each tuple expr may evaluate to (a call's tail tuple, a match's or
    an if's arms), with the function its elements are in."""
    if expr and is_p(expr[0], "(") and close_of(expr, 0) == len(expr) - 1:
        return [(fn, split_top(expr[1:-1]))]
    if (len(expr) >= 3 and expr[0].kind == "ident" and is_p(expr[1], "(")
            and close_of(expr, 1) == len(expr) - 1 and expr[0].value in fns):
        callee = fns[expr[0].value]
        return tuples_of(fns, callee, tail_expr(callee.body))
    if expr and is_p(expr[0], "{") and close_of(expr, 0) == len(expr) - 1:
        return tuples_of(fns, fn, tail_expr(expr[1:-1]))
    if expr and is_i(expr[0], "match"):
        lb = next(i for i, t in enumerate(expr) if is_p(t, "{"))
        arms = []
        for arm in split_top(expr[lb + 1:close_of(expr, lb)]):
            k = next(i for i, t in enumerate(arm) if is_p(t, "=>"))
            arms += tuples_of(fns, fn, arm[k + 1:])
        return arms
    if expr and is_i(expr[0], "if"):
        out, i = [], 0
        while i < len(expr):
            if is_p(expr[i], "{"):
                end = close_of(expr, i)
                out += tuples_of(fns, fn, expr[i:end + 1])
                i = end + 1
            else:
                i += 1
        return out
    raise Unresolved(f"{fn.file}: cannot follow {' '.join(t.value for t in expr)[:80]}")


Item = tuple[Fn, list[Tok], int]  # an expression, its function, the token it is used at


def resolve(fns: dict[str, Fn], items: list[Item]) -> list[list[Item]] | None:
    """The alternatives of items (evaluated together), each variable
    followed to the values it takes; None when one is a parameter."""
    for k, (fn, expr, before) in enumerate(items):
        name = single_ident(expr)
        if name is None or name.startswith("ERRCODE_"):
            continue
        bound = binding(fn, name, before)
        if bound is None:
            if name in fn.params:
                return None
            raise Unresolved(f"{fn.file}: fn {fn.name}: {name} is bound by no let")
        index, at, value = bound
        if index < 0:
            group, alts = [k], [[(fn, value, at)]]
        else:
            # the items bound by the same let take the values of one arm together
            group = [j for j, (f2, e2, b2) in enumerate(items)
                     if f2 is fn and single_ident(e2)
                     and (binding(fn, single_ident(e2), b2) or (0, -1))[1] == at]
            alts = [[(ctx, elems[binding(fn, single_ident(items[j][1]), items[j][2])[0]],
                      at if ctx is fn else len(ctx.body)) for j in group]
                    for ctx, elems in tuples_of(fns, fn, value)]
        out = []
        for alt in alts:
            new = list(items)
            for j, v in zip(group, alt):
                new[j] = v
            sub = resolve(fns, new)
            if sub is None:
                return None
            out += sub
        return out
    return [items]


def templates(expr: list[Tok]) -> list[str]:
    """The message templates of an expression: the first literal of each
    format!(), and the literals outside format!()'s arguments."""
    out, i = [], 0
    while i < len(expr):
        t = expr[i]
        if is_i(t, "format") and i + 2 < len(expr) and is_p(expr[i + 1], "!"):
            end = close_of(expr, i + 2)
            out.append(expr[i + 3].value)
            i = end + 1
            continue
        if t.kind == "str":
            out.append(t.value)
        i += 1
    return out


@dataclasses.dataclass(frozen=True)
class Raised:
    sqlstate: str
    template: str
    sql: bool  # % placeholders (SQL) rather than {...} (Rust)
    where: str
    hinted: bool = True  # raised with a detail or a hint

    def pattern(self, placeholder: str = ".+") -> re.Pattern:
        parts = re.split(r"(%%|%)" if self.sql else r"(\{\{|\}\}|\{[^{}]*\})", self.template)
        rx = ""
        for k, p in enumerate(parts):
            if k % 2 == 0:
                rx += re.escape(p)
            elif p in ("%%", "{{", "}}"):
                rx += re.escape(p[0])
            else:
                rx += placeholder
        return re.compile(rx, re.S)

    def mirror(self) -> re.Pattern:
        """The doc's message that is this one with each value a {name}."""
        return self.pattern(r"\{[^{}]+\}")


def sqlstates() -> dict[str, str]:
    """PostgreSQL's ERRCODE_* names and their SQLSTATEs (utils/errcodes.h)."""
    header = pathlib.Path(pg_config("--includedir-server")) / "utils" / "errcodes.h"
    return {name: "".join(chars.split("','")).strip("'")
            for name, chars in re.findall(r"#define (ERRCODE_\w+)\s+MAKE_SQLSTATE\(([^)]*)\)",
                                          header.read_text())}


# call shapes that raise: (the name, the index of the SQLSTATE argument or a
# fixed SQLSTATE, the index of the message argument)
SITES = {
    "raise": (0, 1), "new": (0, 1),  # ErrorReport::new
    "guc_check_failure": ("22023", 0), "internal": ("XX000", 0),
    "error!": ("XX000", 0), "warning!": ("01000", 0), "ereport!": (1, 2),
}


# The registry's refusals (core/src/registry/, `Refusal::new(SqlState::..,
# message)`), raised by src/errors/'s registry_refusal(), which passes
# them on (their messages are checked here, where they are written).
REGISTRY = ROOT / "core" / "src" / "registry"
REFUSAL_STATES = {"InvalidParameterValue": "22023", "ProgramLimitExceeded": "54000",
                  "NotInPrerequisiteState": "55000", "InsufficientPrivilege": "42501",
                  "LockNotAvailable": "55P03"}
PASS_THROUGH = {"registry_refusal"}


def rust_raised() -> list[Raised]:
    codes = sqlstates()
    files = sorted(SRC.rglob("*.rs")) + sorted(p for p in REGISTRY.rglob("*.rs")
                                               if p.name != "tests.rs")
    out, seen = [], set()
    all_fns = [f for p in files for f in rust_functions(p)]
    for fn in all_fns:
        fns = {f.name: f for f in all_fns if f.file == fn.file}
        b = fn.body
        for i in range(len(b) - 2):
            if b[i].kind != "ident" or (i and is_i(b[i - 1], "fn")):
                continue
            macro = is_p(b[i + 1], "!") and is_p(b[i + 2], "(")
            name = b[i].value + ("!" if macro else "")
            if name not in SITES or not is_p(b[i + 1 + macro], "("):
                continue
            refusal = name == "new" and i >= 2 and is_i(b[i - 2], "Refusal")
            if name == "new" and not (i >= 2 and is_i(b[i - 2], "ErrorReport")) and not refusal:
                continue
            if fn.name in PASS_THROUGH and fn.file.startswith("src/errors/"):
                continue
            # raise() and guc_check_failure() are src/errors/'s own; internal()
            # is errors::internal() elsewhere (other functions share the names)
            if (name in ("raise", "guc_check_failure", "internal")
                    and not fn.file.startswith("src/errors/")
                    and not (name == "internal" and is_i(b[i - 2], "errors"))):
                continue
            key = (fn.file, b[i].line, name)
            if key in seen:  # a nested function's site, seen in its parent
                continue
            seen.add(key)
            lp = i + 1 + macro
            args = split_top(b[lp + 1:close_of(b, lp)])
            code_at, msg_at = SITES[name]
            exprs = [args[msg_at]] + ([args[code_at]] if isinstance(code_at, int) else [])
            where = f"{fn.file}:{b[i].line}"
            alts = resolve(fns, [(fn, e, i) for e in exprs])
            if alts is None:
                # the message is a parameter: raised where fn is called
                assert fn.name in SITES, f"{where}: the message is a parameter of {fn.name}"
                continue
            hinted = raise_hinted(name, args, fn)
            for alt in alts:
                if refusal:
                    names = [t.value for t in alt[1][1] if t.value in REFUSAL_STATES]
                    assert len(names) == 1, f"{where}: SqlState {names}"
                    sqlstate = REFUSAL_STATES[names[0]]
                elif isinstance(code_at, int):
                    names = [t.value for t in alt[1][1] if t.value.startswith("ERRCODE_")]
                    assert len(names) == 1, f"{where}: SQLSTATE {names}"
                    sqlstate = codes[names[0]]
                else:
                    sqlstate = code_at
                found = templates(alt[0][1])
                assert found, f"{where}: no message in {[t.value for t in alt[0][1]]}"
                out += [Raised(sqlstate, t, False, where, hinted) for t in found]
    return out


def raise_hinted(name: str, args: list[list[Tok]], fn: Fn) -> bool:
    """Whether a raise site gives a detail or a hint."""
    if name == "raise":
        return not all(len(a) == 1 and is_i(a[0], "None") for a in args[2:4])
    if name == "new":
        # ErrorReport's set_hint/set_detail, or a Refusal's .hint()/.detail()
        return any(is_i(t, "set_hint") or is_i(t, "set_detail") or is_i(t, "hint")
                   or is_i(t, "detail") for t in fn.body)
    return name not in ("error!", "ereport!")


# --- SQL ---------------------------------------------------------------------

def sql_raised() -> list[Raised]:
    out = []
    for path in sorted(SRC.rglob("*.sql")):
        text = re.sub(r"--[^\n]*", "", path.read_text())
        for m in re.finditer(r"\bRAISE\s+(EXCEPTION|WARNING)\s+'((?:[^']|'')*)'(.*?);",
                             text, re.S):
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            level, message, rest = m.groups()
            message = message.replace("''", "'")
            body = text[text.rfind("CREATE", 0, m.start()):m.start()]
            code = re.search(r"\bERRCODE\s*=\s*('(\w{5})'|\w+)", rest)
            args = [a.strip() for a in rest.split("USING")[0].split(",")[1:]]
            for value, state in sql_values(body, message, args):
                if level == "WARNING" and not code:
                    state = "01000"
                elif not code:
                    state = "P0001"
                elif code.group(2):
                    state = code.group(2)
                assert state, f"{where}: no value of ERRCODE {code.group(1)}"
                hinted = re.search(r"\b(HINT|DETAIL)\s*=", rest) is not None
                out.append(Raised(state, value, True, where, hinted))
    return out


def sql_values(body: str, message: str, args: list[str]) -> list[tuple[str, str | None]]:
    """The messages a RAISE makes: a variable filled in last (`problem`,
    `bad`) that the function sets only with format() becomes each of those
    formats, with the SQLSTATE its branch sets in the variable `code` (or
    the one `code` is declared with)."""
    last = args[-1] if args else ""
    sets = list(re.finditer(rf"\b{last}\s*:=(.*?);", body, re.S)) if re.fullmatch(
        r"[a-z_]+", last) else []
    if not sets or not all("format(" in s.group(1) for s in sets):
        declared = re.search(r"\bcode\s+text\s*:=\s*'(\w{5})'", body)
        return [(message, declared.group(1) if declared else None)]
    head, _, _ = message.rpartition("%")
    declared = re.search(r"\bcode\s+text\s*:=\s*'(\w{5})'", body)
    out = []
    for s in sets:
        branch = body[max(body.rfind(k, 0, s.start()) for k in ("IF ", "ELSIF", "ELSE")):s.start()]
        state = re.search(r"\bcode\s*:=\s*'(\w{5})'", branch) or declared
        for f in re.findall(r"format\('((?:[^']|'')*)'", s.group(1)):
            f = re.sub(r"%[sIL]", "%", f.replace("''", "'"))
            out.append((head + f, state.group(1) if state else None))
    return out


# --- the doc -----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Documented:
    sqlstate: str
    message: str
    line: int


def cells(row: str) -> list[str]:
    """A table row's cells (a `|` inside a code span does not split)."""
    parts = re.split(r"(`[^`]*`)", row.strip().strip("|"))
    out, cur = [], ""
    for k, p in enumerate(parts):
        if k % 2:
            cur += p
            continue
        bits = p.split("|")
        cur += bits[0]
        for b in bits[1:]:
            out.append(cur.strip())
            cur = b
    out.append(cur.strip())
    return out


def documented(text: str) -> list[Documented]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            continue
        row = cells(line)
        m = re.fullmatch(r"`([0-9A-Z]{5})`", row[0])
        if m and len(row) > 1:
            spans = re.findall(r"`([^`]+)`", row[1])
            assert spans, f"errors.md:{n}: a row without a message"
            out += [Documented(m.group(1), s, n) for s in spans]
    return out


def disagreements(raised: list[Raised], docs: list[Documented]) -> tuple[list, list]:
    """(what the code raises that no row has, rows the code raises no longer).

    A code message accounts for the rows it matches; but when a row is the
    message itself with {name} for each value (``snowflake_id lease:
    {problem}``), for that row only: the rows that spell out other
    ``snowflake_id lease: ...`` warnings then need messages of their own,
    and go stale when the code drops them."""
    accounts = {}
    for r in raised:
        mine = [d for d in docs if d.sqlstate == r.sqlstate]
        mirrors = [d for d in mine if r.mirror().fullmatch(d.message)]
        accounts[r] = mirrors or [d for d in mine if r.pattern().fullmatch(d.message)]
    missing = sorted({f"{r.sqlstate} {r.template!r} ({r.where})"
                      for r, ds in accounts.items() if not ds})
    claimed = {d for ds in accounts.values() for d in ds}
    stale = [f"errors.md:{d.line}: {d.sqlstate} {d.message!r}" for d in docs
             if d not in claimed]
    return missing, stale


@pytest.fixture(scope="module")
def raised() -> list[Raised]:
    return rust_raised() + sql_raised()


def test_the_sources_are_parsed(raised):
    # Losing the raise sites (a renamed helper, a new shape) would make the
    # check below pass on nothing.
    rust = [r for r in raised if not r.sql]
    assert len(rust) >= 80 and len(raised) - len(rust) >= 25, len(raised)
    for state, message in [
        ("55000", "no worker id is leased from the registry {registry} after waiting {waited_ms} ms"),
        ("58P01", "could not open {file}: {err}"),
        ("42501", "{file} must be owned by the database server's OS user or root"),
        ("22023", 'parameter "snowflake_id.public_key" is no longer supported'
                  " (the value is not shown)"),
        ("01000", "the snowflake_id layout's time field ran out at {end}: no ID can be made"),
        ("XX000", "snowflake_id redo: unknown op code {info}"),
        # the registry's refusals, each with its SqlState (core/src/registry/)
        ("54000", "lease request of node {node} refused: {problem}"),
        ("22023", "lease request of node {node} refused: {problem}"),
        ("42501", "this session does not hold the lock of node {node}"),
        ("22023", "invalid lease limit: max_blocks_per_node must be from 1 to 64, not %"),
    ]:
        assert any(r.sqlstate == state and r.template == message for r in raised), (state, message)
    # each arm's (branch's) SQLSTATE stays with its message
    assert not any(r.sqlstate == "58030" and r.template.startswith("could not open {file}")
                   for r in raised)
    assert not any(r.sqlstate == "22023" and "max_lease_ms = %" in r.template for r in raised)


def test_errors_md_lists_every_error_and_only_those(raised):
    missing, stale = disagreements(raised, documented(ERRORS_MD.read_text()))
    assert not missing and not stale, (
        "docs/reference/errors.md and the code disagree.\n"
        "Raised by the code, in no row of errors.md (with that SQLSTATE):\n  "
        + "\n  ".join(missing or ["(none)"])
        + "\nIn errors.md, raised by the code no longer (with that SQLSTATE):\n  "
        + "\n  ".join(stale or ["(none)"]))


def unhinted_errors(raised: list[Raised], text: str) -> list[str]:
    """Errors raised with neither a detail nor a hint whose rows in
    errors.md do not all say *no hint* (warnings are not errors)."""
    docs = documented(text)
    lines = text.splitlines()
    out = []
    for r in raised:
        if r.hinted or r.sqlstate.startswith("01"):
            continue
        rows = [d for d in docs if d.sqlstate == r.sqlstate and r.pattern().fullmatch(d.message)]
        if not rows or not all("*no hint*" in lines[d.line - 1] for d in rows):
            out.append(f"{r.sqlstate} {r.template!r} ({r.where})")
    return sorted(set(out))


def test_every_error_has_the_detail_or_hint_errors_md_promises(raised):
    assert "a detail or hint" in ERRORS_MD.read_text()
    unhinted = unhinted_errors(raised, ERRORS_MD.read_text())
    assert not unhinted, (
        "errors raised with neither a detail nor a hint, whose rows in errors.md do not say"
        " *no hint*:\n  " + "\n  ".join(unhinted))
    # The check itself: the rows that say *no hint* are needed, and a
    # RAISE without a HINT is seen.
    assert any(not r.hinted for r in raised if not r.sql)
    assert unhinted_errors(raised, ERRORS_MD.read_text().replace("*no hint*", "no detail"))
    stripped = [dataclasses.replace(r, hinted=False) if "invalid lease limit" in r.template else r
                for r in raised]
    assert any("invalid lease limit" in u
               for u in unhinted_errors(stripped, ERRORS_MD.read_text()))


def test_a_message_changed_on_one_side_fails(raised):
    # The check itself: a word changed in one message of the doc is both a
    # stale row and a message the doc no longer has.
    text = ERRORS_MD.read_text()
    target = "`a standby makes no IDs when worker ids are leased from a registry`"
    assert target in text
    missing, stale = disagreements(raised, documented(text.replace(target, target.replace(
        "standby", "replica"))))
    assert any("a standby makes no IDs" in m for m in missing)
    assert any("a replica makes no IDs" in s for s in stale)
