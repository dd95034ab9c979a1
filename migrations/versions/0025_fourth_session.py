"""0025_fourth_session: runs sql/migrations/0025_fourth_session.sql."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

SQL_FILE = "0025_fourth_session.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
