"""Other tools' model formats, in and out (the Hugging Face classes and files live beside it,
in `taperlm.hf`):

- `gguf_export`: a run written as a GGUF file for llama.cpp;
- `gguf_file`: a stranger's GGUF file read, bounded;
- `gguf_import`: a llama GGUF file read as a model;
- `gguf_tokenizer`: llama.cpp's byte-level BPE tokenizer, written and rebuilt through one table
  of pre-tokenizers;
- `importing`: a Llama-architecture Hugging Face folder or GGUF file made a run (`taperlm import`).

Import the submodules directly; nothing is imported here."""
