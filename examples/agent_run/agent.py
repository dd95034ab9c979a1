"""An agent run on zeroth_pg: three durable steps, one human approval, two sub-runs.

``triage`` plans with a (stand-in) model call, starts two ``research`` child runs, waits for both
without holding a lease, drafts a reply from their findings, then waits for a person to approve
it (an event any service or psql can emit) and sends it. Every step's result is recorded once,
fenced by the lease: a crash, a deploy or the approval wait replays the handler from the top and
every finished step, child start and wait returns its recorded value without running again.

Run it (README.md beside this file)::

    cd examples/agent_run
    python -m zeroth_pg.worker --app agent:app        # both deployments, one fleet worker
    zeroth-pg enqueue --deployment triage --payload '{"ticket": "T-42", "question": "refund?"}'
    psql "$ZEROTH_PG_DSN" -c \
      "SELECT * FROM zeroth.emit_event('approval:T-42', '{\"by\": \"ann\", \"ok\": true}')"
"""

from __future__ import annotations

from typing import Any

from zeroth_pg import App

app = App()


def think(prompt: str) -> str:
    """Stand-in for an LLM call: deterministic, so the example's test can check the output."""
    return f"<{prompt}>"


@app.deployment("research", max_attempts=2)
async def research(run: Any, topic: str) -> dict[str, str]:
    notes = await run.step("read", think, f"notes on {topic}")
    return {"topic": topic, "notes": notes}


@app.deployment("triage")
async def triage(run: Any, ticket: str, question: str) -> dict[str, Any]:
    plan = await run.step("plan", think, f"plan for {question}")                    # step 1
    children = [await run.start_child("research", {"topic": topic})                 # sub-runs
                for topic in ("policy", "history")]
    outcomes = await run.wait_for_children(children)        # the run waits without a lease
    findings = [o.output["notes"] if o.succeeded else f"failed: {o.error}" for o in outcomes]
    draft = await run.step("draft", think, f"reply using {plan} and {findings}")    # step 2
    approval = await run.wait_for_event(f"approval:{ticket}", timeout=24 * 3600)
    if not approval.get("ok"):
        return {"ticket": ticket, "sent": False, "reviewer": approval.get("by")}
    receipt = await run.step("send", lambda: {"sent_to": ticket, "body": draft})   # step 3
    return {"ticket": ticket, "sent": True, "reviewer": approval["by"], "receipt": receipt}
