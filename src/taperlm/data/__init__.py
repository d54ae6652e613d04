"""Data pipeline: corpora -> tokenizer -> memory-mapped token shards -> training batches.

Submodules: `corpus` (sources), `markup` (reST/POD stripping), `tokenizer`, `shards` (binary
format), `prepare` (the `taperlm prepare` pipeline), `loader` (deterministic, resumable batches;
imports torch). Nothing heavy is imported here.
"""
