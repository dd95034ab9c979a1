"""0014_child_runs: runs sql/migrations/0014_child_runs.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

SQL_FILE = "0014_child_runs.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
