"""The render stage: every cell's outcome through a runner, the result store (store.py) answering first.

Rendering is the flow's runner -> outcome step; what an outcome means is the judge's business (judge/)."""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional, Sequence

from runners.base import Errored, Outcome, RenderRequest, Runner


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


def runner_info(runner, seconds: Optional[float] = None, requests: Sequence[RenderRequest] = ()) -> dict:
    """The runner's description for judged results, with what it decided per template (Runner.template_facts:
    e.g. llama.cpp's built-in format), which the report shows beside each template. Call after rendering.
    A runner whose facts follow from the request alone (`template_facts_of`, e.g. Ollama's template choice)
    reports them for every requested template, the ones the result store answered included."""
    info = dict(runner.describe())
    if seconds is not None:
        info["seconds"] = round(seconds, 3)
    facts = runner.template_facts()
    of_requests = getattr(runner, "template_facts_of", None)
    if of_requests is not None:
        facts = {**of_requests(requests), **facts}
    if facts:
        info["template_facts"] = facts
    return info


class Posted(Runner):
    """Outcomes an engine produced elsewhere, as the render stage's source: the service's POST /v1/check is
    posted what an engine rendered and judges it through the same CheckRun as a local runner. Never cached
    (no identity), never held against a baseline the suite ships; each request is answered with the outcome
    posted with it (by identity, so a cell posted twice keeps both outcomes)."""

    name = "service"
    suite_baseline = False
    version = "posted"

    def __init__(self, posted: Iterable[tuple]):
        self._outcomes = {id(request): outcome for request, outcome in posted}

    def render(self, request: RenderRequest) -> Outcome:
        outcome = self._outcomes.get(id(request))
        if outcome is None:
            return Errored(f"no outcome was posted for {request.template_id}/{request.case_id}")
        return outcome

    def render_many(self, requests: Iterable[RenderRequest]) -> Iterator[Outcome]:
        return (self.render(request) for request in requests)
