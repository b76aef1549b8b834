"""The data pipeline, corpus -> tokenizer -> token ids on disk (numpy memmap, tokenized once) -> packed sequences, one
job per module (import each name from its module; this package re-exports nothing):

* errors: DataError, bad input data anywhere in the pipeline.
* corpus: reading the corpus (jsonl / txt files, plain, .xz or .gz, or a hub dataset `hf:owner/name`): corpus_files,
  iter_documents / documents, corpus_location / corpus_extent / corpus_fingerprint, the validation split rule
  (is_validation), and the corpus as blocks of whole documents for the tokenization workers (corpus_blocks).
* tokenizer: WordPiece training (train_wordpiece, prepare_tokenizer) and loading (load_tokenizer, minilm_path);
  tokenizer_fingerprint, special_token_config, check_tokenizer_matches.
* token_cache: the parallel, sharded, resumable token cache (tokenize_corpus: block encoders in worker processes,
  the shard writer, meta / plan / progress files), read back as one stream per split (ShardedTokens).
* sequences: sequences for training: PackedSequences, unigram_counts, EpochSampler, CorpusData, load_tokens, and
  prepare_data (the whole pipeline for a DataArgs, whose home is crossbert_model.data_args).
"""
