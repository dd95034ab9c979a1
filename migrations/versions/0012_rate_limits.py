"""0012_rate_limits: runs sql/migrations/0012_rate_limits.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

SQL_FILE = "0012_rate_limits.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
