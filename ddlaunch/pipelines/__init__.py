"""Pipelines on the login node: runs that wait for each other, from one file.

A pipeline file names stages (a config each, with its ``set:``) and the edges between them
(``after:``). ``ddlaunch pipeline FILE`` submits every stage as its own run, in an order
where each stage's predecessors are submitted before it, each with ``submit --after`` onto
its predecessors' runs (``app.chain``): so ``resume`` of a stage moves its dependents onto
the new job, as for any chained run.

Its parts: the file (``spec``, file:line errors), the use case (``submit``), the record
(``store.pipelines``: ``pipeline.json`` in the pipeline's directory under the run root),
and the one row ``status`` shows for it (``app.pipeline_status``).
"""
