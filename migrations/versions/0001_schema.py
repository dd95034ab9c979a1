"""0001_schema: runs sql/migrations/0001_schema.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

SQL_FILE = "0001_schema.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
