"""The saver under a real StateGraph: what it materializes equals folding add_messages.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ..savers_graph import (
    FREQUENCIES,
    SCENARIOS,
    GraphModel,
    agent_reply,
    build_graph,
    input_batch,
    scenario_ops,
    thread_config,
    view,
)
from ..savers_model import (
    named,
    new_thread_id,
)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_graph_parity_with_add_messages_fold(saver_target: Any, scenario: str) -> None:
    """A real StateGraph in full / delta / full->delta mode, driven by generated turns
    (append, replace by id, remove, remove-all, fork from an older checkpoint,
    update_state), materializes exactly what folding add_messages gives, at the head
    and at every earlier checkpoint."""
    with saver_target.session() as session:

        # Graph runs are expensive: fewer examples than the profile, never more.
        @settings(max_examples=min(8, settings().max_examples))
        @given(
            ops=scenario_ops(),
            frequency=st.sampled_from(FREQUENCIES),
            switch=st.integers(0, 6),
        )
        def check(ops: list[tuple[str, int]], frequency: int, switch: int) -> None:
            async def body() -> None:
                saver = session.backend
                thread = new_thread_id("graph")
                mode = "delta" if scenario == "delta" else "full"
                graphs = {m: build_graph(m, frequency, saver) for m in ("full", "delta")}
                model = GraphModel()
                heads: list[str] = []
                for step, (op, pick) in enumerate(ops):
                    if scenario == "migrate" and step == switch:
                        mode = "delta"
                    graph = graphs[mode]
                    where = f"scenario={scenario} mode={mode} frequency={frequency} step={step} op={op}"
                    if op == "update":
                        batch = input_batch("append" if pick % 2 else "replace", model, pick)
                        await graph.aupdate_state(
                            thread_config(thread, mode), {"messages": batch}, as_node="agent"
                        )
                        model.apply(batch)
                    else:
                        config = thread_config(thread, mode)
                        if op == "fork" and heads:
                            # An older point than the head, when there is one: a real fork.
                            older = heads[:-1] or heads
                            base = older[pick % len(older)]
                            model.state = list(model.at[base])
                            config = thread_config(thread, mode, base)
                        batch = input_batch(op, model, pick)
                        await graph.ainvoke({"messages": batch}, config)
                        model.apply(batch)
                        model.apply(agent_reply(model.state))
                    snap = await graph.aget_state(thread_config(thread, mode))
                    got = view(snap.values.get("messages", []))
                    assert got == view(model.state), (
                        named(f"{where}: head has {got}, folding add_messages gives {view(model.state)} "
                        "(contract: graph parity — the saver materializes exactly the add_messages fold)")
                    )
                    head = snap.config["configurable"]["checkpoint_id"]
                    model.at[head] = list(model.state)
                    heads.append(head)
                graph = graphs[mode]
                for checkpoint_id, expected in model.at.items():
                    snap = await graph.aget_state(thread_config(thread, mode, checkpoint_id))
                    got = view(snap.values.get("messages", []))
                    assert got == view(expected), (
                        named(f"scenario={scenario} frequency={frequency}: checkpoint {checkpoint_id} "
                        f"has {got}, expected {view(expected)} (contract: graph parity at earlier "
                        "checkpoints and forks — no sibling branch leaks in)")
                    )

            session.run(body())

        check()
