"""0023_dirty_table_and_failover: runs sql/migrations/0023_dirty_table_and_failover.sql."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

SQL_FILE = "0023_dirty_table_and_failover.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
