"""The render stage: every cell's outcome through a runner, the result store (store.py) answering first.

Rendering is the flow's runner -> outcome step; what an outcome means is the judge's business (judge/)."""
from __future__ import annotations

from typing import Callable, Optional, Sequence


def render(runner, cells: Sequence, progress: Optional[Callable[[int, int], None]] = None,
           store=None, refresh: bool = False) -> list:
    """Every cell's outcome through the runner, in order. With a result store (render/store.py) the store
    answers first and only the cells it does not hold are rendered; refresh renders every cell and stores
    what comes back."""
    from conformance.render.store import cached_render_many

    outcomes = []
    total = len(cells)
    for index, outcome in enumerate(cached_render_many(runner, [c.request for c in cells], store, refresh), 1):
        outcomes.append(outcome)
        if progress:
            progress(index, total)
    return outcomes


def runner_info(runner, seconds: Optional[float] = None) -> dict:
    """The runner's description for judged results, with what it decided per template (Runner.template_facts:
    e.g. llama.cpp's built-in format), which the report shows beside each template. Call after rendering."""
    info = dict(runner.describe())
    if seconds is not None:
        info["seconds"] = round(seconds, 3)
    facts = runner.template_facts()
    if facts:
        info["template_facts"] = facts
    return info
