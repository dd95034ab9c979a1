"""0024_hot_path_and_suite: runs sql/migrations/0024_hot_path_and_suite.sql."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

SQL_FILE = "0024_hot_path_and_suite.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
