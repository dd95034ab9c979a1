"""The deployments pages: every (tenant, workspace, deployment) scope with its counts by state
(zeroth.scope_overview, through the ``zeroth-pg status`` query) and its limits
(zeroth.scope_limits, zeroth.rate_limits), a page per scope, and — with actions enabled — pause,
resume, max_concurrency, weight and rate limit, each through zeroth.set_scope_limits or
zeroth.set_rate_limit; a deployment's defaults (zeroth.deployments: max_attempts, priority, retry
policy, lease and the attempt and run timeouts, for every scope) shown on each of its scope pages
and set through zeroth.set_deployment_defaults, and its code version policy through
zeroth.set_version_policy (issue 34)."""

from __future__ import annotations

import re
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
_POLICY_FIELDS = ("retry_base_seconds", "retry_max_seconds", "lease_seconds",
                  "attempt_timeout_seconds", "run_timeout_seconds")
_MAX_RETRY_SECONDS = 30 * 86400.0
#: The timeouts' bounds (zeroth.deployments_timeouts_valid): an attempt at most 30 days, a run
#: at most 365, each at least a second.
_MAX_ATTEMPT_TIMEOUT = 30 * 86400.0
_MAX_RUN_TIMEOUT = 365 * 86400.0

#: The version policies (zeroth.set_version_policy) and a code version's form
#: (zeroth._check_code_version): the database checks both again.
_VERSION_POLICIES = ("any", "same", "compatible")
_CODE_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+:/-]{0,127}")
_MAX_COMPATIBLE = 100


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


def _compatible_versions(form: Any, policy: str) -> list[str] | None:
    """The set of code versions of policy compatible (one per line, or separated by commas or
    spaces; 1 to 100, each a code version); None for any other policy, whose field is blank."""
    text = str(form.get("compatible_versions") or "")
    if len(text) > _MAX_COMPATIBLE * 130:
        raise BadInput("compatible_versions is too long")
    versions = [v for v in re.split(r"[\s,]+", text) if v]
    if policy != "compatible":
        if versions:
            raise BadInput("compatible_versions is only for the policy compatible")
        return None
    if not 1 <= len(versions) <= _MAX_COMPATIBLE:
        raise BadInput(f"the policy compatible needs 1 to {_MAX_COMPATIBLE} code versions")
    for version in versions:
        if not _CODE_VERSION.fullmatch(version):
            raise BadInput(
                f"{version[:40]!r} is not a code version (1 to 128 characters: a letter or "
                "digit, then letters, digits and . _ - + : /)")
    return versions


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
            attempt_timeout = _optional_seconds(form, "attempt_timeout_seconds", 1.0,
                                                _MAX_ATTEMPT_TIMEOUT)
            run_timeout = _optional_seconds(form, "run_timeout_seconds", 1.0, _MAX_RUN_TIMEOUT)
            unset = _unset(form)
            both = [k for k, v in (("retry_base_seconds", retry_base),
                                   ("retry_max_seconds", retry_max),
                                   ("lease_seconds", lease),
                                   ("attempt_timeout_seconds", attempt_timeout),
                                   ("run_timeout_seconds", run_timeout))
                    if v is not None and k in unset]
            if both:
                raise BadInput(f"{', '.join(both)}: a value and unset at once")
        except BadInput as exc:
            return ctx.bad_input(request, exc)
        try:
            await ctx.act(request, "deployment defaults", deployment,
                          _calls.SET_DEPLOYMENT_DEFAULTS, deployment, max_attempts, priority,
                          "sql", retry_base, retry_max, lease, unset,
                          attempt_timeout, run_timeout)
        except asyncpg.PostgresError as exc:
            if exc.sqlstate == "ZP008":  # the merged policy out of bounds (base above max)
                return ctx.bad_input(request, BadInput(str(exc)[:300]))
            return ctx.refused(request, exc)
        return RedirectResponse(scope_url(deployment, tenant, workspace) + "&done=defaults",
                                status_code=303)

    async def version_policy_action(request: Request) -> Response:
        """A DBA's code version policy of a deployment (zeroth.set_version_policy, audited in
        zeroth.code_version_changes): which versions may resume a started run."""
        form, refused = await ctx.check_post(request)
        if refused:
            return refused
        try:
            deployment, tenant, workspace = _scope(form)
            policy = str(form.get("version_policy") or "")
            if policy not in _VERSION_POLICIES:
                raise BadInput(f"version_policy must be one of {', '.join(_VERSION_POLICIES)}")
            versions = _compatible_versions(form, policy)
        except BadInput as exc:
            return ctx.bad_input(request, exc)
        try:
            await ctx.act(request, "version policy", deployment, _calls.SET_VERSION_POLICY,
                          deployment, policy, versions)
        except asyncpg.PostgresError as exc:
            if exc.sqlstate == "ZP008":  # an unregistered deployment, a bad version
                return ctx.bad_input(request, BadInput(str(exc)[:300]))
            return ctx.refused(request, exc)
        return RedirectResponse(scope_url(deployment, tenant, workspace) + "&done=version-policy",
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
            Route("/actions/deployment-defaults", defaults_action, methods=["POST"]),
            Route("/actions/version-policy", version_policy_action, methods=["POST"])]
