"""The emulator's synthetic output: a fixed cycle of English words, one word per token, and
token ids to match.  No sampling, no tokenizer, no EOS: every request's first n tokens are
the same, so one growing text serves every stream as slices."""

from __future__ import annotations

_WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which "
          "but have an they you were her she there can all their one has been if more when will would "
          "who so no time up out about into than them only new some could these two may first then do "
          "any like my now over such our man me even most made after also did many before must through "
          "back years where much your way well down should because each just those people how too little "
          "state good very make world still own see men work long get here between both life being under "
          "never day same another know while last might us great old year off come since against go came "
          "right used take three").split()


class Text:
    """Cumulative text and token ids of n tokens as string slices: O(1) work per chunk."""

    def __init__(self):
        self.text = ""
        self.ids = ""
        self.text_off = [0]
        self.ids_off = [0]

    def grow(self, n: int) -> None:
        if n < len(self.text_off):
            return
        words, ids = [self.text], [self.ids]
        toff, ioff = self.text_off, self.ids_off
        tlen, ilen = len(self.text), len(self.ids)
        for i in range(len(toff) - 1, max(n, 2 * len(toff))):
            w = " " + _WORDS[i % len(_WORDS)]
            tid = ("," if i else "") + str(1000 + (i * 7919) % 31000)
            words.append(w)
            ids.append(tid)
            tlen += len(w)
            ilen += len(tid)
            toff.append(tlen)
            ioff.append(ilen)
        self.text = "".join(words)
        self.ids = "".join(ids)

    def text_of(self, lo: int, hi: int) -> str:
        return self.text[self.text_off[lo]:self.text_off[hi]]

    def ids_of(self, n: int) -> str:
        return self.ids[:self.ids_off[n]]


def openai_usage(prompt_tokens: int, n: int) -> str:
    """The OpenAI `usage` object as SGLang writes it, for n generated tokens."""
    return ('{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":null,'
            '"reasoning_tokens":0}' % (prompt_tokens, prompt_tokens + n, n))
