import pytest

from services.training import tasks


@pytest.mark.parametrize("family", tasks.FAMILIES)
def test_deterministic_and_exact(family):
    a = tasks.generate(family, 50, "train", seed=3)
    assert a == tasks.generate(family, 50, "train", seed=3)
    assert a != tasks.generate(family, 50, "train", seed=4)
    for t in a:
        assert t.family == family
        assert tasks.check(t, t.response)
        assert tasks.check(t, " " + t.response + "<|endoftext|><|endoftext|>junk")
        assert not tasks.check(t, t.response + "0")
        assert not tasks.check(t, t.response[:-1])
        assert len(t.prompt) + len(t.response) < 400


@pytest.mark.parametrize("family", tasks.FAMILIES)
def test_heldout_disjoint(family):
    train = tasks.generate(family, 1000, "train", seed=0)
    held = tasks.generate(family, 100, "heldout", seed=0)
    assert not {t.prompt for t in train} & {t.prompt for t in held}
    assert all(tasks.split_of(t.prompt) == "heldout" for t in held)
    # a held-out item is never a train item, whatever seed drew the train side
    assert not set(held) & set(tasks.generate(family, 1000, "train", seed=1))


def test_family_semantics():
    c = tasks.generate("count", 20, "train", 0)
    for t in c:
        start, step, n = (int(x) for x in t.prompt.rstrip(":").split()[2::2])
        xs = [int(x) for x in t.response.split()]
        assert len(xs) == n and 10 <= n <= 40 and xs == [start + i * step for i in range(n)]
    for t in tasks.generate("sort", 20, "train", 0):
        xs = [int(x) for x in t.prompt.split()[1:]]
        assert 5 <= len(xs) <= 8 and all(0 <= x <= 99 for x in xs)
        assert t.response == " ".join(map(str, sorted(xs)))
    for t in tasks.generate("add", 20, "train", 0):
        a, b = t.prompt[4:-1].split("+")
        assert int(t.response) == int(a) + int(b)
    for t in tasks.generate("reverse", 20, "train", 0):
        assert t.response.split() == t.prompt.split()[1:][::-1] and 8 <= len(t.response.split()) <= 24
    for t in tasks.generate("code", 30, "train", 0):
        assert t.response == tasks.run_code(t.prompt.removesuffix("\n#"))
