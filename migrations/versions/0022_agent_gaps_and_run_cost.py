"""0022_agent_gaps_and_run_cost: runs sql/migrations/0022_agent_gaps_and_run_cost.sql."""

from zeroth_pg.migrate import apply_sql_file, forward_only

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

SQL_FILE = "0022_agent_gaps_and_run_cost.sql"


def upgrade() -> None:
    apply_sql_file(SQL_FILE)


def downgrade() -> None:
    forward_only(revision)
