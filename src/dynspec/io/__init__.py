"""Files: atomic writes (atomic), JSON lines (jsonl), typed YAML (typed_yaml)."""
