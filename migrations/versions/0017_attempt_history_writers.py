"""0017_attempt_history_writers: runs sql/migrations/0017_attempt_history_writers.sql."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

SQL_FILE = "0017_attempt_history_writers.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
