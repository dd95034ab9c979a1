"""0010_scope_limits: runs sql/migrations/0010_scope_limits.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

SQL_FILE = "0010_scope_limits.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
