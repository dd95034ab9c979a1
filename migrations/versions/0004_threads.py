"""0004_threads: runs sql/migrations/0004_threads.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

SQL_FILE = "0004_threads.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
