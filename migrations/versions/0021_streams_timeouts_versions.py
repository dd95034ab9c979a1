"""0021_streams_timeouts_versions: runs sql/migrations/0021_streams_timeouts_versions.sql."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

SQL_FILE = "0021_streams_timeouts_versions.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
