"""0011_schedules: runs sql/migrations/0011_schedules.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

SQL_FILE = "0011_schedules.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
