"""How closely two sets of logits agree: one definition for tests, benchmarks and the A/B report.

A top-1 disagreement counts as a near-tie when the reference's top-1/top-2
margin for that input is smaller than three times the largest absolute logit
error measured over the whole set: such inputs may flip under any rounding.
"""

from __future__ import annotations

import numpy as np

NEAR_TIE_FACTOR = 3.0

# Served logits against the float32 reference: fp16 weights (custom) or fp16 compute (GPU)
# keep the relative L2 error under 1e-2 over a set of images and under 5e-2 for every single
# image (worst measured on the H100: 2.2e-2, fp16 cuDNN, a white-noise image).
# One image's logits answered on another image's row would be off by O(1).
SET_REL_L2_TOLERANCE = 1e-2
IMAGE_REL_L2_TOLERANCE = 5e-2


def relative_l2(candidate, reference) -> float:
    """||candidate - reference|| / ||reference|| over all elements: what IMAGE_REL_L2_TOLERANCE bounds."""
    cand = np.asarray(candidate, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    return float(np.linalg.norm(cand - ref) / max(np.linalg.norm(ref), 1e-30))


def compare_logits(candidate, reference) -> dict:
    """Agreement of candidate logits [N, C] with reference logits [N, C] (any float dtype)."""
    cand = np.asarray(candidate, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if cand.shape != ref.shape or cand.ndim != 2:
        raise ValueError(f"logits must both be [N, C], got {cand.shape} and {ref.shape}")
    diff = cand - ref
    max_abs = float(np.abs(diff).max()) if diff.size else 0.0
    rel_l2 = relative_l2(cand, ref)
    row_rel_l2 = np.linalg.norm(diff, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-30)
    top_ref = np.argsort(-ref, axis=1)[:, :5]
    top_cand = np.argsort(-cand, axis=1)[:, :5]
    top1_agree = top_ref[:, 0] == top_cand[:, 0]
    ref_sorted = np.sort(ref, axis=1)
    margin = ref_sorted[:, -1] - ref_sorted[:, -2]
    near_tie = margin < NEAR_TIE_FACTOR * max_abs
    cosine = (cand * ref).sum(1) / np.maximum(np.linalg.norm(cand, axis=1) * np.linalg.norm(ref, axis=1), 1e-30)
    return {
        "inputs": int(ref.shape[0]),
        "max_abs": max_abs,
        "rel_l2": rel_l2,
        "max_row_rel_l2": float(row_rel_l2.max()) if row_rel_l2.size else 0.0,
        "top1_agree": int(top1_agree.sum()),
        "top1_disagreements": int((~top1_agree).sum()),
        "near_tie_disagreements": int((~top1_agree & near_tie).sum()),
        "clear_disagreements": int((~top1_agree & ~near_tie).sum()),
        "top5_agree": int(sum(set(a) == set(b) for a, b in zip(top_ref, top_cand))),
        "min_cosine": float(cosine.min()) if cosine.size else 1.0,
    }
