"""Dynamic MLM masking statistics and the NSP / SOP pair builders."""
from __future__ import annotations

import torch

from training.masking import IGNORE_INDEX, MaskingConfig, build_pairs, mask_tokens, non_special_ids

VOCAB = 1000
SPECIAL = [0, 1, 2, 3, 4]  # pad unk cls sep mask
MASK_ID = 4


def _batch(rows: int = 800, width: int = 256, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of [CLS] tokens [SEP] [PAD]...: ~200k positions, ~90% of them maskable."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (rows, width), generator=g)
    lengths = torch.randint(width // 2, width + 1, (rows,), generator=g)
    for i, n in enumerate(lengths.tolist()):
        ids[i, 0] = 2
        ids[i, n - 1] = 3
        ids[i, n:] = 0
    maskable = (ids >= 5)
    return ids, maskable


def test_masking_statistics_over_200k_tokens() -> None:
    ids, maskable = _batch()
    assert ids.numel() >= 200_000
    out, labels = mask_tokens(ids, maskable, MASK_ID, non_special_ids(VOCAB, SPECIAL), MaskingConfig(),
                              torch.Generator().manual_seed(0))
    selected = labels != IGNORE_INDEX
    n_sel = int(selected.sum())
    assert abs(n_sel / int(maskable.sum()) - 0.15) < 0.005
    # Labels only at selected positions, and they hold the original token.
    assert not (selected & ~maskable).any()
    assert torch.equal(labels[selected], ids[selected])
    # Positions never selected are untouched (specials and padding included).
    assert torch.equal(out[~selected], ids[~selected])
    masked = (out == MASK_ID) & selected
    unchanged = (out == ids) & selected
    replaced = selected & ~masked & ~unchanged
    assert abs(int(masked.sum()) / n_sel - 0.8) < 0.01
    # A random replacement equal to the original (p = 1/995) counts as unchanged: negligible.
    assert abs(int(replaced.sum()) / n_sel - 0.1) < 0.01
    assert abs(int(unchanged.sum()) / n_sel - 0.1) < 0.01
    # Random replacements come from the non-special vocabulary.
    assert int(out[replaced].min()) >= 5


def test_masking_is_seeded() -> None:
    ids, maskable = _batch(rows=50, width=64)
    rnd = non_special_ids(VOCAB, SPECIAL)
    a = mask_tokens(ids, maskable, MASK_ID, rnd, MaskingConfig(), torch.Generator().manual_seed(7))
    b = mask_tokens(ids, maskable, MASK_ID, rnd, MaskingConfig(), torch.Generator().manual_seed(7))
    c = mask_tokens(ids, maskable, MASK_ID, rnd, MaskingConfig(), torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def _docs(n_docs: int = 60, lines: int = 12) -> list[list[list[int]]]:
    """Synthetic documents: token = doc * 1000 + position, so a segment's origin is readable."""
    return [[[d * 1000 + li * 5 + k for k in range(5)] for li in range(lines)] for d in range(n_docs)]


def _contiguous_in_doc(seq: list[int]) -> bool:
    docs = {t // 1000 for t in seq}
    pos = [t % 1000 for t in seq]
    return len(docs) == 1 and pos == sorted(pos) and pos == list(range(pos[0], pos[0] + len(pos)))


def test_nsp_pairs_half_random_from_other_documents() -> None:
    pairs = build_pairs(_docs(), "nsp", max_tokens=40, seed=3)
    rate = sum(p.label for p in pairs) / len(pairs)
    assert 0.35 < rate < 0.65
    for p in pairs:
        if p.label == 0:
            assert _contiguous_in_doc(p.a + p.b)
        else:
            assert {t // 1000 for t in p.a}.isdisjoint({t // 1000 for t in p.b})
        assert len(p.a) + len(p.b) <= 40


def test_sop_pairs_half_swapped_same_document() -> None:
    pairs = build_pairs(_docs(), "sop", max_tokens=40, seed=3)
    rate = sum(p.label for p in pairs) / len(pairs)
    assert 0.35 < rate < 0.65
    for p in pairs:
        assert _contiguous_in_doc(p.b + p.a if p.label else p.a + p.b)
