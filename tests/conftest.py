"""Shared fixtures: a tiny random Qwen2 model on disk, configured modules and real rollouts (plain
helpers are in tests/helpers.py)."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Sequence

import pytest
import torch

from grpo_lightning.rollout.types import Rollout
from grpo_lightning.quickstart.tiny import build_char_tokenizer, save_tiny_model, tiny_config
from tests.helpers import LAUNCHER_VARIABLES, length_parity_reward, merged

# Lightning gives its logger a handler of its own and stops propagation when it is imported before the root
# logger has one, which depends on when pytest installs its capture: route its records to the root logger,
# where caplog reads them, whatever the order.
_lightning_logger = logging.getLogger("lightning.pytorch")
_lightning_logger.propagate = True
for _handler in list(_lightning_logger.handlers):
    _lightning_logger.removeHandler(_handler)


if "PYTEST_XDIST_WORKER_COUNT" in os.environ:  # pytest -n: the workers share the cores
    WORKER_THREADS = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    torch.set_num_threads(WORKER_THREADS)
    # and so do the processes the tests start (fits on the command line, torchrun, sweeps' cells): a
    # process with torch's default of one thread per core beside a busy worker spins on a shared core
    os.environ.setdefault("OMP_NUM_THREADS", str(WORKER_THREADS))


def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n N``: the files that hold ``slow`` tests are dealt to the N workers, each at the
    front of a worker's share. ``--dist worksteal`` gives each worker a contiguous N-th of this list and
    lets an idle worker take queued tests from the end of another's: with the fits of minutes first,
    the run ends on short tests, not with one worker idle beside a long fit that started last. A file
    stays whole (its module fixtures are built once); the files are dealt by their number of slow
    tests, largest first, to the share that has fewest."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    slow = {}
    for item in items:
        if item.get_closest_marker("slow"):
            slow[item.path] = slow.get(item.path, 0) + 1
    if workers < 2 or not slow:
        return
    shares = [[] for _ in range(workers)]
    weights = [0] * workers
    for path in sorted(slow, key=lambda path: (-slow[path], str(path))):
        lightest = weights.index(min(weights))
        shares[lightest].append(path)
        weights[lightest] += slow[path]
    by_file = {}
    for item in items:
        by_file.setdefault(item.path, []).append(item)
    rest = [item for item in items if item.path not in slow]
    ordered = []
    for index, share in enumerate(shares):
        ordered += [item for path in share for item in by_file[path]]
        size = len(items) * (index + 1) // workers - len(ordered)  # fill up to where the next share starts
        ordered += rest[: max(size, 0)]
        rest = rest[max(size, 0):]
    items[:] = ordered + rest


@pytest.fixture(autouse=True)
def no_process_group_left():
    """A test that ran a process group in the worker (Lightning's in-process strategies) leaves it open and
    the launcher's variables set: a later test would run inside it, and its child processes (a fit, a TRL
    run through accelerate) would take themselves for ranks of a job and bind a port that may still be in
    use. Each test ends with neither: the group it opened destroyed, the variables as it found them."""
    before = {name: os.environ.get(name) for name in LAUNCHER_VARIABLES}
    opened = not torch.distributed.is_initialized()
    yield
    if opened and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny matrices: one intra-op thread is much faster than several on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Directory of a tiny random Qwen2 causal LM and its character tokenizer (``save_pretrained``)."""
    tokenizer = build_char_tokenizer()
    config = tiny_config(
        tokenizer,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), tokenizer, config, seed=0))


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory) -> str:
    """A tiny random Qwen2 token classifier with two labels and its tokenizer, saved as a user's would be."""
    from transformers import AutoTokenizer, Qwen2ForTokenClassification

    tokenizer = build_char_tokenizer()
    config = tiny_config(tokenizer, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64,
                         max_position_embeddings=128)  # fmt: skip
    config.num_labels = 2
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("prm")
    Qwen2ForTokenClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    AutoTokenizer.from_pretrained(path)  # round trip: what the reward model loads
    return str(path)


@pytest.fixture
def make_module(tiny_model_dir) -> Callable:
    """``make_module(cls, configure=True, **kwargs)``: a variant on the tiny model.

    Defaults: ``rewards.funcs=[length_parity_reward]``, ``sampling.group_size=4``,
    ``sampling.max_new_tokens=8`` (a group given as a dict adds its fields to these; a group object
    is used as it is). With ``configure`` the model is loaded (``configure_model()``), which is all
    that ``generate``, ``score`` and ``micro_batch_loss`` need; a Trainer loads it itself. A variant
    that distils from a ``teacher`` gets the tiny model itself unless given one.
    """

    def make(cls, configure: bool = True, **kwargs):
        defaults = {"rewards": {"funcs": [length_parity_reward]}, "sampling": {"group_size": 4, "max_new_tokens": 8}}
        if "teacher" in inspect.signature(cls).parameters:
            defaults["teacher"] = tiny_model_dir
        module = cls(model=tiny_model_dir, **merged(defaults, kwargs))
        if configure:
            module.configure_model()
        return module

    return make


@pytest.fixture
def make_rollout() -> Callable:
    """``make_rollout(module, prompts, seed=0, **columns)``: a scored rollout of ``module.settings.group_size``
    completions per prompt, sampled with ``module.sampling`` under a fixed seed.

    ``columns`` are extra dataset columns (one value per prompt), passed on to the reward functions.
    """

    def make(module, prompts: Sequence[str], seed: int = 0, **columns: Sequence) -> Rollout:
        batch = {"prompt": list(prompts), **{name: list(values) for name, values in columns.items()}}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            rollout = module.generate(batch, module.settings.group_size, module.sampling)
        module.score(rollout)
        return rollout

    return make


@pytest.fixture(scope="module", params=["python", "bubblewrap"])
def sandbox_backend(request) -> str:
    """Each code-execution backend: the interpreter's own layers, and bubblewrap where it is installed."""
    from grpo_lightning.rewards.sandbox.command import bubblewrap_problem

    if request.param == "bubblewrap" and bubblewrap_problem() is not None:
        pytest.skip(f"bubblewrap cannot run here: {bubblewrap_problem()} (apt-get install bubblewrap)")
    return request.param
