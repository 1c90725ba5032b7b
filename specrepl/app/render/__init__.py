"""Everything specrepl shows on the terminal, drawn with rich; the only part of
the application that prints.

- repl.py: `Renderer`, what the REPL and `--prompt` show: start-up, the result
  of each slash command (a view per result type), answers, messages; the
  bottom toolbar's lines.
- answer.py: an answer streamed as it is generated, its summary table and the
  debug histograms.
- models.py: the loaded models as a table.
- measure.py: `MeasureRenderer`, the views of `soak` and `replay`.
- distill.py: `DistillRenderer`, the progress of `distill` and the head it wrote.
- formatting.py: what every view shares (sizes, counts, values, the table style).

It reads results and events; it never changes settings and never calls a model.
"""
