"""0005_operator: runs sql/migrations/0005_operator.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

SQL_FILE = "0005_operator.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
