"""Search results without raw LaTeX (kda.site.search_text)."""

import json

from kda.site.search_text import clean_search_index, plain_math, plain_text


def test_formulas_become_readable_text():
    assert plain_math(r"d_k\times d_v") == "d_k× d_v"
    assert plain_math(r"\operatorname{diag}(e^{g_t})\, S_{t-1}") == "diag(e^g_t) S_t-1"
    assert plain_math(r"\tilde S_i^\top k_i \le 2^{96}") == "S_i^ᵀ k_i ≤ 2^96"
    assert plain_math(r"\begin{aligned} a &= b \\ c &= d \end{aligned}") == "a = b c = d"
    assert plain_math(r"\frac{a}{b} + \sum_{j<i} x_j") == "(a)/(b) + Σ_j<i x_j"


def test_text_keeps_its_words_and_loses_its_delimiters():
    text = r"the chunk affine map \(S' = MS + B\) and \[\beta_i \in [0, 1]\] done"
    assert plain_text(text) == "the chunk affine map S' = MS + B and β_i ∈ [0, 1] done"


def test_index_rewritten_in_place(tmp_path):
    (tmp_path / "search").mkdir()
    index = {"config": {"lang": ["en"]}, "docs": [{"location": "a/", "title": r"Level \(1\)", "text": r"\(x\le 1\)"},
                                                  {"location": "b/", "title": "B", "text": "no math"}]}
    (tmp_path / "search" / "search_index.json").write_text(json.dumps(index))
    assert clean_search_index(tmp_path) == 2
    docs = json.loads((tmp_path / "search" / "search_index.json").read_text())["docs"]
    assert [d["title"] for d in docs] == ["Level 1", "B"] and docs[0]["text"] == "x≤ 1"
