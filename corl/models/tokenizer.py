"""A character-level tokenizer built locally (nothing can be downloaded from a hub).

It is a real ``PreTrainedTokenizerFast`` saved as ``tokenizer.json``, so transformers, TRL and vLLM
load a member directory by path like any hub model.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
# Printable ASCII without the other whitespace: enough for arithmetic, judge templates and short text.
CHARSET = "".join(c for c in string.printable if c not in "\t\n\r\x0b\x0c")


def build_char_tokenizer(charset: str = CHARSET) -> PreTrainedTokenizerFast:
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for ch in charset:
        vocab.setdefault(ch, len(vocab))
    # BPE with no merges over single characters is a character tokenizer; Fuse joins without spaces.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        bos_token=EOS,
        padding_side="left",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
