"""Data pipeline: corpora -> tokenizer -> memory-mapped token shards -> training batches.

Submodules: `corpus` (sources), `readers` (streaming readers of local files and Hugging Face
datasets), `markup` (reST/POD stripping), `tokenizer`, `tokenizer_bounds` (what a tokenizer
file may become: entries, expansion, regexes), `encode` (order-preserving parallel
tokenization), `shards` (binary format), `datadir` (a data dir on disk: meta.json, shard lists,
replacing one safely), `identity` (a run bound to its data), `prepare` (the `taperlm prepare`
pipeline), `val_split` (its validation split), `progress` (the status line of long data work),
`heap` (keeping a long process's heap from growing), `loader` (deterministic, resumable batches;
imports torch). Nothing heavy is imported here.
"""
