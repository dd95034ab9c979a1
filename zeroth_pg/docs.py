"""Generate ``docs/sql-api.md`` from the catalog of a migrated database.

The SQL API is documented where it lives: every public function's ``COMMENT ON FUNCTION``, its
signature and result from ``pg_proc``, and, read from the function bodies, the SQLSTATEs it can
raise (``ERRCODE = '…'``) and the NOTIFY channels it can send on (``zeroth._notify('…', …)``),
followed through the ``zeroth.*`` functions it calls (``_require`` raises ZP008, ``_notify_wakeup``
notifies ``zeroth_wakeup``, …). Views and result types come with their columns and comments.

Command line (without ``--dsn`` a throwaway server is started, as ``migrate dump-schema`` does)::

    python -m zeroth_pg.docs                 # rewrite docs/sql-api.md and the status diagram
    python -m zeroth_pg.docs --check         # exit 1 (and show the diff) when either is stale
    python -m zeroth_pg.docs --dsn ADMIN_DSN # migrate a scratch database on that server

tests/docs/test_docs_fresh.py fails when the committed file is stale.

The status diagram of ``docs/state-machine.md`` (its first ``mermaid`` block) is generated too,
from the table of legal transitions ``zeroth.run_transitions`` (issue 33: the state machine as
data), one edge per row in ``edge_no`` order.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from zeroth_pg import errors, migrate
from zeroth_pg._libpq import libpq_dsn
from zeroth_pg._paths import repo_root, sql_functions_dir

__all__ = ["DOCS_COMMAND", "FunctionDoc", "read_functions", "render", "sql_api_markdown",
           "state_machine_diagram", "state_machine_markdown", "with_status_diagram"]

DOCS_COMMAND = "python -m zeroth_pg.docs"
SCHEMA = "zeroth"

_ERRCODE_RE = re.compile(r"ERRCODE\s*=\s*'([0-9A-Z]{5})'")
# Every notification goes through zeroth._notify(channel, payload) (internal/notify.sql).
_NOTIFY_RE = re.compile(r"(?:pg_notify|zeroth\._notify)\(\s*'([^']+)'")
_CALL_RE = re.compile(rf"\b{SCHEMA}\.([a-z_][a-z0-9_]*)\s*\(")
_LINE_COMMENT_RE = re.compile(r"--[^\n]*")

# Roles other than the owner holding a privilege (PUBLIC for grantee 0), sorted.
_GRANTEES = """coalesce((SELECT array_agg(g.role ORDER BY g.role)
                  FROM (SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                             ELSE pg_get_userbyid(a.grantee)::text END AS role
                          FROM aclexplode({acl}) a
                         WHERE a.privilege_type = '{privilege}' AND a.grantee <> {owner}) g),
                '{{}}') AS grantees,
       {acl} IS NULL AS default_acl"""

_FUNCTIONS = f"""
    SELECT p.proname AS name,
           pg_get_function_arguments(p.oid) AS arguments,
           pg_get_function_result(p.oid) AS result,
           pg_get_functiondef(p.oid) AS definition,
           coalesce(obj_description(p.oid, 'pg_proc'), '') AS comment,
           p.provolatile::text AS volatility,
           p.prosecdef AS security_definer,
           {_GRANTEES.format(acl="p.proacl", privilege="EXECUTE", owner="p.proowner")}
      FROM pg_proc p
      JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = %s
     ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)"""

_RELATIONS = f"""
    SELECT c.relname AS name, c.relkind::text AS kind,
           coalesce(obj_description(c.oid, 'pg_class'), obj_description(c.reltype, 'pg_type'),
                    '') AS comment,
           array_agg(a.attname::text ORDER BY a.attnum) AS columns,
           array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum) AS types,
           {_GRANTEES.format(acl="c.relacl", privilege="SELECT", owner="c.relowner")}
      FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
     WHERE n.nspname = %s AND c.relkind IN ('v', 'c')
     GROUP BY c.oid, c.relname, c.relkind
     ORDER BY c.relkind DESC, c.relname"""

_TRIGGERS = """
    SELECT t.tgname AS name, c.relname AS table_name, p.proname AS function,
           pg_get_triggerdef(t.oid) AS definition,
           coalesce(obj_description(p.oid, 'pg_proc'), '') AS comment
      FROM pg_trigger t
      JOIN pg_class c ON c.oid = t.tgrelid
      JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_proc p ON p.oid = t.tgfoid
     WHERE n.nspname = %s AND NOT t.tgisinternal
     ORDER BY c.relname, t.tgname"""

_ENUMS = """
    SELECT t.typname AS name, coalesce(obj_description(t.oid, 'pg_type'), '') AS comment,
           array_agg(e.enumlabel::text ORDER BY e.enumsortorder) AS labels
      FROM pg_type t
      JOIN pg_namespace n ON n.oid = t.typnamespace
      JOIN pg_enum e ON e.enumtypid = t.oid
     WHERE n.nspname = %s
     GROUP BY t.oid, t.typname
     ORDER BY t.typname"""

_VOLATILITY = {"i": "immutable", "s": "stable", "v": "volatile"}


@dataclass(frozen=True, slots=True)
class FunctionDoc:
    """One function of schema ``zeroth`` as the catalog describes it."""

    name: str
    arguments: str
    result: str
    comment: str
    volatility: str
    security_definer: bool
    grantees: tuple[str, ...]
    default_acl: bool
    raises: tuple[str, ...]
    notifies: tuple[str, ...]

    @property
    def public(self) -> bool:
        return not self.name.startswith("_")


@dataclass(frozen=True, slots=True)
class _Body:
    codes: frozenset[str]
    channels: frozenset[str]
    calls: frozenset[str]


def _body(definition: str) -> _Body:
    # Only the code counts: a comment that mentions pg_notify( or ERRCODE is not a call.
    code = _LINE_COMMENT_RE.sub("", definition)
    return _Body(frozenset(_ERRCODE_RE.findall(code)), frozenset(_NOTIFY_RE.findall(code)),
                 frozenset(_CALL_RE.findall(code)))


def _closure(name: str, bodies: dict[str, _Body]) -> tuple[frozenset[str], frozenset[str]]:
    """SQLSTATEs and channels of ``name`` and of every zeroth function it calls, transitively."""
    codes: set[str] = set()
    channels: set[str] = set()
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in bodies:
            continue
        seen.add(current)
        body = bodies[current]
        codes |= body.codes
        channels |= body.channels
        todo.extend(body.calls)
    return frozenset(codes), frozenset(channels)


def read_functions(conn: psycopg.Connection[Any]) -> list[FunctionDoc]:
    """Every function of schema ``zeroth`` (internal ones too), ordered by name and arguments."""
    rows = conn.cursor(row_factory=dict_row).execute(_FUNCTIONS, (SCHEMA,)).fetchall()
    bodies: dict[str, _Body] = {}
    for row in rows:
        body = _body(row["definition"])
        previous = bodies.get(row["name"])
        # Overloads share a name in a call site: a call may reach any of them.
        bodies[row["name"]] = body if previous is None else _Body(
            previous.codes | body.codes, previous.channels | body.channels,
            previous.calls | body.calls)
    docs = []
    for row in rows:
        codes, channels = _closure(row["name"], bodies)
        docs.append(FunctionDoc(
            name=row["name"], arguments=row["arguments"],
            result=row["result"], comment=row["comment"],
            volatility=_VOLATILITY[row["volatility"]], security_definer=row["security_definer"],
            grantees=tuple(row["grantees"]), default_acl=row["default_acl"],
            raises=tuple(sorted(codes)), notifies=tuple(sorted(channels))))
    return docs


def _split_arguments(arguments: str) -> list[str]:
    """Split ``pg_get_function_arguments`` output at top-level commas (not inside quotes or
    parentheses of a DEFAULT expression)."""
    parts: list[str] = []
    depth, quoted, start = 0, False, 0
    for i, char in enumerate(arguments):
        if char == "'":
            quoted = not quoted
        elif not quoted and char == "(":
            depth += 1
        elif not quoted and char == ")":
            depth -= 1
        elif not quoted and depth == 0 and char == ",":
            parts.append(arguments[start:i].strip())
            start = i + 1
    tail = arguments[start:].strip()
    return [*parts, tail] if tail else parts


def _signature(fn: FunctionDoc) -> str:
    arguments = _split_arguments(fn.arguments)
    body = "\n    " + ",\n    ".join(arguments) + "\n" if arguments else ""
    return f"{SCHEMA}.{fn.name}({body}) RETURNS {fn.result}"


def _codes(codes: Iterable[str]) -> str:
    return ", ".join(f"`{code}`" for code in codes) or "—"


def _sqlstate_legend() -> list[str]:
    lines = ["| SQLSTATE | Python exception | meaning |", "|---|---|---|"]
    for code, cls in sorted(errors._BY_SQLSTATE.items()):
        meaning = (cls.__doc__ or "").strip().splitlines()[0].removeprefix(f"{code}: ")
        lines.append(f"| `{code}` | `zeroth_pg.{cls.__name__}` | {meaning} |")
    return lines


def _grantees(grantees: Iterable[str], default_acl: bool, default: str) -> str:
    if default_acl:
        return f"{default} (default privileges)"
    return ", ".join(f"`{role}`" for role in grantees) or "the owner only"


_DEFINES = re.compile(
    r"^CREATE OR REPLACE (?:FUNCTION|VIEW|TRIGGER) (?:zeroth\.)?(\w+)", re.MULTILINE
)


def source_files() -> dict[str, str]:
    """Function, view or trigger name → its file, relative to the repository root."""
    root = sql_functions_dir()
    return {
        name: f"sql/functions/{path.relative_to(root).as_posix()}"
        for path in migrate.function_files()
        for name in _DEFINES.findall(path.read_text(encoding="utf-8"))
    }


def _source(sources: dict[str, str], name: str) -> str:
    path = sources.get(name)
    return f"[{path}](../{path})" if path else "*(no file)*"


def render(functions: list[FunctionDoc], relations: list[dict[str, Any]],
           triggers: list[dict[str, Any]], enums: list[dict[str, Any]],
           revision: str | None) -> str:
    """The markdown of docs/sql-api.md."""
    sources = source_files()
    public = [fn for fn in functions if fn.public]
    out = [
        "# SQL API reference",
        "",
        f"<!-- Generated from the catalog by `{DOCS_COMMAND}`; do not edit by hand. -->",
        "<!-- tests/docs/test_docs_fresh.py fails when this file is stale. -->",
        "",
        f"Schema `{SCHEMA}` at migration revision `{revision or 'unknown'}`. Every public function "
        "is meant to be called with **named notation** "
        f"(`SELECT {SCHEMA}.renew_lease(run_id => $1, worker_id => $2, generation => $3)`); "
        "functions whose names start with `_` are internal and not part of the API. Conventions "
        "(database time, fencing, scope, lock order) are in [sql/README.md](../sql/README.md); "
        "the status and lease edges are drawn in [state-machine.md](state-machine.md). Each "
        "function, view and trigger links to its file in `sql/functions/`, the whole truth about "
        "it (header, body, owner, grants, comment).",
        "",
        "*Raises* lists the SQLSTATEs a function can raise, read from its body and the bodies of "
        f"the `{SCHEMA}` functions it calls; *notifies* lists the NOTIFY channels it can send on. "
        "Routine outcomes (nothing claimed, a fenced write refused) are return values, not errors. "
        "Codes outside class ZP are PostgreSQL's own (40001 serialization_failure: retry the "
        "call). Triggers (below) may notify too, on the writes they watch.",
        "",
        "**Error documents.** Every error document a function stores — `fail_run`'s `error`, "
        "`commit_fenced`'s `error`, and the stop document of a run ended by someone else "
        "(`{stop_reason, message, worker_id, lease_generation[, previous_error]}`) — is bounded "
        f"by `{SCHEMA}._bounded_error` (sql/functions/internal/errors.sql), never refused, so "
        "the attempt still ends: each top-level string longer than **65,536 characters** is cut "
        "to that many and the document gets `\"truncated\": true`; a document still larger than "
        "**1 MiB** (1,048,576 bytes of uncompressed jsonb), or larger than 16 MiB as given, is "
        "replaced by its summary `{truncated: true, original_bytes, message, type, stop_reason, "
        "worker_id, lease_generation}` (the scalar keys it had; `message` cut to 65,536 "
        "characters, the names to 1,000). A stop document keeps the previous error bounded, as "
        "its summary when the whole would pass 1 MiB, so it never grows past the bound however "
        "often the run is stopped. A run whose recovery raises (`claim_orphaned`, "
        "`claim_orphaned_scopes`, `reconcile_thread_runs`, `claim_for_takeover`) is rolled back "
        "alone and dead-lettered with `stop_reason: recovery_failed`; the others are recovered "
        "by the same call.",
        "",
        *_sqlstate_legend(),
        "",
        "## Functions",
        "",
        "| function | returns | raises | notifies |",
        "|---|---|---|---|",
    ]
    for fn in public:
        out.append(f"| [`{fn.name}`](#{fn.name}) | `{fn.result}` | {_codes(fn.raises)} | "
                   f"{_codes(fn.notifies)} |")
    previous = None
    for fn in public:
        if fn.name != previous:
            out += ["", f"### {fn.name}"]
            previous = fn.name
        out += [
            "",
            "```sql",
            _signature(fn),
            "```",
            "",
            fn.comment or "*(no comment)*",
            "",
            f"- **Returns:** `{fn.result}`",
            f"- **Raises:** {_codes(fn.raises)}",
            f"- **Notifies:** {_codes(fn.notifies)}",
            f"- **Volatility:** {fn.volatility}; **security:** "
            f"{'definer' if fn.security_definer else 'invoker'}",
            f"- **EXECUTE:** {_grantees(fn.grantees, fn.default_acl, 'PUBLIC')}",
            f"- **Source:** {_source(sources, fn.name)}",
        ]
    for kind, title in (("v", "Views"), ("c", "Result types")):
        out += ["", f"## {title}"]
        for rel in relations:
            if rel["kind"] != kind:
                continue
            out += ["", f"### {SCHEMA}.{rel['name']}", "", rel["comment"] or "*(no comment)*", ""]
            if kind == "v":
                readers = _grantees(rel["grantees"], rel["default_acl"], "the owner only")
                out += [f"SELECT: {readers}; source: {_source(sources, rel['name'])}", ""]
            out += ["| column | type |", "|---|---|"]
            out += [f"| `{column}` | `{type_}` |"
                    for column, type_ in zip(rel["columns"], rel["types"], strict=True)]
    by_name = {fn.name: fn for fn in functions}
    out += ["", "## Triggers"]
    for trigger in triggers:
        channels = by_name[trigger["function"]].notifies if trigger["function"] in by_name else ()
        out += ["", f"### {trigger['name']}", "", "```sql", trigger["definition"], "```", "",
                trigger["comment"] or "*(no comment)*", "", f"- **Notifies:** {_codes(channels)}",
                f"- **Source:** {_source(sources, trigger['name'])}"]
    out += ["", "## Enums"]
    for enum in enums:
        out += ["", f"### {SCHEMA}.{enum['name']}", "", enum["comment"] or "*(no comment)*", "",
                ", ".join(f"`{label}`" for label in enum["labels"])]
    return "\n".join(out) + "\n"


def sql_api_markdown(dsn: str) -> str:
    """docs/sql-api.md for the migrated database at ``dsn``."""
    with psycopg.connect(libpq_dsn(dsn), autocommit=True) as conn:
        functions = read_functions(conn)
        cursor = conn.cursor(row_factory=dict_row)
        relations = cursor.execute(_RELATIONS, (SCHEMA,)).fetchall()
        triggers = cursor.execute(_TRIGGERS, (SCHEMA,)).fetchall()
        enums = cursor.execute(_ENUMS, (SCHEMA,)).fetchall()
    return render(functions, relations, triggers, enums, migrate.current_revision(dsn))


_TRANSITIONS = f"""SELECT t.from_status::text AS from_status, t.to_status::text AS to_status,
                          t.label FROM {SCHEMA}.run_transitions t ORDER BY t.edge_no"""
_MERMAID_RE = re.compile(r"```mermaid\n.*?```", re.S)


def state_machine_diagram(rows: Iterable[dict[str, Any]]) -> str:
    """The mermaid status diagram of ``zeroth.run_transitions`` rows (NULL status: ``[*]``)."""
    edges = [f"    {row['from_status'] or '[*]'} --> {row['to_status'] or '[*]'}: {row['label']}"
             for row in rows]
    return "\n".join(["```mermaid", "stateDiagram-v2", *edges, "```"])


def with_status_diagram(markdown: str, diagram: str) -> str:
    """``markdown`` (docs/state-machine.md) with its first mermaid block replaced by
    ``diagram``."""
    if not _MERMAID_RE.search(markdown):
        raise ValueError("docs/state-machine.md has no mermaid block")
    return _MERMAID_RE.sub(lambda _: diagram, markdown, count=1)


def state_machine_markdown(dsn: str, markdown: str) -> str:
    """``markdown`` with the status diagram of the migrated database at ``dsn``."""
    with psycopg.connect(libpq_dsn(dsn), autocommit=True) as conn:
        rows = conn.cursor(row_factory=dict_row).execute(_TRANSITIONS).fetchall()
    return with_status_diagram(markdown, state_machine_diagram(rows))


def sql_api_path() -> Path:
    root = repo_root()
    if root is None:
        raise FileNotFoundError("docs/ exists only in a source checkout; pass --output")
    return root / "docs" / "sql-api.md"


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=DOCS_COMMAND, description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="admin DSN of a server to use (default: a throwaway server)")
    parser.add_argument("--output", type=Path, default=None, help="default: docs/sql-api.md")
    parser.add_argument("--check", action="store_true", help="fail if the file would change")
    args = parser.parse_args(argv)

    target: Path = args.output or sql_api_path()
    diagram_target = target.parent / "state-machine.md"
    with migrate.migrated_scratch_database(args.dsn) as dsn:
        fresh = sql_api_markdown(dsn)
        old_diagram = (diagram_target.read_text(encoding="utf-8")
                       if diagram_target.exists() else None)
        fresh_diagram = (None if old_diagram is None
                         else state_machine_markdown(dsn, old_diagram))
    old = target.read_text(encoding="utf-8") if target.exists() else ""
    if args.check:
        stale = 0
        for path, before, after in ((target, old, fresh),
                                    (diagram_target, old_diagram, fresh_diagram)):
            if before is not None and after is not None and before != after:
                sys.stdout.writelines(difflib.unified_diff(
                    before.splitlines(True), after.splitlines(True), str(path), "catalog"))
                stale = 1
        return stale
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(fresh, encoding="utf-8")
    print(f"wrote {target}")
    if fresh_diagram is not None and fresh_diagram != old_diagram:
        diagram_target.write_text(fresh_diagram, encoding="utf-8")
        print(f"wrote {diagram_target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
