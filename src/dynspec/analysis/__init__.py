"""Reading finished runs (pandas, matplotlib): levels and crossovers, `dynspec tune`, the report
(report/), the pipeline that renders it, the figure cache, the made-up machine family, and
`dynspec fit` (fit_cli, run_fit: a fit spec from a run's own measurements)."""
