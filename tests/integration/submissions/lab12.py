"""Lab 12 (torch.compile): a baseline-equivalent submission — the code the lab starts from.

"baseline" keeps the planted head as it is (``OneGraphHead`` adds nothing: five graphs), serves
tokens through ``baseline_compile`` (``dynamic=False``: a compile per shape, then eager past the
recompile limit) and "compiles" the scorer for inference by returning it in eager: 0 on the
graph, recompile and speed checks and on the visible tests they vouch for. Its break-even is
right (it keeps those points: it is arithmetic, not the lab's baseline code).
"""

PLANTED_AS_IS = '''
class OneGraphHead(lab.PlantedHead):
    """PlantedHead's outputs, without a graph break."""
'''

NAIVE = '''
def compile_for_any_length(model, backend):
    """A callable serving token batches of any shape through at most two compiled graphs."""
    return lab.baseline_compile(model, backend=backend)
'''

EAGER = '''
def compile_for_inference(model):
    """A callable computing model(images), compiled for CPU inference."""
    return model
'''

VARIANT = {
    "students": {
        "baseline": {"one_graph": PLANTED_AS_IS, "recompiles": NAIVE, "inference": EAGER},
    },
    "speed_checks": [
        "test_one_graph_visible",
        "test_one_graph_hidden",
        "test_recompiles_visible",
        "test_recompiles_hidden",
        "test_inference_visible",
        "test_inference_speed_hidden",
    ],
    "loop_checks": [],
}
