"""Run as ``python -I -S gym_child.py <tree> <category.module> <name> <json config>``: generate
reasoning-gym problems without importing the package's ``__init__`` (and so without its heavy
dependencies). Standard library only; prints one JSON object per problem: question, answer."""

import importlib
import json
import sys
import types


def _stub(tree: str, package: str) -> types.ModuleType:
    mod = types.ModuleType(package)
    mod.__path__ = [f"{tree}/{package.replace('.', '/')}"]
    sys.modules[package] = mod
    return mod


def main() -> None:
    tree, module, name, config = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    sys.path.insert(0, tree)
    _stub(tree, "reasoning_gym")
    coaching = _stub(tree, "reasoning_gym.coaching")
    for sub in ("attributes", "base_curriculum"):  # what the generators use of the coaching package
        names = vars(importlib.import_module(f"reasoning_gym.coaching.{sub}"))
        vars(coaching).update({k: v for k, v in names.items() if not k.startswith("__")})
    parts = module.split(".")
    for i in range(1, len(parts)):
        _stub(tree, "reasoning_gym." + ".".join(parts[:i]))
    importlib.import_module(f"reasoning_gym.{module}")
    from reasoning_gym.factory import DATASETS

    dataset_cls, config_cls = DATASETS[name]
    for item in dataset_cls(config_cls(**config)):
        print(json.dumps({"question": item["question"], "answer": str(item["answer"])}))


if __name__ == "__main__":
    main()
