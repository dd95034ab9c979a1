"""0009_exact_locks: runs sql/migrations/0009_exact_locks.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

SQL_FILE = "0009_exact_locks.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
