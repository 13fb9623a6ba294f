"""The special tokens shared by the tokenizer and the sequence format, ids 0, 1, 2 in SPECIALS order."""

EOS = "<|endoftext|>"
MASK = "<|mask|>"
RESPONSE = "<|response|>"
SPECIALS: tuple[str, ...] = (EOS, MASK, RESPONSE)
