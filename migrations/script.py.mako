"""${message}: runs sql/migrations/${up_revision}_<slug>.sql.

Forward-only: the SQL file is the migration, this stub only runs it. Name this file like the SQL
file (NNNN_slug.py for NNNN_slug.sql); tests/migrations/test_stubs.py checks the pairing.
"""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None

SQL_FILE = "${up_revision}_<slug>.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
