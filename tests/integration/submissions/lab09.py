"""Lab 09 (profiling): a baseline-equivalent submission.

"baseline" pastes the planted slow step (``lab.baseline_setup``/``baseline_step``) into the
exercise as the student's "fix". It trains exactly like the slow step, so it keeps the
correctness tests, but it must score 0 on the speedup check.
No looper: a looping step would time out in three cells (the visible test, correctness and
speed), which costs more grading time than it tests.
"""

SLOW_COPY = '''
def fast_setup(model, lr):
    """Prepare ``model`` (in place) and return its optimizer: SGD with learning rate ``lr``."""
    return torch.optim.SGD(model.parameters(), lr=lr)


def fast_step(model, opt, tokens, labels):
    """One SGD step on (tokens, labels) equal to lab.baseline_step's; returns the loss."""
    rows = model.embedding.num_embeddings
    width = 2 * tokens.shape[1] - 1
    out = []
    for row in tokens.tolist():
        words = [t for t in row if t != 0]
        feats = [t % (rows - 1) + 1 for t in words]
        feats += [(a * lab.PRIME + b) % (rows - 1) + 1 for a, b in zip(words, words[1:])]
        out.append(feats + [0] * (width - len(feats)))
    ids = torch.tensor(out, dtype=torch.long)
    logits = model(ids).double()
    losses = [F.cross_entropy(logits[i : i + 1], labels[i : i + 1]) for i in range(len(ids))]
    loss = torch.stack(losses).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()
'''

VARIANT = {
    "students": {
        "baseline": {"fast_step": SLOW_COPY},
    },
    "speed_checks": ["test_fix_speed_hidden"],
    "loop_checks": [],
}
