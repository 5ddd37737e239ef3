"""bench/estimate/estimate_train_check.py: its flags are bench/run.sh's pretrain_gpt recipe and a
valid `gigatron estimate` command for every shape (the comparison itself runs on the GPU machine,
`bash bench/run.sh estimate-train`; its CPU twin is tests/tools/test_estimate_memory.py's bf16
recipe layout)."""

import re

from bench.estimate import estimate_train_check as check
from gigatron.tools.estimate.args import estimate_args
from tests._paths import REPO


def test_flags_are_train_ones_recipe_and_parse_for_every_shape():
    run_sh = (REPO / "bench" / "run.sh").read_text()
    body = run_sh[run_sh.index("train_one() {") :]
    line = body[body.index("$TRAIN_SHAPE") : body.index('"$@"')]
    recipe = re.sub(r"\s+", " ", line.replace("\\", "")).split()[1:]
    nodrop = re.search(r'^NODROP="([^"]*)"', run_sh, re.M).group(1).split()
    ours = check.RECIPE.split()
    for i, flag in enumerate(recipe + nodrop):
        if flag.startswith("--") and flag != "--torch-compile":  # ours: eager (what it models)
            assert flag in ours, flag
            nxt = (recipe + nodrop + [""])[i + 1]
            if not nxt.startswith("--") and nxt:
                assert ours[ours.index(flag) + 1] == nxt, (flag, nxt)
    for shape in check.SHAPES:
        flags = check.train_flags(shape, "eager", "cpu", 4, 2)
        args = estimate_args([*flags, "--world-size", "1"])
        assert args.flat_adam_step and args.bf16 and args.use_distributed_optimizer
