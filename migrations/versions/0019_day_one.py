"""0019_day_one: runs sql/migrations/0019_day_one.sql."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

SQL_FILE = "0019_day_one.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
