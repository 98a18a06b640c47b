"""Text and its tokens: llm.c's tokenizer file (tokenizer), BPE tokenizers of text and byte-level ids (bpe),
tokenizer files made from others (tokenizer_files) and text -> llm.c token shards (make_shards)."""
