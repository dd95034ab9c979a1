"""The deployments pages: every (tenant, workspace, deployment) scope with its counts by state
(zeroth.scope_overview, through the ``zeroth-pg status`` query) and its limits
(zeroth.scope_limits, zeroth.rate_limits), a page per scope, and — with actions enabled — pause,
resume, max_concurrency, weight and rate limit, each through zeroth.set_scope_limits or
zeroth.set_rate_limit; a deployment's defaults (zeroth.deployments: max_attempts, priority, retry
policy and lease, for every scope) shown on each of its scope pages and set through
zeroth.set_deployment_defaults."""

from __future__ import annotations

import urllib.parse
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from zeroth_pg import _calls
from zeroth_pg.web._shared import (
    BadInput,
    Context,
    form_float,
    form_int,
    form_name,
    form_optional_name,
)

__all__ = ["routes"]

# The scope's own limits row (NULL values: none), read as the DSN's role (row-level security).
_LIMITS = """SELECT l.max_concurrency, l.weight, l.paused, l.rate_limit, l.note
      FROM zeroth.scope_limits l
     WHERE l.tenant_id = $1 AND l.workspace_key = $2 AND l.deployment_ref = $3"""

# The rate limit keys this role sees (a zeroth_reader: the keys its tenant's scopes name).
_RATE_LIMITS = """SELECT k.name, k.max_starts, k.period_seconds, k.note
      FROM zeroth.rate_limits k ORDER BY k.name LIMIT 500"""

# The schedules of one scope's deployment.
_SCOPE_SCHEDULES = """SELECT s.name, s.cron, s.interval_seconds, s.next_fire_at, s.paused,
           s.last_error
      FROM zeroth.schedules s
     WHERE s.tenant_id = $1 AND s.workspace_key = $2 AND s.deployment_ref = $3
     ORDER BY s.name LIMIT 200"""

# A deployment's defaults (global: every scope's runs of it), a table zeroth_reader may read.
_DEFAULTS = """SELECT d.max_attempts, d.priority, d.managed_by, d.version, d.updated_at,
           d.updated_by, d.retry_base_seconds, d.retry_max_seconds, d.lease_seconds,
           d.attempt_timeout_seconds, d.run_timeout_seconds
      FROM zeroth.deployments d WHERE d.deployment_ref = $1"""

# Code versions (issue 34): the deployment's version policy (set by a DBA only:
# zeroth.set_version_policy), shown on the scope page with the runs of the scope pinned to a
# version (zeroth.pinned_runs).
_VERSION_POLICY = """SELECT d.version_policy, d.compatible_versions
      FROM zeroth.deployments d WHERE d.deployment_ref = $1"""

_OPS = ("pause", "resume", "limits")

#: The policy values of a deployment a form may set back to not set (zeroth.set_deployment_defaults
#: unset).
_POLICY_FIELDS = ("retry_base_seconds", "retry_max_seconds", "lease_seconds")
_MAX_RETRY_SECONDS = 30 * 86400.0


def _optional_seconds(form: Any, key: str, low: float, high: float) -> float | None:
    """A number of seconds in [low, high]; blank: None (keep)."""
    if not str(form.get(key) or "").strip():
        return None
    return form_float(form, key, low, high)


def _unset(form: Any) -> list[str]:
    """The policy values the form sets back to not set (checkboxes ``unset_<field>``, ``on``)."""
    unset = []
    for field in _POLICY_FIELDS:
        value = form.get(f"unset_{field}")
        if value is None:
            continue
        if value != "on":
            raise BadInput(f"unset_{field} must be on or absent")
        unset.append(field)
    return unset


def scope_url(deployment: str, tenant: str, workspace: str | None) -> str:
    """The page of one scope."""
    params = {"deployment": deployment, "tenant": tenant}
    if workspace is not None:
        params["workspace"] = workspace
    return "/deployments/scope?" + urllib.parse.urlencode(params)


def _workspace_key(workspace: str | None) -> str:
    return "" if workspace is None else "w:" + workspace


def _scope(fields: Any) -> tuple[str, str, str | None]:
    return (form_name(fields, "deployment"), form_name(fields, "tenant"),
            form_optional_name(fields, "workspace"))


def routes(ctx: Context) -> list[Route]:
    async def deployments(request: Request) -> Response:
        async with ctx.pool().acquire() as conn:
            scopes = await conn.fetch(_calls.STATUS, None, None, None)
            totals = await conn.fetch(_calls.STATUS_BY_DEPLOYMENT, None, None, None)
            keys = await conn.fetch(_RATE_LIMITS)
        return ctx.render(request, "deployments.html", scopes=scopes, totals=totals, keys=keys,
                          scope_url=scope_url)

    async def scope_page(request: Request) -> Response:
        try:
            deployment, tenant, workspace = _scope(request.query_params)
        except BadInput as exc:
            return ctx.bad_input(request, exc)
        async with ctx.pool().acquire() as conn:
            rows = await conn.fetch(_calls.STATUS, deployment, tenant, workspace)
            limits = await conn.fetchrow(_LIMITS, tenant, _workspace_key(workspace), deployment)
            keys = await conn.fetch(_RATE_LIMITS)
            schedules = await conn.fetch(_SCOPE_SCHEDULES, tenant, _workspace_key(workspace),
                                         deployment)
            defaults = await conn.fetchrow(_DEFAULTS, deployment)
            versions = await conn.fetchrow(_VERSION_POLICY, deployment)
            pinned = [p for p in await conn.fetch(_calls.PINNED_RUNS, deployment, tenant,
                                                  workspace)
                      if p["workspace_id"] == workspace]
        # STATUS with a NULL workspace matches every workspace: this page is one scope.
        counts = next((r for r in rows if r["workspace_id"] == workspace), None)
        runs_query = urllib.parse.urlencode(
            {"deployment": deployment, "tenant": tenant,
             **({"workspace": workspace} if workspace is not None else {})})
        return ctx.render(request, "scope.html", deployment=deployment, tenant=tenant,
                          workspace=workspace, counts=counts, limits=limits, keys=keys,
                          schedules=schedules, runs_query=runs_query, defaults=defaults,
                          versions=versions, pinned=pinned,
                          done=request.query_params.get("done"))

    async def scope_action(request: Request) -> Response:
        form, refused = await ctx.check_post(request)
        if refused:
            return refused
        try:
            deployment, tenant, workspace = _scope(form)
            op = str(form.get("op", ""))
            if op not in _OPS:
                raise BadInput(f"op must be one of {', '.join(_OPS)}")
            paused = max_concurrency = weight = rate_limit = None
            if op == "pause":
                paused = True
            elif op == "resume":
                paused = False
            else:
                # Blank: no limit (0 removes it), the default weight, no rate limit key.
                max_concurrency = form_int(form, "max_concurrency", 1, 10000, blank=0)
                weight = form_int(form, "weight", 1, 1000, blank=1)
                rate_limit = form_optional_name(form, "rate_limit") or ""
        except BadInput as exc:
            return ctx.bad_input(request, exc)
        try:
            await ctx.act(request, f"scope {op}", f"{tenant}/{workspace or ''}/{deployment}",
                          _calls.SET_SCOPE_LIMITS, deployment, tenant, workspace, paused,
                          max_concurrency, weight, rate_limit, None)
        except asyncpg.PostgresError as exc:
            return ctx.refused(request, exc)
        return RedirectResponse(scope_url(deployment, tenant, workspace) + "&done=" + op,
                                status_code=303)

    async def defaults_action(request: Request) -> Response:
        """A DBA's defaults of a deployment (zeroth.set_deployment_defaults, managed_by sql: the
        applications' registrations keep them from then on); blank keeps a value."""
        form, refused = await ctx.check_post(request)
        if refused:
            return refused
        try:
            deployment, tenant, workspace = _scope(form)
            max_attempts = form_int(form, "max_attempts", 1, 1000)
            priority = form_int(form, "priority", -1_000_000, 1_000_000)
            retry_base = _optional_seconds(form, "retry_base_seconds", 0.0, _MAX_RETRY_SECONDS)
            retry_max = _optional_seconds(form, "retry_max_seconds", 0.0, _MAX_RETRY_SECONDS)
            # A registered lease is at least a second (zeroth.deployments: a shorter one lapses
            # before its run can start).
            lease = _optional_seconds(form, "lease_seconds", 1.0, 86400.0)
            unset = _unset(form)
            both = [k for k, v in (("retry_base_seconds", retry_base),
                                   ("retry_max_seconds", retry_max),
                                   ("lease_seconds", lease)) if v is not None and k in unset]
            if both:
                raise BadInput(f"{', '.join(both)}: a value and unset at once")
        except BadInput as exc:
            return ctx.bad_input(request, exc)
        try:
            await ctx.act(request, "deployment defaults", deployment,
                          _calls.SET_DEPLOYMENT_DEFAULTS, deployment, max_attempts, priority,
                          "sql", retry_base, retry_max, lease, unset,
                          None, None)  # the timeouts: kept (shown, not set, on this page)
        except asyncpg.PostgresError as exc:
            if exc.sqlstate == "ZP008":  # the merged policy out of bounds (base above max)
                return ctx.bad_input(request, BadInput(str(exc)[:300]))
            return ctx.refused(request, exc)
        return RedirectResponse(scope_url(deployment, tenant, workspace) + "&done=defaults",
                                status_code=303)

    async def rate_limit_action(request: Request) -> Response:
        form, refused = await ctx.check_post(request)
        if refused:
            return refused
        try:
            name = form_name(form, "name")
            max_starts = form_int(form, "max_starts", 1, 1_000_000)
            if max_starts is None:
                raise BadInput("max_starts is required")
            period = form_float(form, "period_seconds", 0.001, 86400)
        except BadInput as exc:
            return ctx.bad_input(request, exc)
        try:
            await ctx.act(request, "rate limit", name, _calls.SET_RATE_LIMIT, name, max_starts,
                          period, None)
        except asyncpg.PostgresError as exc:
            return ctx.refused(request, exc)
        return RedirectResponse("/deployments?" + urllib.parse.urlencode({"done": name}),
                                status_code=303)

    return [Route("/deployments", deployments),
            Route("/deployments/scope", scope_page),
            Route("/actions/scope", scope_action, methods=["POST"]),
            Route("/actions/rate-limit", rate_limit_action, methods=["POST"]),
            Route("/actions/deployment-defaults", defaults_action, methods=["POST"])]
