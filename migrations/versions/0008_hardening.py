"""0008_hardening: runs sql/migrations/0008_hardening.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

SQL_FILE = "0008_hardening.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
