# SGLang 0.5.23's EAGLE-3 draft.
from sglang.srt.models.llama_eagle3 import EntryClass  # noqa: F401
