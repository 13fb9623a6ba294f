"""Incremental text: deltas never need retracting; stop sequences cut the text and are never half sent."""

from services.orchestrator.detok import TextStream, held_back


def chars(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def codes(text: str) -> list[int]:
    return list(map(ord, text))


def test_partial_stop_is_held_back_then_cut():
    stream = TextStream(chars, ["bcd"])
    assert stream.push(codes("ab")) == ("a", [ord("a"), ord("b")])  # "b" may start "bcd"
    assert stream.push(codes("c")) == ("", [ord("c")])
    assert stream.push(codes("dxyz")) == ("", [ord("d")])  # cut before "bcd"; ids end with the completing token
    assert stream.stopped and stream.text == "a"
    assert stream.push(codes("more")) == ("", []) and stream.flush() == ("", [])


def test_held_back_text_is_released_when_it_cannot_be_a_stop():
    stream = TextStream(chars, ["bcd"])
    assert stream.push(codes("ab"))[0] == "a"
    assert stream.push(codes("x"))[0] == "bx"
    assert stream.push(codes("bc"))[0] == ""
    assert stream.flush()[0] == "bc" and stream.text == "abxbc"


def test_incomplete_character_waits_for_its_bytes():
    def utf8(ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    stream = TextStream(utf8)
    euro = "€".encode()
    assert stream.push([ord("a"), euro[0]]) == ("a", [ord("a"), euro[0]])
    assert stream.push([euro[1]])[0] == ""
    assert stream.push([euro[2]])[0] == "€"


def test_held_back_length():
    assert held_back("xab", ["abc", "bz"]) == 2
    assert held_back("xa", ["abc"]) == 1
    assert held_back("xy", ["abc"]) == 0
    assert held_back("abc", []) == 0
