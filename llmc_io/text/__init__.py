"""Text and its tokens: llm.c's tokenizer file (tokenizer), BPE tokenizers of text (bpe, byte_tokens),
tokenizer files made from others (tokenizer_files) and text -> llm.c token shards (make_shards)."""
