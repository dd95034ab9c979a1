"""0018_second_review: runs sql/migrations/0018_second_review.sql."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

SQL_FILE = "0018_second_review.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
