"""0020_settle_and_registry: runs sql/migrations/0020_settle_and_registry.sql."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

SQL_FILE = "0020_settle_and_registry.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
