"""Root causes: a confirmed minimal reproducer for every divergence, clustered and ranked (docs/explain.md).

Data flow: judge -> cause -> report. `explain(results, engine_runner, reference_runner, requests)` takes one
runner's judged results (judge.pipeline.RunnerResults) and returns an Explanation: ranked causes, each with
its reproducer (rendered again on both sides) and the cells it explains, and the cells left unexplained with
the reason.

  signature.py  what "differs in the same way" means (normalised symptoms)
  template.py   a template as a tree of its exact source; smaller candidates; expression simplification
  reduce.py     delta debugging of one (template, case) pair, as a coroutine of render batches
  driver.py     many reductions at once through both runners' render_many
  cluster.py    cause keys, ids, titles, gains
  cache.py      reductions cached on disk by runner identity and input
  causes.py     the whole analysis: its named stages (plan, look up, reduce, cluster, confirm, rank) and explain()
"""
from conformance.explain.causes import Cause, Explanation, explain

__all__ = ["Cause", "Explanation", "explain"]
