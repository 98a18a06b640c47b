"""Text and its tokens: llm.c's tokenizer file (tokenizer), BPE tokenizers of text (bpe, byte_tokens,
gpt2_tokenizer_json, tokenizer_export) and text -> llm.c token shards (make_shards)."""
