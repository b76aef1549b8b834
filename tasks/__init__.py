"""The task files (YAML, one per task, by family), shipped as package data; read by crossbert_eval.tasks.registry."""
