"""Where the SQL files and the alembic environment live.

In a source or editable checkout they are the repository's top-level ``sql/`` and
``migrations/``; in an installed wheel they are shipped inside the package as
``zeroth_pg/_sql`` and ``zeroth_pg/_migrations`` (see the package-dir mapping in pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _pick(installed: str, checkout: str, marker: str) -> Path:
    for candidate in (_PACKAGE_DIR / installed, _PACKAGE_DIR.parent / checkout):
        if (candidate / marker).exists():
            return candidate
    raise FileNotFoundError(
        f"zeroth_pg cannot find its {checkout}/ directory (looked in {_PACKAGE_DIR / installed} "
        f"and {_PACKAGE_DIR.parent / checkout}); the installation is incomplete"
    )


def sql_dir() -> Path:
    """The ``sql/`` directory: ``migrations/NNNN_slug.sql``, ``functions/``, ``schema.sql``."""
    return _pick("_sql", "sql", "migrations")


def sql_migrations_dir() -> Path:
    """The directory holding the ``NNNN_slug.sql`` migration files."""
    return sql_dir() / "migrations"


def sql_functions_dir() -> Path:
    """The directory holding one file per function and view, and ``order.txt``."""
    return sql_dir() / "functions"


def migrations_dir() -> Path:
    """The alembic script directory (``env.py``, ``versions/``)."""
    return _pick("_migrations", "migrations", "env.py")


def repo_root() -> Path | None:
    """The source checkout's root, or None when running from an installed wheel."""
    root = _PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").exists() and (root / "sql").is_dir() else None
