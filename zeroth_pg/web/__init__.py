"""``zeroth-pg web``: an operator dashboard served by the package (Starlette + Jinja2).

Read-only unless built with ``enable_actions=True``; actions are POSTs with a CSRF token, run as
the connecting role (a ``zeroth_reader`` DSN is refused by the database), and are logged. An
optional token (``ZEROTH_PG_WEB_TOKEN``) guards every page. Every value rendered is escaped by
Jinja's autoescape. Reads go through the SQL the ``zeroth-pg`` command uses
(:mod:`zeroth_pg._calls`) and the operator views.
"""

from __future__ import annotations

from zeroth_pg.web.app import create_app

__all__ = ["create_app"]
