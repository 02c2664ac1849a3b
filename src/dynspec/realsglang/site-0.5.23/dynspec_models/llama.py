# SGLang 0.5.23's Llama (the tiny target).
from sglang.srt.models.llama import EntryClass  # noqa: F401
