"""Incremental text: deltas never need retracting; stop sequences cut the text and are never half sent."""

import pytest

from services.orchestrator.api.detok import Redecoder, StreamDecoder, TextStream, detokenizer, held_back
from tests.tiny import tokenizer

MULTIBYTE = "count: é € 😀 中文 ok"


def chars(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def codes(text: str) -> list[int]:
    return list(map(ord, text))


def test_partial_stop_is_held_back_then_cut():
    stream = TextStream(Redecoder(chars), ["bcd"])
    assert stream.push(codes("ab")) == ("a", [ord("a"), ord("b")])  # "b" may start "bcd"
    assert stream.push(codes("c")) == ("", [ord("c")])
    assert stream.push(codes("dxyz")) == ("", [ord("d")])  # cut before "bcd"; ids end with the completing token
    assert stream.stopped and stream.text == "a"
    assert stream.push(codes("more")) == ("", []) and stream.flush() == ("", [])


def test_held_back_text_is_released_when_it_cannot_be_a_stop():
    stream = TextStream(Redecoder(chars), ["bcd"])
    assert stream.push(codes("ab"))[0] == "a"
    assert stream.push(codes("x"))[0] == "bx"
    assert stream.push(codes("bc"))[0] == ""
    assert stream.flush()[0] == "bc" and stream.text == "abxbc"


def test_incomplete_character_waits_for_its_bytes():
    def utf8(ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    stream = TextStream(Redecoder(utf8))
    euro = "€".encode()
    assert stream.push([ord("a"), euro[0]]) == ("a", [ord("a"), euro[0]])
    assert stream.push([euro[1]])[0] == ""
    assert stream.push([euro[2]])[0] == "€"


def test_held_back_length():
    assert held_back("xab", ["abc", "bz"]) == 2
    assert held_back("xa", ["abc"]) == 1
    assert held_back("xy", ["abc"]) == 0
    assert held_back("abc", []) == 0


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tokenizer(str(tmp_path_factory.mktemp("tok")))


def one_at_a_time(stream: TextStream, ids: list[int]) -> tuple[str, list[int]]:
    text, sent = [], []
    for i in ids:
        delta, delta_ids = stream.push([i])
        text.append(delta)
        sent += delta_ids
    delta, delta_ids = stream.flush()
    return "".join(text) + delta, sent + delta_ids


def test_streamed_text_equals_full_decoding_across_split_characters(tok):
    ids = tok.encode(MULTIBYTE + "<|endoftext|>", add_special_tokens=False)
    split = [n for n in range(1, len(ids)) if tok.decode(ids[:n]).endswith("\ufffd")]
    assert split, "the byte-level tokenizer must split some character over several ids for this test to bite"
    stream = TextStream(detokenizer(tok))
    assert isinstance(stream.decoder, StreamDecoder)
    text, sent = one_at_a_time(stream, ids)
    assert text == tok.decode(ids, skip_special_tokens=True) == MULTIBYTE
    assert sent == ids
    for n in split:  # a half character is never sent
        prefix = TextStream(detokenizer(tok))
        assert "\ufffd" not in prefix.push(ids[:n])[0]


def test_stop_after_a_split_character_cuts_text_and_ends_ids_at_the_completing_token(tok):
    ids = tok.encode(MULTIBYTE, add_special_tokens=False)
    for stop in (["😀"], ["中文"], ["€ 😀", "zz"]):
        text, sent = one_at_a_time(TextStream(detokenizer(tok), stop), ids)
        assert text == MULTIBYTE[: MULTIBYTE.index(stop[0])]
        assert stop[0] in tok.decode(sent) and stop[0] not in tok.decode(sent[:-1])


def test_bytes_that_never_complete_a_character_are_flushed_as_full_decoding_shows_them(tok):
    euro = tok.encode("€", add_special_tokens=False)
    ids = tok.encode("ok ", add_special_tokens=False) + euro[:-1]
    for decoder in (StreamDecoder(tok), Redecoder(lambda x: tok.decode(x, skip_special_tokens=True))):
        text, _ = one_at_a_time(TextStream(decoder), ids)
        assert text == tok.decode(ids, skip_special_tokens=True) and text.endswith("\ufffd")


def test_stream_decoder_and_redecoding_agree_round_by_round(tok):
    ids = tok.encode(MULTIBYTE * 3, add_special_tokens=False)
    rounds = [ids[i : i + 3] for i in range(0, len(ids), 3)]
    fast = TextStream(StreamDecoder(tok), ["中文 ok"])
    slow = TextStream(Redecoder(lambda x: tok.decode(x, skip_special_tokens=True)), ["中文 ok"])
    assert [fast.push(r) for r in rounds] == [slow.push(r) for r in rounds]
    assert fast.flush() == slow.flush() and fast.text == slow.text
