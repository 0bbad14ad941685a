"""anvil-train's --recipe presets for the PyTorch scripts: apps/recipes.json,
the one table that anvil-train, train_step and bench_train read too
(apps/recipes.md says why each value is what it is).

    from anvil_recipes import recipe
    recipe("seed", "lenet")["lr"]   # 0.2

Keys are anvil-train's flags without the dashes: "epochs", "batch-size",
"lr", "momentum", "weight-decay", "nesterov", "init", "lr-schedule", ...
"""
import json
import os

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "apps", "recipes.json")


def recipe(name, model):
    """The settings of recipe `name` (seed, best) for `model` (lenet, resnet18, resnet18-96)."""
    with open(TABLE) as f:
        table = json.load(f)
    rows = table.get(name)
    if not isinstance(rows, dict):
        raise SystemExit(f"{os.path.normpath(TABLE)}: no recipe '{name}'")
    if model not in rows:
        raise SystemExit(f"{os.path.normpath(TABLE)}: recipe '{name}' has no row for '{model}'")
    return rows[model]
