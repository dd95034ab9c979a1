"""0013_steps_events: runs sql/migrations/0013_steps_events.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

SQL_FILE = "0013_steps_events.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
