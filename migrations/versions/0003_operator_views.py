"""0003_operator_views: runs sql/migrations/0003_operator_views.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

SQL_FILE = "0003_operator_views.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
