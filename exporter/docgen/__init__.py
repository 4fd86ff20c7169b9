"""The generated parts of the docs, made from the declarations they describe.

`python -m exporter.docgen` (part of `make docs`) writes docs/metrics.md and rewrites
each block between `<!-- BEGIN generated:NAME -->` and `<!-- END generated:NAME -->`;
`--check` only reports what is stale (a unit test runs it).
"""
