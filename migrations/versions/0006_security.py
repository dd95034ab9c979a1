"""0006_security: runs sql/migrations/0006_security.sql (forward-only)."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

SQL_FILE = "0006_security.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
