"""What a command reads and writes on disk:

- `io`: atomic files, bounded JSON/YAML/text readers, hashes, quoting;
- `runlock`: one writer per run directory (the lock file);
- `outdirs`: which output folders a command may create or replace, and how their files move in;
- `outfiles`: which single output files a command may write or replace.

Import the submodules directly; nothing is imported here."""
