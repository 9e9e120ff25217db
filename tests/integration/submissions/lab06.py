"""Lab 06 (attention): a baseline-equivalent submission.

"baseline" pastes the naive attention — the lab's baseline, which materialises the (L, L) score
matrix — into the SDPA exercise and the blockwise one. Its answers are right, but it runs no
fused kernel and makes the score matrix, so it must score 0 on the blockwise cells and the SDPA
correctness cell (which checks that a fused kernel ran), and on the speed and memory checks
(it is the grader's baseline, 1.0x on both).
No looper: the sweep, the text classifier and three graded cells call ``attention_sdpa``; a
looping one would time out in several cells.
"""

NAIVE_AS_SDPA = '''
def attention_sdpa(q, k, v, mask=None):
    """The same attention as attention_naive, through F.scaled_dot_product_attention."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    return scores.softmax(dim=-1) @ v
'''

NAIVE_AS_BLOCKWISE = '''
def attention_blockwise(q, k, v, mask=None, block_size=128):
    """softmax(q k^T / sqrt(d)) v over blocks of keys with an online softmax: no L x L matrix."""
    return attention_naive(q, k, v, mask)
'''

VARIANT = {
    "students": {
        "baseline": {"attention_sdpa": NAIVE_AS_SDPA, "attention_blockwise": NAIVE_AS_BLOCKWISE},
    },
    "speed_checks": [
        "test_blockwise_visible",
        "test_blockwise_hidden",
        "test_blockwise_memory_hidden",
        "test_sdpa_visible",
        "test_sdpa_hidden",
        "test_speed_hidden",
        "test_memory_hidden",
    ],
    "loop_checks": [],
}
