"""0016_attempt_history: runs sql/migrations/0016_attempt_history.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

SQL_FILE = "0016_attempt_history.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
