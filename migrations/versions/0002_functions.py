"""0002_functions: runs sql/migrations/0002_functions.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

SQL_FILE = "0002_functions.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
