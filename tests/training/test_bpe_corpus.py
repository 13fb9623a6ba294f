import pytest
from transformers import AutoTokenizer

from services.training import bpe, corpus, dataset


def test_corpus_split_by_module():
    docs = corpus.iter_modules()
    tr, ho = corpus.load("train"), corpus.load("heldout")
    assert len(tr) + len(ho) == len(docs) and ho and tr
    assert not {d.module for d in tr} & {d.module for d in ho}
    text = docs[0].text
    assert "".join(corpus.chunks(text, 300)).replace("\n", "").strip()
    assert all(len(c) <= 300 for c in corpus.chunks(text, 300))


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("bpe")
    data = root / "data"
    dataset.build(dataset.DataConfig(out=str(data), n_train=100, n_heldout=10, max_modules=20))
    bpe.train_from_data(bpe.BpeConfig(vocab_size=1024, out=str(root / "tok"), data=str(data)))
    return root


def test_tokenizer_roundtrip_and_specials(tok_dir):
    tok = AutoTokenizer.from_pretrained(tok_dir / "tok", local_files_only=True)
    assert bpe.special_ids(tok) == {bpe.EOS: 0, bpe.MASK: 1, bpe.RESPONSE: 2}
    assert tok.eos_token == tok.pad_token == bpe.EOS and tok.mask_token == bpe.MASK
    assert len(tok) <= 8192
    texts = dataset.load_corpus(tok_dir / "data", "heldout")[:200] + [d.text for d in corpus.load("heldout")[:5]]
    texts += ["  weird\tspacing\n\n ünïcödé 💥 x==1 ", "count from 7 step 3 for 12:"]
    for t in texts:
        assert tok.decode(tok(t, add_special_tokens=False)["input_ids"]) == t
    s = "sort: 83 16 59" + bpe.RESPONSE + "16 59 83" + bpe.EOS
    ids = tok(s, add_special_tokens=False)["input_ids"]
    assert ids.count(2) == 1 and ids[-1] == 0 and tok.decode(ids) == s
    # digits one per token
    assert all(len(tok.convert_tokens_to_string([x]).strip()) <= 1 for x in tok.tokenize(" 123 4567"))


def test_chat_template(tok_dir):
    tok = AutoTokenizer.from_pretrained(tok_dir / "tok", local_files_only=True)
    p = "add 001+002="
    out = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
    assert out == p + bpe.RESPONSE


def test_data_build_deterministic(tmp_path):
    for d in ("a", "b"):
        dataset.build(dataset.DataConfig(out=str(tmp_path / d), seed=5, n_train=30, n_heldout=5, max_modules=3))
    for f in ("tasks_train.jsonl", "tasks_heldout.jsonl", "corpus_train.jsonl", "corpus_heldout.jsonl"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    tr = {t.prompt for t in dataset.load_tasks(tmp_path / "a", "train")}
    assert not tr & {t.prompt for t in dataset.load_tasks(tmp_path / "a", "heldout")}
