"""0007_fast_path: runs sql/migrations/0007_fast_path.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

SQL_FILE = "0007_fast_path.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
